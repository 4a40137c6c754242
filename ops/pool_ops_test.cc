#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <variant>

#include "core/thread_pool.h"
#include "ops/op.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

using Ints = std::vector<int64_t>;
using Pair = std::array<int64_t, 2>;

Pair Get(const AttrMap& attrs, const char* name, Pair def) {
  if (!attrs.Has(name)) return def;
  const AttrValue& a = attrs.values().at(name);
  if (const int64_t* i = std::get_if<int64_t>(&a)) return {*i, *i};
  const Ints& l = std::get<Ints>(a);
  return {l[0], l[1]};
}

// PyTorch's pooling_output_shape, written out from its definition (p_end:
// the padding after the input, p unless a row split's part sets it).
int64_t OutExtent(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode, int64_t p_end = -1) {
  if (p_end < 0) p_end = p;
  double span = static_cast<double>(in + p + p_end - d * (k - 1) - 1) / static_cast<double>(s);
  int64_t out = static_cast<int64_t>(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

struct RefPool {
  Pair k, s, p, d;
  bool ceil_mode;
  int64_t n, c, h, w, oh, ow;
  int64_t row_offset;  // max pools: added to the indices' rows
  RefPool(const AttrMap& a, const Shape& x)
      : k(Get(a, "kernel", {0, 0})),
        s(Get(a, "stride", k)),
        p(Get(a, "padding", {0, 0})),
        d(Get(a, "dilation", {1, 1})),
        ceil_mode(a.Bool("ceil_mode")),
        n(x[0]),
        c(x[1]),
        h(x[2]),
        w(x[3]),
        oh(OutExtent(h, k[0], s[0], p[0], d[0], ceil_mode, a.Has("bottom_padding") ? a.Int("bottom_padding") : -1)),
        ow(OutExtent(w, k[1], s[1], p[1], d[1], ceil_mode)),
        row_offset(a.Has("row_offset") ? a.Int("row_offset") : 0) {}
};

// Max and argmax over each window, scanning taps in order with -inf padding.
std::vector<Tensor> MaxPoolRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  RefPool r(attrs, in[0].shape());
  Tensor y = ZerosF64({r.n, r.c, r.oh, r.ow});
  Tensor idx = Tensor::Zeros({r.n, r.c, r.oh, r.ow}, DType::kI64);
  for (int64_t pl = 0; pl < r.n * r.c; ++pl)
    for (int64_t oy = 0; oy < r.oh; ++oy)
      for (int64_t ox = 0; ox < r.ow; ++ox) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t arg = -1;
        for (int64_t ki = 0; ki < r.k[0]; ++ki)
          for (int64_t kj = 0; kj < r.k[1]; ++kj) {
            int64_t iy = oy * r.s[0] - r.p[0] + ki * r.d[0], ix = ox * r.s[1] - r.p[1] + kj * r.d[1];
            if (iy < 0 || iy >= r.h || ix < 0 || ix >= r.w) continue;
            double v = At(in[0], (pl * r.h + iy) * r.w + ix);
            if (v > best) {
              best = v;
              arg = (iy + r.row_offset) * r.w + ix;
            }
          }
        int64_t o = (pl * r.oh + oy) * r.ow + ox;
        At(y, o) = best;
        idx.data<int64_t>()[o] = arg;
      }
  return {y, idx};
}

// Mean over each window; the divisor follows PyTorch's avg_pool2d.
std::vector<Tensor> AvgPoolRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  RefPool r(attrs, in[0].shape());
  const bool include_pad = attrs.Bool("count_include_pad");
  Tensor y = ZerosF64({r.n, r.c, r.oh, r.ow});
  for (int64_t pl = 0; pl < r.n * r.c; ++pl)
    for (int64_t oy = 0; oy < r.oh; ++oy)
      for (int64_t ox = 0; ox < r.ow; ++ox) {
        int64_t y0 = oy * r.s[0] - r.p[0], x0 = ox * r.s[1] - r.p[1];
        int64_t y1 = std::min(y0 + r.k[0], r.h + r.p[0]), x1 = std::min(x0 + r.k[1], r.w + r.p[1]);
        double sum = 0;
        int64_t inside = 0;
        for (int64_t iy = y0; iy < y1; ++iy)
          for (int64_t ix = x0; ix < x1; ++ix)
            if (iy >= 0 && iy < r.h && ix >= 0 && ix < r.w) {
              sum += At(in[0], (pl * r.h + iy) * r.w + ix);
              ++inside;
            }
        At(y, (pl * r.oh + oy) * r.ow + ox) = sum / static_cast<double>(include_pad ? (y1 - y0) * (x1 - x0) : inside);
      }
  return {y};
}

std::vector<Tensor> AdaptiveAvgRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const Shape& x = in[0].shape();
  Pair out = Get(attrs, "output_size", {0, 0});
  const int64_t h = x[2], w = x[3];
  Tensor y = ZerosF64({x[0], x[1], out[0], out[1]});
  for (int64_t pl = 0; pl < x[0] * x[1]; ++pl)
    for (int64_t oy = 0; oy < out[0]; ++oy)
      for (int64_t ox = 0; ox < out[1]; ++ox) {
        auto lo = [](int64_t i, int64_t in_, int64_t out_) { return static_cast<int64_t>(std::floor(double(i * in_) / out_)); };
        auto hi = [](int64_t i, int64_t in_, int64_t out_) {
          return static_cast<int64_t>(std::ceil(double((i + 1) * in_) / out_));
        };
        double sum = 0;
        int64_t count = 0;
        for (int64_t iy = lo(oy, h, out[0]); iy < hi(oy, h, out[0]); ++iy)
          for (int64_t ix = lo(ox, w, out[1]); ix < hi(ox, w, out[1]); ++ix, ++count) sum += At(in[0], (pl * h + iy) * w + ix);
        At(y, (pl * out[0] + oy) * out[1] + ox) = sum / count;
      }
  return {y};
}

InputSpec U(Shape s) { return InputSpec::Uniform(std::move(s)); }

std::vector<OpCase> Cases() {
  return {
      {"max pool 2x2 (stride defaults to kernel)", "MaxPool2d", {{"kernel", int64_t{2}}}, {U({2, 3, 6, 6})}, MaxPoolRef},
      // Stride-2 rows in vector lanes, loaded as runs where the run stays
      // inside the plane: one block that ends at the plane's last element,
      // and overlapping blocks of a 14-wide output row.
      {"max pool 2x2 on 16x16 planes", "MaxPool2d", {{"kernel", int64_t{2}}}, {U({2, 3, 16, 16})}, MaxPoolRef},
      {"max pool 2x2 on 28x28 planes", "MaxPool2d", {{"kernel", int64_t{2}}}, {U({1, 2, 28, 28})}, MaxPoolRef},
      {"max pool 3x3 stride 2 on 29x29 planes", "MaxPool2d", {{"kernel", int64_t{3}}, {"stride", int64_t{2}}},
       {U({1, 2, 29, 29})}, MaxPoolRef},
      {"max pool 3x3 stride 2 padding 1", "MaxPool2d",
       {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}, {U({2, 2, 7, 7})}, MaxPoolRef},
      {"max pool non-square kernel and stride, overlapping", "MaxPool2d",
       {{"kernel", Ints{3, 2}}, {"stride", Ints{2, 1}}, {"padding", Ints{1, 0}}}, {U({1, 2, 7, 5})}, MaxPoolRef},
      {"max pool dilation 2 stride 1", "MaxPool2d", {{"kernel", int64_t{2}}, {"stride", int64_t{1}}, {"dilation", int64_t{2}}},
       {U({1, 2, 6, 5})}, MaxPoolRef},
      {"max pool ceil_mode (partial last window)", "MaxPool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"ceil_mode", true}}, {U({1, 2, 6, 6})}, MaxPoolRef},
      {"max pool ceil_mode with padding", "MaxPool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}, {"ceil_mode", true}},
       {U({2, 1, 6, 5})}, MaxPoolRef},
      // A row split's parts (PoolOp::PartAttrs): padding above only, below
      // only (bottom_padding), and rows 3.. of a plane (row_offset: indices
      // past the part's own plane, so no gradient check of its backward).
      {"max pool of a top part: padding above, none below", "MaxPool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}, {"bottom_padding", int64_t{0}}},
       {U({2, 2, 6, 7})}, MaxPoolRef},
      {"max pool of a bottom part: padding below only, dilated", "MaxPool2d",
       {{"kernel", int64_t{3}}, {"stride", Ints{1, 2}}, {"padding", Ints{0, 1}}, {"dilation", int64_t{2}},
        {"bottom_padding", int64_t{3}}},
       {U({1, 2, 6, 5})}, MaxPoolRef},
      {"max pool of a middle part: indices from row 3 of the plane", "MaxPool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", Ints{0, 1}}, {"bottom_padding", int64_t{0}},
        {"row_offset", int64_t{3}}},
       {U({2, 2, 5, 6})}, MaxPoolRef, {}, {}, 2e-4, 1e-9, 1e-5, /*check_gradient=*/false},
      {"avg pool 2x2", "AvgPool2d", {{"kernel", int64_t{2}}}, {U({2, 3, 6, 6})}, AvgPoolRef},
      {"avg pool 3x3 stride 2 padding 1 count_include_pad", "AvgPool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}}, {U({2, 2, 7, 6})}, AvgPoolRef},
      {"avg pool 3x3 stride 2 padding 1 exclude pad", "AvgPool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}, {"count_include_pad", false}},
       {U({2, 2, 7, 6})}, AvgPoolRef},
      {"avg pool ceil_mode padding count_include_pad", "AvgPool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}, {"ceil_mode", true}},
       {U({1, 2, 6, 5})}, AvgPoolRef},
      {"avg pool ceil_mode padding exclude pad", "AvgPool2d",
       {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}, {"ceil_mode", true},
        {"count_include_pad", false}},
       {U({1, 2, 6, 5})}, AvgPoolRef},
      {"avg pool non-square kernel and stride", "AvgPool2d", {{"kernel", Ints{2, 3}}, {"stride", Ints{1, 2}}},
       {U({2, 2, 4, 7})}, AvgPoolRef},
      {"adaptive avg pool to 1x1", "AdaptiveAvgPool2d", {{"output_size", int64_t{1}}}, {U({2, 3, 5, 4})},
       AdaptiveAvgRef},
      // The global pool's planes of 4 and 16, whose loops have their size
      // at compile time.
      {"adaptive avg pool to 1x1 from 2x2", "AdaptiveAvgPool2d", {{"output_size", int64_t{1}}}, {U({2, 3, 2, 2})},
       AdaptiveAvgRef},
      {"adaptive avg pool to 1x1 from 4x4", "AdaptiveAvgPool2d", {{"output_size", int64_t{1}}}, {U({2, 3, 4, 4})},
       AdaptiveAvgRef},
      {"adaptive avg pool to a non-divisor size", "AdaptiveAvgPool2d", {{"output_size", Ints{3, 2}}},
       {U({2, 2, 7, 5})}, AdaptiveAvgRef},
      {"adaptive avg pool evenly", "AdaptiveAvgPool2d", {{"output_size", int64_t{2}}}, {U({1, 3, 4, 6})},
       AdaptiveAvgRef},
      {"adaptive avg pool larger than the input", "AdaptiveAvgPool2d", {{"output_size", Ints{4, 5}}},
       {U({1, 2, 3, 3})}, AdaptiveAvgRef},
  };
}

TEST_CASE("pool ops pass the op harness") {
  for (const OpCase& c : Cases()) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// Big enough that the planes split over the pool's workers.
TEST_CASE("pool kernels agree across thread counts") {
  std::vector<OpCase> cases = {
      {"max pool", "MaxPool2d", {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}},
       {U({4, 16, 24, 24})}, MaxPoolRef},
      {"avg pool", "AvgPool2d", {{"kernel", int64_t{2}}}, {U({4, 16, 24, 24})}, AvgPoolRef},
      {"adaptive avg pool", "AdaptiveAvgPool2d", {{"output_size", int64_t{5}}}, {U({4, 16, 24, 24})}, AdaptiveAvgRef},
  };
  for (int threads : {1, 3}) {
    ThreadPool::SetDefaultThreads(threads);
    for (const OpCase& c : cases) DYNAMIC_SECTION(c.name << " on " << threads << " threads") { RunOpCase(c); }
  }
  ThreadPool::SetDefaultThreads(0);
}

TensorType F32(Shape s) { return {std::move(s), DType::kF32}; }

StatusOr<std::vector<TensorType>> Infer(const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in) {
  return InferOpTypes(*OpRegistry::Global().GetOp(op).value(), attrs, in);
}

std::string InferError(const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in) {
  auto r = Infer(op, attrs, in);
  return r.ok() ? "" : r.status().message();
}

Shape InferShape(const std::string& op, const AttrMap& attrs, const Shape& x) {
  auto r = Infer(op, attrs, {F32(x)});
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return r->at(0).shape;
}

TEST_CASE("pool shape inference follows PyTorch") {
  // floor vs ceil mode; in ceil mode the last window must start inside the
  // input or its left padding (5 + 2 * 1 - 2 = 5, ceil(5 / 2) + 1 = 4 -> 3).
  CHECK(InferShape("MaxPool2d", {{"kernel", int64_t{3}}, {"stride", int64_t{2}}}, {1, 1, 6, 6}) == Shape({1, 1, 2, 2}));
  CHECK(InferShape("MaxPool2d", {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"ceil_mode", true}}, {1, 1, 6, 6}) ==
        Shape({1, 1, 3, 3}));
  CHECK(InferShape("MaxPool2d", {{"kernel", int64_t{2}}, {"padding", int64_t{1}}, {"ceil_mode", true}}, {1, 1, 5, 5}) ==
        Shape({1, 1, 3, 3}));
  CHECK(InferShape("MaxPool2d", {{"kernel", int64_t{3}}, {"stride", int64_t{1}}, {"dilation", int64_t{2}}},
                   {2, 3, 9, 8}) == Shape({2, 3, 5, 4}));
  CHECK(InferShape("AvgPool2d", {{"kernel", Ints{2, 4}}, {"stride", Ints{}}}, {1, 2, 8, 8}) == Shape({1, 2, 4, 2}));
  CHECK(InferShape("AdaptiveAvgPool2d", {{"output_size", Ints{3, 7}}}, {4, 2, 10, 5}) == Shape({4, 2, 3, 7}));
  auto max = Infer("MaxPool2d", {{"kernel", int64_t{2}}}, {F32({1, 2, 4, 4})});
  REQUIRE(max.ok());
  REQUIRE(max->size() == 2);
  CHECK(max->at(1) == TensorType{Shape({1, 2, 2, 2}), DType::kI64});
}

TEST_CASE("pool shape errors name the problem") {
  using Catch::Matchers::Contains;
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{5}}}, {F32({1, 1, 4, 4})}),
             Contains("kernel [5, 5] with dilation [1, 1] spans [5, 5], larger than the padded input [4, 4]"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{3}}, {"dilation", int64_t{2}}}, {F32({1, 1, 4, 8})}),
             Contains("spans [5, 5]") && Contains("padded input [4, 8]"));
  CHECK_THAT(InferError("AvgPool2d", {{"kernel", Ints{3, 3}}}, {F32({1, 1, 2, 5})}),
             Contains("kernel [3, 3] spans [3, 3], larger than the padded input [2, 5]") && Contains("x [1, 1, 2, 5]"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{2}}, {"padding", int64_t{2}}}, {F32({1, 1, 8, 8})}),
             Contains("padding [2, 2] must be between 0 and half the kernel [2, 2]"));
  CHECK_THAT(InferError("MaxPool2d", {}, {F32({1, 1, 8, 8})}), Contains("missing required attribute 'kernel'"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{2}}}, {F32({1, 8, 8})}),
             Contains("input x must be [N, C, H, W], got [1, 8, 8]"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{2}}, {"stride", Ints{0, 1}}}, {F32({1, 1, 8, 8})}),
             Contains("stride must be >= 1, got [0, 1]"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", Ints{2, 2, 2}}}, {F32({1, 1, 8, 8})}),
             Contains("'kernel' must be an int or a list of 2 ints, got [2, 2, 2]"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{2}}, {"ceil_mode", int64_t{1}}}, {F32({1, 1, 8, 8})}),
             Contains("'ceil_mode' must be of type bool"));
  CHECK_THAT(InferError("AvgPool2d", {{"kernel", int64_t{2}}, {"dilation", int64_t{2}}}, {F32({1, 1, 8, 8})}),
             Contains("unknown attribute 'dilation'"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{2}}, {"count_include_pad", false}}, {F32({1, 1, 8, 8})}),
             Contains("unknown attribute 'count_include_pad'"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{3}}, {"bottom_padding", int64_t{3}}}, {F32({1, 1, 8, 8})}),
             Contains("bottom_padding 3 must be -1 (the padding) or in [0, 3) (a window must hold an input row)"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{3}}, {"row_offset", int64_t{-1}}}, {F32({1, 1, 8, 8})}),
             Contains("row_offset must be >= 0, got -1"));
  CHECK_THAT(InferError("AdaptiveAvgPool2d", {{"output_size", Ints{0, 2}}}, {F32({1, 1, 8, 8})}),
             Contains("output_size must be >= 1, got [0, 2]"));
  CHECK_THAT(InferError("AdaptiveAvgPool2d", {}, {F32({1, 1, 8, 8})}), Contains("missing required attribute 'output_size'"));
  CHECK_THAT(InferError("AdaptiveAvgPool2d", {{"output_size", int64_t{2}}}, {F32({1, 1, 0, 8})}),
             Contains("has an empty plane"));
  CHECK_THAT(InferError("MaxPool2d", {{"kernel", int64_t{2}}}, {{Shape({1, 1, 4, 4}), DType::kI32}}),
             Contains("must be f32 or f64"));
  // Backward ops check their inputs against the forward geometry.
  CHECK_THAT(InferError("MaxPool2dBackward", {{"kernel", int64_t{2}}, {"input_shape", Ints{1, 1, 8, 8}}},
                        {F32({1, 1, 4, 4}), F32({1, 1, 4, 4})}),
             Contains("indices must be i64 shaped like dy [1, 1, 4, 4]"));
  CHECK_THAT(InferError("AvgPool2dBackward", {{"kernel", int64_t{2}}, {"input_shape", Ints{1, 1, 6, 6}}},
                        {F32({1, 1, 4, 4})}),
             Contains("dy [1, 1, 4, 4] is not the forward output [1, 1, 3, 3]"));
  CHECK_THAT(InferError("AdaptiveAvgPool2dBackward", {{"output_size", int64_t{2}}}, {F32({1, 1, 2, 2})}),
             Contains("missing required attribute 'input_shape'"));
}

TEST_CASE("pool cost counts window elements") {
  const OpDef* avg = OpRegistry::Global().GetOp("AvgPool2d").value();
  AttrMap attrs{{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}};
  std::vector<TensorType> in = {F32({2, 3, 5, 5})};
  LOOM_CHECK_OK(CanonicalizeAttrs(*avg, &attrs));
  auto out = avg->InferTypes(attrs, in).value();
  // Along each axis the 3 windows cover input rows {0,1}, {1,2,3}, {3,4}: 7
  // taps; 2 * 3 planes of 7 * 7 adds, plus one scale per output.
  CHECK(avg->Cost(attrs, in, out).flops == 6 * 49 + 6 * 9);
  const OpDef* max = OpRegistry::Global().GetOp("MaxPool2d").value();
  AttrMap max_attrs{{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}};
  LOOM_CHECK_OK(CanonicalizeAttrs(*max, &max_attrs));
  auto max_out = max->InferTypes(max_attrs, in).value();
  CHECK(max->Cost(max_attrs, in, max_out).flops == 6 * 49);
}

// Runs a CPU kernel directly (for values the harness cannot compare), on
// the attributes as a node would hold them.
void RunKernel(const std::string& op, AttrMap attrs, std::vector<const Tensor*> in, std::vector<Tensor*> out) {
  REQUIRE(CanonicalizeAttrs(*OpRegistry::Global().GetOp(op).value(), &attrs).ok());
  KernelContext ctx;
  ctx.attrs = &attrs;
  ctx.inputs = std::move(in);
  ctx.outputs = std::move(out);
  const KernelFn* kernel = OpRegistry::Global().FindKernel(op, DeviceType::kCpu);
  REQUIRE(kernel != nullptr);
  Status s = (*kernel)(ctx);
  INFO(s.ToString());
  REQUIRE(s.ok());
}

// As in PyTorch, a NaN in a window is its maximum (so NaNs propagate).
TEST_CASE("max pool propagates NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  AttrMap attrs{{"kernel", int64_t{2}}};
  Tensor x = Tensor::FromVector<float>({1, 1, 2, 4}, {1, nan, 3, 0, 2, 4, 5, -1});
  Tensor y = Tensor::Zeros({1, 1, 1, 2}), idx = Tensor::Zeros({1, 1, 1, 2}, DType::kI64);
  RunKernel("MaxPool2d", attrs, {&x}, {&y, &idx});
  CHECK(std::isnan(y.ScalarAt(0)));
  CHECK(idx.ScalarAt(0) == 1);
  CHECK(y.ScalarAt(1) == 5);
  CHECK(idx.ScalarAt(1) == 6);
}

// A window that dilation leaves with no input element gives -inf and index
// -1 (and no gradient), rather than reading outside the plane. (Not a
// harness case: -inf does not compare or differentiate.)
TEST_CASE("max pool window with no input element") {
  // Width 2, kernel 2, dilation 3, padding 1: the one window's taps are at
  // -1 and 2, both outside.
  AttrMap attrs{{"kernel", Ints{1, 2}}, {"padding", Ints{0, 1}}, {"dilation", Ints{1, 3}}, {"stride", int64_t{1}}};
  auto types = Infer("MaxPool2d", attrs, {F32({1, 2, 3, 2})});
  REQUIRE(types.ok());
  REQUIRE(types->at(0).shape == Shape({1, 2, 3, 1}));
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 2}, std::vector<float>(12, 1.0f));
  Tensor y = Tensor::Zeros({1, 2, 3, 1}), idx = Tensor::Zeros({1, 2, 3, 1}, DType::kI64);
  RunKernel("MaxPool2d", attrs, {&x}, {&y, &idx});
  for (int64_t i = 0; i < 6; ++i) {
    CHECK(y.ScalarAt(i) == -std::numeric_limits<double>::infinity());
    CHECK(idx.ScalarAt(i) == -1);
  }
  AttrMap back = attrs;
  back.Set("input_shape", Ints{1, 2, 3, 2});
  Tensor dy = Tensor::FromVector<float>({1, 2, 3, 1}, std::vector<float>(6, 1.0f));
  Tensor dx = Tensor::FromVector<float>({1, 2, 3, 2}, std::vector<float>(12, 7.0f));
  RunKernel("MaxPool2dBackward", back, {&dy, &idx}, {&dx});
  for (int64_t i = 0; i < 12; ++i) CHECK(dx.ScalarAt(i) == 0.0);
}

}  // namespace
}  // namespace loom::testing
