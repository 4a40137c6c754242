#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/half.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/half_harness.h"
#include "tests/op_harness.h"
#include "tests/reference_ops.h"

namespace loom::testing {
namespace {

TEST_CASE("matmul ops pass the op harness") {
  std::vector<OpCase> cases = {
      {"matmul", "MatMul", {}, {InputSpec::Uniform({3, 4}), InputSpec::Uniform({4, 5})}, MatMulRef},
      {"matmul A^T", "MatMul", {{"transpose_a", true}}, {InputSpec::Uniform({4, 3}), InputSpec::Uniform({4, 5})}, MatMulRef},
      {"matmul B^T", "MatMul", {{"transpose_b", true}}, {InputSpec::Uniform({3, 4}), InputSpec::Uniform({5, 4})}, MatMulRef},
      {"matmul A^T B^T", "MatMul", {{"transpose_a", true}, {"transpose_b", true}},
       {InputSpec::Uniform({4, 3}), InputSpec::Uniform({5, 4})}, MatMulRef},
      {"matmul large (threaded panels)", "MatMul", {}, {InputSpec::Uniform({64, 48}), InputSpec::Uniform({48, 80})}, MatMulRef},
      {"batch matmul", "BatchMatMul", {}, {InputSpec::Uniform({3, 2, 4}), InputSpec::Uniform({3, 4, 5})}, MatMulRef},
      {"batch matmul B^T", "BatchMatMul", {{"transpose_b", true}},
       {InputSpec::Uniform({2, 3, 4}), InputSpec::Uniform({2, 5, 4})}, MatMulRef},
      // One 2-D operand that every batch entry reads (its gradient sums theirs).
      {"batch matmul shared B", "BatchMatMul", {}, {InputSpec::Uniform({3, 2, 4}), InputSpec::Uniform({4, 5})},
       MatMulRef},
      {"batch matmul A^T shared B", "BatchMatMul", {{"transpose_a", true}},
       {InputSpec::Uniform({2, 2, 4, 3}), InputSpec::Uniform({4, 5})}, MatMulRef},
      {"batch matmul shared A B^T", "BatchMatMul", {{"transpose_b", true}},
       {InputSpec::Uniform({2, 4}), InputSpec::Uniform({3, 5, 4})}, MatMulRef},
      {"linear with bias", "Linear", {}, {InputSpec::Uniform({4, 6}), InputSpec::Uniform({3, 6}), InputSpec::Uniform({3})}, LinearRef},
      {"linear no bias rank 3", "Linear", {}, {InputSpec::Uniform({2, 3, 6}), InputSpec::Uniform({5, 6})}, LinearRef},
      // Batched, a fused array's: each batch entry's own weight and bias.
      {"linear batched with bias", "Linear", {},
       {InputSpec::Uniform({3, 4, 6}), InputSpec::Uniform({3, 5, 6}), InputSpec::Uniform({3, 5})}, LinearRef},
      {"linear batched no bias", "Linear", {}, {InputSpec::Uniform({2, 1, 6}), InputSpec::Uniform({2, 5, 6})},
       LinearRef},
      // No input features: the output is the bias (it was left unwritten).
      {"linear with no input features", "Linear", {},
       {InputSpec::Uniform({4, 0}), InputSpec::Uniform({3, 0}), InputSpec::Uniform({3})}, LinearRef},
      {"linear batched with no input features", "Linear", {},
       {InputSpec::Uniform({2, 4, 0}), InputSpec::Uniform({2, 3, 0}), InputSpec::Uniform({2, 3})}, LinearRef},
      {"linear batched large (threaded panels)", "Linear", {},
       {InputSpec::Uniform({2, 40, 48}), InputSpec::Uniform({2, 70, 48}), InputSpec::Uniform({2, 70})}, LinearRef},
      // Batched on a shared x [rows, in] (a fused first layer's data): y [B, rows, out].
      {"linear batched shared x with bias", "Linear", {},
       {InputSpec::Uniform({4, 6}), InputSpec::Uniform({3, 5, 6}), InputSpec::Uniform({3, 5})}, LinearRef},
      {"linear batched shared x no bias", "Linear", {}, {InputSpec::Uniform({1, 6}), InputSpec::Uniform({2, 5, 6})},
       LinearRef},
      {"linear batched shared x large (threaded panels)", "Linear", {},
       {InputSpec::Uniform({40, 48}), InputSpec::Uniform({3, 70, 48}), InputSpec::Uniform({3, 70})}, LinearRef},
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// ---- bf16 / f16: forward and backward through the executor on every device ----

TEST_CASE("MatMul and BatchMatMul in bf16 and f16 match the f64 reference rounded once, forward and backward") {
  struct Case {
    const char* op;
    std::vector<int64_t> batch;
    int64_t m, n, k;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {"MatMul", {}, 5, 6, 7, false, false},   {"MatMul", {}, 5, 6, 7, true, false},
      {"MatMul", {}, 5, 6, 7, false, true},    {"MatMul", {}, 5, 6, 7, true, true},
      {"MatMul", {}, 33, 40, 70, false, false}, {"BatchMatMul", {2, 3}, 5, 4, 7, false, false},
      {"BatchMatMul", {3}, 6, 5, 9, true, false}, {"BatchMatMul", {2, 2}, 4, 6, 8, false, true},
  };
  Rng rng(21);
  for (DType low : {DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      int64_t batch = 1;
      for (int64_t d : c.batch) batch *= d;
      auto with_batch = [&](int64_t r, int64_t s) {
        std::vector<int64_t> dims = c.batch;
        dims.push_back(r);
        dims.push_back(s);
        return Shape(dims);
      };
      const Shape sa = c.ta ? with_batch(c.k, c.m) : with_batch(c.m, c.k);
      const Shape sb = c.tb ? with_batch(c.n, c.k) : with_batch(c.k, c.n);
      const Shape sy = with_batch(c.m, c.n);
      const std::vector<double> a = RandomHalfValues(sa.numel(), low, rng), b = RandomHalfValues(sb.numel(), low, rng);
      const std::vector<double> g = RandomHalfValues(sy.numel(), low, rng);
      // op(A)[bi, i, l] and op(B)[bi, l, j] of the stored operands.
      auto opa = [&](int64_t bi, int64_t i, int64_t l) {
        return a[bi * c.m * c.k + (c.ta ? l * c.m + i : i * c.k + l)];
      };
      auto opb = [&](int64_t bi, int64_t l, int64_t j) {
        return b[bi * c.k * c.n + (c.tb ? j * c.k + l : l * c.n + j)];
      };
      Exact y(sy.numel()), da(sa.numel()), db(sb.numel());
      for (int64_t bi = 0; bi < batch; ++bi)
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < c.n; ++j)
            for (int64_t l = 0; l < c.k; ++l) {
              const double dy = g[(bi * c.m + i) * c.n + j];
              y.Add((bi * c.m + i) * c.n + j, opa(bi, i, l) * opb(bi, l, j));
              // dop(A)[i, l] += dy[i, j] op(B)[l, j]; dop(B)[l, j] += op(A)[i, l] dy[i, j].
              da.Add(bi * c.m * c.k + (c.ta ? l * c.m + i : i * c.k + l), dy * opb(bi, l, j));
              db.Add(bi * c.k * c.n + (c.tb ? j * c.k + l : l * c.n + j), opa(bi, i, l) * dy);
            }
      const AttrMap attrs{{"transpose_a", c.ta}, {"transpose_b", c.tb}};
      for (Device device : TestDevices()) {
        const std::string what = std::string(c.op) + " " + sa.ToString() + (c.ta ? "^T" : "") + " x " + sb.ToString() +
                                 (c.tb ? "^T" : "") + " in " + DTypeName(low) + " on " + device.ToString();
        HalfOpRun run = RunHalfOp(c.op, attrs, {sa, sb}, {a, b}, sy, g, low, device);
        CheckHalf(run.outputs.at("y"), y, low, c.k, what + ": y");
        CheckHalf(run.outputs.at("d0"), da, low, c.n, what + ": da");
        CheckHalf(run.outputs.at("d1"), db, low, c.m, what + ": db");
      }
    }
  }
}

TEST_CASE("Linear in bf16 and f16 matches the f64 reference rounded once, forward and backward") {
  struct Case {
    std::vector<int64_t> x_dims;
    int64_t out;
    bool bias;
  };
  const std::vector<Case> cases = {{{2, 3, 16}, 8, true}, {{5, 16}, 12, false}, {{16}, 3, true}, {{40, 24}, 33, true}};
  Rng rng(22);
  for (DType low : {DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      const Shape sx(c.x_dims);
      const int64_t in = sx.dim(-1), rows = sx.numel() / in, out = c.out;
      std::vector<int64_t> y_dims = c.x_dims;
      y_dims.back() = out;
      const Shape sy(y_dims), sw({out, in}), sb({out});
      const std::vector<double> x = RandomHalfValues(sx.numel(), low, rng), w = RandomHalfValues(sw.numel(), low, rng);
      const std::vector<double> bias = RandomHalfValues(out, low, rng), g = RandomHalfValues(sy.numel(), low, rng);
      Exact y(sy.numel()), dx(sx.numel()), dw(sw.numel()), db(out);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) {
          const double dy = g[r * out + o];
          if (c.bias) {
            y.Add(r * out + o, bias[o]);
            db.Add(o, dy);
          }
          for (int64_t i = 0; i < in; ++i) {
            y.Add(r * out + o, x[r * in + i] * w[o * in + i]);
            dx.Add(r * in + i, dy * w[o * in + i]);
            dw.Add(o * in + i, dy * x[r * in + i]);
          }
        }
      std::vector<Shape> shapes = {sx, sw};
      std::vector<std::vector<double>> values = {x, w};
      if (c.bias) {
        shapes.push_back(sb);
        values.push_back(bias);
      }
      for (Device device : TestDevices()) {
        const std::string what = "Linear " + sx.ToString() + " x " + sw.ToString() + (c.bias ? " + bias" : "") +
                                 " in " + DTypeName(low) + " on " + device.ToString();
        HalfOpRun run = RunHalfOp("Linear", {}, shapes, values, sy, g, low, device);
        CheckHalf(run.outputs.at("y"), y, low, in + 1, what + ": y");
        CheckHalf(run.outputs.at("d0"), dx, low, out, what + ": dx");
        CheckHalf(run.outputs.at("d1"), dw, low, rows, what + ": dw");
        if (c.bias) CheckHalf(run.outputs.at("d2"), db, low, rows, what + ": db");
      }
    }
  }
}

TEST_CASE("a batched Linear names the shapes it needs") {
  const OpDef* linear = OpRegistry::Global().FindOp("Linear");
  auto types = [](Shape x, Shape w, Shape b) {
    return std::vector<TensorType>{{x, DType::kF32}, {w, DType::kF32}, {b, DType::kF32}};
  };
  auto ok = InferOpTypes(*linear, {}, types({3, 4, 6}, {3, 5, 6}, {3, 5}));
  REQUIRE(ok.status().ToString() == "OK");
  CHECK((*ok)[0].shape == Shape({3, 4, 5}));
  auto batches = InferOpTypes(*linear, {}, types({2, 4, 6}, {3, 5, 6}, {3, 5}));
  CHECK_THAT(batches.status().message(),
             Catch::Contains("takes x [3, rows, in] or a shared x [rows, in], got [2, 4, 6]"));
  auto shared = InferOpTypes(*linear, {}, types({4, 6}, {3, 5, 6}, {3, 5}));
  REQUIRE(shared.status().ToString() == "OK");
  CHECK((*shared)[0].shape == Shape({3, 4, 5}));
  auto bias = InferOpTypes(*linear, {}, types({3, 4, 6}, {3, 5, 6}, {5}));
  CHECK_THAT(bias.status().message(), Catch::Contains("bias must be [3, 5], got [5]"));
  auto rank = InferOpTypes(*linear, {}, types({3, 4, 6}, {1, 3, 5, 6}, {5}));
  CHECK_THAT(rank.status().message(), Catch::Contains("[out, in] or batched [B, out, in]"));
}

TEST_CASE("the GEMMs take bf16 and f16 in type inference, one dtype per node") {
  const OpDef* mm = OpRegistry::Global().FindOp("MatMul");
  const OpDef* linear = OpRegistry::Global().FindOp("Linear");
  for (DType low : {DType::kBF16, DType::kF16}) {
    auto ok = InferOpTypes(*mm, {}, {{{2, 3}, low}, {{3, 4}, low}});
    REQUIRE(ok.status().ToString() == "OK");
    CHECK((*ok)[0].dtype == low);
    auto mixed = InferOpTypes(*mm, {}, {{{2, 3}, low}, {{3, 4}, DType::kF32}});
    CHECK_FALSE(mixed.ok());
    auto lin = InferOpTypes(*linear, {}, {{{2, 3}, low}, {{4, 3}, low}, {{4}, DType::kF32}});
    REQUIRE_FALSE(lin.ok());
    CHECK_THAT(lin.status().message(), Catch::Contains("Linear: dtypes differ"));
  }
  auto ints = InferOpTypes(*mm, {}, {{{2, 3}, DType::kI32}, {{3, 4}, DType::kI32}});
  REQUIRE_FALSE(ints.ok());
  CHECK_THAT(ints.status().message(), Catch::Contains("MatMul input 0 must be f32, f64, bf16 or f16, got i32"));
}

}  // namespace
}  // namespace loom::testing
