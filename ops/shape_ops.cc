// Data-movement ops: Transpose (alias Permute), Flatten, Concat, Split, Slice
// and SliceBackward. They only move elements, so their kernels work for every
// dtype (dispatched on the element size) and their Cost has no FLOPs.
//
// Conventions:
//   Transpose(x) attrs perm (int list, a permutation of x's axes; negative
//     entries count from the end; absent or empty reverses the axes, numpy's
//     default): y.shape[i] = x.shape[perm[i]].  "Permute" is the same op.
//   Flatten(x) attrs start_dim (default 1), end_dim (default -1): PyTorch's
//     torch.flatten; a rank-0 input becomes [1].
//   Concat(x0, ..., xn) attr axis (default 0): all inputs share dtype, rank
//     and every extent except `axis`.
//   Split(x) attrs axis (default 0), sizes (int list, required, summing to
//     x.shape[axis]): one output per entry of sizes.
//   Slice(x) attrs axis (default 0), start (default 0), end (default: the
//     extent), step (default 1, must be positive): Python's x[start:end:step]
//     along `axis`, negative start/end counting from the end, clamped.
//   SliceBackward(dy) attrs of the Slice plus shape (the Slice's input
//     shape): scatters dy into zeros of that shape.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/op.h"
#include "ops/shape_geometry.h"
#include "ops/transpose8.h"

namespace loom {
namespace {

// Calls fn(U{}) with an unsigned integer type of the dtype's size: these
// kernels copy elements without looking at them.
template <typename Fn>
Status DispatchBytes(DType dtype, Fn&& fn) {
  switch (DTypeSize(dtype)) {
    case 1: fn(uint8_t{}); return Status::Ok();
    case 2: fn(uint16_t{}); return Status::Ok();
    case 4: fn(uint32_t{}); return Status::Ok();
    case 8: fn(uint64_t{}); return Status::Ok();
    default: return Unimplemented("no CPU copy kernel for dtype ", DTypeName(dtype));
  }
}

using shape_ops::AxisSplit;
using shape_ops::MergePermutedDims;
using shape_ops::PermutedDims;
using shape_ops::Product;
using shape_ops::ResolveAxis;
using shape_ops::ResolvePerm;
using shape_ops::ResolveSlice;
using shape_ops::SliceRange;
using shape_ops::SplitAt;

// Which slabs (inner-sized rows along the axis) of one side of a copy are used:
// slab indices start, start + step, ... within `len` slabs per outer index.
struct SlabRange {
  int64_t len, start, step;
};

// For each outer index o and i < count:
//   dst[o, dst.start + i * dst.step, :] = src[o, src.start + i * src.step, :]
// with slabs of `inner` elements. Work is split over (o, i) pairs; runs of
// unit-step slabs are copied with one memcpy.
template <typename T>
void CopySlabs(const T* src, SlabRange s, T* dst, SlabRange d, int64_t outer, int64_t count, int64_t inner,
               ThreadPool* pool) {
  if (outer == 0 || count == 0 || inner == 0) return;
  const bool contiguous = s.step == 1 && d.step == 1;
  ParallelRange(pool, outer * count, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1;) {
      const int64_t o = u / count, i = u % count;
      const int64_t n = std::min(count - i, u1 - u);  // slabs left in this outer row
      const T* from = src + (o * s.len + s.start + i * s.step) * inner;
      T* to = dst + (o * d.len + d.start + i * d.step) * inner;
      if (contiguous) {
        std::memcpy(to, from, static_cast<size_t>(n * inner) * sizeof(T));
      } else if (inner == 1) {
        for (int64_t k = 0; k < n; ++k) to[k * d.step] = from[k * s.step];
      } else {
        for (int64_t k = 0; k < n; ++k) std::memcpy(to + k * d.step * inner, from + k * s.step * inner, inner * sizeof(T));
      }
      u += n;
    }
  }, std::max<int64_t>(1, 32768 / inner));
}

Status CopyKernel(KernelContext& ctx) {
  if (ctx.in(0).nbytes() > 0) std::memcpy(ctx.out(0).raw_data(), ctx.in(0).raw_data(), ctx.in(0).nbytes());
  return Status::Ok();
}

// ---------------------------------------------------------------- Transpose

class TransposeOp : public OpDef {
 public:
  explicit TransposeOp(const char* name) : name_(name) {
    DeclareAttrs().Default("perm", std::vector<int64_t>{}, "output dim i is input dim perm[i]; empty: reversed");
  }
  std::string name() const override { return name_; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, name_));
    LOOM_ASSIGN_OR_RETURN(std::vector<int> perm, ResolvePerm(name_, attrs, in[0].shape));
    std::vector<int64_t> dims(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) dims[i] = in[0].shape[perm[i]];
    return std::vector<TensorType>{{Shape(dims), in[0].dtype}};
  }
  // Any output axis i, reading input axis perm[i].
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>&) const override {
    SplitRules rules;
    auto perm = ResolvePerm(name_, attrs, in[0].shape);
    if (!perm.ok()) return rules;
    for (size_t i = 0; i < perm->size(); ++i) {
      DimSplit d = SplitAlong(static_cast<int>(i), 1, 1);
      d.inputs[0].axis = (*perm)[i];
      if (i == 0 && (*perm)[0] == 0) rules.sample = d;
      else rules.other.push_back(d);
    }
    return rules;
  }
  Status Gradient(GradBuilder& g) const override {
    std::vector<int> perm = ResolvePerm(name_, g.attrs(), g.type(g.input(0)).shape).value();
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
    g.SetInputGrad(0, g.Emit1("Transpose", {g.output_grad(0)}, AttrMap{{"perm", inverse}}));
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // The replica axis keeps its position; the permutation moves the rest.
  Status Fuse(FusionBuilder& f) const override {
    const FusedValue& x = f.input(0);
    const int rank = f.SingleShape(x).rank();
    std::vector<int64_t> perm = f.attrs().Ints("perm");
    if (perm.empty())
      for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
    const int k = x.axis();
    std::vector<int64_t> fused;
    for (int j = 0; j <= rank; ++j) {
      if (j == k) {
        fused.push_back(k);
        continue;
      }
      int64_t p = perm[j < k ? j : j - 1];
      if (p < 0) p += rank;
      fused.push_back(FusedAxis(static_cast<int>(p), k));
    }
    AttrMap attrs = f.attrs();
    attrs.Set("perm", fused);
    LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit(name_, {x}, attrs, f.name(), {ReplicaLayout::Axis(k)}));
    return f.MapOutputs(outs);
  }

 private:
  const char* name_;
};
LOOM_REGISTER_OP(TransposeOp, "Transpose");
LOOM_REGISTER_OP(TransposeOp, "Permute");

// Gathers y[i0, ..., ik] = x[i_perm...] by walking y in row-major order with
// x's strides permuted. Unit dims are dropped and output dims that stay
// adjacent in x are merged first, so e.g. [B, T, H, D] -> [B, H, T, D] walks
// D-long contiguous runs.
Status TransposeKernel(KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  if (x.numel() == 0) return Status::Ok();
  std::vector<int> perm = ResolvePerm("Transpose", *ctx.attrs, x.shape()).value();
  // Merged output dims and their strides in x.
  const PermutedDims merged = MergePermutedDims(x.shape(), perm);
  const std::vector<int64_t>& dims = merged.dims;
  const std::vector<int64_t>& strides = merged.strides;
  if (dims.size() <= 1) return CopyKernel(ctx);  // the element order is unchanged
  const Shape out(dims);
  const std::vector<int64_t> none(dims.size(), 0);
  const int64_t inner = dims.back(), rows = x.numel() / inner;
  const int rank = static_cast<int>(dims.size());
  if (strides[rank - 2] == 1) {
    // x's contiguous dim becomes the output's second-to-last, so each output
    // row reads its elements `step` apart, one cache line each, and the next
    // row the same lines again: the matrices [J, A] -> [A, J] go instead in
    // square tiles, whose lines stay in L1 between the rows that share them.
    const int64_t a_n = dims[rank - 2], j_n = dims[rank - 1], step = strides[rank - 1];
    const int64_t matrices = x.numel() / (a_n * j_n);
    constexpr int64_t kTile = 16;
    const int64_t a_tiles = (a_n + kTile - 1) / kTile, j_tiles = (j_n + kTile - 1) / kTile;
    const int64_t tiles = a_tiles * j_tiles;
    // Consecutive tiles step along the longer rows, x's (a) or the
    // output's (j), so that those are read or written in order: stepping
    // across rows 4 KiB or more apart instead left every line a cache and
    // TLB miss (PointNet's [16, 64, 1024] -> [16, 1024, 64], register tiles either
    // way: 0.72 -> 0.33 ms).
    const bool along_x_rows = step > j_n;
    auto matrix_offset = [&](int64_t m) {  // matrix m's first element in x
      int64_t offset = 0;
      for (int d = rank - 3; d >= 0; --d) {
        offset += (m % dims[d]) * strides[d];
        m /= dims[d];
      }
      return offset;
    };
    return DispatchBytes(x.dtype(), [&](auto zero) {
      using U = decltype(zero);
      const U* px = static_cast<const U*>(x.raw_data());
      U* py = static_cast<U*>(y.raw_data());
      ParallelRange(ctx.pool, matrices * tiles, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t m = t / tiles, u = t % tiles;
          const int64_t a0 = (along_x_rows ? u % a_tiles : u / j_tiles) * kTile,
                        j0 = (along_x_rows ? u / a_tiles : u % j_tiles) * kTile;
          const U* src = px + matrix_offset(m);
          U* dst = py + m * a_n * j_n;
          const int64_t a1 = std::min(a_n, a0 + kTile), j1 = std::min(j_n, j0 + kTile);
#if defined(__AVX__)
          // A whole tile of 4-byte elements: four 8 x 8 transposes in
          // registers (its scalar loops read one element per load).
          if constexpr (sizeof(U) == 4) {
            if (a1 - a0 == kTile && j1 - j0 == kTile) {
              for (int64_t a = a0; a < a1; a += 8)
                for (int64_t j = j0; j < j1; j += 8)
                  Transpose8x8(reinterpret_cast<const float*>(src + j * step + a), step,
                               reinterpret_cast<float*>(dst + a * j_n + j), j_n, nullptr);
              continue;
            }
          }
#endif
          for (int64_t a = a0; a < a1; ++a)
            for (int64_t j = j0; j < j1; ++j) dst[a * j_n + j] = src[j * step + a];
        }
      }, std::max<int64_t>(1, 32768 / (kTile * kTile)));
    });
  }
  return DispatchBytes(x.dtype(), [&](auto zero) {
    using U = decltype(zero);
    const U* px = static_cast<const U*>(x.raw_data());
    U* py = static_cast<U*>(y.raw_data());
    ParallelRange(ctx.pool, rows, [&](int64_t r0, int64_t r1) {
      ForEachBroadcast(out, strides, none, r0, r1, [&](int64_t o, int64_t i, int64_t, int64_t len, int64_t step, int64_t) {
        for (int64_t j = 0; j < len; ++j) py[o + j] = px[i + j * step];
      });
    }, std::max<int64_t>(1, 32768 / inner));
  });
}
LOOM_REGISTER_KERNEL("Transpose", DeviceType::kCpu, TransposeKernel);
LOOM_REGISTER_KERNEL("Permute", DeviceType::kCpu, TransposeKernel);

// ------------------------------------------------------------------ Flatten

class FlattenOp : public OpDef {
 public:
  FlattenOp() {
    DeclareAttrs()
        .Default("start_dim", int64_t{1}, "first dim merged (negative: from the end)")
        .Default("end_dim", int64_t{-1}, "last dim merged (negative: from the end)");
  }
  std::string name() const override { return "Flatten"; }
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return ViewSplits(in[0], out[0]);
  }
  bool IsView() const override { return true; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "Flatten"));
    const Shape& x = in[0].shape;
    // PyTorch treats a scalar as rank 1 here: start/end may be 0 or -1.
    const Shape as_rank1 = x.rank() == 0 ? Shape({1}) : x;
    LOOM_ASSIGN_OR_RETURN(int start, ResolveAxis("Flatten", "start_dim", attrs.Int("start_dim"), as_rank1));
    LOOM_ASSIGN_OR_RETURN(int end, ResolveAxis("Flatten", "end_dim", attrs.Int("end_dim"), as_rank1));
    if (start > end)
      return InvalidArgument("Flatten: start_dim ", attrs.Int("start_dim"), " comes after end_dim ",
                             attrs.Int("end_dim"), " for input of shape ", x.ToString());
    std::vector<int64_t> dims(as_rank1.dims().begin(), as_rank1.dims().begin() + start);
    dims.push_back(Product(as_rank1, start, end + 1));
    dims.insert(dims.end(), as_rank1.dims().begin() + end + 1, as_rank1.dims().end());
    return std::vector<TensorType>{{Shape(dims), in[0].dtype}};
  }
  Status Gradient(GradBuilder& g) const override {
    g.SetInputGrad(0, g.Emit1("Reshape", {g.output_grad(0)}, AttrMap{{"shape", g.type(g.input(0)).shape.dims()}}));
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  Status Fuse(FusionBuilder& f) const override { return f.AsReshape(); }
};
LOOM_REGISTER_OP(FlattenOp);
LOOM_REGISTER_KERNEL("Flatten", DeviceType::kCpu, CopyKernel);
// Shape ops move elements of any size (DispatchBytes): every dtype.
LOOM_REGISTER_KERNEL_SUPPORT("Transpose", DeviceType::kCpu, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Permute", DeviceType::kCpu, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Flatten", DeviceType::kCpu, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Concat", DeviceType::kCpu, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Split", DeviceType::kCpu, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Slice", DeviceType::kCpu, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("SliceBackward", DeviceType::kCpu, AnyDTypeSupport());

// ------------------------------------------------------------ Concat, Split

class ConcatOp : public OpDef {
 public:
  ConcatOp() { DeclareAttrs().Default("axis", int64_t{0}, "the dim joined along (negative: from the end)"); }
  std::string name() const override { return "Concat"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (in.empty()) return InvalidArgument("Concat takes at least one input, got none");
    const Shape& first = in[0].shape;
    LOOM_ASSIGN_OR_RETURN(int axis, ResolveAxis("Concat", "axis", attrs.Int("axis"), first));
    std::vector<int64_t> dims = first.dims();
    dims[axis] = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const Shape& s = in[i].shape;
      if (in[i].dtype != in[0].dtype)
        return InvalidArgument("Concat: input ", i, " is ", DTypeName(in[i].dtype), " but input 0 is ",
                               DTypeName(in[0].dtype));
      bool match = s.rank() == first.rank();
      for (int d = 0; match && d < s.rank(); ++d) match = d == axis || s[d] == first[d];
      if (!match)
        return InvalidArgument("Concat: input ", i, " has shape ", s.ToString(), " but input 0 has ", first.ToString(),
                               "; all extents except axis ", axis, " must match");
      dims[axis] += s[axis];
    }
    return std::vector<TensorType>{{Shape(dims), in[0].dtype}};
  }
  // Along any axis but the joined one, the inputs and the output alike.
  // And k equal chunks joined along the axis split k ways along it, part j
  // reading input j alone: the chunks stay where they were made (an LSTM's
  // sequence parts). A follower takes it only then (graph/task_graph.cc).
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    const StatusOr<int> axis = NormalizeAxis(attrs.Int("axis"), out[0].shape.rank());
    if (!axis.ok()) return {};
    SplitRules rules = AllAxesBut(in, out, *axis);
    if (in.size() < 2) return rules;
    for (const TensorType& t : in)
      if (t.shape[*axis] != in[0].shape[*axis]) return rules;
    DimSplit chunks = SplitAlong(-1, in.size(), 1);
    chunks.outputs[0].axis = *axis;
    for (size_t j = 0; j < in.size(); ++j) chunks.inputs[j].part = static_cast<int64_t>(j);
    rules.other.push_back(std::move(chunks));
    return rules;
  }
  // One Split of dy hands every input its part in a single pass.
  Status Gradient(GradBuilder& g) const override {
    const int n = static_cast<int>(g.node().inputs.size());
    const int axis = NormalizeAxis(g.attrs().Int("axis"), g.type(g.input(0)).shape.rank()).value();
    std::vector<int64_t> sizes(n);
    for (int i = 0; i < n; ++i) sizes[i] = g.type(g.input(i)).shape[axis];
    std::vector<ValueId> parts =
        g.Emit("Split", {g.output_grad(0)}, AttrMap{{"axis", int64_t{axis}}, {"sizes", sizes}});
    for (int i = 0; i < n; ++i) g.SetInputGrad(i, parts[i]);
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // Every input with the replica axis where the first replicated one has it
  // (shared ones broadcast); the concat axis shifts past it.
  Status Fuse(FusionBuilder& f) const override {
    int k = -1;
    for (int i = 0; i < f.num_inputs() && k < 0; ++i)
      if (f.input(i).replicated()) k = f.input(i).axis();
    LOOM_ASSIGN_OR_RETURN(int axis, NormalizeAxis(f.attrs().Int("axis"), f.SingleShape(f.input(0)).rank()));
    std::vector<FusedValue> ins;
    for (int i = 0; i < f.num_inputs(); ++i) {
      LOOM_ASSIGN_OR_RETURN(FusedValue v, f.Replicated(f.input(i), k, f.name() + "/in" + std::to_string(i)));
      ins.push_back(v);
    }
    AttrMap attrs = f.attrs();
    attrs.Set("axis", static_cast<int64_t>(FusedAxis(axis, k)));
    LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit("Concat", ins, attrs, f.name(), {ReplicaLayout::Axis(k)}));
    return f.MapOutputs(outs);
  }
};
LOOM_REGISTER_OP(ConcatOp);

LOOM_REGISTER_KERNEL("Concat", DeviceType::kCpu, [](KernelContext& ctx) {
  Tensor& y = ctx.out(0);
  const int axis = NormalizeAxis(ctx.attrs->Int("axis"), y.shape().rank()).value();
  const AxisSplit ys = SplitAt(y.shape(), axis);
  return DispatchBytes(y.dtype(), [&](auto zero) {
    using U = decltype(zero);
    int64_t offset = 0;
    for (const Tensor* x : ctx.inputs) {
      const int64_t len = x->shape()[axis];
      CopySlabs(static_cast<const U*>(x->raw_data()), {len, 0, 1}, static_cast<U*>(y.raw_data()), {ys.len, offset, 1},
                ys.outer, len, ys.inner, ctx.pool);
      offset += len;
    }
  });
});

class SplitOp : public OpDef {
 public:
  SplitOp() {
    DeclareAttrs()
        .Default("axis", int64_t{0}, "the dim split (negative: from the end)")
        .Required("sizes", AttrType::kInts, "the extent of each output along axis");
  }
  std::string name() const override { return "Split"; }
  // Along any axis but the one it splits: the input and every output alike.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    const StatusOr<int> axis = NormalizeAxis(attrs.Int("axis"), in[0].shape.rank());
    if (!axis.ok()) return rules;
    for (int a = 0; a < in[0].shape.rank(); ++a) {
      if (a == *axis) continue;
      if (a == 0) rules.sample = SplitAlong(a, in.size(), out.size());
      else rules.other.push_back(SplitAlong(a, in.size(), out.size()));
    }
    return rules;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "Split"));
    const Shape& x = in[0].shape;
    LOOM_ASSIGN_OR_RETURN(int axis, ResolveAxis("Split", "axis", attrs.Int("axis"), x));
    const std::vector<int64_t> sizes = attrs.Ints("sizes");
    if (sizes.empty()) return InvalidArgument("Split: attribute 'sizes' is empty");
    int64_t total = 0;
    for (int64_t s : sizes) {
      if (s < 0) return InvalidArgument("Split: attribute 'sizes' ", Shape(sizes).ToString(), " has a negative entry");
      total += s;
    }
    if (total != x[axis])
      return InvalidArgument("Split: sizes ", Shape(sizes).ToString(), " sum to ", total, " but axis ", axis,
                             " of input ", x.ToString(), " has extent ", x[axis]);
    std::vector<TensorType> out;
    for (int64_t s : sizes) {
      std::vector<int64_t> dims = x.dims();
      dims[axis] = s;
      out.push_back({Shape(dims), in[0].dtype});
    }
    return out;
  }
  // Concat of the output gradients; outputs nothing flowed into count as zeros.
  Status Gradient(GradBuilder& g) const override {
    std::vector<ValueId> parts;
    for (size_t i = 0; i < g.node().outputs.size(); ++i) {
      ValueId dy = g.output_grad(static_cast<int>(i));
      if (dy == kNoValue) {
        const TensorType& t = g.type(g.output(static_cast<int>(i)));
        dy = g.Emit1("Fill", {},
                     AttrMap{{"shape", t.shape.dims()}, {"value", 0.0}, {"dtype", std::string(DTypeName(t.dtype))}});
      }
      parts.push_back(dy);
    }
    g.SetInputGrad(0, g.Emit1("Concat", parts, AttrMap{{"axis", g.attrs().Int("axis")}}));
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  Status Fuse(FusionBuilder& f) const override { return f.AlongAxis("axis"); }
};
LOOM_REGISTER_OP(SplitOp);

LOOM_REGISTER_KERNEL("Split", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  const int axis = NormalizeAxis(ctx.attrs->Int("axis"), x.shape().rank()).value();
  const AxisSplit xs = SplitAt(x.shape(), axis);
  return DispatchBytes(x.dtype(), [&](auto zero) {
    using U = decltype(zero);
    int64_t offset = 0;
    for (Tensor* y : ctx.outputs) {
      const int64_t len = y->shape()[axis];
      CopySlabs(static_cast<const U*>(x.raw_data()), {xs.len, offset, 1}, static_cast<U*>(y->raw_data()), {len, 0, 1},
                xs.outer, len, xs.inner, ctx.pool);
      offset += len;
    }
  });
});

// -------------------------------------------------------- Slice (+backward)

// Slice's attributes; SliceBackward takes them too.
AttrSchema& DeclareSliceAttrs(AttrSchema& s) {
  return s.Default("axis", int64_t{0}, "the dim sliced (negative: from the end)")
      .Default("start", int64_t{0}, "first index (negative: from the end; clamped)")
      .Default("end", std::numeric_limits<int64_t>::max(), "one past the last index (negative: from the end; clamped)")
      .Default("step", int64_t{1}, "stride between indices, positive");
}

Shape SlicedShape(const Shape& x, const SliceRange& r) {
  std::vector<int64_t> dims = x.dims();
  dims[r.axis] = r.count;
  return Shape(dims);
}

// Slice and SliceBackward split along every axis but the sliced one.
SplitRules AlongUnsliced(const std::string& op, const AttrMap& attrs, const Shape& whole) {
  SplitRules rules;
  StatusOr<SliceRange> r = ResolveSlice(op, attrs, whole);
  if (!r.ok()) return rules;
  for (int a = 0; a < whole.rank(); ++a) {
    if (a == r->axis || whole[a] < 2) continue;
    if (a == 0) rules.sample = SplitAlong(a, 1, 1);
    else rules.other.push_back(SplitAlong(a, 1, 1));
  }
  return rules;
}

class SliceOp : public OpDef {
 public:
  SliceOp() { DeclareSliceAttrs(DeclareAttrs()); }
  std::string name() const override { return "Slice"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "Slice"));
    LOOM_ASSIGN_OR_RETURN(SliceRange r, ResolveSlice("Slice", attrs, in[0].shape));
    return std::vector<TensorType>{{SlicedShape(in[0].shape, r), in[0].dtype}};
  }
  // Reads only the selected elements.
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.bytes_read = c.bytes_written;
    return c;
  }
  // A contiguous range (step 1) is all it reads; a part given only that
  // range slices it from its first row.
  std::optional<std::vector<Region>> WholeReads(const AttrMap& attrs, const std::vector<TensorType>& in,
                                                const std::vector<TensorType>&) const override {
    StatusOr<SliceRange> r = ResolveSlice("Slice", attrs, in[0].shape);
    if (!r.ok() || r->step != 1 || r->count == 0) return std::nullopt;
    Region range = Region::Whole(in[0].shape);
    range.lo[r->axis] = r->start;
    range.hi[r->axis] = r->start + r->count;
    return std::vector<Region>{range};
  }
  // Along any other axis than the sliced one (sample: axis 0 when it is
  // not the sliced one).
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>&) const override {
    return AlongUnsliced("Slice", attrs, in[0].shape);
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    LOOM_ASSIGN_OR_RETURN(SliceRange r, ResolveSlice("Slice", attrs, in[0].shape));
    const Region& held = in_regions[0];
    if (r.step != 1 || held.lo[r.axis] > r.start || held.hi[r.axis] < r.start + r.count)
      return InvalidArgument("Slice: rows ", held.ToString(), " do not hold the range of ", r.count, " from ", r.start);
    AttrMap part = attrs;
    part.Set("axis", static_cast<int64_t>(r.axis));
    part.Set("start", r.start - held.lo[r.axis]);
    part.Set("end", r.start - held.lo[r.axis] + r.count);
    return part;
  }
  Status Gradient(GradBuilder& g) const override {
    AttrMap attrs = g.attrs();
    attrs.Set("shape", g.type(g.input(0)).shape.dims());
    g.SetInputGrad(0, g.Emit1("SliceBackward", {g.output_grad(0)}, attrs));
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  Status Fuse(FusionBuilder& f) const override { return f.AlongAxis("axis"); }
};
LOOM_REGISTER_OP(SliceOp);

LOOM_REGISTER_KERNEL("Slice", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  SliceRange r = ResolveSlice("Slice", *ctx.attrs, x.shape()).value();
  const AxisSplit xs = SplitAt(x.shape(), r.axis);
  return DispatchBytes(x.dtype(), [&](auto zero) {
    using U = decltype(zero);
    CopySlabs(static_cast<const U*>(x.raw_data()), {xs.len, r.start, r.step}, static_cast<U*>(ctx.out(0).raw_data()),
              {r.count, 0, 1}, xs.outer, r.count, xs.inner, ctx.pool);
  });
});

class SliceBackwardOp : public OpDef {
 public:
  SliceBackwardOp() { DeclareSliceAttrs(DeclareAttrs()).Required("shape", AttrType::kInts, "the Slice input's shape"); }
  std::string name() const override { return "SliceBackward"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "SliceBackward"));
    const Shape x(attrs.Ints("shape"));
    LOOM_ASSIGN_OR_RETURN(SliceRange r, ResolveSlice("SliceBackward", attrs, x));
    if (SlicedShape(x, r) != in[0].shape)
      return InvalidArgument("SliceBackward: gradient of shape ", in[0].shape.ToString(), " does not match the slice ",
                             SlicedShape(x, r).ToString(), " of ", x.ToString());
    return std::vector<TensorType>{{x, in[0].dtype}};
  }
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>&,
                    const std::vector<TensorType>& out) const override {
    return AlongUnsliced("SliceBackward", attrs, out[0].shape);
  }
  // A part's gradient has the part's shape.
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&, const std::vector<TensorType>&,
                              const std::vector<Region>&, const std::vector<Region>& out) const override {
    AttrMap part = attrs;
    part.Set("shape", out[0].shape().dims());
    return part;
  }
};
LOOM_REGISTER_OP(SliceBackwardOp);

LOOM_REGISTER_KERNEL("SliceBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  Tensor& dx = ctx.out(0);
  SliceRange r = ResolveSlice("SliceBackward", *ctx.attrs, dx.shape()).value();
  const AxisSplit xs = SplitAt(dx.shape(), r.axis);
  // All-zero bytes are zero in every dtype.
  if (dx.nbytes() > 0) std::memset(dx.raw_data(), 0, dx.nbytes());
  return DispatchBytes(dx.dtype(), [&](auto zero) {
    using U = decltype(zero);
    CopySlabs(static_cast<const U*>(ctx.in(0).raw_data()), {r.count, 0, 1}, static_cast<U*>(dx.raw_data()),
              {xs.len, r.start, r.step}, xs.outer, r.count, xs.inner, ctx.pool);
  });
});

}  // namespace
}  // namespace loom
