// Reductions (ReduceSum, ReduceMean, ReduceMax, with ReduceMaxBackward) and
// the softmax family (Softmax, LogSoftmax, with SoftmaxBackward and
// LogSoftmaxBackward).
//
// Conventions:
//   Reduce{Sum,Mean,Max}(x) attrs axes (int list, negative entries count from
//     the end; absent or empty = all axes), keepdims (bool, default false:
//     reduced axes are dropped; true: kept with extent 1). ReduceMean of an
//     empty reduction is NaN (0 / 0); ReduceMax rejects empty reductions.
//     ReduceMax propagates NaN; its gradient goes to the first maximum in
//     row-major order when there are ties.
//   ReduceMax(x) -> (y, index): index (i64, y's shape) is each maximum's
//     position among its reduction's elements, row-major over the reduced
//     axes: the first element equal to y (the first NaN when y is NaN).
//   ReduceMaxBackward(x, index, dy) attrs of the ReduceMax -> dx: dy at
//     each index, zeros elsewhere. x gives dx's shape and type only (it is
//     not read: finding each maximum again cost PointNet's backward a pass
//     over a 64 MiB x per layer).
//   Softmax(x), LogSoftmax(x) attr axis (default -1); computed as
//     exp(x - max) / sum and x - max - log(sum) so large inputs do not
//     overflow.
//   SoftmaxBackward(y, dy), LogSoftmaxBackward(y, dy) attr axis: y is the
//     forward output.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/inline_vector.h"
#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/op.h"
#include "ops/reduce_geometry.h"

// The f64 kernels' eight-lane vectors are 64 bytes; on a build without
// AVX-512, GCC notes that returning one changes the calling convention
// (-Wpsabi). The functions that return them are internal to this file, so
// no call crosses between code built with different flags.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace loom {
namespace {

// ---------------------------------------------------------------- reductions

// The reductions' attributes (ReduceMaxBackward takes ReduceMax's).
AttrSchema& DeclareReduceAttrs(AttrSchema& s) {
  return s.Default("axes", std::vector<int64_t>{}, "the dims reduced (negative: from the end); empty: all")
      .Default("keepdims", false, "keep each reduced dim with extent 1");
}

Shape ReducedShape(const Shape& x, const std::vector<bool>& mask, bool keepdims) {
  std::vector<int64_t> dims;
  for (int d = 0; d < x.rank(); ++d) {
    if (!mask[d]) dims.push_back(x[d]);
    else if (keepdims) dims.push_back(1);
  }
  return Shape(dims);
}

int64_t ReducedCount(const Shape& x, const std::vector<bool>& mask) {
  int64_t n = 1;
  for (int d = 0; d < x.rank(); ++d)
    if (mask[d]) n *= x[d];
  return n;
}

// The groups of ReduceGroupsOf (ops/reduce_geometry.h) with the CPU
// kernels' walks over them.
struct ReduceLayout : ReduceGroups {
  ReduceLayout(const Shape& x, const std::vector<bool>& mask) : ReduceGroups(ReduceGroupsOf(x, mask)) {}

  int64_t RowOffset(int64_t row) const { return StridedOffset(kept_dims, kept_strides, row); }
  // The offset of reduced index r from its row's start.
  int64_t ReducedOffset(int64_t r) const { return StridedOffset(red_dims, red_strides, r); }
  // The offset of row-major index i over `dims` with these strides.
  static int64_t StridedOffset(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, int64_t i) {
    int64_t offset = 0;
    for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
      offset += (i % dims[d]) * strides[d];
      i /= dims[d];
    }
    return offset;
  }

  // Visits reduced indices [r0, r1) of the row at `base` as runs along the
  // innermost reduced axis: fn(offset, n, stride) covers the inner vectors
  // at offset + k * stride, k < n. fn returns false to stop early.
  template <typename Fn>
  void ForRuns(int64_t base, int64_t r0, int64_t r1, Fn&& fn) const {
    if (r0 >= r1) return;
    const int outer_rank = static_cast<int>(red_dims.size()) - 1;
    const int64_t last = red_dims.back(), last_stride = red_strides.back();
    InlineVector<int64_t, 8> idx(static_cast<size_t>(outer_rank), 0);
    int64_t q = r0 / last, k = r0 % last;
    for (int d = outer_rank - 1; d >= 0; --d) {
      idx[d] = q % red_dims[d];
      q /= red_dims[d];
    }
    for (int64_t r = r0; r < r1;) {
      int64_t offset = base + k * last_stride;
      for (int d = 0; d < outer_rank; ++d) offset += idx[d] * red_strides[d];
      const int64_t n = std::min(last - k, r1 - r);
      if (!fn(offset, n, last_stride)) return;
      r += n;
      k = 0;
      for (int d = outer_rank - 1; d >= 0; --d) {
        if (++idx[d] < red_dims[d]) break;
        idx[d] = 0;
      }
    }
  }
};

enum class ReduceKind { kSum, kMean, kMax };

// NaN wins, so a NaN anywhere in the reduction shows in the result.
template <typename T>
T MaxStep(T a, T v) {
  return (v > a || v != v) ? v : a;
}

// Whether v is the maximum m (NaN matches NaN).
template <typename T>
bool IsMax(T v, T m) {
  return v == m || (v != v && m != m);
}

// MaxStep folded over p[0, n) from a, in 2 x kSumLanes independent lanes
// (a running maximum is a chain of dependent compares, which neither
// vectorises nor pipelines). The maximum of a set is the same in any
// order; only which of equal zeros (-0, +0) and which NaN comes out can
// differ from a fold in order, and that is a function of n alone.
template <typename T>
T MaxOfRun(const T* p, int64_t n, T a) {
  typedef T Lanes __attribute__((vector_size(kSumLanes * sizeof(T))));
  typedef T Unaligned __attribute__((vector_size(kSumLanes * sizeof(T)), aligned(alignof(T)), may_alias));
  auto load = [](const T* q) { return Lanes(*reinterpret_cast<const Unaligned*>(q)); };
  int64_t i = 0;
  if (n >= 2 * kSumLanes) {
    Lanes m0 = load(p), m1 = load(p + kSumLanes);
    auto nan = (m0 != m0) | (m1 != m1);
    for (i = 2 * kSumLanes; i + 2 * kSumLanes <= n; i += 2 * kSumLanes) {
      const Lanes v0 = load(p + i), v1 = load(p + i + kSumLanes);
      m0 = v0 > m0 ? v0 : m0;
      m1 = v1 > m1 ? v1 : m1;
      nan |= (v0 != v0) | (v1 != v1);
    }
    for (int l = 0; l < kSumLanes; ++l) {
      a = MaxStep(MaxStep(a, m0[l]), m1[l]);
      if (nan[l]) a = std::numeric_limits<T>::quiet_NaN();
    }
  }
  for (; i < n; ++i) a = MaxStep(a, p[i]);
  return a;
}

// The first k < n with IsMax(p[k], m), or n: blocks of four vectors of
// kSumLanes elements compared at a time, then the block that holds it one
// by one. (The test whether any lane hit is a chain of lane extracts, as
// long as the compares themselves, so it is asked once per four vectors:
// PointNet's ReduceMaxBackward 1.2-1.3x faster, docs/benchmarks.md.)
template <typename T>
int64_t FirstMax(const T* p, int64_t n, T m) {
  typedef T Lanes __attribute__((vector_size(kSumLanes * sizeof(T))));
  typedef T Unaligned __attribute__((vector_size(kSumLanes * sizeof(T)), aligned(alignof(T)), may_alias));
  constexpr int64_t kBlock = 4 * kSumLanes;
  const bool nan = m != m;
  const Lanes mv = Lanes{} + m;
  auto hits = [&](int64_t at) {
    const Lanes v = *reinterpret_cast<const Unaligned*>(p + at);
    return nan ? (v != v) : (v == mv);
  };
  int64_t k = 0;
  for (; k + kBlock <= n; k += kBlock) {
    const auto hit = hits(k) | hits(k + kSumLanes) | hits(k + 2 * kSumLanes) | hits(k + 3 * kSumLanes);
    bool any = false;
    for (int l = 0; l < kSumLanes; ++l) any |= hit[l] != 0;
    if (any) break;
  }
  while (k < n && !IsMax(p[k], m)) ++k;
  return k;
}

// Folds reduced indices [r0, r1) of `row` into acc[0, inner) with step(acc,
// x); `run(p, n, a)`, where given, folds n contiguous elements into a as
// step would.
template <typename T, typename Acc, typename Step, typename Run = std::nullptr_t>
void FoldRange(const ReduceLayout& L, const T* x, int64_t row, int64_t r0, int64_t r1, Acc* acc, Step step,
               Run run = nullptr) {
  L.ForRuns(L.RowOffset(row), r0, r1, [&](int64_t offset, int64_t n, int64_t stride) {
    if constexpr (!std::is_same_v<Run, std::nullptr_t>) {
      if (L.inner == 1 && stride == 1) {
        acc[0] = run(x + offset, n, acc[0]);
        return true;
      }
    }
    if (L.inner == 1) {
      Acc a = acc[0];
      for (int64_t k = 0; k < n; ++k) a = step(a, x[offset + k * stride]);
      acc[0] = a;
    } else {
      for (int64_t k = 0; k < n; ++k) {
        const T* p = x + offset + k * stride;
        for (int64_t j = 0; j < L.inner; ++j) acc[j] = step(acc[j], p[j]);
      }
    }
    return true;
  });
}

// Reduces x into y. Rows are spread over the pool; when there are few rows
// and long reductions, each row's reduction is cut into fixed blocks whose
// partial results are combined in order, so results do not depend on the
// number of threads.
constexpr int64_t kReduceBlockElems = 16384;
int64_t ReduceBlock(const ReduceLayout& L) { return std::max<int64_t>(1, kReduceBlockElems / L.inner); }
bool ReducesRowByRow(const ReduceLayout& L) { return L.rows >= 64 || L.reduced < 2 * ReduceBlock(L); }
// Whether each row's reduction is one contiguous run.
bool ContiguousRows(const ReduceLayout& L) {
  return L.inner == 1 && L.red_dims.size() == 1 && L.red_strides[0] == 1;
}

template <typename T, typename Acc, typename Step, typename Finish, typename Run = std::nullptr_t>
void Reduce(const ReduceLayout& L, const T* x, T* y, Acc init, Step step, Finish finish, ThreadPool* pool,
            Run run = nullptr) {
  const int64_t inner = L.inner;
  if (L.rows == 0 || inner == 0) return;
  const int64_t block = ReduceBlock(L);
  if (ReducesRowByRow(L)) {
    const int64_t work = std::max<int64_t>(1, L.reduced * inner);
    ParallelRange(pool, L.rows, [&](int64_t r0, int64_t r1) {
      std::vector<Acc> acc(inner);
      for (int64_t row = r0; row < r1; ++row) {
        std::fill(acc.begin(), acc.end(), init);
        FoldRange(L, x, row, 0, L.reduced, acc.data(), step, run);
        for (int64_t j = 0; j < inner; ++j) y[row * inner + j] = finish(acc[j]);
      }
    }, std::max<int64_t>(1, 32768 / work));
    return;
  }
  const int64_t blocks = (L.reduced + block - 1) / block;
  std::vector<Acc> partial(L.rows * blocks * inner, init);
  ParallelRange(pool, L.rows * blocks, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t row = u / blocks, b = u % blocks;
      FoldRange(L, x, row, b * block, std::min(L.reduced, (b + 1) * block), &partial[u * inner], step, run);
    }
  }, 1);
  for (int64_t row = 0; row < L.rows; ++row)
    for (int64_t j = 0; j < inner; ++j) {
      Acc acc = init;
      for (int64_t b = 0; b < blocks; ++b) acc = step(acc, partial[(row * blocks + b) * inner + j]);
      y[row * inner + j] = finish(acc);
    }
}

// A reduction, and ReduceMax's gradient, split along any axis it keeps
// (sample: axis 0 when kept): x's axis a is the output's a, or a less the
// reduced axes before it without keepdims. Inputs after x are shaped as
// the reduction's output (ReduceMaxBackward's index and dy); the outputs
// too (ReduceMax's y and index), or as x (`output_is_x`: ReduceMaxBackward's
// dx).
SplitRules AlongKeptAxes(const AttrMap& attrs, const Shape& x, size_t inputs, size_t outputs, bool output_is_x) {
  SplitRules rules;
  const StatusOr<std::vector<bool>> mask = ResolveReduceAxes("Reduce", attrs, x);
  if (!mask.ok()) return rules;
  const bool keepdims = attrs.Bool("keepdims");
  int reduced_before = 0;
  for (int a = 0; a < x.rank(); ++a) {
    if ((*mask)[static_cast<size_t>(a)]) {
      ++reduced_before;
      continue;
    }
    const int y_axis = keepdims ? a : a - reduced_before;
    DimSplit d = SplitAlong(y_axis, inputs, outputs);
    d.inputs[0].axis = a;
    if (output_is_x) d.outputs[0].axis = a;
    if (a == 0) rules.sample = std::move(d);
    else rules.other.push_back(std::move(d));
  }
  return rules;
}

class ReduceOp : public OpDef {
 public:
  ReduceOp(const char* name, ReduceKind kind) : name_(name), kind_(kind) { DeclareReduceAttrs(DeclareAttrs()); }
  std::string name() const override { return name_; }
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return AlongKeptAxes(attrs, in[0].shape, in.size(), out.size(), /*output_is_x=*/false);
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, name_));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], std::string(name_) + " input"));
    LOOM_ASSIGN_OR_RETURN(std::vector<bool> mask, ResolveReduceAxes(name_, attrs, in[0].shape));
    const Shape y = ReducedShape(in[0].shape, mask, attrs.Bool("keepdims"));
    if (kind_ != ReduceKind::kMax) return std::vector<TensorType>{{y, in[0].dtype}};
    if (ReducedCount(in[0].shape, mask) == 0)
      return InvalidArgument(name_, ": cannot take the maximum over an empty reduction (input ", in[0].shape.ToString(),
                             ", attribute 'axes' ", Shape(attrs.Ints("axes")).ToString(), ")");
    return std::vector<TensorType>{{y, in[0].dtype}, {y, DType::kI64}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    // One add (or compare) per input element; Mean divides each result once.
    c.flops = static_cast<double>(in[0].shape.numel());
    if (kind_ == ReduceKind::kMean) c.flops += static_cast<double>(out[0].shape.numel());
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    const ValueId x = g.input(0);
    const Shape& xs = g.type(x).shape;
    ValueId dy = g.output_grad(0);
    if (kind_ == ReduceKind::kMax) {
      g.SetInputGrad(0, g.Emit1("ReduceMaxBackward", {x, g.output(1), dy}, g.attrs()));
      return Status::Ok();
    }
    const std::vector<bool> mask = ResolveReduceAxes(name_, g.attrs(), xs).value();
    if (kind_ == ReduceKind::kMean) {
      const int64_t n = ReducedCount(xs, mask);
      dy = g.Emit1("MulScalar", {dy}, AttrMap{{"value", n > 0 ? 1.0 / static_cast<double>(n) : 0.0}});
    }
    // Put the reduced axes back as unit axes, then repeat dy along them.
    const Shape kept = ReducedShape(xs, mask, /*keepdims=*/true);
    if (g.type(dy).shape != kept) dy = g.Emit1("Reshape", {dy}, AttrMap{{"shape", kept.dims()}});
    if (kept != xs) dy = g.Emit1("BroadcastTo", {dy}, AttrMap{{"shape", xs.dims()}});
    g.SetInputGrad(0, dy);
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // Over the same axes, shifted past the replica axis, which is never
  // reduced: an empty axes list (all axes) is spelled out.
  Status Fuse(FusionBuilder& f) const override {
    const FusedValue& x = f.input(0);
    const int rank = f.SingleShape(x).rank();
    const int k = x.axis();
    std::vector<int64_t> axes = f.attrs().Ints("axes");
    if (axes.empty())
      for (int i = 0; i < rank; ++i) axes.push_back(i);
    std::vector<int64_t> fused;
    int before = 0;  // reduced axes before the replica axis
    for (int64_t a : axes) {
      LOOM_ASSIGN_OR_RETURN(int axis, NormalizeAxis(a, rank));
      fused.push_back(FusedAxis(axis, k));
      before += axis < k ? 1 : 0;
    }
    // A reduction over no axis (of a scalar) is the identity; its empty axes
    // list would reduce the replica axis too. (ReduceMax's index is then 0,
    // made per replica: a shared index would be broadcast to them later.)
    if (fused.empty()) {
      LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit("Identity", {x}, AttrMap{}, f.name(), {x.layout}));
      if (kind_ == ReduceKind::kMax) {
        const AttrMap zero{
            {"shape", f.WithReplicaAxis(f.output_shape(1), 0).dims()}, {"dtype", "i64"}, {"value", 0.0}};
        LOOM_ASSIGN_OR_RETURN(auto index, f.Emit("Fill", {}, zero, f.name() + "/index", {ReplicaLayout::Axis(0)}));
        outs.push_back(index.at(0));
      }
      return f.MapOutputs(outs);
    }
    AttrMap attrs = f.attrs();
    attrs.Set("axes", fused);
    const ReplicaLayout layout = ReplicaLayout::Axis(f.attrs().Bool("keepdims") ? k : k - before);
    LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit(name_, {x}, attrs, f.name(), {layout}));
    return f.MapOutputs(outs);
  }

 private:
  const char* name_;
  ReduceKind kind_;
};
LOOM_REGISTER_OP(ReduceOp, "ReduceSum", ReduceKind::kSum);
LOOM_REGISTER_OP(ReduceOp, "ReduceMean", ReduceKind::kMean);
LOOM_REGISTER_OP(ReduceOp, "ReduceMax", ReduceKind::kMax);

// ReduceMax's outputs: y as Reduce makes it, and index[o] = the reduced
// index of output o's first element IsMax of y[o]. Contiguous rows reduced
// row by row (PointNet's max over points) take each row's maximum and then
// its index while the row is in cache, the same maximum as Reduce's; other
// layouts search in a second pass.
template <typename T>
void ReduceMaxWithIndex(const ReduceLayout& L, const T* x, T* y, int64_t* index, ThreadPool* pool) {
  if (L.rows == 0 || L.inner == 0) return;
  if (ContiguousRows(L) && ReducesRowByRow(L)) {
    ParallelRange(pool, L.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const T* p = x + L.RowOffset(row);
        y[row] = MaxOfRun(p, L.reduced, -std::numeric_limits<T>::infinity());
        index[row] = FirstMax(p, L.reduced, y[row]);
      }
    }, std::max<int64_t>(1, 32768 / L.reduced));
    return;
  }
  Reduce(L, x, y, -std::numeric_limits<T>::infinity(), [](T a, T v) { return MaxStep(a, v); }, [](T a) { return a; },
         pool, [](const T* p, int64_t n, T a) { return MaxOfRun(p, n, a); });
  ParallelRange(pool, L.rows, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const T* m = y + row * L.inner;
      int64_t* at = index + row * L.inner;
      std::fill(at, at + L.inner, L.reduced);  // none yet (a maximum is always found)
      int64_t left = L.inner, r = 0;
      L.ForRuns(L.RowOffset(row), 0, L.reduced, [&](int64_t offset, int64_t n, int64_t stride) {
        for (int64_t k = 0; k < n && left > 0; ++k) {
          const T* p = x + offset + k * stride;
          for (int64_t j = 0; j < L.inner; ++j)
            if (at[j] == L.reduced && IsMax(p[j], m[j])) {
              at[j] = r + k;
              --left;
            }
        }
        r += n;
        return left > 0;
      });
    }
  }, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, L.reduced * L.inner)));
}

template <ReduceKind kKind>
Status ReduceKernel(KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  const std::vector<bool> mask = ResolveReduceAxes("Reduce", *ctx.attrs, x.shape()).value();
  const ReduceLayout layout(x.shape(), mask);
  return DispatchFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    T* py = ctx.out(0).data<T>();
    if constexpr (kKind == ReduceKind::kMax) {
      ReduceMaxWithIndex(layout, px, py, ctx.out(1).data<int64_t>(), ctx.pool);
    } else {
      // Sums accumulate in double: f32 sums over long axes lose digits otherwise.
      const double scale = kKind == ReduceKind::kMean ? 1.0 / static_cast<double>(layout.reduced) : 1.0;
      Reduce(layout, px, py, 0.0, [](double a, auto v) { return a + static_cast<double>(v); },
             [scale](double a) { return static_cast<T>(a * scale); }, ctx.pool);
    }
  });
}
LOOM_REGISTER_KERNEL("ReduceSum", DeviceType::kCpu, ReduceKernel<ReduceKind::kSum>);
LOOM_REGISTER_KERNEL("ReduceMean", DeviceType::kCpu, ReduceKernel<ReduceKind::kMean>);
LOOM_REGISTER_KERNEL("ReduceMax", DeviceType::kCpu, ReduceKernel<ReduceKind::kMax>);

// dx = dy at each reduction's maximum (ReduceMax's index), 0 elsewhere.
class ReduceMaxBackwardOp : public OpDef {
 public:
  ReduceMaxBackwardOp() { DeclareReduceAttrs(DeclareAttrs()); }
  std::string name() const override { return "ReduceMaxBackward"; }
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return AlongKeptAxes(attrs, in[0].shape, in.size(), out.size(), /*output_is_x=*/true);
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 3, "ReduceMaxBackward (x, index, dy)"));
    LOOM_ASSIGN_OR_RETURN(std::vector<TensorType> y, OpRegistry::Global().FindOp("ReduceMax")->InferTypes(attrs, {in[0]}));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[1], y[1], "ReduceMaxBackward: index must be ReduceMax(x)'s"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[2], y[0], "ReduceMaxBackward: dy must match ReduceMax(x)"));
    return std::vector<TensorType>{in[0]};
  }
  // dx is written whole; x is not read.
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.bytes_read -= static_cast<double>(in[0].shape.numel() * DTypeSize(in[0].dtype));
    c.flops = 0;
    return c;
  }
};
LOOM_REGISTER_OP(ReduceMaxBackwardOp);

LOOM_REGISTER_KERNEL("ReduceMaxBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  const std::vector<bool> mask = ResolveReduceAxes("ReduceMaxBackward", *ctx.attrs, x.shape()).value();
  const ReduceLayout L(x.shape(), mask);
  const int64_t* index = ctx.in(1).data<int64_t>();
  return DispatchFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pdy = ctx.in(2).data<T>();
    T* pdx = ctx.out(0).data<T>();
    // An index outside the reduction (none can come from ReduceMax) sends nothing.
    auto at = [&](int64_t o) { return index[o] >= 0 && index[o] < L.reduced; };
    if (ContiguousRows(L)) {
      // Each row's elements are one contiguous run, zeroed and set by the
      // thread that owns the row.
      ParallelRange(ctx.pool, L.rows, [&](int64_t r0, int64_t r1) {
        for (int64_t row = r0; row < r1; ++row) {
          T* dx = pdx + L.RowOffset(row);
          std::fill(dx, dx + L.reduced, T(0));
          if (at(row)) dx[index[row]] = pdy[row];
        }
      }, std::max<int64_t>(1, 32768 / L.reduced));
      return;
    }
    ParallelRange(ctx.pool, x.numel(), [&](int64_t i0, int64_t i1) { std::fill(pdx + i0, pdx + i1, T(0)); });
    ParallelRange(ctx.pool, L.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t base = L.RowOffset(row);
        for (int64_t j = 0; j < L.inner; ++j) {
          const int64_t o = row * L.inner + j;
          if (at(o)) pdx[base + L.ReducedOffset(index[o]) + j] = pdy[o];
        }
      }
    }, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, L.inner)));
  });
});

// ------------------------------------------------------------------ softmax

// Softmax's and its backward's one attribute.
AttrSchema& DeclareSoftmaxAttrs(AttrSchema& s) {
  return s.Default("axis", int64_t{-1}, "the dim normalized over (negative: from the end)");
}

// The softmax axis is walked for a block of up to kLanes neighbouring inner
// positions at once: with inner == 1 that is one row, otherwise the inner
// loops run over contiguous memory.
constexpr int64_t kLanes = 64;

// Calls fn(base, width) for every lane block: the block's elements for axis
// index c are base[c * inner + j], j < width.
template <typename Fn>
void ForEachLaneBlock(ThreadPool* pool, const AxisLayout& L, Fn&& fn) {
  if (L.outer == 0 || L.inner == 0) return;
  const int64_t width = std::min(L.inner, kLanes);
  const int64_t blocks = (L.inner + width - 1) / width;
  ParallelRange(pool, L.outer * blocks, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t o = u / blocks, j0 = (u % blocks) * width;
      fn(o * L.len * L.inner + j0, std::min(width, L.inner - j0));
    }
  }, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, L.len * width)));
}

// A softmax and its gradient split along every axis but the one they
// normalise.
SplitRules SoftmaxSplits(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  const StatusOr<int> axis = NormalizeAxis(attrs.Int("axis"), in[0].shape.rank());
  return axis.ok() ? AllAxesBut(in, out, *axis) : SplitRules{};
}

template <bool kLog>
class SoftmaxOp : public OpDef {
 public:
  SoftmaxOp() { DeclareSoftmaxAttrs(this->DeclareAttrs()); }
  std::string name() const override { return kLog ? "LogSoftmax" : "Softmax"; }
  // Along any axis but the normalised one.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return SoftmaxSplits(attrs, in, out);
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, name()));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], name() + " input"));
    LOOM_RETURN_IF_ERROR(ResolveSoftmaxAxis(name(), attrs, in[0].shape).status());
    return in;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    // Per element: max, subtract, exp, sum, then scale (or subtract log-sum).
    c.flops = 5.0 * static_cast<double>(in[0].shape.numel());
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    g.SetInputGrad(0, g.Emit1(kLog ? "LogSoftmaxBackward" : "SoftmaxBackward", {g.output(0), g.output_grad(0)},
                              AttrMap{{"axis", g.attrs().Int("axis")}}));
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  Status Fuse(FusionBuilder& f) const override { return f.AlongAxis("axis"); }
};
LOOM_REGISTER_OP(SoftmaxOp<false>);
LOOM_REGISTER_OP(SoftmaxOp<true>);

template <bool kLog>
Status SoftmaxKernel(KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  const AxisLayout L = ResolveSoftmaxAxis("Softmax", *ctx.attrs, x.shape()).value();
  return DispatchFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    T* py = ctx.out(0).data<T>();
    ForEachLaneBlock(ctx.pool, L, [&](int64_t base, int64_t w) {
      std::array<T, kLanes> m;
      std::array<double, kLanes> s{};
      m.fill(-std::numeric_limits<T>::infinity());
      for (int64_t c = 0; c < L.len; ++c) {
        const T* xr = px + base + c * L.inner;
        for (int64_t j = 0; j < w; ++j) m[j] = std::max(m[j], xr[j]);
      }
      for (int64_t c = 0; c < L.len; ++c) {
        const T* xr = px + base + c * L.inner;
        T* yr = py + base + c * L.inner;
        for (int64_t j = 0; j < w; ++j) {
          const T e = std::exp(xr[j] - m[j]);
          if constexpr (!kLog) yr[j] = e;
          s[j] += e;
        }
      }
      if constexpr (kLog) {
        // (x - max) - log(sum), not x - (max + log(sum)): the shifted value
        // is small, so f32 keeps its digits when the inputs are large.
        std::array<T, kLanes> log_sum;
        for (int64_t j = 0; j < w; ++j) log_sum[j] = static_cast<T>(std::log(s[j]));
        for (int64_t c = 0; c < L.len; ++c) {
          const T* xr = px + base + c * L.inner;
          T* yr = py + base + c * L.inner;
          for (int64_t j = 0; j < w; ++j) yr[j] = (xr[j] - m[j]) - log_sum[j];
        }
      } else {
        std::array<T, kLanes> inv;
        for (int64_t j = 0; j < w; ++j) inv[j] = static_cast<T>(1.0 / s[j]);
        for (int64_t c = 0; c < L.len; ++c) {
          T* yr = py + base + c * L.inner;
          for (int64_t j = 0; j < w; ++j) yr[j] *= inv[j];
        }
      }
    });
  });
}
LOOM_REGISTER_KERNEL("Softmax", DeviceType::kCpu, SoftmaxKernel<false>);
LOOM_REGISTER_KERNEL("LogSoftmax", DeviceType::kCpu, SoftmaxKernel<true>);

// Softmax:    dx = y * (dy - sum(dy * y))
// LogSoftmax: dx = dy - exp(y) * sum(dy)
template <bool kLog>
class SoftmaxBackwardOp : public OpDef {
 public:
  SoftmaxBackwardOp() { DeclareSoftmaxAttrs(this->DeclareAttrs()); }
  std::string name() const override { return kLog ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return SoftmaxSplits(attrs, in, out);
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, name() + " (y, dy)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], name() + " y"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], name() + ": y and dy differ"));
    LOOM_RETURN_IF_ERROR(ResolveSoftmaxAxis(name(), attrs, in[0].shape).status());
    return std::vector<TensorType>{in[0]};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 4.0 * static_cast<double>(in[0].shape.numel());  // product/exp, sum, subtract, multiply
    return c;
  }
};
LOOM_REGISTER_OP(SoftmaxBackwardOp<false>);
LOOM_REGISTER_OP(SoftmaxBackwardOp<true>);

template <bool kLog>
Status SoftmaxBackwardKernel(KernelContext& ctx) {
  const Tensor& y = ctx.in(0);
  const AxisLayout L = ResolveSoftmaxAxis("SoftmaxBackward", *ctx.attrs, y.shape()).value();
  return DispatchFloat(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* py = y.data<T>();
    const T* pdy = ctx.in(1).data<T>();
    T* pdx = ctx.out(0).data<T>();
    ForEachLaneBlock(ctx.pool, L, [&](int64_t base, int64_t w) {
      std::array<double, kLanes> s{};
      for (int64_t c = 0; c < L.len; ++c) {
        const int64_t at = base + c * L.inner;
        for (int64_t j = 0; j < w; ++j) s[j] += kLog ? pdy[at + j] : pdy[at + j] * py[at + j];
      }
      for (int64_t c = 0; c < L.len; ++c) {
        const int64_t at = base + c * L.inner;
        for (int64_t j = 0; j < w; ++j) {
          const T sum = static_cast<T>(s[j]);
          if constexpr (kLog) pdx[at + j] = pdy[at + j] - std::exp(py[at + j]) * sum;
          else pdx[at + j] = py[at + j] * (pdy[at + j] - sum);
        }
      }
    });
  });
}
LOOM_REGISTER_KERNEL("SoftmaxBackward", DeviceType::kCpu, SoftmaxBackwardKernel<false>);
LOOM_REGISTER_KERNEL("LogSoftmaxBackward", DeviceType::kCpu, SoftmaxBackwardKernel<true>);

}  // namespace
}  // namespace loom
