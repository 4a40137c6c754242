#include <catch2/catch.hpp>

#include <cmath>

#include "tests/half_harness.h"
#include "tests/op_harness.h"
#include "tests/reference_ops.h"

namespace loom::testing {
namespace {

std::vector<OpCase> Cases() {
  auto add = [](double a, double b) { return a + b; };
  auto sub = [](double a, double b) { return a - b; };
  auto mul = [](double a, double b) { return a * b; };
  auto div = [](double a, double b) { return a / b; };
  std::vector<OpCase> cases;
  cases.push_back({"add same shape", "Add", {}, {InputSpec::Uniform({3, 4}), InputSpec::Uniform({3, 4})}, BinaryRef(add)});
  cases.push_back({"add bias broadcast", "Add", {}, {InputSpec::Uniform({2, 3, 4}), InputSpec::Uniform({4})}, BinaryRef(add)});
  cases.push_back({"add both broadcast", "Add", {}, {InputSpec::Uniform({2, 1, 4}), InputSpec::Uniform({3, 1})}, BinaryRef(add)});
  cases.push_back({"sub broadcast", "Sub", {}, {InputSpec::Uniform({2, 3}), InputSpec::Uniform({2, 1})}, BinaryRef(sub)});
  cases.push_back({"mul broadcast", "Mul", {}, {InputSpec::Uniform({4, 1, 3}), InputSpec::Uniform({1, 5, 3})}, BinaryRef(mul)});
  // Rows merged for the kernels (CollapseBroadcast): a per-channel scale over
  // planes with a replica axis, and operands whose broadcast dims alternate
  // (nothing merges across them); their gradients reduce through SumToShape.
  cases.push_back({"mul per-channel scale, 5-D", "Mul", {},
                   {InputSpec::Uniform({2, 3, 2, 4, 5}), InputSpec::Uniform({2, 3, 2, 1, 1})}, BinaryRef(mul)});
  cases.push_back({"mul alternating broadcast dims", "Mul", {},
                   {InputSpec::Uniform({2, 1, 3, 4, 1}), InputSpec::Uniform({1, 5, 3, 1, 2})}, BinaryRef(mul)});
  cases.push_back({"mul scalar tensor", "Mul", {}, {InputSpec::Uniform({}), InputSpec::Uniform({2, 3})}, BinaryRef(mul)});
  cases.push_back({"div broadcast", "Div", {}, {InputSpec::Uniform({2, 3}), InputSpec::Uniform({3}, 0.5, 2.0)}, BinaryRef(div)});
  // Rows of 2, 4, 8 and 16 against one value each (their own loop), the
  // value on either side of a non-commutative op.
  cases.push_back({"mul per-row scale, 2x2 planes", "Mul", {},
                   {InputSpec::Uniform({2, 5, 2, 2}), InputSpec::Uniform({2, 5, 1, 1})}, BinaryRef(mul)});
  cases.push_back({"sub per-row value first, rows of 2", "Sub", {},
                   {InputSpec::Uniform({3, 1}), InputSpec::Uniform({3, 2})}, BinaryRef(sub)});
  cases.push_back({"div per-row divisor, rows of 8", "Div", {},
                   {InputSpec::Uniform({4, 8}), InputSpec::Uniform({4, 1}, 0.5, 2.0)}, BinaryRef(div)});
  cases.push_back({"div per-row value first, rows of 16", "Div", {},
                   {InputSpec::Uniform({2, 3, 1}), InputSpec::Uniform({2, 3, 16}, 0.5, 2.0)}, BinaryRef(div)});
  cases.push_back({"neg", "Neg", {}, {InputSpec::Uniform({5})}, UnaryRef([](double x) { return -x; })});
  cases.push_back({"add scalar", "AddScalar", {{"value", 2.5}}, {InputSpec::Uniform({2, 3})}, UnaryRef([](double x) { return x + 2.5; })});
  cases.push_back({"mul scalar", "MulScalar", {{"value", -3.0}}, {InputSpec::Uniform({2, 3})}, UnaryRef([](double x) { return -3 * x; })});
  cases.push_back({"pow scalar", "PowScalar", {{"value", 1.5}}, {InputSpec::Uniform({7}, 0.2, 2.0)},
                   UnaryRef([](double x) { return std::pow(x, 1.5); })});
  cases.push_back({"identity", "Identity", {}, {InputSpec::Uniform({3, 2})}, UnaryRef([](double x) { return x; })});
  cases.push_back({"reshape with -1", "Reshape", {{"shape", std::vector<int64_t>{3, -1}}}, {InputSpec::Uniform({2, 3, 2})},
                   [](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
                     return std::vector<Tensor>{in[0].Reshape({3, 4}).value()};
                   }});
  cases.push_back({"sum to shape", "SumToShape", {{"shape", std::vector<int64_t>{3, 1}}}, {InputSpec::Uniform({2, 3, 4})},
                   [](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
                     Tensor y = ZerosF64({3, 1});
                     for (int a = 0; a < 2; ++a)
                       for (int b = 0; b < 3; ++b)
                         for (int c = 0; c < 4; ++c) At(y, b) += At(in[0], (a * 3 + b) * 4 + c);
                     return std::vector<Tensor>{y};
                   }});
  cases.push_back({"broadcast to", "BroadcastTo", {{"shape", std::vector<int64_t>{2, 3, 4}}}, {InputSpec::Uniform({3, 1})},
                   [](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
                     Tensor y = ZerosF64({2, 3, 4});
                     for (int64_t i = 0; i < 24; ++i) At(y, i) = At(in[0], (i / 4) % 3);
                     return std::vector<Tensor>{y};
                   }});
  OpCase fill{"fill", "Fill", {{"shape", std::vector<int64_t>{2, 2}}, {"value", 0.5}, {"dtype", "f64"}}, {},
              [](const std::vector<Tensor>&, const AttrMap&, const std::vector<Tensor>&) {
                Tensor y = ZerosF64({2, 2});
                y.Fill(0.5);
                return std::vector<Tensor>{y};
              }};
  fill.check_gradient = false;
  fill.checked_outputs = {0};
  cases.push_back(fill);
  return cases;
}

TEST_CASE("basic ops pass the op harness") {
  for (const OpCase& c : Cases()) {
    // Fill's dtype comes from its attribute; skip the f32 comparison quirk by running it as is.
    DYNAMIC_SECTION(c.name) { RunOpCase(c); }
  }
}

// SumToShape of x down to `target` (right-aligned, as broadcasting), in f64.
OpCase SumToCase(const std::string& name, const Shape& x, const std::vector<int64_t>& target) {
  return {name, "SumToShape", {{"shape", target}}, {InputSpec::Uniform(x)},
          [x, target](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
            Tensor y = ZerosF64(Shape(target));
            const int offset = x.rank() - static_cast<int>(target.size());
            for (int64_t i = 0; i < x.numel(); ++i) {
              int64_t rest = i, o = 0, scale = 1;
              for (int d = x.rank() - 1; d >= 0; --d) {
                const int64_t at = rest % x[d];
                rest /= x[d];
                const int t = d - offset;
                if (t < 0) continue;
                o += (target[static_cast<size_t>(t)] == 1 ? 0 : at) * scale;
                scale *= target[static_cast<size_t>(t)];
              }
              At(y, o) += At(in[0], i);
            }
            return std::vector<Tensor>{y};
          }};
}

// SumToShape splits rows with outputs of their own, and the row groups of
// kept leading axes, among the threads; rows into a kept inner axis alone,
// or several rows into one output, stay on one thread. The same bits on 1-4
// threads, and the right sums.
TEST_CASE("SumToShape in parallel gives the same bits on any thread count") {
  const std::vector<OpCase> cases = {
      SumToCase("planes to [N, C, 1, 1]", {8, 32, 16, 16}, {8, 32, 1, 1}),
      SumToCase("2x2 planes to [N, C, 1, 1] (rows of a compile-time width)", {8, 32, 2, 2}, {8, 32, 1, 1}),
      SumToCase("4x4 planes to [N, C, 1, 1]", {8, 32, 4, 4}, {8, 32, 1, 1}),
      SumToCase("rows to a kept inner axis", {4096, 24}, {24}),
      SumToCase("a kept inner axis with a summed middle one", {64, 40, 48}, {64, 1, 48}),
      SumToCase("a fused bias gradient, [R, rows, out] to [R, 1, out]", {16, 128, 96}, {16, 1, 96}),
      SumToCase("kept leading axes, summed middle ones", {6, 5, 30, 20, 7}, {6, 5, 1, 1, 7}),
      SumToCase("planes of several images to [1, C, 1, 1]", {8, 32, 16, 16}, {1, 32, 1, 1}),
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) {
      RunOpCase(c);
      CheckSameAcrossThreads(c);
    }
}

// Fusion broadcasts a shared half-precision operand to the replicas (a
// mixed-precision GEMM's input): BroadcastTo copies bf16 / f16 bit for bit,
// and its gradient sums in f32 and rounds once.
TEST_CASE("BroadcastTo in bf16 and f16 copies exactly, and its gradient rounds once") {
  const Shape x_shape{3, 1}, y_shape{2, 3, 4};
  for (DType low : {DType::kBF16, DType::kF16}) {
    Rng rng(9);
    const std::vector<double> x = RandomHalfValues(x_shape.numel(), low, rng);
    const std::vector<double> g = RandomHalfValues(y_shape.numel(), low, rng);
    Exact y(y_shape.numel()), dx(x_shape.numel());
    for (int64_t i = 0; i < y_shape.numel(); ++i) {
      const int64_t row = (i / 4) % 3;
      y.Add(i, x[row]);
      dx.Add(row, g[i]);
    }
    for (Device device : TestDevices()) {
      const std::string what = std::string(DTypeName(low)) + " on " + device.ToString();
      HalfOpRun run = RunHalfOp("BroadcastTo", {{"shape", y_shape.dims()}}, {x_shape}, {x}, y_shape, g, low, device);
      CHECK(run.outputs.at("y").Cast(DType::kF64)->ToDoubleVector() == y.value);
      CheckHalf(run.outputs.at("d0"), dx, low, 8, what + ": dx");
    }
  }
}

}  // namespace
}  // namespace loom::testing
