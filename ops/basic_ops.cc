// Sources (Input, Parameter, Buffer), Fill, Identity, Reshape, SumToShape
// and the broadcasting binary ops Add, Sub, Mul, Div: the ops that gradient
// rules of every other family build on.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/op.h"

namespace loom {
namespace {

// The type of a source or Fill: its attributes shape and dtype.
AttrSchema& DeclareTypeAttrs(AttrSchema& s) {
  return s.Required("shape", AttrType::kInts, "the tensor's shape")
      .Default("dtype", "f32", "the tensor's dtype (f32, f64, i32, i64, bf16, f16, bool)");
}

StatusOr<TensorType> TypeFromAttrs(const AttrMap& attrs) {
  TensorType t;
  t.shape = Shape(attrs.Ints("shape"));
  for (int64_t d : t.shape.dims())
    if (d < 0) return InvalidArgument("negative extent in shape ", t.shape.ToString());
  LOOM_ASSIGN_OR_RETURN(t.dtype, ParseDType(attrs.Str("dtype")));
  return t;
}

// Input / Parameter / Buffer: the executor binds their tensors; no kernel.
class SourceOp : public OpDef {
 public:
  explicit SourceOp(const char* name) : name_(name) {
    AttrSchema& s = DeclareTypeAttrs(DeclareAttrs());
    if (std::string(name) == kInputOp) return;
    // State initializers (runtime/executor.cc reads them; absent values take
    // the defaults stated there, so that an initializer holds only what it uses).
    s.Optional("init", AttrType::kString, "zeros (when absent), ones, constant, normal, uniform or sinusoidal")
        .Optional("value", AttrType::kFloat, "init constant: the value")
        .Optional("mean", AttrType::kFloat, "init normal: the mean")
        .Optional("std", AttrType::kFloat, "init normal: the standard deviation")
        .Optional("low", AttrType::kFloat, "init uniform: the lower bound")
        .Optional("high", AttrType::kFloat, "init uniform: the upper bound")
        // Set by the fusion pass (graph/fusion.h) on stacked state.
        .Optional("replica_seeds", AttrType::kInts, "fused [R, ...] state: replica r is initialized from seed r");
  }
  std::string name() const override { return name_; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 0, name_));
    LOOM_ASSIGN_OR_RETURN(TensorType t, TypeFromAttrs(attrs));
    return std::vector<TensorType>{t};
  }
  OpCost Cost(const AttrMap&, const std::vector<TensorType>&, const std::vector<TensorType>&) const override {
    return {};
  }
  // The fusion pass stacks sources itself: state as [R, ...], inputs shared
  // or, when asked, [R, ...].
  FusionKind fusion_kind() const override { return FusionKind::kFused; }

 private:
  const char* name_;
};
LOOM_REGISTER_OP(SourceOp, kInputOp);
LOOM_REGISTER_OP(SourceOp, kParameterOp);
LOOM_REGISTER_OP(SourceOp, kBufferOp);

// Fill: a tensor of one value. attrs: shape, dtype, value.
class FillOp : public OpDef {
 public:
  FillOp() { DeclareTypeAttrs(DeclareAttrs()).Required("value", AttrType::kFloat, "every element's value"); }
  std::string name() const override { return "Fill"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 0, "Fill"));
    LOOM_ASSIGN_OR_RETURN(TensorType t, TypeFromAttrs(attrs));
    return std::vector<TensorType>{t};
  }
  // No inputs: its value is shared by all replicas, and the fusion pass
  // keeps it as it is (it never asks for its rule).
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
};
LOOM_REGISTER_OP(FillOp);
LOOM_REGISTER_KERNEL_SUPPORT("Fill", DeviceType::kCpu, AnyDTypeSupport());
LOOM_REGISTER_KERNEL("Fill", DeviceType::kCpu, [](KernelContext& ctx) {
  ctx.out(0).Fill(ctx.attrs->Float("value"));
  return Status::Ok();
});

// Identity: y = x (also what a pass leaves behind when it drops an op).
class IdentityOp : public ElementwiseOpDef {
 public:
  IdentityOp() { DeclareAttrs(); }
  std::string name() const override { return "Identity"; }
  bool IsView() const override { return true; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "Identity"));
    return in;
  }
  Status Gradient(GradBuilder& g) const override {
    g.SetInputGrad(0, g.output_grad(0));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(IdentityOp);

Status CopyKernel(KernelContext& ctx) {
  std::memcpy(ctx.out(0).raw_data(), ctx.in(0).raw_data(), ctx.in(0).nbytes());
  return Status::Ok();
}
LOOM_REGISTER_KERNEL("Identity", DeviceType::kCpu, CopyKernel);
LOOM_REGISTER_KERNEL_SUPPORT("Identity", DeviceType::kCpu, AnyDTypeSupport());

// Reshape: attrs shape (one entry may be -1, inferred).
class ReshapeOp : public OpDef {
 public:
  ReshapeOp() { DeclareAttrs().Required("shape", AttrType::kInts, "the output shape; one entry may be -1 (inferred)"); }
  std::string name() const override { return "Reshape"; }
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return ViewSplits(in[0], out[0]);
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&, const std::vector<TensorType>&,
                              const std::vector<Region>&, const std::vector<Region>& out) const override {
    AttrMap part = attrs;
    part.Set("shape", out[0].shape().dims());
    return part;
  }
  bool IsView() const override { return true; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "Reshape"));
    std::vector<int64_t> dims = attrs.Ints("shape");
    int infer = -1;
    int64_t known = 1;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] == -1) {
        if (infer >= 0) return InvalidArgument("Reshape: more than one -1 in shape");
        infer = static_cast<int>(i);
      } else if (dims[i] < 0) {
        return InvalidArgument("Reshape: negative extent ", dims[i]);
      } else {
        known *= dims[i];
      }
    }
    int64_t numel = in[0].shape.numel();
    if (infer >= 0) {
      if (known == 0 || numel % known != 0)
        return InvalidArgument("Reshape: cannot infer -1 for ", in[0].shape.ToString(), " into ", Shape(dims).ToString());
      dims[infer] = numel / known;
    }
    if (Shape(dims).numel() != numel)
      return InvalidArgument("Reshape: ", in[0].shape.ToString(), " has ", numel, " elements, ", Shape(dims).ToString(),
                             " has ", Shape(dims).numel());
    return std::vector<TensorType>{{Shape(dims), in[0].dtype}};
  }
  Status Gradient(GradBuilder& g) const override {
    g.SetInputGrad(0, g.Emit1("Reshape", {g.output_grad(0)}, AttrMap{{"shape", g.type(g.input(0)).shape.dims()}}));
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  Status Fuse(FusionBuilder& f) const override { return f.AsReshape(); }
};
LOOM_REGISTER_OP(ReshapeOp);
LOOM_REGISTER_KERNEL("Reshape", DeviceType::kCpu, CopyKernel);
LOOM_REGISTER_KERNEL_SUPPORT("Reshape", DeviceType::kCpu, AnyDTypeSupport());

// SumToShape: sums a broadcast tensor back down to attrs.shape (the reverse
// of broadcasting; gradient of broadcasting ops).
class SumToShapeOp : public OpDef {
 public:
  SumToShapeOp() { DeclareAttrs().Required("shape", AttrType::kInts, "the shape summed down to"); }
  std::string name() const override { return "SumToShape"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "SumToShape"));
    Shape target(attrs.Ints("shape"));
    auto b = BroadcastShapes(target, in[0].shape);
    if (!b.ok() || *b != in[0].shape)
      return InvalidArgument("SumToShape: ", target.ToString(), " does not broadcast to ", in[0].shape.ToString());
    return std::vector<TensorType>{{target, in[0].dtype}};
  }
  // Any input axis: one the target keeps splits the output alike; one it
  // sums over leaves each part a partial sum (a batch part's bias gradient).
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    const Shape& x = in[0].shape;
    const Shape& y = out[0].shape;
    for (int a = 0; a < x.rank(); ++a) {
      if (x[a] < 2) continue;
      const int kept = a - (x.rank() - y.rank());
      DimSplit d = SplitAlong(a, 1, 1);
      d.outputs[0].axis = kept >= 0 && y[kept] == x[a] ? kept : -1;
      d.partial_sums = d.outputs[0].axis < 0;
      if (a == 0) rules.sample = d;
      else rules.other.push_back(d);
    }
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&, const std::vector<TensorType>&,
                              const std::vector<Region>&, const std::vector<Region>& out) const override {
    AttrMap part = attrs;
    part.Set("shape", out[0].shape().dims());
    return part;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = static_cast<double>(in[0].shape.numel());
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    g.SetInputGrad(0, g.Emit1("BroadcastTo", {g.output_grad(0)}, AttrMap{{"shape", g.type(g.input(0)).shape.dims()}}));
    return Status::Ok();
  }
  // No fused form, so it runs once per replica: gradient rules emit it, and
  // fusion runs on forward graphs, where it is rare.
  FusionKind fusion_kind() const override { return FusionKind::kPerReplica; }
};
LOOM_REGISTER_OP(SumToShapeOp);
// bf16 / f16 sum in f32 and round once (the bias gradient of a half Linear).
LOOM_REGISTER_KERNEL_SUPPORT("SumToShape", DeviceType::kCpu,
                             DTypeSupport({DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));
// Elements a parallel chunk of SumToShape sums at least.
constexpr int64_t kSumGrain = 32768;
Status SumToShapeKernel(KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  return DispatchFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* out = y.data<T>();
    std::fill(out, out + y.numel(), T(0));
    const T* in = x.data<T>();
    if (x.numel() == 0) return;
    const BroadcastSpace space = CollapseBroadcast(x.shape(), BroadcastStrides(y.shape(), x.shape()),
                                                   std::vector<int64_t>(x.shape().rank(), 0));
    const int64_t inner = space.shape.dim(-1), rows = x.numel() / inner;
    // Rows that each sum into an output of their own ([N, C, H, W] -> [N,
    // C, 1, 1]) split among the threads, and so do the row groups of kept
    // leading axes ([R, rows, D] -> [R, 1, D], a fused array's bias
    // gradients: 16 replicas' 0.29 ms on one thread). The rest stay on one
    // thread, each output summed in row order: rows that add element-wise
    // into a kept inner axis ([B, D] -> [D], a bias gradient) were measured
    // no faster split by columns (bert_medium), and slower on
    // transformer_lm's [1024, 128] (the hand-off, and rows read from the
    // other core's cache).
    const int rank = space.shape.rank();
    bool own_outputs = true;
    for (int d = 0; d + 1 < rank; ++d) own_outputs &= space.sa[static_cast<size_t>(d)] != 0 || space.shape[d] == 1;
    const int64_t inner_step = space.sa.back();
    auto rows_of = [&](int64_t r0, int64_t r1) {
      ForEachBroadcast(space.shape, space.sa, space.sb, r0, r1,
                       [&](int64_t i0, int64_t o, int64_t, int64_t len, int64_t step, int64_t) {
                         if (step == 0) {
                           out[o] += ArraySum(in + i0, len);
                         } else if (step == 1) {
                           for (int64_t j = 0; j < len; ++j) out[o + j] += in[i0 + j];
                         } else {
                           for (int64_t j = 0; j < len; ++j) out[o + j * step] += in[i0 + j];
                         }
                       });
    };
    if (rank == 2 && space.sa == std::vector<int64_t>{1, 0}) {  // row r into out[r], short rows unrolled
      WithSmallExtent(inner, [&](auto width) {
        ParallelRange(ctx.pool, rows, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) out[r] += ArraySum(in + r * width, width);
        }, std::max<int64_t>(1, kSumGrain / inner));
      });
    } else if (inner_step == 0 && own_outputs) {
      ParallelRange(ctx.pool, rows, rows_of, std::max<int64_t>(1, kSumGrain / inner));
    } else {
      int64_t groups = 1;  // of the kept leading axes: consecutive rows with outputs of their own
      for (int d = 0; d + 1 < rank && space.sa[static_cast<size_t>(d)] != 0; ++d) groups *= space.shape[d];
      const int64_t group_rows = rows / groups;
      ParallelRange(ctx.pool, groups, [&](int64_t g0, int64_t g1) { rows_of(g0 * group_rows, g1 * group_rows); },
                    std::max<int64_t>(1, kSumGrain / (group_rows * inner)));
    }
  });
}
LOOM_REGISTER_KERNEL("SumToShape", DeviceType::kCpu, [](KernelContext& ctx) {
  return IsHalf(ctx.in(0).dtype()) ? RunHalfInF32(ctx, SumToShapeKernel) : SumToShapeKernel(ctx);
});

// BroadcastTo: repeats x along broadcast dims to attrs.shape.
class BroadcastToOp : public OpDef {
 public:
  BroadcastToOp() { DeclareAttrs().Required("shape", AttrType::kInts, "the shape broadcast to"); }
  std::string name() const override { return "BroadcastTo"; }
  // Along any output axis, x along the axis it aligns with or whole where
  // it broadcasts (as a binary op's operand).
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return AllAxesBut(in, out, -1);
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&, const std::vector<TensorType>&,
                              const std::vector<Region>&, const std::vector<Region>& out) const override {
    AttrMap part = attrs;
    part.Set("shape", out[0].shape().dims());
    return part;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "BroadcastTo"));
    Shape target(attrs.Ints("shape"));
    auto b = BroadcastShapes(in[0].shape, target);
    if (!b.ok() || *b != target)
      return InvalidArgument("BroadcastTo: ", in[0].shape.ToString(), " does not broadcast to ", target.ToString());
    return std::vector<TensorType>{{target, in[0].dtype}};
  }
  Status Gradient(GradBuilder& g) const override {
    g.SetInputGrad(0, g.SumToShape(g.output_grad(0), g.type(g.input(0)).shape));
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // To the target shape, the replica axis aligned as for a binary op.
  Status Fuse(FusionBuilder& f) const override {
    const FusedValue& in = f.input(0);
    const Shape& to = f.output_shape(0);
    const int t = in.axis() + (to.rank() - f.SingleShape(in).rank());
    LOOM_ASSIGN_OR_RETURN(FusedValue x, f.AlignForBroadcast(in, to.rank(), t, f.name()));
    AttrMap attrs = f.attrs();
    attrs.Set("shape", f.WithReplicaAxis(to, t).dims());
    LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit(name(), {x}, attrs, f.name(), {ReplicaLayout::Axis(t)}));
    return f.MapOutputs(outs);
  }
};
LOOM_REGISTER_OP(BroadcastToOp);
// A copy: any element type of 2, 4 or 8 bytes (bf16 / f16 for mixed precision).
template <typename Bits>
void BroadcastCopy(const Tensor& x, Tensor& y) {
  const Bits* in = static_cast<const Bits*>(x.raw_data());
  Bits* out = static_cast<Bits*>(y.raw_data());
  if (y.numel() == 0) return;
  const BroadcastSpace space =
      CollapseBroadcast(y.shape(), BroadcastStrides(x.shape(), y.shape()), std::vector<int64_t>(y.shape().rank(), 0));
  const int64_t rows = y.numel() / space.shape.dim(-1);
  ForEachBroadcast(space.shape, space.sa, space.sb, 0, rows, [&](int64_t o0, int64_t i, int64_t, int64_t len, int64_t step, int64_t) {
    if (step == 0) {  // one value along the row (a scalar seed's gradient, a bias)
      std::fill(out + o0, out + o0 + len, in[i]);
    } else {
      for (int64_t j = 0; j < len; ++j) out[o0 + j] = in[i + j * step];
    }
  });
}
LOOM_REGISTER_KERNEL_SUPPORT("BroadcastTo", DeviceType::kCpu,
                             DTypeSupport({DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));
LOOM_REGISTER_KERNEL("BroadcastTo", DeviceType::kCpu, [](KernelContext& ctx) -> Status {
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  switch (DTypeSize(x.dtype())) {
    case 2: BroadcastCopy<uint16_t>(x, y); return Status::Ok();
    case 4: BroadcastCopy<uint32_t>(x, y); return Status::Ok();
    case 8: BroadcastCopy<uint64_t>(x, y); return Status::Ok();
    default: return Unimplemented("BroadcastTo: no CPU kernel for dtype ", DTypeName(x.dtype()));
  }
});

// Binary element-wise ops with numpy broadcasting.
enum class BinaryKind { kAdd, kSub, kMul, kDiv };

class BinaryOp : public OpDef {
 public:
  BinaryOp(const char* name, BinaryKind kind) : name_(name), kind_(kind) { DeclareAttrs(); }
  std::string name() const override { return name_; }
  // Any axis of the output; an input that broadcasts along it is read whole.
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    if (out[0].shape.rank() == 0) return rules;
    rules.sample = ElementwiseAlong(0, in, out);
    rules.attribute = ImageRows(in, out);
    rules.other = ElementwiseAxes(in, out, 0);
    return rules;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, name_));
    if (in[0].dtype != in[1].dtype)
      return InvalidArgument(name_, ": dtypes differ (", DTypeName(in[0].dtype), " vs ", DTypeName(in[1].dtype), ")");
    LOOM_ASSIGN_OR_RETURN(Shape out, BroadcastShapes(in[0].shape, in[1].shape));
    return std::vector<TensorType>{{out, in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = static_cast<double>(out[0].shape.numel());
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    ValueId dy = g.output_grad(0);
    const Shape& sa = g.type(g.input(0)).shape;
    const Shape& sb = g.type(g.input(1)).shape;
    switch (kind_) {
      case BinaryKind::kAdd:
        g.SetInputGrad(0, g.SumToShape(dy, sa));
        g.SetInputGrad(1, g.SumToShape(dy, sb));
        break;
      case BinaryKind::kSub:
        g.SetInputGrad(0, g.SumToShape(dy, sa));
        if (g.NeedsInputGrad(1)) g.SetInputGrad(1, g.SumToShape(g.Emit1("Neg", {dy}), sb));
        break;
      case BinaryKind::kMul:
        if (g.NeedsInputGrad(0)) g.SetInputGrad(0, g.SumToShape(g.Emit1("Mul", {dy, g.input(1)}), sa));
        if (g.NeedsInputGrad(1)) g.SetInputGrad(1, g.SumToShape(g.Emit1("Mul", {dy, g.input(0)}), sb));
        break;
      case BinaryKind::kDiv: {
        // d/da = dy / b; d/db = -dy * y / b
        ValueId dy_over_b = g.Emit1("Div", {dy, g.input(1)});
        g.SetInputGrad(0, g.SumToShape(dy_over_b, sa));
        if (g.NeedsInputGrad(1))
          g.SetInputGrad(1, g.SumToShape(g.Emit1("Neg", {g.Emit1("Mul", {dy_over_b, g.output(0)})}), sb));
        break;
      }
    }
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // Both operands padded to the output's rank, with the replica axis (or an
  // extent-1 axis, for a shared operand) where the fewest must move it
  // (transformer_lm's residual adds took the stream's axis, and every fused
  // Linear after them moved it back).
  Status Fuse(FusionBuilder& f) const override {
    const int rank = f.output_shape(0).rank();
    const int t = f.BroadcastReplicaAxis(rank);
    std::vector<FusedValue> ins;
    for (int i = 0; i < f.num_inputs(); ++i) {
      LOOM_ASSIGN_OR_RETURN(FusedValue a,
                            f.AlignForBroadcast(f.input(i), rank, t, f.name() + "/in" + std::to_string(i)));
      ins.push_back(a);
    }
    LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit(name_, ins, f.attrs(), f.name(), {ReplicaLayout::Axis(t)}));
    return f.MapOutputs(outs);
  }

 private:
  const char* name_;
  BinaryKind kind_;
};

LOOM_REGISTER_OP(BinaryOp, "Add", BinaryKind::kAdd);
LOOM_REGISTER_OP(BinaryOp, "Sub", BinaryKind::kSub);
LOOM_REGISTER_OP(BinaryOp, "Mul", BinaryKind::kMul);
LOOM_REGISTER_OP(BinaryOp, "Div", BinaryKind::kDiv);

template <BinaryKind kKind, typename T>
inline T Apply(T a, T b) {
  if constexpr (kKind == BinaryKind::kAdd) return a + b;
  if constexpr (kKind == BinaryKind::kSub) return a - b;
  if constexpr (kKind == BinaryKind::kMul) return a * b;
  if constexpr (kKind == BinaryKind::kDiv) return a / b;
}

template <BinaryKind kKind>
Status BinaryKernel(KernelContext& ctx) {
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  Tensor& y = ctx.out(0);
  return DispatchFloat(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* py = y.data<T>();
    const int64_t n = y.numel();
    if (n == 0) return;
    if (a.shape() == b.shape()) {  // the common case: no broadcasting
      ParallelRange(ctx.pool, n, [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) py[i] = Apply<kKind>(pa[i], pb[i]);
      });
      return;
    }
    const BroadcastSpace space = CollapseBroadcast(y.shape(), BroadcastStrides(a.shape(), y.shape()),
                                                   BroadcastStrides(b.shape(), y.shape()));
    const int64_t inner = space.shape.dim(-1);
    const int64_t rows = n / inner;
    // Rows against one value each ([N, C, 2, 2] * [N, C, 1, 1]: a
    // squeeze-and-excitation scale on small maps) in a loop of their own,
    // short rows with their width known at compile time: per row,
    // ForEachBroadcast's offsets and a loop of run-time length 4 cost
    // several times the row's work.
    const std::vector<int64_t> along = {inner, 1}, across = {1, 0};
    const bool b_per_row = space.sa == along && space.sb == across, a_per_row = space.sa == across && space.sb == along;
    if (a_per_row || b_per_row) {
      auto per_row = [&](auto width, auto b_scalar) {
        ParallelRange(ctx.pool, rows, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t j = 0; j < width; ++j) {
              const int64_t i = r * width + j;
              py[i] = b_scalar ? Apply<kKind>(pa[i], pb[r]) : Apply<kKind>(pa[r], pb[i]);
            }
        }, std::max<int64_t>(1, 32768 / inner));
      };
      WithSmallExtent(inner, [&](auto width) {
        if (b_per_row) return per_row(width, std::true_type());
        per_row(width, std::false_type());
      });
      return;
    }
    auto row = [&](int64_t o, int64_t ia, int64_t ib, int64_t len, auto step_a, auto step_b) {
      for (int64_t j = 0; j < len; ++j) py[o + j] = Apply<kKind>(pa[ia + j * step_a], pb[ib + j * step_b]);
    };
    using One = std::integral_constant<int64_t, 1>;
    using Zero = std::integral_constant<int64_t, 0>;
    ParallelRange(ctx.pool, rows, [&](int64_t r0, int64_t r1) {
      ForEachBroadcast(space.shape, space.sa, space.sb, r0, r1,
                       [&](int64_t o, int64_t ia, int64_t ib, int64_t len, int64_t step_a, int64_t step_b) {
                         // Known steps vectorise: a row against a scalar, or two rows.
                         if (step_a == 1 && step_b == 0) return row(o, ia, ib, len, One(), Zero());
                         if (step_a == 0 && step_b == 1) return row(o, ia, ib, len, Zero(), One());
                         if (step_a == 1 && step_b == 1) return row(o, ia, ib, len, One(), One());
                         row(o, ia, ib, len, step_a, step_b);
                       });
    }, std::max<int64_t>(1, 32768 / inner));
  });
}

// Add also in bf16 / f16 (in f32, rounded once): autodiff accumulates the
// gradients of a half value with several consumers (a GEMM output feeding a GEMM) with it.
LOOM_REGISTER_KERNEL("Add", DeviceType::kCpu, [](KernelContext& ctx) {
  return IsHalf(ctx.out(0).dtype()) ? RunHalfInF32(ctx, BinaryKernel<BinaryKind::kAdd>)
                                    : BinaryKernel<BinaryKind::kAdd>(ctx);
});
LOOM_REGISTER_KERNEL("Sub", DeviceType::kCpu, BinaryKernel<BinaryKind::kSub>);
LOOM_REGISTER_KERNEL("Mul", DeviceType::kCpu, BinaryKernel<BinaryKind::kMul>);
LOOM_REGISTER_KERNEL("Div", DeviceType::kCpu, BinaryKernel<BinaryKind::kDiv>);
// Type inference takes any dtype (the same for both operands); the kernels
// DispatchFloat, so an integer Add fails at Executor::Create, not mid-step.
LOOM_REGISTER_KERNEL_SUPPORT("Add", DeviceType::kCpu,
                             DTypeSupport({DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));
LOOM_REGISTER_KERNEL_SUPPORT("Sub", DeviceType::kCpu, DTypeSupport({DType::kF32, DType::kF64}));
LOOM_REGISTER_KERNEL_SUPPORT("Mul", DeviceType::kCpu, DTypeSupport({DType::kF32, DType::kF64}));
LOOM_REGISTER_KERNEL_SUPPORT("Div", DeviceType::kCpu, DTypeSupport({DType::kF32, DType::kF64}));

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Scalar ops: y = f(x; value). Neg, AddScalar, MulScalar, PowScalar.
enum class ScalarKind { kNeg, kAdd, kMul, kPow };

class ScalarOp : public ElementwiseOpDef {
 public:
  ScalarOp(const char* name, ScalarKind kind) : name_(name), kind_(kind) {
    if (kind == ScalarKind::kNeg) DeclareAttrs();
    else DeclareAttrs().Required("value", AttrType::kFloat, "the scalar operand");
  }
  std::string name() const override { return name_; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, name_));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], std::string(name_) + " input"));
    return in;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = static_cast<double>(in[0].shape.numel()) * (kind_ == ScalarKind::kPow ? 4 : 1);
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    ValueId dy = g.output_grad(0);
    double v = g.attrs().Float("value");
    switch (kind_) {
      case ScalarKind::kNeg: g.SetInputGrad(0, g.Emit1("Neg", {dy})); break;
      case ScalarKind::kAdd: g.SetInputGrad(0, dy); break;
      case ScalarKind::kMul: g.SetInputGrad(0, g.Emit1("MulScalar", {dy}, AttrMap{{"value", v}})); break;
      case ScalarKind::kPow: {
        // d/dx x^v = v * x^(v-1)
        ValueId p = g.Emit1("PowScalar", {g.input(0)}, AttrMap{{"value", v - 1.0}});
        g.SetInputGrad(0, g.Emit1("Mul", {dy, g.Emit1("MulScalar", {p}, AttrMap{{"value", v}})}));
        break;
      }
    }
    return Status::Ok();
  }

 private:
  const char* name_;
  ScalarKind kind_;
};

LOOM_REGISTER_OP(ScalarOp, "Neg", ScalarKind::kNeg);
LOOM_REGISTER_OP(ScalarOp, "AddScalar", ScalarKind::kAdd);
LOOM_REGISTER_OP(ScalarOp, "MulScalar", ScalarKind::kMul);
LOOM_REGISTER_OP(ScalarOp, "PowScalar", ScalarKind::kPow);

template <ScalarKind kKind>
Status ScalarKernel(KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = ctx.in(0).data<T>();
    T* y = ctx.out(0).data<T>();
    const T v = static_cast<T>(ctx.attrs->Float("value"));
    ParallelRange(ctx.pool, ctx.in(0).numel(), [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        if constexpr (kKind == ScalarKind::kNeg) y[i] = -x[i];
        if constexpr (kKind == ScalarKind::kAdd) y[i] = x[i] + v;
        if constexpr (kKind == ScalarKind::kMul) y[i] = x[i] * v;
        if constexpr (kKind == ScalarKind::kPow) y[i] = std::pow(x[i], v);
      }
    });
  });
}

LOOM_REGISTER_KERNEL("Neg", DeviceType::kCpu, ScalarKernel<ScalarKind::kNeg>);
LOOM_REGISTER_KERNEL("AddScalar", DeviceType::kCpu, ScalarKernel<ScalarKind::kAdd>);
LOOM_REGISTER_KERNEL("MulScalar", DeviceType::kCpu, ScalarKernel<ScalarKind::kMul>);
LOOM_REGISTER_KERNEL("PowScalar", DeviceType::kCpu, ScalarKernel<ScalarKind::kPow>);

}  // namespace
}  // namespace loom
