// MatMul (2-D), BatchMatMul (leading batch dims) and Linear (y = x W^T + b,
// PyTorch's weight layout [out, in]; batched, a fused array's, with weights
// [B, out, in]). All run on Gemm / BatchedGemm. bf16 operands go to the
// bf16 GEMM where the CPU has one (HasBf16Gemm: pairs of products added in
// f32), else, as f16 ones, are widened to f32; the product is rounded once.
#include "ops/fusion_builder.h"
#include "ops/gemm.h"
#include "ops/op.h"

namespace loom {
namespace {

// Whether a BatchMatMul operand of rank `rank` is one matrix that every batch
// entry of the other operand (of rank `other`) reads.
bool SharedOperand(int rank, int other) { return rank == 2 && other >= 3; }

// Shapes of op(A) x op(B) for the last two dims, with equal leading dims; in
// a BatchMatMul (min_rank 3) one operand may instead be 2-D, shared by every
// batch entry (a fused Linear's weight gradient on its shared input).
StatusOr<Shape> MatMulShape(const std::string& op, const Shape& a, const Shape& b, bool ta, bool tb, int min_rank) {
  const bool shared = min_rank > 2 && (SharedOperand(a.rank(), b.rank()) || SharedOperand(b.rank(), a.rank()));
  if (!shared && (a.rank() < min_rank || b.rank() != a.rank()))
    return InvalidArgument(op, ": operands must both have rank ",
                           min_rank == 2 ? "2" : ">= 3 (or one of them rank 2, shared by every batch entry)",
                           ", got ", a.ToString(), " and ", b.ToString());
  const int ra = a.rank(), rb = b.rank();
  for (int d = 0; !shared && d < ra - 2; ++d)
    if (a[d] != b[d]) return InvalidArgument(op, ": batch dims differ: ", a.ToString(), " vs ", b.ToString());
  int64_t m = ta ? a[ra - 1] : a[ra - 2], ka = ta ? a[ra - 2] : a[ra - 1];
  int64_t kb = tb ? b[rb - 1] : b[rb - 2], n = tb ? b[rb - 2] : b[rb - 1];
  if (ka != kb)
    return InvalidArgument(op, ": inner dims differ: ", a.ToString(), (ta ? "^T" : ""), " x ", b.ToString(),
                           (tb ? "^T" : ""), " (", ka, " vs ", kb, ")");
  const Shape& batched = ra >= rb ? a : b;
  std::vector<int64_t> out(batched.dims().begin(), batched.dims().end() - 2);
  out.push_back(m);
  out.push_back(n);
  return Shape(out);
}

// MatMul / BatchMatMul. attrs: transpose_a, transpose_b.
class MatMulOp : public OpDef {
 public:
  MatMulOp(const char* name, bool batched) : name_(name), batched_(batched) {
    DeclareAttrs()
        .Default("transpose_a", false, "use the transpose of a's last two dims")
        .Default("transpose_b", false, "use the transpose of b's last two dims");
  }
  std::string name() const override { return name_; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, name_));
    LOOM_RETURN_IF_ERROR(ExpectFloatOrHalf(in[0], std::string(name_) + " input 0"));
    LOOM_RETURN_IF_ERROR(ExpectSameType({in[0].shape, in[0].dtype}, {in[0].shape, in[1].dtype}, std::string(name_) + " dtypes"));
    if (!batched_ && in[0].shape.rank() != 2) return InvalidArgument("MatMul takes 2-D operands (use BatchMatMul), got ", in[0].shape.ToString());
    LOOM_ASSIGN_OR_RETURN(Shape out, MatMulShape(name_, in[0].shape, in[1].shape, attrs.Bool("transpose_a"),
                                                 attrs.Bool("transpose_b"), batched_ ? 3 : 2));
    return std::vector<TensorType>{{out, in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const Shape& s = in[0].shape;
    int64_t k = a.Bool("transpose_a") ? s.dim(-2) : s.dim(-1);
    c.flops = 2.0 * static_cast<double>(out[0].shape.numel()) * static_cast<double>(k);
    return c;
  }
  // y = op(A) op(B). With A' = op(A): dA' = dy B'^T, dB' = A'^T dy; then undo op.
  Status Gradient(GradBuilder& g) const override {
    bool ta = g.attrs().Bool("transpose_a"), tb = g.attrs().Bool("transpose_b");
    ValueId dy = g.output_grad(0), a = g.input(0), b = g.input(1);
    auto mm = [&](ValueId x, bool tx, ValueId y, bool ty) {
      return g.Emit1(name_, {x, y}, AttrMap{{"transpose_a", tx}, {"transpose_b", ty}});
    };
    // A shared operand's gradient is the sum of every batch entry's.
    auto summed = [&](ValueId grad, ValueId x) { return g.SumToShape(grad, g.type(x).shape); };
    if (g.NeedsInputGrad(0)) g.SetInputGrad(0, summed(ta ? mm(b, tb, dy, true) : mm(dy, false, b, !tb), a));
    if (g.NeedsInputGrad(1)) g.SetInputGrad(1, summed(tb ? mm(dy, true, a, ta) : mm(a, !ta, dy, false), b));
    return Status::Ok();
  }
  // y [..., M, N] = op(A) op(B). Sample: the leading batch dim (batched) or
  // the rows M; parameter: the columns N, or "reduction": K (partial sums);
  // other: the rows, the further batch dims. A shared 2-D operand is read
  // whole by every part of a batch split.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    const bool ta = attrs.Bool("transpose_a"), tb = attrs.Bool("transpose_b");
    const int r = out[0].shape.rank(), ra = in[0].shape.rank(), rb = in[1].shape.rank();
    auto batch_axis = [&](int rank, int d) { return rank == r ? d : -1; };
    auto split = [](int a, int b, int y) {
      DimSplit d = SplitAlong(-1, 2, 1);
      d.inputs[0].axis = a;
      d.inputs[1].axis = b;
      d.outputs[0].axis = y;
      return d;
    };
    const DimSplit rows = split(ta ? ra - 1 : ra - 2, -1, r - 2);
    DimSplit reduction = split(ta ? ra - 2 : ra - 1, tb ? rb - 1 : rb - 2, -1);
    reduction.partial_sums = true;
    SplitRules rules;
    rules.parameter = split(-1, tb ? rb - 2 : rb - 1, r - 1);
    rules.parameter_variants.emplace_back("reduction", reduction);
    if (r > 2) {
      rules.sample = split(batch_axis(ra, 0), batch_axis(rb, 0), 0);
      for (int b = 1; b < r - 2; ++b) rules.other.push_back(split(batch_axis(ra, b), batch_axis(rb, b), b));
      rules.other.push_back(rows);
    } else {
      rules.sample = rows;
    }
    return rules;
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // A BatchMatMul with the replicas as the leading batch dim.
  Status Fuse(FusionBuilder& f) const override {
    std::vector<FusedValue> ins;
    for (int i = 0; i < f.num_inputs(); ++i) {
      LOOM_ASSIGN_OR_RETURN(FusedValue v, f.Replicated(f.input(i), 0, f.name() + "/in" + std::to_string(i)));
      ins.push_back(v);
    }
    LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit("BatchMatMul", ins, f.attrs(), f.name(), {ReplicaLayout::Axis(0)}));
    return f.MapOutputs(outs);
  }

 private:
  const char* name_;
  bool batched_;
};
LOOM_REGISTER_OP(MatMulOp, "MatMul", false);
LOOM_REGISTER_OP(MatMulOp, "BatchMatMul", true);

Status MatMulKernel(KernelContext& ctx) {
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  Tensor& y = ctx.out(0);
  bool ta = ctx.attrs->Bool("transpose_a"), tb = ctx.attrs->Bool("transpose_b");
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  int64_t m = y.shape().dim(-2), n = y.shape().dim(-1), k = ta ? sa.dim(-2) : sa.dim(-1);
  int64_t batch = y.numel() / std::max<int64_t>(1, m * n);
  // A batch entry's matrix; a shared 2-D operand is every entry's (stride 0).
  auto stride = [&](const Shape& s) { return s.rank() == y.shape().rank() ? s.dim(-1) * s.dim(-2) : 0; };
  if (a.dtype() == DType::kBF16) {  // the bf16 GEMM, into an f32 y (HalfGemm)
    BatchedGemm(ta, tb, batch, m, n, k, 1.0f, a.data<BFloat16>(), sa.dim(-1), stride(sa), b.data<BFloat16>(),
                sb.dim(-1), stride(sb), 0.0f, y.data<float>(), n, m * n, ctx.pool);
    return Status::Ok();
  }
  return DispatchFloat(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    BatchedGemm<T>(ta, tb, batch, m, n, k, T(1), a.data<T>(), sa.dim(-1), stride(sa), b.data<T>(), sb.dim(-1),
                   stride(sb), T(0), y.data<T>(), n, m * n, ctx.pool);
  });
}
// A GEMM op's kernel for half outputs: bf16 operands read by the bf16 GEMM
// where there is one, else every half operand widened to f32; the result
// in f32, rounded once.
Status HalfGemm(KernelContext& ctx, const KernelFn& kernel) {
  if (ctx.in(0).dtype() == DType::kBF16 && HasBf16Gemm()) return RunHalfOutputsInF32(ctx, kernel);
  return RunHalfInF32(ctx, kernel);
}
Status MatMulAnyFloatKernel(KernelContext& ctx) {
  return IsHalf(ctx.out(0).dtype()) ? HalfGemm(ctx, MatMulKernel) : MatMulKernel(ctx);
}
LOOM_REGISTER_KERNEL("MatMul", DeviceType::kCpu, MatMulAnyFloatKernel);
LOOM_REGISTER_KERNEL("BatchMatMul", DeviceType::kCpu, MatMulAnyFloatKernel);
LOOM_REGISTER_KERNEL_SUPPORT("MatMul", DeviceType::kCpu, HalfFloatKernelSupport());
LOOM_REGISTER_KERNEL_SUPPORT("BatchMatMul", DeviceType::kCpu, HalfFloatKernelSupport());

// The rows of a Linear's x or y: every dimension but the features (counted,
// not divided out: x has no elements when there are no input features).
int64_t FeatureRows(const Shape& s) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < s.rank(); ++i) rows *= s[i];
  return rows;
}

// Linear: x [..., in], weight [out, in], optional bias [out] -> [..., out].
// Batched (a fused array's Linear): weight [B, out, in], optional bias
// [B, out], and x [B, rows, in] (each entry its own rows) or [rows, in]
// (rows every entry reads) -> [B, rows, out], each batch entry its own
// Linear, so that the bias is added in the product's pass.
class LinearOp : public OpDef {
 public:
  LinearOp() { DeclareAttrs(); }
  std::string name() const override { return "Linear"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    if (in.size() != 2 && in.size() != 3) return InvalidArgument("Linear takes (x, weight[, bias]), got ", in.size(), " inputs");
    const Shape& x = in[0].shape;
    const Shape& w = in[1].shape;
    LOOM_RETURN_IF_ERROR(ExpectFloatOrHalf(in[0], "Linear input"));
    if (x.rank() < 1) return InvalidArgument("Linear input must have rank >= 1");
    if (w.rank() != 2 && w.rank() != 3)
      return InvalidArgument("Linear weight must be [out, in] or batched [B, out, in], got ", w.ToString());
    const bool batched = w.rank() == 3, shared_x = batched && x.rank() == 2;
    if (batched && !shared_x && (x.rank() != 3 || x[0] != w[0]))
      return InvalidArgument("Linear with batched weight ", w.ToString(), " takes x [", w[0],
                             ", rows, in] or a shared x [rows, in], got ", x.ToString());
    if (w.dim(-1) != x.dim(-1))
      return InvalidArgument("Linear: input features ", x.dim(-1), " (input ", x.ToString(), ") != weight in-features ",
                             w.dim(-1), " (weight ", w.ToString(), ")");
    for (const auto& t : in)
      if (t.dtype != in[0].dtype) return InvalidArgument("Linear: dtypes differ");
    const Shape bias = batched ? Shape({w[0], w[1]}) : Shape({w[0]});
    if (in.size() == 3 && in[2].shape != bias)
      return InvalidArgument("Linear bias must be ", bias.ToString(), ", got ", in[2].shape.ToString());
    std::vector<int64_t> out = x.dims();
    out.back() = w.dim(-2);
    if (shared_x) out.insert(out.begin(), w[0]);
    return std::vector<TensorType>{{Shape(out), in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 2.0 * static_cast<double>(out[0].shape.numel()) * static_cast<double>(in[1].shape.dim(-1));
    if (in.size() == 3) c.flops += static_cast<double>(out[0].shape.numel());
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    ValueId dy = g.output_grad(0), x = g.input(0), w = g.input(1);
    const Shape& xs = g.type(x).shape;
    const Shape& ys = g.type(g.output(0)).shape;
    const bool bias = g.node().inputs.size() == 3 && g.NeedsInputGrad(2);
    if (g.type(w).shape.rank() == 3) {  // per batch entry: [rows, out] x [out, in], [out, rows] x [rows, in]
      // A shared x's gradient sums every entry's; its weight gradients read it in place.
      if (g.NeedsInputGrad(0)) g.SetInputGrad(0, g.SumToShape(g.Emit1("BatchMatMul", {dy, w}), xs));
      if (g.NeedsInputGrad(1)) g.SetInputGrad(1, g.Emit1("BatchMatMul", {dy, x}, AttrMap{{"transpose_a", true}}));
      if (bias) {
        const ValueId sums = g.SumToShape(dy, Shape({ys[0], 1, ys[2]}));
        g.SetInputGrad(2, g.Emit1("Reshape", {sums}, AttrMap{{"shape", std::vector<int64_t>{ys[0], ys[2]}}}));
      }
      return Status::Ok();
    }
    const int64_t rows = FeatureRows(xs);
    // Work on 2-D views [rows, features].
    ValueId dy2 = ys.rank() == 2 ? dy : g.Emit1("Reshape", {dy}, AttrMap{{"shape", std::vector<int64_t>{rows, ys.dim(-1)}}});
    if (g.NeedsInputGrad(0)) {
      ValueId dx = g.Emit1("MatMul", {dy2, w});  // [rows, out] x [out, in]
      if (xs.rank() != 2) dx = g.Emit1("Reshape", {dx}, AttrMap{{"shape", xs.dims()}});
      g.SetInputGrad(0, dx);
    }
    if (g.NeedsInputGrad(1)) {
      ValueId x2 = xs.rank() == 2 ? x : g.Emit1("Reshape", {x}, AttrMap{{"shape", std::vector<int64_t>{rows, xs.dim(-1)}}});
      g.SetInputGrad(1, g.Emit1("MatMul", {dy2, x2}, AttrMap{{"transpose_a", true}}));  // [out, rows] x [rows, in]
    }
    if (bias) g.SetInputGrad(2, g.SumToShape(dy, g.type(g.input(2)).shape));
    return Status::Ok();
  }
  // Sample: the rows of x and y, every part with the whole weight. Parameter:
  // the output features, every part reading the whole x. Batched: the batch
  // entries (sample; a shared x read whole), their rows (other) or their
  // output features.
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    const int rank = out[0].shape.rank();
    const bool batched = in[1].shape.rank() == 3;
    auto split = [&](int x, int weight, int y) {
      DimSplit d = SplitAlong(weight, in.size(), 1);
      d.inputs[0].axis = x;
      d.outputs[0].axis = y;
      return d;
    };
    if (batched) {
      const bool shared_x = in[0].shape.rank() == 2;
      rules.sample = split(shared_x ? -1 : 0, 0, 0);
      rules.other.push_back(split(shared_x ? 0 : 1, -1, 1));
      rules.parameter = split(-1, 1, 2);
      return rules;
    }
    if (rank >= 2) rules.sample = split(0, -1, 0);
    rules.parameter = split(-1, 0, rank - 1);
    return rules;
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // One batched Linear [R, rows, in] x [R, out, in]^T + [R, out] -> [R, rows,
  // out]: on a replicated x each replica's rows, on a shared x (a first
  // layer's data) the same rows, read in place by every replica. Each
  // replica's product has one model's shape, and the replica axis comes out
  // first, where the next fused Linear reads it. (One product against the
  // weights stacked [R*out, in] put the replica axis beside the features,
  // and the next layer moved it with a transpose each step, forward and
  // backward.)
  Status Fuse(FusionBuilder& f) const override {
    const FusedValue x = f.input(0);
    const Shape ws = f.SingleShape(f.input(1));
    if (ws.rank() == 3)
      return InvalidArgument("Linear '", f.name(), "': a batched Linear (weight ", ws.ToString(),
                             ") has no fused form; fuse the model whose Linears it batches");
    const int64_t r = f.replicas(), in_f = ws[1], rows = FeatureRows(f.SingleShape(x));
    std::vector<FusedValue> ins(1);
    if (x.replicated()) {
      LOOM_ASSIGN_OR_RETURN(FusedValue x0, f.MoveAxis(x, 0, f.name() + "/x"));
      LOOM_ASSIGN_OR_RETURN(ins[0], f.Reshape(x0, Shape({r, rows, in_f}), ReplicaLayout::Axis(0), f.name() + "/rows"));
    } else {
      LOOM_ASSIGN_OR_RETURN(ins[0], f.Reshape(x, Shape({rows, in_f}), ReplicaLayout::Shared(), f.name() + "/rows"));
    }
    for (int i = 1; i < f.num_inputs(); ++i) {  // [R, out, in] and [R, out]
      LOOM_ASSIGN_OR_RETURN(FusedValue p, f.Replicated(f.input(i), 0, f.name() + "/param" + std::to_string(i)));
      ins.push_back(p);
    }
    LOOM_ASSIGN_OR_RETURN(FusedValue y, f.Emit1("Linear", ins, f.attrs(), f.name(), ReplicaLayout::Axis(0)));
    LOOM_ASSIGN_OR_RETURN(FusedValue out, f.Reshape(y, f.WithReplicaAxis(f.output_shape(0), 0), ReplicaLayout::Axis(0),
                                                    f.name() + "/unrows"));
    return f.MapOutputs({out});
  }
};
LOOM_REGISTER_OP(LinearOp);

Status LinearKernel(KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  const Tensor& w = ctx.in(1);
  Tensor& y = ctx.out(0);
  const int64_t batch = w.shape().rank() == 3 ? w.shape()[0] : 1;
  const int64_t in_f = w.shape().dim(-1), out_f = w.shape().dim(-2);
  const int64_t rows = FeatureRows(y.shape()) / batch;  // per batch entry (with no input features, y is the bias)
  const bool shared_x = w.shape().rank() == 3 && x.shape().rank() == 2;  // every batch entry reads it
  const int64_t x_stride = shared_x ? 0 : rows * in_f;
  return DispatchFloat(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* py = y.data<T>();
    T beta = 0;
    const bool bf16 = x.dtype() == DType::kBF16;  // the bf16 GEMM, into an f32 y (HalfGemm)
    if (ctx.inputs.size() == 3) {  // start from the broadcast bias, then accumulate x W^T
      for (int64_t r = 0; r < batch * rows; ++r) {
        const int64_t entry = (r / rows) * out_f;  // of the bias [batch, out]
        if (bf16) {
          const BFloat16* b = ctx.in(2).data<BFloat16>() + entry;
          for (int64_t j = 0; j < out_f; ++j) py[r * out_f + j] = static_cast<T>(ToFloat(b[j]));
        } else {
          const T* b = ctx.in(2).data<T>() + entry;
          std::copy(b, b + out_f, py + r * out_f);
        }
      }
      beta = 1;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (bf16) {
        BatchedGemm(false, true, batch, rows, out_f, in_f, 1.0f, x.data<BFloat16>(), in_f, x_stride,
                    w.data<BFloat16>(), in_f, out_f * in_f, beta, py, out_f, rows * out_f, ctx.pool);
        return;
      }
    }
    if (batch == 1) {
      Gemm<T>(false, true, rows, out_f, in_f, T(1), x.data<T>(), in_f, w.data<T>(), in_f, beta, py, out_f, ctx.pool);
    } else {
      BatchedGemm<T>(false, true, batch, rows, out_f, in_f, T(1), x.data<T>(), in_f, x_stride, w.data<T>(), in_f,
                     out_f * in_f, beta, py, out_f, rows * out_f, ctx.pool);
    }
  });
}
LOOM_REGISTER_KERNEL("Linear", DeviceType::kCpu, [](KernelContext& ctx) {
  return IsHalf(ctx.out(0).dtype()) ? HalfGemm(ctx, LinearKernel) : LinearKernel(ctx);
});
LOOM_REGISTER_KERNEL_SUPPORT("Linear", DeviceType::kCpu, HalfFloatKernelSupport());

}  // namespace
}  // namespace loom
