// ScaledDotProductAttention and its backward op: the core of multi-head
// attention (the model API adds the projections and head reshapes).
//
//   S = scale * Q K^T, masked; P = softmax_rows(S); O = P V.
//
// The forward op returns P as its second output: it is the buffer the scores
// are computed in anyway, the backward op needs it (no recomputation), and
// callers may read (and differentiate through) the attention weights.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/attention_geometry.h"
#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/gemm.h"
#include "ops/op.h"

namespace loom {
namespace {

constexpr const char* kAttention = "ScaledDotProductAttention";
constexpr const char* kAttentionBackward = "ScaledDotProductAttentionBackward";

StatusOr<AttnDims> CheckQkv(const std::string& op, const TensorType& q, const TensorType& k, const TensorType& v) {
  LOOM_RETURN_IF_ERROR(ExpectFloat(q, op + " q"));
  LOOM_RETURN_IF_ERROR(ExpectRank(q, 4, op + " q [B, H, Tq, D]"));
  LOOM_RETURN_IF_ERROR(ExpectRank(k, 4, op + " k [B, H, Tk, D]"));
  LOOM_RETURN_IF_ERROR(ExpectRank(v, 4, op + " v [B, H, Tk, Dv]"));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    return InvalidArgument(op, ": q, k, v dtypes differ (", DTypeName(q.dtype), ", ", DTypeName(k.dtype), ", ",
                           DTypeName(v.dtype), ")");
  const Shape &sq = q.shape, &sk = k.shape, &sv = v.shape;
  if (sk[0] != sq[0] || sk[1] != sq[1] || sk[3] != sq[3])
    return InvalidArgument(op, ": k ", sk.ToString(), " must be [B, H, Tk, D] with B, H, D of q ", sq.ToString());
  if (sv[0] != sq[0] || sv[1] != sq[1] || sv[2] != sk[2])
    return InvalidArgument(op, ": v ", sv.ToString(), " must be [B, H, Tk, Dv] with B, H of q ", sq.ToString(),
                           " and Tk of k ", sk.ToString());
  return AttnDims{sq[0], sq[1], sq[2], sk[2], sq[3], sv[3]};
}

bool IsMaskDType(DType d) {
  return d == DType::kBool || d == DType::kI32 || d == DType::kI64 || d == DType::kF32 || d == DType::kF64;
}

// ---------------------------------------------------------------------------
// ScaledDotProductAttention
//   inputs: q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv],
//           optional key_padding_mask [B, Tk] (bool, i32, i64, f32 or f64;
//           nonzero = padded key, excluded from every query of that batch row)
//   attrs:  causal (bool, default false; see LastVisibleKey, ops/attention_causal.h),
//           query_offset (int, with causal: the key position of query 0;
//           default Tk - Tq, aligned bottom-right),
//           scale (float > 0, default 1/sqrt(D))
//   outputs: 0 = out [B, H, Tq, Dv], 1 = probs [B, H, Tq, Tk] (the attention
//           weights; zero on masked keys).
// A query row with no visible key gets all-zero weights and a zero output
// (softmax over an empty set is undefined; zero keeps NaN out of training).
// Batch (sample) and head (parameter) splits of every [B, H, ...] tensor of
// the attention ops; `mask` (an input [B, Tk], -1: none) has only a batch.
// Attribute: the query sequence (axis 2 of q and of every [B, H, Tq, ...]
// tensor; k, v and the mask whole). Inputs 1 and 2 (k, v) have Tk there,
// and so do the backward op's outputs 1 and 2 (dk, dv): each part holds a
// partial sum of those.
SplitRules AttentionSplits(size_t inputs, size_t outputs, int mask, bool backward) {
  SplitRules rules;
  rules.sample = SplitAlong(0, inputs, outputs);
  rules.parameter = SplitAlong(1, inputs, outputs);
  rules.attribute = SplitAlong(2, inputs, outputs);
  for (size_t keyed : {1, 2}) {
    rules.attribute->inputs[keyed].axis = -1;
    if (backward) rules.attribute->outputs[keyed].axis = -1;
  }
  rules.attribute->partial_sums = backward;
  if (mask >= 0) {
    rules.parameter->inputs[static_cast<size_t>(mask)].axis = -1;
    rules.attribute->inputs[static_cast<size_t>(mask)].axis = -1;
  }
  return rules;
}

class AttentionOp : public OpDef {
 public:
  AttentionOp() {
    DeclareAttrs()
        .Default("causal", false, "query i sees keys up to its own position (aligned bottom-right)")
        .Optional("query_offset", AttrType::kInt,
                  "with causal: the key position of query 0; absent: Tk - Tq (aligned bottom-right)")
        .Optional("scale", AttrType::kFloat, "the scores' factor, > 0; absent: 1/sqrt(D)");
  }
  std::string name() const override { return kAttention; }

  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (in.size() != 3 && in.size() != 4)
      return InvalidArgument(kAttention, " takes (q, k, v[, key_padding_mask]), got ", in.size(), " inputs");
    LOOM_ASSIGN_OR_RETURN(AttnDims n, CheckQkv(kAttention, in[0], in[1], in[2]));
    LOOM_RETURN_IF_ERROR(ResolveAttentionScale(kAttention, attrs, n.d).status());
    if (in.size() == 4) {
      const TensorType& m = in[3];
      if (m.shape != Shape({n.b, n.tk}))
        return InvalidArgument(kAttention, ": key_padding_mask must be [B, Tk] = [", n.b, ", ", n.tk, "], got ",
                               m.shape.ToString());
      if (!IsMaskDType(m.dtype))
        return InvalidArgument(kAttention, ": key_padding_mask must be bool, i32, i64, f32 or f64, got ",
                               DTypeName(m.dtype));
    }
    DType dt = in[0].dtype;
    return std::vector<TensorType>{{Shape({n.b, n.h, n.tq, n.dv}), dt}, {Shape({n.b, n.h, n.tq, n.tk}), dt}};
  }

  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const Shape &q = in[0].shape, &v = in[2].shape;
    double scores = static_cast<double>(out[1].shape.numel());  // B H Tq Tk
    // Q K^T and P V (the GEMMs also cover masked entries), plus the softmax:
    // max, subtract, exp, sum, divide per score.
    c.flops = 2.0 * scores * static_cast<double>(q[3]) + 2.0 * scores * static_cast<double>(v[3]) + 5.0 * scores;
    return c;
  }

  // dq, dk, dv from the backward op; the mask gets no gradient (it selects).
  Status Gradient(GradBuilder& g) const override {
    if (!g.NeedsInputGrad(0) && !g.NeedsInputGrad(1) && !g.NeedsInputGrad(2)) return Status::Ok();
    const TensorType& q = g.type(g.input(0));
    LOOM_ASSIGN_OR_RETURN(double scale, ResolveAttentionScale(kAttention, g.attrs(), q.shape[3]));
    ValueId d_out = g.output_grad(0);
    if (d_out == kNoValue) {  // only the weights reach the loss
      const TensorType& t = g.type(g.output(0));
      d_out = g.Emit1("Fill", {},
                      AttrMap{{"shape", t.shape.dims()}, {"value", 0.0}, {"dtype", std::string(DTypeName(t.dtype))}});
    }
    std::vector<ValueId> ins = {g.input(0), g.input(1), g.input(2), g.output(1), d_out};
    if (g.output_grad(1) != kNoValue) ins.push_back(g.output_grad(1));
    std::vector<ValueId> grads = g.Emit(kAttentionBackward, ins, AttrMap{{"scale", scale}});
    for (int i = 0; i < 3; ++i) g.SetInputGrad(i, grads[i]);
    return Status::Ok();
  }

  // Independent per (batch, head): sample splits the batch (the key
  // padding mask's rows too), parameter the heads (the mask whole). Each
  // query row is independent too: attribute splits the query sequence,
  // every part reading all keys and values (FlexFlow's sequence split).
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return AttentionSplits(in.size(), out.size(), in.size() == 4 ? 3 : -1, /*backward=*/false);
  }
  // A causal part of the query rows keeps its rows' key positions.
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    AttrMap part = attrs;
    const Region& q = in_regions[0];
    const int64_t tq = in[0].shape[2];
    if (attrs.Bool("causal") && (q.lo[2] != 0 || q.hi[2] != tq))
      part.Set("query_offset", ResolveQueryOffset(attrs, tq, in[1].shape[2]) + q.lo[2]);
    return part;
  }

  // Attention is independent per (batch, head): the replicas become heads,
  // q/k/v [B, R*H, T, D]. A key padding mask [B, Tk] serves every head, so
  // it must be shared; a per-replica mask runs once per replica. Without a
  // mask, q/k/v that come replica-major (from fused Linears, [R, B, H, T,
  // D]) become batch entries instead, [R*B, H, T, D]: no data moves, where
  // heads would take a transpose of each input and of each output.
  FusionKind fusion_kind() const override { return FusionKind::kFusedOrPerReplica; }
  Status Fuse(FusionBuilder& f) const override {
    const bool has_mask = f.num_inputs() > 3;
    if (has_mask && f.input(3).replicated()) return f.PerReplica();
    std::vector<FusedValue> ins;
    auto replica_major = [&](int i) { return f.input(i).replicated() && f.input(i).axis() == 0; };
    if (!has_mask && replica_major(0) && replica_major(1) && replica_major(2)) {
      for (int i = 0; i < 3; ++i) {
        LOOM_ASSIGN_OR_RETURN(FusedValue v, f.MergeIntoDim0(f.input(i), f.name() + "/in" + std::to_string(i)));
        ins.push_back(v);
      }
      return f.EmitMergedAndMap(ins, /*dim=*/0);
    }
    for (int i = 0; i < 3; ++i) {
      LOOM_ASSIGN_OR_RETURN(FusedValue v, f.MergeIntoDim1(f.input(i), f.name() + "/in" + std::to_string(i)));
      ins.push_back(v);
    }
    if (has_mask) ins.push_back(f.input(3));
    return f.EmitMergedAndMap(ins);
  }
};
LOOM_REGISTER_OP(AttentionOp);

// Padded-key flags [B, Tk] (1 = excluded) from a mask of any accepted dtype.
template <typename M>
void ReadMask(const Tensor& mask, std::vector<uint8_t>* padded) {
  const M* m = mask.data<M>();
  for (size_t i = 0; i < padded->size(); ++i) (*padded)[i] = m[i] != M(0) ? 1 : 0;
}

std::vector<uint8_t> PaddedKeys(const Tensor& mask) {
  std::vector<uint8_t> padded(static_cast<size_t>(mask.numel()));
  switch (mask.dtype()) {
    case DType::kBool: ReadMask<bool>(mask, &padded); break;
    case DType::kI32: ReadMask<int32_t>(mask, &padded); break;
    case DType::kI64: ReadMask<int64_t>(mask, &padded); break;
    case DType::kF32: ReadMask<float>(mask, &padded); break;
    case DType::kF64: ReadMask<double>(mask, &padded); break;
    default: LOOM_CHECK(false, "key_padding_mask dtype ", DTypeName(mask.dtype()), " passed type inference");
  }
  return padded;
}

// Rows per ParallelRange chunk for row-wise passes over [rows, width]
// (element-wise work of ~8k items per chunk; exp dominates).
int64_t RowChunk(int64_t width) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(1, width)); }

// Softmax of one score row in place over the visible keys j <= last that are
// not padded; every other entry becomes 0, and so does a row with none.
template <typename T>
void MaskedSoftmaxRow(T* row, int64_t tk, int64_t last, const uint8_t* padded) {
  auto visible = [&](int64_t j) { return j <= last && !(padded && padded[j]); };
  T max = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < tk; ++j)
    if (visible(j)) max = std::max(max, row[j]);
  if (max == -std::numeric_limits<T>::infinity()) {
    std::fill(row, row + tk, T(0));
    return;
  }
  T sum = 0;
  for (int64_t j = 0; j < tk; ++j) {
    row[j] = visible(j) ? std::exp(row[j] - max) : T(0);
    sum += row[j];
  }
  const T inv = T(1) / sum;  // sum >= 1: the max term contributes exp(0)
  for (int64_t j = 0; j < tk; ++j) row[j] *= inv;
}

Status AttentionKernel(KernelContext& ctx) {
  const Tensor &q = ctx.in(0), &k = ctx.in(1), &v = ctx.in(2);
  Tensor &out = ctx.out(0), &probs = ctx.out(1);
  const AttnDims n = AttnDimsOf(q, k, v);
  LOOM_ASSIGN_OR_RETURN(double scale, ResolveAttentionScale(kAttention, *ctx.attrs, n.d));
  const bool causal = ctx.attrs->Bool("causal");
  const int64_t query_offset = ResolveQueryOffset(*ctx.attrs, n.tq, n.tk);
  std::vector<uint8_t> padded;
  if (ctx.inputs.size() == 4) padded = PaddedKeys(ctx.in(3));
  return DispatchFloat(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = probs.data<T>();  // [B, H, Tq, Tk]
    // Scores: S = scale * Q K^T, computed in the weights buffer.
    BatchedGemm<T>(false, true, n.heads(), n.tq, n.tk, n.d, static_cast<T>(scale), q.data<T>(), n.d, n.tq * n.d,
                   k.data<T>(), n.d, n.tk * n.d, T(0), p, n.tk, n.tq * n.tk, ctx.pool);
    // Masked softmax, one (batch, head, query) row at a time.
    ParallelRange(ctx.pool, n.heads() * n.tq, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t batch = r / (n.h * n.tq), i = r % n.tq;
        const uint8_t* pad = padded.empty() ? nullptr : padded.data() + batch * n.tk;
        MaskedSoftmaxRow(p + r * n.tk, n.tk, LastVisibleKey(causal, i, query_offset, n.tk), pad);
      }
    }, RowChunk(n.tk));
    // out = P V: [Tq, Tk] x [Tk, Dv] per (batch, head).
    BatchedGemm<T>(false, false, n.heads(), n.tq, n.dv, n.tk, T(1), p, n.tk, n.tq * n.tk, v.data<T>(), n.dv,
                   n.tk * n.dv, T(0), out.data<T>(), n.dv, n.tq * n.dv, ctx.pool);
  });
}
LOOM_REGISTER_KERNEL(kAttention, DeviceType::kCpu, AttentionKernel);

// ---------------------------------------------------------------------------
// ScaledDotProductAttentionBackward
//   inputs: q, k, v, probs [B, H, Tq, Tk] (forward output 1),
//           d_out [B, H, Tq, Dv], optional d_probs [B, H, Tq, Tk]
//   attrs:  scale (the forward's resolved scale; required)
//   outputs: dq, dk, dv (types of q, k, v).
// Masking needs no inputs here: masked weights are exactly zero, and every
// term of dS below carries a factor P.
//   dV = P^T dO;  G = dO V^T + dP_extra;  dS = P * (G - rowsum(P * G));
//   dQ = scale dS K;  dK = scale dS^T Q.
class AttentionBackwardOp : public OpDef {
 public:
  AttentionBackwardOp() { DeclareAttrs().Required("scale", AttrType::kFloat, "the forward op's resolved scale"); }
  std::string name() const override { return kAttentionBackward; }

  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (in.size() != 5 && in.size() != 6)
      return InvalidArgument(kAttentionBackward, " takes (q, k, v, probs, d_out[, d_probs]), got ", in.size(),
                             " inputs");
    LOOM_ASSIGN_OR_RETURN(AttnDims n, CheckQkv(kAttentionBackward, in[0], in[1], in[2]));
    LOOM_RETURN_IF_ERROR(ResolveAttentionScale(kAttentionBackward, attrs, n.d).status());
    const TensorType probs{Shape({n.b, n.h, n.tq, n.tk}), in[0].dtype};
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[3], probs, std::string(kAttentionBackward) + " probs vs expected"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[4], {Shape({n.b, n.h, n.tq, n.dv}), in[0].dtype},
                                        std::string(kAttentionBackward) + " d_out vs expected"));
    if (in.size() == 6)
      LOOM_RETURN_IF_ERROR(ExpectSameType(in[5], probs, std::string(kAttentionBackward) + " d_probs vs expected"));
    return std::vector<TensorType>{in[0], in[1], in[2]};
  }

  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const double scores = static_cast<double>(in[3].shape.numel());
    const double d = static_cast<double>(in[0].shape[3]), dv = static_cast<double>(in[2].shape[3]);
    // dV and dO V^T (2 x Dv), dQ and dK (2 x D), and dS: the row dot
    // product, subtract and multiply (4 per score, +1 with d_probs).
    c.flops = scores * (4.0 * dv + 4.0 * d + 4.0 + (in.size() == 6 ? 1.0 : 0.0));
    // The [B, H, Tq, Tk] scratch: written by the GEMM and the row pass, read
    // by the row pass and the dQ and dK GEMMs.
    const double scratch = scores * static_cast<double>(DTypeSize(in[0].dtype));
    c.bytes_written += 2 * scratch;
    c.bytes_read += 3 * scratch;
    return c;
  }
  // As the forward op's: every input and gradient by the batch or the
  // heads; by the query rows, each part with partial sums of dk and dv.
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return AttentionSplits(in.size(), out.size(), -1, /*backward=*/true);
  }
};
LOOM_REGISTER_OP(AttentionBackwardOp);

Status AttentionBackwardKernel(KernelContext& ctx) {
  const Tensor &q = ctx.in(0), &k = ctx.in(1), &v = ctx.in(2), &probs = ctx.in(3), &d_out = ctx.in(4);
  const Tensor* d_probs = ctx.inputs.size() == 6 ? &ctx.in(5) : nullptr;
  const AttnDims n = AttnDimsOf(q, k, v);
  const double scale = ctx.attrs->Float("scale");
  LOOM_ASSIGN_OR_RETURN(Tensor ds, Tensor::Empty(probs.shape(), probs.dtype(), ctx.device));  // [B, H, Tq, Tk]
  return DispatchFloat(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = probs.data<T>();
    const T* g_out = d_out.data<T>();
    T* s = ds.data<T>();
    const int64_t sq = n.tq * n.d, sk = n.tk * n.d, sv = n.tk * n.dv, so = n.tq * n.dv, sp = n.tq * n.tk;
    // dV = P^T dO: [Tk, Tq] x [Tq, Dv].
    BatchedGemm<T>(true, false, n.heads(), n.tk, n.dv, n.tq, T(1), p, n.tk, sp, g_out, n.dv, so, T(0),
                   ctx.out(2).data<T>(), n.dv, sv, ctx.pool);
    // G = dO V^T (+ d_probs): the gradient reaching the weights.
    T beta = 0;
    if (d_probs) {
      std::memcpy(s, d_probs->data<T>(), static_cast<size_t>(probs.numel()) * sizeof(T));
      beta = 1;
    }
    BatchedGemm<T>(false, true, n.heads(), n.tq, n.tk, n.dv, T(1), g_out, n.dv, so, v.data<T>(), n.dv, sv, beta, s,
                   n.tk, sp, ctx.pool);
    // Softmax backward per row, in place: dS = P * (G - <P, G>).
    ParallelRange(ctx.pool, n.heads() * n.tq, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* pr = p + r * n.tk;
        T* gr = s + r * n.tk;
        T dot = 0;
        for (int64_t j = 0; j < n.tk; ++j) dot += pr[j] * gr[j];
        for (int64_t j = 0; j < n.tk; ++j) gr[j] = pr[j] * (gr[j] - dot);
      }
    }, RowChunk(n.tk));
    // dQ = scale dS K: [Tq, Tk] x [Tk, D]; dK = scale dS^T Q: [Tk, Tq] x [Tq, D].
    const T alpha = static_cast<T>(scale);
    BatchedGemm<T>(false, false, n.heads(), n.tq, n.d, n.tk, alpha, s, n.tk, sp, k.data<T>(), n.d, sk, T(0),
                   ctx.out(0).data<T>(), n.d, sq, ctx.pool);
    BatchedGemm<T>(true, false, n.heads(), n.tk, n.d, n.tq, alpha, s, n.tk, sp, q.data<T>(), n.d, sq, T(0),
                   ctx.out(1).data<T>(), n.d, sk, ctx.pool);
  });
}
LOOM_REGISTER_KERNEL(kAttentionBackward, DeviceType::kCpu, AttentionBackwardKernel);

}  // namespace
}  // namespace loom
