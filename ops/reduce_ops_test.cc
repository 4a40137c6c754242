#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/allocator.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

using Ints = std::vector<int64_t>;

std::vector<int64_t> Unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.rank());
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[d] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

enum class Kind { kSum, kMean, kMax };

// Visits every input element and folds it into the output element whose
// coordinates are the input's with the reduced ones dropped (or set to 0).
ReferenceFn ReduceRef(Kind kind) {
  return [kind](const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
    const Shape& xs = in[0].shape();
    const int rank = xs.rank();
    std::vector<bool> reduced(rank, attrs.Ints("axes").empty());
    for (int64_t a : attrs.Ints("axes")) reduced[a < 0 ? a + rank : a] = true;
    const bool keep = attrs.Bool("keepdims");
    std::vector<int64_t> out_dims, kept_dims;  // kept_dims: the extents that index the output
    int64_t count = 1;
    for (int d = 0; d < rank; ++d) {
      if (reduced[d]) {
        count *= xs[d];
        if (keep) out_dims.push_back(1);
      } else {
        out_dims.push_back(xs[d]);
        kept_dims.push_back(xs[d]);
      }
    }
    Tensor y = ZerosF64(Shape(out_dims));
    // ReduceMax's index: each output's elements counted in row-major order,
    // the first largest one's count.
    Tensor index = ZerosF64(Shape(out_dims));
    std::vector<int64_t> count_of(static_cast<size_t>(y.numel()), 0);
    std::vector<bool> seen(y.numel(), false);
    for (int64_t i = 0; i < xs.numel(); ++i) {
      std::vector<int64_t> idx = Unravel(i, xs);
      int64_t o = 0;
      for (int d = 0, k = 0; d < rank; ++d)
        if (!reduced[d]) o = o * kept_dims[k++] + idx[d];
      const double v = At(in[0], i);
      if (kind == Kind::kMax) {
        if (!seen[o] || v > At(y, o)) {
          At(y, o) = v;
          At(index, o) = static_cast<double>(count_of[static_cast<size_t>(o)]);
        }
        seen[o] = true;
        ++count_of[static_cast<size_t>(o)];
      } else {
        At(y, o) += v;
      }
    }
    if (kind == Kind::kMean)
      for (int64_t o = 0; o < y.numel(); ++o) At(y, o) /= static_cast<double>(count);
    if (kind == Kind::kMax) return std::vector<Tensor>{y, index};
    return std::vector<Tensor>{y};
  };
}

// softmax / log-softmax along `axis`, one fibre at a time.
ReferenceFn SoftmaxRef(bool log) {
  return [log](const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
    const Shape& xs = in[0].shape();
    int axis = static_cast<int>(attrs.Int("axis"));
    if (axis < 0) axis += xs.rank();
    const int64_t n = xs[axis];
    int64_t stride = 1;
    for (int d = axis + 1; d < xs.rank(); ++d) stride *= xs[d];
    Tensor y = ZerosF64(xs);
    for (int64_t i = 0; i < xs.numel(); ++i) {
      if (Unravel(i, xs)[axis] != 0) continue;  // i starts a fibre
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < n; ++c) mx = std::max(mx, At(in[0], i + c * stride));
      double sum = 0;
      for (int64_t c = 0; c < n; ++c) sum += std::exp(At(in[0], i + c * stride) - mx);
      for (int64_t c = 0; c < n; ++c) {
        const double z = At(in[0], i + c * stride) - mx;
        At(y, i + c * stride) = log ? z - std::log(sum) : std::exp(z) / sum;
      }
    }
    return std::vector<Tensor>{y};
  };
}

std::vector<OpCase> Cases() {
  auto U = [](Shape s) { return InputSpec::Uniform(std::move(s)); };
  std::vector<OpCase> c;
  const auto sum = ReduceRef(Kind::kSum), mean = ReduceRef(Kind::kMean), max = ReduceRef(Kind::kMax);
  c.push_back({"sum all axes", "ReduceSum", {}, {U({3, 4})}, sum});
  c.push_back({"sum last axis", "ReduceSum", {{"axes", Ints{1}}}, {U({3, 4})}, sum});
  c.push_back({"sum first axis", "ReduceSum", {{"axes", Ints{0}}}, {U({3, 4})}, sum});
  c.push_back({"sum non-adjacent axes keepdims", "ReduceSum", {{"axes", Ints{0, 2}}, {"keepdims", true}}, {U({2, 3, 4})}, sum});
  c.push_back({"sum middle axis negative", "ReduceSum", {{"axes", Ints{-2}}}, {U({2, 3, 4})}, sum});
  c.push_back({"sum all axes keepdims", "ReduceSum", {{"keepdims", true}}, {U({2, 3})}, sum});
  c.push_back({"sum over unit and inner axes", "ReduceSum", {{"axes", Ints{1, 3}}}, {U({2, 1, 3, 4})}, sum});
  c.push_back({"sum scalar", "ReduceSum", {}, {U({})}, sum});
  c.push_back({"sum rows in parallel", "ReduceSum", {{"axes", Ints{1}}}, {U({256, 300})}, sum});
  c.push_back({"sum one long row (blocked)", "ReduceSum", {}, {U({7, 10000})}, sum});
  c.push_back({"sum leading axis (blocked inner vectors)", "ReduceSum", {{"axes", Ints{0}}}, {U({5000, 8})}, sum});
  c.push_back({"sum of empty axis is zero", "ReduceSum", {{"axes", Ints{1}}}, {U({3, 0})}, sum});
  c.push_back({"sum long non-adjacent axes (split)", "ReduceSum", {{"axes", Ints{0, 2}}}, {U({300, 3, 40})}, sum});
  c.push_back({"sum middle axis of few columns (split)", "ReduceSum", {{"axes", Ints{1}}}, {U({2, 3000, 3})}, sum});

  c.push_back({"mean last axis", "ReduceMean", {{"axes", Ints{-1}}}, {U({3, 5})}, mean});
  c.push_back({"mean two axes keepdims", "ReduceMean", {{"axes", Ints{1, 2}}, {"keepdims", true}}, {U({2, 3, 4})}, mean});
  c.push_back({"mean first and last of 4d", "ReduceMean", {{"axes", Ints{0, 3}}}, {U({2, 3, 2, 5})}, mean});
  c.push_back({"mean all (blocked)", "ReduceMean", {}, {U({40000})}, mean});
  c.push_back({"mean of empty axis is NaN", "ReduceMean", {{"axes", Ints{0}}}, {U({0, 3})}, mean});

  c.push_back({"max last axis", "ReduceMax", {{"axes", Ints{1}}}, {U({4, 5})}, max});
  c.push_back({"max first axis", "ReduceMax", {{"axes", Ints{0}}}, {U({4, 5})}, max});
  c.push_back({"max non-adjacent axes keepdims", "ReduceMax", {{"axes", Ints{0, 2}}, {"keepdims", true}}, {U({3, 2, 4})}, max});
  c.push_back({"max all", "ReduceMax", {}, {U({3, 4})}, max});
  c.push_back({"max long row (blocked)", "ReduceMax", {{"axes", Ints{1}}}, {U({2, 40000})}, max});
  c.push_back({"max leading axis (blocked inner vectors)", "ReduceMax", {{"axes", Ints{0}}}, {U({4000, 16})}, max});

  auto wide = [](Shape s) { return InputSpec::Uniform(std::move(s), -4.0, 4.0); };
  c.push_back({"softmax last axis", "Softmax", {}, {wide({3, 5})}, SoftmaxRef(false)});
  c.push_back({"softmax middle axis", "Softmax", {{"axis", 1}}, {wide({2, 4, 3})}, SoftmaxRef(false)});
  c.push_back({"softmax first axis", "Softmax", {{"axis", 0}}, {wide({4, 3})}, SoftmaxRef(false)});
  c.push_back({"softmax over more than one lane block", "Softmax", {{"axis", -2}}, {wide({2, 3, 150})}, SoftmaxRef(false)});
  c.push_back({"softmax 1d", "Softmax", {}, {wide({6})}, SoftmaxRef(false)});
  c.push_back({"softmax rows in parallel", "Softmax", {}, {wide({512, 100})}, SoftmaxRef(false)});
  c.push_back({"log softmax last axis", "LogSoftmax", {}, {wide({3, 5})}, SoftmaxRef(true)});
  c.push_back({"log softmax middle axis", "LogSoftmax", {{"axis", 1}}, {wide({2, 4, 3})}, SoftmaxRef(true)});
  c.push_back({"log softmax over more than one lane block", "LogSoftmax", {{"axis", 0}}, {wide({5, 130})},
               SoftmaxRef(true)});
  c.push_back({"log softmax rows in parallel", "LogSoftmax", {}, {wide({512, 100})}, SoftmaxRef(true)});
  // Rows longer than a CUDA block's threads, along the last and a strided axis.
  c.push_back({"softmax long rows", "Softmax", {}, {wide({3, 2000})}, SoftmaxRef(false)});
  c.push_back({"softmax long strided axis", "Softmax", {{"axis", 1}}, {wide({2, 600, 5})}, SoftmaxRef(false)});
  c.push_back({"log softmax long rows", "LogSoftmax", {}, {wide({2, 3000})}, SoftmaxRef(true)});
  c.push_back({"log softmax long strided axis", "LogSoftmax", {{"axis", 0}}, {wide({700, 40})}, SoftmaxRef(true)});
  return c;
}

TEST_CASE("reduce and softmax ops pass the op harness") {
  for (const OpCase& c : Cases()) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

TEST_CASE("reductions and softmax reject bad attributes with clear messages") {
  using Catch::Matchers::Contains;
  TensorType x{{2, 3, 4}, DType::kF32};
  CHECK_THAT(InferError("ReduceSum", {{"axes", Ints{3}}}, {x}),
             Contains("'axes' [3] has axis 3, out of range for input of shape [2, 3, 4]"));
  CHECK_THAT(InferError("ReduceMean", {{"axes", Ints{1, -2}}}, {x}), Contains("names axis 1 twice"));
  CHECK_THAT(InferError("ReduceMax", {{"axes", Ints{1}}}, {TensorType{{2, 0}, DType::kF32}}),
             Contains("empty reduction (input [2, 0]"));
  CHECK_THAT(InferError("ReduceSum", {}, {TensorType{{2}, DType::kI64}}), Contains("ReduceSum input must be f32 or f64"));
  CHECK_THAT(InferError("Softmax", {{"axis", 3}}, {x}), Contains("'axis' = 3 is out of range for input of shape [2, 3, 4]"));
  CHECK_THAT(InferError("SoftmaxBackward", {}, {x, TensorType{{2, 3, 5}, DType::kF32}}), Contains("y and dy differ"));
  CHECK_THAT(InferError("ReduceMaxBackward", {{"axes", Ints{1}}}, {x, TensorType{{2, 4}, DType::kF32}, x}),
             Contains("index must be ReduceMax(x)'s"));
  CHECK_THAT(InferError("ReduceMaxBackward", {{"axes", Ints{1}}}, {x, TensorType{{2, 4}, DType::kI64}, x}),
             Contains("dy must match ReduceMax(x)"));
}

// Builds x -> op -> ReduceSum (loss), returns the op output and d loss / dx.
std::pair<Tensor, Tensor> ForwardAndGrad(const std::string& op, const AttrMap& attrs, const Tensor& x,
                                         Device device = Device::Cpu()) {
  Graph graph;
  GraphBuilder b(&graph);
  ValueId in = b.Input("x", {x.shape(), x.dtype()});
  ValueId y = b.Add1(op, {in}, attrs, "op").value();
  ValueId loss = b.Add1("ReduceSum", {y}, {}, "loss").value();
  auto grads = BuildGradients(&graph, loss, {in});
  REQUIRE(grads.ok());
  graph.outputs()["y"] = y;
  graph.outputs()["dx"] = grads->at(in);
  ExecutorOptions opts;
  opts.device = device;
  auto exec = Executor::Create(graph, opts);
  REQUIRE(exec.status().ToString() == "OK");
  auto r = (*exec)->Run({{"x", x}});
  REQUIRE(r.status().ToString() == "OK");
  return {(*r)["y"].To(Device::Cpu()).value(), (*r)["dx"].To(Device::Cpu()).value()};
}

TEST_CASE("ReduceMax sends the gradient to the first maximum on ties") {
  Tensor x = Tensor::FromVector<float>({2, 3}, {1, 3, 3, 2, 2, 0});
  auto [y, dx] = ForwardAndGrad("ReduceMax", {{"axes", Ints{1}}}, x);
  CHECK(y.ToDoubleVector() == std::vector<double>{3, 2});
  CHECK(dx.ToDoubleVector() == std::vector<double>{0, 1, 0, 1, 0, 0});
  // Along a leading axis the first maximum is the lowest row.
  auto [y0, dx0] = ForwardAndGrad("ReduceMax", {{"axes", Ints{0}}}, Tensor::FromVector<float>({2, 2}, {5, 1, 5, 1}));
  CHECK(dx0.ToDoubleVector() == std::vector<double>{1, 1, 0, 0});
}

// The same rules on CUDA when there is a GPU, with ties and NaN spread over
// threads and over the blocks a long reduction is split into.
TEST_CASE("ReduceMax on CUDA sends the gradient where the CPU does") {
  if (!GpuAvailable() || !OpRegistry::Global().SupportsOp("ReduceMax", DeviceType::kCuda)) return;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> rows(2 * 40000, 0.0f);
  for (int64_t i : {9001, 20000, 100, 39999}) rows[i] = 5;  // row 0: first maximum at 100
  for (int64_t i : {777, 778, 5}) rows[40000 + i] = 1;      // row 1: the NaN wins
  rows[40000 + 30000] = nan;
  std::vector<float> cols(40000 * 3, -1.0f);
  for (int64_t r : {31000, 17, 16}) cols[r * 3 + 1] = 2;  // column 1: first maximum in row 16
  const struct {
    Tensor x;
    Ints axes;
  } cases[] = {{Tensor::FromVector<float>({2, 40000}, rows), {1}},
               {Tensor::FromVector<float>({40000, 3}, cols), {0}},
               {Tensor::FromVector<float>({2, 3}, {1, 3, 3, 2, 2, 0}), {1}}};
  for (const auto& c : cases) {
    auto [y_cpu, dx_cpu] = ForwardAndGrad("ReduceMax", {{"axes", c.axes}}, c.x);
    auto [y_gpu, dx_gpu] = ForwardAndGrad("ReduceMax", {{"axes", c.axes}}, c.x, Device::Cuda(0));
    const std::vector<double> a = y_cpu.ToDoubleVector(), b = y_gpu.ToDoubleVector();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK((a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))));
    CHECK(dx_cpu.ToDoubleVector() == dx_gpu.ToDoubleVector());
  }
}

TEST_CASE("ReduceMax propagates NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::FromVector<float>({2, 3}, {1, nan, 3, 4, 5, 6});
  auto [y, dx] = ForwardAndGrad("ReduceMax", {{"axes", Ints{1}}}, x);
  CHECK(std::isnan(y.ScalarAt(0)));
  CHECK(y.ScalarAt(1) == 6);
  CHECK(dx.ToDoubleVector()[1] == 1);  // the gradient follows the NaN
}

// Rows of 37 run through the vector lanes (two blocks of 8, a loop, a
// tail): ties across lanes, NaN in the first block, in the loop and in the
// tail, and the maximum in the tail, for both float types.
template <typename T>
void CheckLongRowMaxima() {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const int64_t n = 37;
  std::vector<T> x(5 * n);
  for (int64_t i = 0; i < 5 * n; ++i) x[i] = static_cast<T>(-2.0 - (i % 7) * 0.25);
  x[0 * n + 5] = x[0 * n + 30] = 7;  // a tie: the first one gets the gradient
  x[1 * n + 20] = nan;               // NaN in the loop
  x[2 * n + 35] = nan;               // NaN in the tail
  x[3 * n + 3] = nan;                // NaN in the first block, a larger value after it
  x[3 * n + 10] = 9;
  x[4 * n + 36] = -1;                // the maximum in the tail
  auto [y, dx] = ForwardAndGrad("ReduceMax", {{"axes", Ints{1}}}, Tensor::FromVector<T>({5, n}, x));
  const std::vector<double> yv = y.ToDoubleVector(), dxv = dx.ToDoubleVector();
  CHECK(yv[0] == 7);
  CHECK(std::isnan(yv[1]));
  CHECK(std::isnan(yv[2]));
  CHECK(std::isnan(yv[3]));
  CHECK(yv[4] == -1);
  std::vector<double> want(5 * n, 0.0);
  for (int64_t at : {0 * n + 5, 1 * n + 20, 2 * n + 35, 3 * n + 3, 4 * n + 36}) want[at] = 1;
  CHECK(dxv == want);
}

// Rows of 200 for the gradient's search in blocks of four vectors (three
// blocks of 64, a tail of 8): the maximum in each vector of a block, a tie
// across blocks, NaN in a later block than a larger value, and in the tail.
template <typename T>
void CheckBlockSearch() {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const int64_t n = 200, rows = 8;
  std::vector<T> x(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) x[i] = static_cast<T>(-2.0 - (i % 11) * 0.125);
  const std::vector<int64_t> first = {0, 17, 47, 63, 64 + 33, 128 + 60, 195, 150};
  for (int64_t r = 0; r < 6; ++r) x[r * n + first[r]] = 5;
  x[6 * n + 195] = nan;  // in the tail
  x[7 * n + 150] = nan;  // in the third block, after a larger value in the first
  x[7 * n + 10] = 8;
  x[2 * n + 47 + 64] = 5;  // a tie in the next block: the first gets the gradient
  auto [y, dx] = ForwardAndGrad("ReduceMax", {{"axes", Ints{1}}}, Tensor::FromVector<T>({rows, n}, x));
  const std::vector<double> dxv = dx.ToDoubleVector();
  std::vector<double> want(rows * n, 0.0);
  for (int64_t r = 0; r < rows; ++r) want[r * n + first[r]] = 1;
  CHECK(dxv == want);
}

TEST_CASE("ReduceMax over long rows: ties, NaN and the tail in its vector lanes") {
  CheckLongRowMaxima<float>();
  CheckLongRowMaxima<double>();
  CheckBlockSearch<float>();
  CheckBlockSearch<double>();
}

TEST_CASE("softmax is stable for large inputs") {
  // exp(1000) overflows f32 and f64; shifting by the maximum keeps it exact.
  Tensor x = Tensor::FromVector<float>({1, 3}, {1000, 1001, 1002});
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  auto [p, dp] = ForwardAndGrad("Softmax", {}, x);
  CHECK(p.ScalarAt(0) == Approx(1 / z));
  CHECK(p.ScalarAt(2) == Approx(std::exp(2.0) / z));
  for (double g : dp.ToDoubleVector()) CHECK(std::abs(g) < 1e-6);  // sum of softmax is constant
  auto [lp, dlp] = ForwardAndGrad("LogSoftmax", {}, x);
  CHECK(lp.ScalarAt(0) == Approx(-std::log(z)));
  CHECK(lp.ScalarAt(2) == Approx(2 - std::log(z)));
  CHECK(dlp.ScalarAt(0) == Approx(1 - 3 / z));  // 1 - n * softmax
}

}  // namespace
}  // namespace loom::testing
