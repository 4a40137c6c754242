// Dropout and Embedding, with PyTorch semantics.
//
// Dropout: x -> (y, mask); attrs p (default 0.5), training (default true, as
// torch.nn.functional.dropout). The mask has x's type and holds the scale
// each element was multiplied by: 0 for a dropped element, 1 / (1 - p) for a
// kept one, so y = x * mask and dx = dy * mask. p = 1 drops everything (the
// mask is all 0, no division by zero); eval or p = 0 is the identity with an
// all-ones mask. Element n is dropped iff CounterUniform(key, n) < p
// (core/counter_rng.h), so any thread on any device draws any element
// without walking the others, and the CPU and CUDA kernels give the same
// mask. The key is the first number of the node's per-step stream (ctx.rng);
// fused replicas (attrs replica_seeds, replica_axis) each use the key of
// their own seed's stream, and n counts a replica's elements in the order a
// single model holds them, so each replica draws the single model's mask.
// A part of a split dropout (graph/task_graph.h) starts its count at attr
// offset, the whole tensor's index of its first element, so the parts draw
// the whole's mask; a part along an inner axis (the batch of a time-major
// [T, B, H]) is runs of `run` elements, `run_stride` apart in the whole.
//
// Embedding: (indices i32 | i64 [...], weight [num_embeddings, dim]) ->
// [..., dim]; attr padding_idx (default -1: none), whose row gets no
// gradient. Out-of-range indices fail the step with InvalidArgument. The
// gradient w.r.t. weight is an "EmbeddingBackward" scatter-add; indices
// have none.
#include <algorithm>
#include <cstring>
#include <string>

#include "core/counter_rng.h"
#include "ops/cpu_util.h"
#include "ops/dropout_embedding_util.h"
#include "ops/fusion_builder.h"
#include "ops/op.h"

namespace loom {
namespace {

// ---------------------------------------------------------------------------
// Dropout

// Elements per unit of parallel work. The draws do not depend on it: each
// element's comes from its counter alone.
constexpr int64_t kDropoutBlock = 16384;

using dropout_embedding::DispatchIndex;
using dropout_embedding::DropoutActive;
using dropout_embedding::Dropped;
using dropout_embedding::DropThreshold;
using dropout_embedding::DropoutKeys;
using dropout_embedding::IndexOutOfRange;
using dropout_embedding::MakeDropoutKeys;

// The input dim that holds a fused dropout's replicas; -1 unfused.
int ReplicaAxis(const AttrMap& attrs) {
  return attrs.Has("replica_seeds") ? static_cast<int>(attrs.Int("replica_axis")) : -1;
}
// The batch: axis 0, or 1 behind replicas on axis 0.
int BatchAxis(const AttrMap& attrs) { return ReplicaAxis(attrs) == 0 ? 1 : 0; }

// Fused, an active dropout draws one mask per replica from the replica's
// seed: the fusion pass emits that form itself (graph/fusion.cc); in eval
// or with p = 0 it is the identity, element-wise.
class DropoutOp : public ElementwiseOpDef {
 public:
  DropoutOp() {
    DeclareAttrs()
        .Default("p", 0.5, "probability of zeroing an element, in [0, 1]")
        .Default("training", true, "false: the identity (evaluation)")
        // Set by the fusion pass (graph/fusion.h) on an active fused dropout.
        .Optional("replica_seeds", AttrType::kInts, "fused: one seed per replica, each replica's mask from its own")
        .Optional("replica_axis", AttrType::kInt, "fused: the input dim that holds the replicas")
        .Default("offset", int64_t{0}, "a part's: the draw index of its first element in the whole tensor")
        .Default("run", int64_t{0}, "a part's: elements in each contiguous run of the whole (0: one run)")
        .Default("run_stride", int64_t{0}, "a part's: the whole's draw indices from one run to the next");
  }
  std::string name() const override { return "Dropout"; }
  // Active, a part draws by position: along the batch (axis 0, or 1 when
  // the replicas are axis 0) and the replica axis (each part keeps its
  // replicas' seeds); unfused, along any one axis. Inactive, it is
  // element-wise.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    if (!DropoutActive(attrs)) return ElementwiseOpDef::Splits(attrs, in, out);
    SplitRules rules;
    const int replica_axis = ReplicaAxis(attrs);
    if (BatchAxis(attrs) < in[0].shape.rank()) rules.sample = SplitAlong(BatchAxis(attrs), in.size(), out.size());
    if (replica_axis >= 0) rules.other.push_back(SplitAlong(replica_axis, in.size(), out.size()));
    if (replica_axis < 0 && attrs.Int("run", 0) == 0)
      for (int a = 1; a < in[0].shape.rank(); ++a) rules.other.push_back(SplitAlong(a, in.size(), out.size()));
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    if (!DropoutActive(attrs)) return attrs;
    const Shape& shape = in[0].shape;
    const Region& part = in_regions[0];
    const int replica_axis = ReplicaAxis(attrs), batch_axis = BatchAxis(attrs);
    if (replica_axis < 0 && attrs.Int("run", 0) == 0) {
      // Unfused: the part's elements are runs of the whole's draw order.
      int split = -1;
      for (int d = 0; d < shape.rank(); ++d)
        if (part.lo[d] != 0 || part.hi[d] != shape[d]) {
          if (split >= 0)
            return InvalidArgument("Dropout: a part may split one axis, not ", split, " and ", d, " (",
                                   part.ToString(), " of ", shape.ToString(), ")");
          split = d;
        }
      AttrMap out = attrs;
      if (split < 0) return out;
      int64_t inner = 1;
      for (int d = split + 1; d < shape.rank(); ++d) inner *= shape[d];
      out.Set("offset", attrs.Int("offset") + part.lo[split] * inner);
      if (split > 0) {
        out.Set("run", (part.hi[split] - part.lo[split]) * inner);
        out.Set("run_stride", shape[split] * inner);
      }
      return out;
    }
    for (int d = 0; d < shape.rank(); ++d)
      if (d != replica_axis && d != batch_axis && (part.lo[d] != 0 || part.hi[d] != shape[d]))
        return InvalidArgument("Dropout: a part may split only the batch and the replicas, not axis ", d, " (",
                               part.ToString(), " of ", shape.ToString(), ")");
    AttrMap out = attrs;
    if (replica_axis >= 0) {
      const std::vector<int64_t> seeds = attrs.Ints("replica_seeds");
      out.Set("replica_seeds", std::vector<int64_t>(seeds.begin() + part.lo[replica_axis],
                                                    seeds.begin() + part.hi[replica_axis]));
    }
    if (batch_axis < shape.rank() && part.lo[batch_axis] > 0) {
      // Elements per batch row of one replica, in the replica's draw order.
      const int64_t replicas = replica_axis >= 0 ? shape[replica_axis] : 1;
      const int64_t row = shape.numel() / shape[batch_axis] / replicas;
      out.Set("offset", attrs.Int("offset") + part.lo[batch_axis] * row);
    }
    return out;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "Dropout"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "Dropout input"));
    const double p = attrs.Float("p");
    if (!(p >= 0 && p <= 1)) return InvalidArgument("Dropout: attribute p must be in [0, 1], got ", p);
    if (attrs.Has("replica_seeds")) {
      const int64_t axis = attrs.Int("replica_axis");
      if (axis < 0 || axis >= in[0].shape.rank())
        return InvalidArgument("Dropout: replica_axis ", axis, " is outside input ", in[0].shape.ToString());
      if (in[0].shape[static_cast<int>(axis)] != static_cast<int64_t>(attrs.Ints("replica_seeds").size()))
        return InvalidArgument("Dropout: ", attrs.Ints("replica_seeds").size(), " replica seeds for replica axis ",
                               axis, " of input ", in[0].shape.ToString());
    }
    return std::vector<TensorType>{in[0], in[0]};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    // One comparison against the draw and one multiply per element.
    c.flops = DropoutActive(a) ? 2.0 * static_cast<double>(in[0].shape.numel()) : 0.0;
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    ValueId dy = g.output_grad(0);
    if (dy == kNoValue) return Status::Ok();  // the mask does not depend on x
    g.SetInputGrad(0, DropoutActive(g.attrs()) ? g.Emit1("Mul", {dy, g.output(1)}) : dy);
    return Status::Ok();
  }
  bool IsRandom() const override { return true; }
};
LOOM_REGISTER_OP(DropoutOp);

// One element's dropout with its draw: mask = scale where kept, else 0, as
// a multiply (a branch on a random bit mispredicts), and y = x * mask.
template <typename T>
inline void DropOne(uint64_t draw, uint64_t threshold, T scale, const T& x, T& y, T& mask) {
  mask = scale * static_cast<T>(!Dropped(draw, threshold));
  y = x * mask;
}

// Dropout over elements [0, count) whose draws are first, first + 1, ...
// of stream `key`: mask = scale where kept, else 0, and y = x * mask. Eight
// draws at a time in vector lanes (CounterU64's MixCounter on vectors; the
// compiler kept the scalar loop scalar), the same bits as CounterU64 and
// Dropped, then the rest one by one. The eight are two halves of four: a
// 64-bit vector of four fills 32 bytes, a register on AVX2 as on AVX-512,
// and the counters they carry from block to block stay in registers (a
// carried 64-byte vector went through the stack on AVX2).
template <typename T>
void DropoutRun(uint64_t key, uint64_t first, uint64_t threshold, T scale, const T* x, T* y, T* mask,
                int64_t count) {
  constexpr int kHalf = 4, kLanes = 2 * kHalf;
  typedef uint64_t Draws __attribute__((vector_size(kHalf * sizeof(uint64_t))));
  typedef int64_t Keeps __attribute__((vector_size(kHalf * sizeof(int64_t))));
  typedef T Values __attribute__((vector_size(kHalf * sizeof(T))));
  typedef T UnalignedValues __attribute__((vector_size(kHalf * sizeof(T)), aligned(alignof(T)), may_alias));
  // key + (first + k + lane) * kCounterGamma (CounterU64's n + 1 is lane),
  // carried from block to block by one add, all mod 2^64: a 64-bit multiply
  // is three 32-bit ones on AVX2.
  const Draws low_lanes = {1, 2, 3, 4}, high_lanes = {5, 6, 7, 8};
  Draws counters[2] = {key + (first + low_lanes) * kCounterGamma, key + (first + high_lanes) * kCounterGamma};
  int64_t k = 0;
  for (; k + kLanes <= count; k += kLanes) {
    for (int h = 0; h < 2; ++h) {
      const Draws z = MixCounter(counters[h]);
      counters[h] += kLanes * kCounterGamma;
      const Keeps keep = -((z >> 11) >= threshold);  // 1 where kept: !Dropped
      const Values m = scale * __builtin_convertvector(keep, Values);
      const int64_t at = k + h * kHalf;
      *reinterpret_cast<UnalignedValues*>(mask + at) = m;
      *reinterpret_cast<UnalignedValues*>(y + at) = *reinterpret_cast<const UnalignedValues*>(x + at) * m;
    }
  }
  for (; k < count; ++k)
    DropOne(CounterU64(key, first + static_cast<uint64_t>(k)), threshold, scale, x[k], y[k], mask[k]);
}

LOOM_REGISTER_KERNEL("Dropout", DeviceType::kCpu, [](KernelContext& ctx) {
  const double p = ctx.attrs->Float("p");
  const bool active = DropoutActive(*ctx.attrs);
  const int64_t n = ctx.in(0).numel();
  if (active && !ctx.rng) return Internal("Dropout: the executor gave no random stream");
  // Fused replicas (graph/fusion.h): replica r's elements, in the order a
  // single model holds them, draw with the key of replica r's seed, so its
  // mask is the one the single model would draw. The CUDA kernel makes the
  // keys with the same MakeDropoutKeys (ops/dropout_embedding_util.h).
  const DropoutKeys draw = active ? MakeDropoutKeys(ctx) : DropoutKeys{};
  const std::vector<uint64_t>& stream_keys = draw.keys;
  const int64_t replicas = draw.replicas, outer = draw.outer, inner = draw.inner;
  const uint64_t offset = static_cast<uint64_t>(ctx.attrs->Int("offset"));
  // A part in runs of the whole (unfused only, PartAttrs): element i's index
  // in the whole's draw order, from the part's first.
  const int64_t run = ctx.attrs->Int("run", 0), run_stride = ctx.attrs->Int("run_stride", 0);
  if (run > 0 && replicas > 1) return Internal("Dropout: a fused part in runs");
  const auto draw_index = [&](int64_t i) {
    return offset + static_cast<uint64_t>(run > 0 ? (i / run) * run_stride + i % run : i);
  };
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = ctx.in(0).data<T>();  // [n]
    T* y = ctx.out(0).data<T>();       // [n]
    T* mask = ctx.out(1).data<T>();    // [n]
    if (!active) {
      std::copy(x, x + n, y);
      std::fill(mask, mask + n, T(1));
      return;
    }
    const T scale = p < 1 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
    // P(drop) = p; p = 1 drops all (DropThreshold: CounterUniform < p in integers).
    const uint64_t threshold = DropThreshold(p);
    const int64_t per_replica = outer * inner;
    const int64_t blocks = (per_replica + kDropoutBlock - 1) / kDropoutBlock;
    ParallelRange(ctx.pool, replicas * blocks, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t r = t / blocks, b = t % blocks;
        const uint64_t key = stream_keys[r];
        const int64_t end = std::min(per_replica, (b + 1) * kDropoutBlock);
        // Replica r's elements i are runs of `inner` contiguous ones.
        for (int64_t i = b * kDropoutBlock; i < end;) {
          const int64_t count = std::min(inner - i % inner, end - i);
          const int64_t at = ((i / inner) * replicas + r) * inner + i % inner;
          if (run == 0) {  // the draw index is the element's own
            DropoutRun(key, offset + static_cast<uint64_t>(i), threshold, scale, x + at, y + at, mask + at, count);
          } else {
            for (int64_t k = 0; k < count; ++k)
              DropOne(CounterU64(key, draw_index(i + k)), threshold, scale, x[at + k], y[at + k], mask[at + k]);
          }
          i += count;
        }
      }
    }, 1);
  });
});

// ---------------------------------------------------------------------------
// Embedding

// The indices as int64, or an error naming the first out-of-range one.
StatusOr<std::vector<int64_t>> ReadIndices(const std::string& op, const Tensor& indices, int64_t num_embeddings) {
  std::vector<int64_t> out(indices.numel());
  Status s = DispatchIndex(indices.dtype(), [&](auto zero) -> Status {
    using I = decltype(zero);
    const I* p = indices.data<I>();
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t v = p[i];
      if (v < 0 || v >= num_embeddings)
        return IndexOutOfRange(op, v, static_cast<int64_t>(i), indices.shape(), num_embeddings);
      out[i] = v;
    }
    return Status::Ok();
  });
  if (!s.ok()) return s;
  return out;
}

Status ExpectIndices(const TensorType& t, const std::string& what) {
  if (t.dtype != DType::kI32 && t.dtype != DType::kI64)
    return InvalidArgument(what, " must be i32 or i64, got ", DTypeName(t.dtype));
  return Status::Ok();
}

Status ExpectPaddingIdx(const std::string& op, int64_t padding_idx, int64_t num_embeddings) {
  if (padding_idx != -1 && (padding_idx < 0 || padding_idx >= num_embeddings))
    return InvalidArgument(op, ": attribute padding_idx must be -1 (none) or in [0, ", num_embeddings, "), got ",
                           padding_idx);
  return Status::Ok();
}

// A part of a vocabulary split holds the table rows [vocab_offset,
// vocab_offset + rows) of a vocabulary of vocab_size (-1: the table is the
// whole vocabulary): indices are checked against the vocabulary, and those
// outside the part's rows read zeros (forward) or add nowhere (backward).
AttrSchema& DeclareVocabAttrs(AttrSchema& schema) {
  return schema
      .Default("vocab_offset", int64_t{0}, "a vocabulary part's: the vocabulary row of its table's row 0")
      .Default("vocab_size", int64_t{-1}, "a vocabulary part's: the whole vocabulary's rows; -1: the table's");
}

// The vocabulary's size for a table (or gradient) of `rows` rows, checked.
StatusOr<int64_t> VocabSize(const std::string& op, const AttrMap& attrs, int64_t rows) {
  const int64_t offset = attrs.Int("vocab_offset"), size = attrs.Int("vocab_size");
  const int64_t vocab = size == -1 ? rows : size;
  if (offset < 0 || vocab < 1 || offset + rows > vocab)
    return InvalidArgument(op, ": the table's ", rows, " rows from vocab_offset ", offset,
                           " do not fit a vocabulary of ", vocab, " rows (vocab_size ", size, ")");
  return vocab;
}

// A part's attributes: its rows of the table (or gradient) `rows` of a
// whole of `whole_rows` rows.
AttrMap VocabPart(const AttrMap& attrs, int64_t whole_rows, const Region& rows) {
  if (rows.lo[0] == 0 && rows.hi[0] == whole_rows) return attrs;
  AttrMap part = attrs;
  const int64_t size = attrs.Int("vocab_size");
  part.Set("vocab_offset", attrs.Int("vocab_offset") + rows.lo[0]);
  part.Set("vocab_size", size == -1 ? whole_rows : size);
  return part;
}

class EmbeddingOp : public OpDef {
 public:
  EmbeddingOp() {
    DeclareVocabAttrs(DeclareAttrs().Default("padding_idx", int64_t{-1}, "a row whose gradient is zero; -1: none"));
  }
  std::string name() const override { return "Embedding"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, "Embedding (indices, weight)"));
    LOOM_RETURN_IF_ERROR(ExpectIndices(in[0], "Embedding indices (input 0)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[1], "Embedding weight (input 1)"));
    LOOM_RETURN_IF_ERROR(ExpectRank(in[1], 2, "Embedding weight [num_embeddings, dim] (input 1)"));
    LOOM_ASSIGN_OR_RETURN(const int64_t vocab, VocabSize("Embedding", attrs, in[1].shape[0]));
    LOOM_RETURN_IF_ERROR(ExpectPaddingIdx("Embedding", attrs.Int("padding_idx"), vocab));
    std::vector<int64_t> out = in[0].shape.dims();
    out.push_back(in[1].shape[1]);
    return std::vector<TensorType>{{Shape(out), in[1].dtype}};
  }
  OpCost Cost(const AttrMap&, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    // A gather: reads the indices and only the rows it copies.
    OpCost c;
    const double row_bytes = static_cast<double>(out[0].shape.numel() * DTypeSize(out[0].dtype));
    c.bytes_read = static_cast<double>(in[0].shape.numel() * DTypeSize(in[0].dtype)) + row_bytes;
    c.bytes_written = row_bytes;
    return c;
  }
  // Sample: the indices' first axis and the output's, the table whole;
  // other: any other axis of the indices (the batch of time-major ids [T,
  // B]). Parameter: the embedding dimension (the table's columns, the
  // output's last axis), the indices whole; or, "vocabulary", the table's
  // rows, each part looking up the indices it holds (the output a partial
  // sum, zeros where a part holds no row).
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    for (int a = 0; a < in[0].shape.rank(); ++a) {
      DimSplit ids = SplitAlong(-1, in.size(), out.size());
      ids.inputs[0].axis = a;
      ids.outputs[0].axis = a;
      if (a == 0) rules.sample = std::move(ids);
      else rules.other.push_back(std::move(ids));
    }
    rules.parameter = SplitAlong(-1, in.size(), out.size());
    rules.parameter->inputs[1].axis = 1;
    rules.parameter->outputs[0].axis = out[0].shape.rank() - 1;
    DimSplit vocabulary = SplitAlong(-1, in.size(), out.size());
    vocabulary.inputs[1].axis = 0;
    vocabulary.partial_sums = true;
    rules.parameter_variants.emplace_back("vocabulary", std::move(vocabulary));
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    return VocabPart(attrs, in[1].shape[0], in_regions[1]);
  }
  Status Gradient(GradBuilder& g) const override {
    if (!g.NeedsInputGrad(1)) return Status::Ok();
    const Shape& w = g.type(g.input(1)).shape;
    g.SetInputGrad(1, g.Emit1("EmbeddingBackward", {g.output_grad(0), g.input(0)},
                              AttrMap{{"num_embeddings", w[0]},
                                      {"padding_idx", g.attrs().Int("padding_idx")},
                                      {"vocab_offset", g.attrs().Int("vocab_offset")},
                                      {"vocab_size", g.attrs().Int("vocab_size")}}));
    return Status::Ok();
  }

  // Shared indices: one lookup in the replicas' tables laid side by side,
  // [V, R*D]. Per-replica indices have no fused form (a gather per replica
  // would need a batched lookup) and run once per replica.
  FusionKind fusion_kind() const override { return FusionKind::kFusedOrPerReplica; }
  Status Fuse(FusionBuilder& f) const override {
    if (f.input(0).replicated()) return f.PerReplica();
    const Shape ws = f.SingleShape(f.input(1));
    const Shape& ys = f.output_shape(0);
    LOOM_ASSIGN_OR_RETURN(FusedValue w, f.MoveAxis(f.input(1), 1, f.name() + "/tables"));
    LOOM_ASSIGN_OR_RETURN(w, f.Reshape(w, Shape({ws[0], f.replicas() * ws[1]}), ReplicaLayout::Merged(1, ws[1]),
                                       f.name() + "/side_by_side"));
    const int axis = ys.rank() - 1;
    LOOM_ASSIGN_OR_RETURN(FusedValue y, f.Emit1("Embedding", {f.input(0), w}, f.attrs(), f.name(),
                                                ReplicaLayout::Merged(axis, ws[1])));
    LOOM_ASSIGN_OR_RETURN(FusedValue out, f.Reshape(y, f.WithReplicaAxis(ys, axis), ReplicaLayout::Axis(axis),
                                                    f.name() + "/split_replicas"));
    return f.MapOutputs({out});
  }
};
LOOM_REGISTER_OP(EmbeddingOp);

LOOM_REGISTER_KERNEL("Embedding", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& weight = ctx.in(1);
  const int64_t rows = weight.shape()[0], dim = weight.shape()[1];
  LOOM_ASSIGN_OR_RETURN(const int64_t vocab, VocabSize("Embedding", *ctx.attrs, rows));
  const int64_t first = ctx.attrs->Int("vocab_offset");
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> idx, ReadIndices("Embedding", ctx.in(0), vocab));
  // Row copies are dtype-agnostic: whole rows of bytes.
  const size_t row_bytes = static_cast<size_t>(dim) * DTypeSize(weight.dtype());
  const char* w = static_cast<const char*>(weight.raw_data());  // [rows, dim]
  char* y = static_cast<char*>(ctx.out(0).raw_data());          // [n, dim]
  ParallelRange(ctx.pool, static_cast<int64_t>(idx.size()), [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      const int64_t row = idx[i] - first;
      if (row >= 0 && row < rows) std::memcpy(y + i * row_bytes, w + row * row_bytes, row_bytes);
      else std::memset(y + i * row_bytes, 0, row_bytes);  // another part's row (all-bits-zero is 0.0)
    }
  }, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, dim)));
  return Status::Ok();
});

// EmbeddingBackward: (dy [..., dim], indices [...]) -> dweight
// [num_embeddings, dim]; attrs num_embeddings, padding_idx.
class EmbeddingBackwardOp : public OpDef {
 public:
  EmbeddingBackwardOp() {
    DeclareVocabAttrs(DeclareAttrs()
                          .Required("num_embeddings", AttrType::kInt, "rows of the forward weight (of a part's)")
                          .Required("padding_idx", AttrType::kInt, "the forward op's padding_idx"));
  }
  std::string name() const override { return "EmbeddingBackward"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, "EmbeddingBackward (dy, indices)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "EmbeddingBackward dy"));
    LOOM_RETURN_IF_ERROR(ExpectIndices(in[1], "EmbeddingBackward indices"));
    const Shape& dy = in[0].shape;
    const Shape& ids = in[1].shape;
    bool ok = dy.rank() == ids.rank() + 1;
    for (int d = 0; ok && d < ids.rank(); ++d) ok = dy[d] == ids[d];
    if (!ok)
      return InvalidArgument("EmbeddingBackward: dy ", dy.ToString(), " must be indices ", ids.ToString(), " + [dim]");
    const int64_t num = attrs.Int("num_embeddings");
    if (num < 1) return InvalidArgument("EmbeddingBackward: attribute num_embeddings must be positive, got ", num);
    LOOM_ASSIGN_OR_RETURN(const int64_t vocab, VocabSize("EmbeddingBackward", attrs, num));
    LOOM_RETURN_IF_ERROR(ExpectPaddingIdx("EmbeddingBackward", attrs.Int("padding_idx"), vocab));
    return std::vector<TensorType>{{Shape{num, dy.dim(-1)}, in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = static_cast<double>(in[0].shape.numel());  // one add per dy element
    return c;
  }
  // Sample: dy and the indices by their first axis, the table's gradient a
  // partial sum. Parameter: dy's last axis and the gradient's columns; or,
  // "vocabulary", the gradient's rows, from all of dy and the indices.
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    // Along any axis of the ids (and of the gradient they index): each part
    // adds its ids' rows, a partial sum of the table's gradient.
    for (int a = 0; a < in[1].shape.rank(); ++a) {
      DimSplit ids = SplitAlong(-1, in.size(), out.size());
      ids.inputs[0].axis = a;
      ids.inputs[1].axis = a;
      ids.partial_sums = true;
      if (a == 0) rules.sample = std::move(ids);
      else rules.other.push_back(std::move(ids));
    }
    rules.parameter = SplitAlong(-1, in.size(), out.size());
    rules.parameter->inputs[0].axis = in[0].shape.rank() - 1;
    rules.parameter->outputs[0].axis = 1;
    rules.parameter_variants.emplace_back("vocabulary", SplitAlong(-1, in.size(), out.size()));
    rules.parameter_variants.back().second.outputs[0].axis = 0;
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&,
                              const std::vector<TensorType>& out, const std::vector<Region>&,
                              const std::vector<Region>& out_regions) const override {
    AttrMap part = VocabPart(attrs, out[0].shape[0], out_regions[0]);
    part.Set("num_embeddings", out_regions[0].hi[0] - out_regions[0].lo[0]);
    return part;
  }
};
LOOM_REGISTER_OP(EmbeddingBackwardOp);

LOOM_REGISTER_KERNEL("EmbeddingBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  Tensor& dw = ctx.out(0);
  const int64_t num = dw.shape()[0], dim = dw.shape()[1];
  const int64_t padding_idx = ctx.attrs->Int("padding_idx"), first = ctx.attrs->Int("vocab_offset");
  LOOM_ASSIGN_OR_RETURN(const int64_t vocab, VocabSize("EmbeddingBackward", *ctx.attrs, num));
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> idx, ReadIndices("EmbeddingBackward", ctx.in(1), vocab));
  const int64_t n = static_cast<int64_t>(idx.size());
  return DispatchFloat(dw.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* dy = ctx.in(0).data<T>();  // [n, dim]
    T* out = dw.data<T>();              // [num_embeddings, dim]
    // Split over columns: every output element has one writer and sums its
    // contributions in index order, so the result is deterministic.
    ParallelRange(ctx.pool, dim, [&](int64_t j0, int64_t j1) {
      for (int64_t r = 0; r < num; ++r) std::fill(out + r * dim + j0, out + r * dim + j1, T(0));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = idx[i] - first;  // another part's row when outside [0, num)
        if (idx[i] == padding_idx || r < 0 || r >= num) continue;
        T* row = out + r * dim;
        const T* g = dy + i * dim;
        for (int64_t j = j0; j < j1; ++j) row[j] += g[j];
      }
    }, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, n)));
  });
});

}  // namespace
}  // namespace loom
