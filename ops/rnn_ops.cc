// LSTM (one layer, time-major, PyTorch's gate order and weight layout, so
// torch.nn.LSTM weights load as they are) and LSTMBackward (backpropagation
// through time). Stacked LSTMs chain these ops: layer l's y is layer l+1's x.
// Fused (attribute replicas = R): R replicas' LSTMs replica-major, every
// tensor [R, ...] (ops/lstm_geometry.h), each replica the unfused op's bits.
//
//   pre_t = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh     [N, 4Hd], blocks i|f|g|o
//   i, f, o = sigmoid(.), g = tanh(.)
//   c_t = f * c_{t-1} + i * g;  h_t = o * tanh(c_t)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/gemm.h"
#include "ops/lstm_geometry.h"
#include "ops/op.h"

namespace loom {
namespace {

constexpr const char* kLstm = "LSTM";
constexpr const char* kLstmBackward = "LSTMBackward";

// Sigmoid and tanh count as this many FLOPs each in Cost() (exp, add,
// divide and a negation, roughly).
constexpr double kActivationFlops = 4;

Status ExpectShape(const std::string& op, const std::string& what, const TensorType& t, const Shape& want,
                   DType dtype) {
  if (t.shape != want)
    return InvalidArgument(op, ": ", what, " must be ", want.ToString(), ", got ", t.shape.ToString());
  if (t.dtype != dtype)
    return InvalidArgument(op, ": ", what, " must be ", DTypeName(dtype), " like x, got ", DTypeName(t.dtype));
  return Status::Ok();
}

// One replica's shapes and names as the op's: [R, ...] for a fused op
// (replicas r > 0), as they are for an unfused one.
struct ReplicaShapes {
  int64_t r = 0;
  int lead() const { return r > 0 ? 1 : 0; }
  Shape Of(const Shape& one) const {
    if (r == 0) return one;
    std::vector<int64_t> dims = {r};
    for (int i = 0; i < one.rank(); ++i) dims.push_back(one[i]);
    return Shape(dims);
  }
  // "h0 [N, Hd]" -> "h0 [R, N, Hd]".
  std::string Name(const std::string& s) const {
    const size_t open = s.find('[');
    return r == 0 || open == std::string::npos ? s : s.substr(0, open + 1) + "R, " + s.substr(open + 1);
  }
};

// Checks (x, h0, c0, w_ih, w_hh), the first five inputs of both ops, against
// each other and the replica count.
StatusOr<LstmDims> CheckLstmCore(const std::string& op, const ReplicaShapes& rs, const std::vector<TensorType>& in) {
  const int lead = rs.lead();
  LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], op + " x"));
  LOOM_RETURN_IF_ERROR(ExpectRank(in[0], 3 + lead, op + " " + rs.Name("x [T, N, I]")));
  LOOM_RETURN_IF_ERROR(ExpectRank(in[1], 2 + lead, op + " " + rs.Name("h0 [N, Hd]")));
  const Shape& x = in[0].shape;
  if (rs.r > 0 && x[0] != rs.r)
    return InvalidArgument(op, ": replicas = ", rs.r, " needs x [", rs.r, ", T, N, I], got ", x.ToString());
  const LstmDims n{std::max<int64_t>(rs.r, 1), x[lead], x[lead + 1], x[lead + 2], in[1].shape[lead + 1]};
  const DType dt = in[0].dtype;
  if (in[1].shape[lead] != n.n)
    return InvalidArgument(op, ": h0 ", in[1].shape.ToString(), " must be ", rs.Name("[N, Hd]"), " with N = ", n.n,
                           " from x ", x.ToString());
  LOOM_RETURN_IF_ERROR(ExpectShape(op, rs.Name("h0 [N, Hd]"), in[1], rs.Of({n.n, n.hd}), dt));
  LOOM_RETURN_IF_ERROR(ExpectShape(op, rs.Name("c0 [N, Hd]"), in[2], rs.Of({n.n, n.hd}), dt));
  LOOM_RETURN_IF_ERROR(ExpectShape(op, rs.Name("w_ih [4*Hd, I]"), in[3], rs.Of({n.gates(), n.in}), dt));
  LOOM_RETURN_IF_ERROR(ExpectShape(op, rs.Name("w_hh [4*Hd, Hd]"), in[4], rs.Of({n.gates(), n.hd}), dt));
  return n;
}

// FLOPs of the two GEMMs x W_ih^T and h W_hh^T over all steps (forward); the
// backward runs each of them twice (data and weight gradients).
double ProjectionFlops(const LstmDims& n) {
  return 2.0 * static_cast<double>(n.r * n.t * n.n * n.gates()) * static_cast<double>(n.in + n.hd);
}

// Rows of N per ParallelRange chunk for the per-step element-wise passes
// (~4k hidden units per chunk: each costs several exp/tanh).
int64_t RowChunk(int64_t hd) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(1, hd)); }

// ---------------------------------------------------------------------------
// Splits of both ops. `lead` is 1 for a fused op (its replica axis first).

int ReplicaLead(const AttrMap& attrs) { return attrs.Int("replicas") > 0 ? 1 : 0; }

AttrSchema& DeclareLstmReplicas(AttrSchema& s) {
  return s.Default("replicas", int64_t{0}, "fused: R replicas' LSTMs, replica-major (0 = unfused)");
}

// The batch: axis 1 of the sequences ([T, N, ...]) and axis 0 of the states
// ([N, Hd]), each one further for a fused op; the weights are whole and, in
// the backward op, their gradients partial sums.
DimSplit LstmBatchSplit(const std::vector<TensorType>& in, const std::vector<TensorType>& out, bool partial,
                        int lead) {
  DimSplit d = SplitAlong(-1, in.size(), out.size());
  auto batch_axis = [lead](const TensorType& t, bool weight) {
    return weight ? -1 : t.shape.rank() == 3 + lead ? 1 + lead : lead;
  };
  // Weights: inputs 3..6 of the forward op, 3 and 4 of the backward op.
  const size_t weights_end = partial ? 5 : 7;
  for (size_t i = 0; i < in.size(); ++i) d.inputs[i].axis = batch_axis(in[i], i >= 3 && i < weights_end);
  for (size_t i = 0; i < out.size(); ++i) d.outputs[i].axis = batch_axis(out[i], partial && i >= 3);
  d.partial_sums = partial;
  return d;
}

// The sequence (axis 0 of x, y, gates, cells, dy, dx; 1 fused) in k chunks
// of equal length. The recurrence chains them, so the split expands into
// one node per chunk, pinned to its part and handed the state the chunk
// before it ends with (ExpandBuilder::Pin): on its own one layer's chunks
// run one after another, but stacked layers overlap (a wavefront: layer 2's
// chunk 0 runs beside layer 1's chunk 1).
DimSplit LstmSequenceSplit(const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                           const std::vector<size_t>& sequence_inputs, const std::vector<size_t>& sequence_outputs,
                           int lead) {
  DimSplit d = SplitAlong(-1, in.size(), out.size());
  for (size_t i : sequence_inputs) d.inputs[i].axis = lead;
  for (size_t i : sequence_outputs) d.outputs[i].axis = lead;
  d.expands = true;
  d.alone = true;
  return d;
}

// The rules of either op; a fused op also splits along its replicas (axis
// 0 of everything; PartReplicaCount gives each part its count).
SplitRules LstmSplits(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                      bool backward) {
  const int lead = ReplicaLead(attrs);
  SplitRules rules;
  rules.sample = LstmBatchSplit(in, out, backward, lead);
  rules.attribute = backward ? LstmSequenceSplit(in, out, {0, 5, 6, 7, 8}, {0}, lead)
                             : LstmSequenceSplit(in, out, {0}, {0, 3, 4}, lead);
  if (lead) rules.other.push_back(SplitAlong(0, in.size(), out.size()));
  return rules;
}

// Steps [first, end) of a sequence (its axis `axis`), on the current pin.
ValueId SequenceRows(ExpandBuilder& b, ValueId v, int axis, int64_t first, int64_t end, const std::string& suffix) {
  return b.Emit("Slice", {v}, AttrMap{{"axis", int64_t{axis}}, {"start", first}, {"end", end}}, suffix).at(0);
}

ValueId JoinSequence(ExpandBuilder& b, const std::vector<ValueId>& chunks, int axis, const std::string& suffix) {
  return b.Emit("Concat", chunks, AttrMap{{"axis", int64_t{axis}}}, suffix).at(0);
}

// ---------------------------------------------------------------------------
// LSTM
//   inputs: x [T, N, I], h0 [N, Hd], c0 [N, Hd], w_ih [4*Hd, I],
//           w_hh [4*Hd, Hd], b_ih [4*Hd], b_hh [4*Hd] (gate blocks i, f, g, o)
//   outputs: 0 = y [T, N, Hd] (h_1 .. h_T), 1 = h_T [N, Hd], 2 = c_T [N, Hd],
//            3 = gates [T, N, 4*Hd] (activated i, f, g, o), 4 = cells [T, N, Hd]
//            (c_1 .. c_T); 3 and 4 are saved for LSTMBackward.
//   fused (replicas = R): every input and output [R, ...].
// With T = 0, y is empty and (h_T, c_T) = (h0, c0).
class LstmOp : public OpDef {
 public:
  LstmOp() { DeclareLstmReplicas(DeclareAttrs()); }
  std::string name() const override { return kLstm; }

  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return LstmSplits(attrs, in, out, false);
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    return PartReplicaCount(attrs, in[0], in_regions[0]);
  }

  // k chunks: chunk j runs steps [j L, (j + 1) L) from chunk j - 1's (h, c).
  Status Expand(ExpandBuilder& b) const override {
    const int axis = ReplicaLead(b.attrs());
    const int64_t k = b.parts(), steps = b.type(b.input(0)).shape[axis] / k;
    ValueId h = b.input(1), c = b.input(2);
    std::vector<ValueId> ys, gates, cells;
    for (int64_t j = 0; j < k; ++j) {
      b.Pin(j);
      const std::string at = std::to_string(j);
      const ValueId x = SequenceRows(b, b.input(0), axis, j * steps, (j + 1) * steps, "x" + at);
      const std::vector<ValueId> o =
          b.Emit(kLstm, {x, h, c, b.input(3), b.input(4), b.input(5), b.input(6)}, b.attrs(), "chunk" + at);
      ys.push_back(o.at(0));
      h = o.at(1);
      c = o.at(2);
      gates.push_back(o.at(3));
      cells.push_back(o.at(4));
    }
    b.Pin(-1);
    b.SetOutput(0, JoinSequence(b, ys, axis, "y"));
    b.SetOutput(1, h);
    b.SetOutput(2, c);
    b.SetOutput(3, JoinSequence(b, gates, axis, "gates"));
    b.SetOutput(4, JoinSequence(b, cells, axis, "cells"));
    return Status::Ok();
  }

  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs,
                                               const std::vector<TensorType>& in) const override {
    if (in.size() != 7)
      return InvalidArgument(kLstm, " takes (x, h0, c0, w_ih, w_hh, b_ih, b_hh), got ", in.size(), " inputs");
    LOOM_ASSIGN_OR_RETURN(const int64_t r, ReplicaCountAttr(kLstm, attrs));
    const ReplicaShapes rs{r};
    LOOM_ASSIGN_OR_RETURN(const LstmDims n, CheckLstmCore(kLstm, rs, in));
    const DType dt = in[0].dtype;
    LOOM_RETURN_IF_ERROR(ExpectShape(kLstm, rs.Name("b_ih [4*Hd]"), in[5], rs.Of({n.gates()}), dt));
    LOOM_RETURN_IF_ERROR(ExpectShape(kLstm, rs.Name("b_hh [4*Hd]"), in[6], rs.Of({n.gates()}), dt));
    return std::vector<TensorType>{{rs.Of({n.t, n.n, n.hd}), dt},
                                   {rs.Of({n.n, n.hd}), dt},
                                   {rs.Of({n.n, n.hd}), dt},
                                   {rs.Of({n.t, n.n, n.gates()}), dt},
                                   {rs.Of({n.t, n.n, n.hd}), dt}};
  }

  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const LstmDims n = LstmDimsOf(in[0].shape, in[1].shape);
    // Per hidden unit and step: 4 bias adds, 5 activations (3 sigmoid, 2
    // tanh), 3 for c_t and 1 for h_t.
    const double units = static_cast<double>(n.r * n.t * n.n * n.hd);
    c.flops = ProjectionFlops(n) + units * (4 + 5 * kActivationFlops + 3 + 1);
    return c;
  }

  Status Gradient(GradBuilder& g) const override {
    if (g.output_grad(3) != kNoValue || g.output_grad(4) != kNoValue)
      return Unimplemented(kLstm, " outputs 3 (gates) and 4 (cells) are saved for ", kLstmBackward,
                           " and carry no gradient; build the loss from y, h_T and c_T");
    bool any = false;
    for (int i = 0; i < 7; ++i) any = any || g.NeedsInputGrad(i);
    if (!any) return Status::Ok();
    std::vector<ValueId> ins = {g.input(0), g.input(1), g.input(2), g.input(3), g.input(4),
                                g.output(0), g.output(3), g.output(4)};
    for (int i = 0; i < 3; ++i) {  // output grads that do not reach the loss are zero
      ValueId d = g.output_grad(i);
      if (d == kNoValue) {
        const TensorType& t = g.type(g.output(i));
        d = g.Emit1("Fill", {},
                    AttrMap{{"shape", t.shape.dims()}, {"value", 0.0}, {"dtype", std::string(DTypeName(t.dtype))}});
      }
      ins.push_back(d);
    }
    std::vector<ValueId> grads = g.Emit(kLstmBackward, ins, g.attrs());
    for (int i = 0; i < 5; ++i) g.SetInputGrad(i, grads[i]);
    g.SetInputGrad(5, grads[5]);  // both biases enter pre_t the same way
    g.SetInputGrad(6, grads[5]);
    return Status::Ok();
  }

  // R replicas in one node: every input with its replica axis first (a
  // shared one, the zero initial state say, broadcast to R copies).
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  Status Fuse(FusionBuilder& f) const override {
    if (f.attrs().Int("replicas") != 0) return InvalidArgument(kLstm, " '", f.name(), "' is fused already");
    std::vector<FusedValue> inputs;
    for (int i = 0; i < f.num_inputs(); ++i) {
      LOOM_ASSIGN_OR_RETURN(FusedValue v, f.Replicated(f.input(i), 0, f.name() + "/in" + std::to_string(i)));
      inputs.push_back(v);
    }
    AttrMap attrs = f.attrs();
    attrs.Set("replicas", f.replicas());
    LOOM_ASSIGN_OR_RETURN(std::vector<FusedValue> outputs,
                          f.Emit(kLstm, inputs, attrs, f.name(), {ReplicaLayout::Axis(0)}));
    return f.MapOutputs(outputs);
  }
};
LOOM_REGISTER_OP(LstmOp);

// How many replicas of a fused op run their steps together: as many as
// keep a step's operands (w_hh, the step's gates, h and c) within 2 MiB,
// so that the threads' shares stay in their L2s from step to step. On the
// AVX2 EPYC (2 cores, 512 KiB L2 each), 4 replicas of hidden size 128
// (nmt's, rnntc's; 360-460 KiB each) stepped together ran their LSTMs
// 5-35% faster than one after another, and 4 of rnnlm's (hidden 256, 1.2
// MiB each) 15-40% slower, even on one thread. Stepping together saves a
// product and a pass a step per replica, which pays most for small models.
int64_t ReplicasPerPass(const LstmDims& n, size_t element_bytes) {
  constexpr double kStepBytes = 2 * 1024 * 1024;
  const double per_replica =
      static_cast<double>((n.gates() * n.hd + n.n * n.gates() + 2 * n.n * n.hd) * element_bytes);
  return std::clamp<int64_t>(static_cast<int64_t>(kStepBytes / std::max(1.0, per_replica)), 1, n.r);
}

// Each replica's slab (one for an unfused op) runs the unfused op's products
// and passes, so its bits are the unfused op's. Replicas run in groups
// (ReplicasPerPass): a group's products batched, each step's pass over all
// of its rows at once.
Status LstmKernel(KernelContext& ctx) {
  const Tensor &x = ctx.in(0), &h0 = ctx.in(1), &c0 = ctx.in(2), &w_ih = ctx.in(3), &w_hh = ctx.in(4);
  const LstmDims all = LstmDimsOf(x.shape(), h0.shape());
  const int64_t G = all.gates(), Hd = all.hd, rows = all.t * all.n;
  return DispatchFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const int64_t group = ReplicasPerPass(all, sizeof(T));
    std::vector<T> bias(static_cast<size_t>(G));  // [4Hd]
    for (int64_t first = 0; first < all.r; first += group) {
      LstmDims n = all;  // this group's replicas
      n.r = std::min(group, all.r - first);
      T* y = ctx.out(0).data<T>() + first * n.seq_stride();        // [T, N, Hd] per replica
      T* gates = ctx.out(3).data<T>() + first * n.gates_stride();  // [T, N, 4Hd]
      T* cells = ctx.out(4).data<T>() + first * n.seq_stride();    // [T, N, Hd]
      const T* w_hh_first = w_hh.data<T>() + first * n.w_hh_stride();
      // Every step's input projection at once: gates = x W_ih^T + (b_ih + b_hh).
      for (int64_t r = 0; r < n.r; ++r) {
        const T *b_ih = ctx.in(5).data<T>() + (first + r) * G, *b_hh = ctx.in(6).data<T>() + (first + r) * G;
        for (int64_t j = 0; j < G; ++j) bias[j] = b_ih[j] + b_hh[j];
        T* g = gates + r * n.gates_stride();
        for (int64_t row = 0; row < rows; ++row) std::copy(bias.begin(), bias.end(), g + row * G);
      }
      BatchedGemm<T>(false, true, n.r, rows, G, n.in, T(1), x.data<T>() + first * n.x_stride(), n.in, n.x_stride(),
                     w_ih.data<T>() + first * n.w_ih_stride(), n.in, n.w_ih_stride(), T(1), gates, G,
                     n.gates_stride(), ctx.pool);

      // The state entering step t: (h0, c0) at step 0, then the step
      // before's rows of y and cells.
      const T* h_prev = h0.data<T>() + first * n.state_stride();
      const T* c_prev = c0.data<T>() + first * n.state_stride();
      int64_t prev_stride = n.state_stride();
      for (int64_t t = 0; t < n.t; ++t) {
        T* g = gates + t * n.n * G;   // [N, 4Hd] of the group's first replica
        T* h = y + t * n.n * Hd;      // [N, Hd]
        T* c = cells + t * n.n * Hd;  // [N, Hd]
        BatchedGemm<T>(false, true, n.r, n.n, G, Hd, T(1), h_prev, Hd, prev_stride, w_hh_first, Hd,
                       n.w_hh_stride(), T(1), g, G, n.gates_stride(), ctx.pool);
        ParallelRange(ctx.pool, n.r * n.n, [&](int64_t q0, int64_t q1) {
          for (int64_t q = q0; q < q1; ++q) {
            const int64_t rep = q / n.n, row = q % n.n;
            T* gr = g + rep * n.gates_stride() + row * G;
            T* cr = c + rep * n.seq_stride() + row * Hd;
            T* hr = h + rep * n.seq_stride() + row * Hd;
            const T* cp = c_prev + rep * prev_stride + row * Hd;
            LOOM_ELEMENTWISE_LOOP
            for (int64_t j = 0; j < Hd; ++j) {
              const T ig = Sigmoid(gr[j]), fg = Sigmoid(gr[Hd + j]), gg = Tanh(gr[2 * Hd + j]);
              const T og = Sigmoid(gr[3 * Hd + j]);
              gr[j] = ig;
              gr[Hd + j] = fg;
              gr[2 * Hd + j] = gg;
              gr[3 * Hd + j] = og;
              cr[j] = fg * cp[j] + ig * gg;
              hr[j] = og * Tanh(cr[j]);
            }
          }
        }, RowChunk(Hd));
        h_prev = h;
        c_prev = c;
        prev_stride = n.seq_stride();
      }
      const size_t state_bytes = static_cast<size_t>(n.state_stride()) * sizeof(T);
      for (int64_t r = 0; r < n.r; ++r) {
        std::memcpy(ctx.out(1).data<T>() + (first + r) * n.state_stride(), h_prev + r * prev_stride, state_bytes);
        std::memcpy(ctx.out(2).data<T>() + (first + r) * n.state_stride(), c_prev + r * prev_stride, state_bytes);
      }
    }
  });
}
LOOM_REGISTER_KERNEL(kLstm, DeviceType::kCpu, LstmKernel);

// ---------------------------------------------------------------------------
// LSTMBackward
//   inputs: x, h0, c0, w_ih, w_hh (as LSTM), y, gates, cells (LSTM outputs
//           0, 3, 4), dy [T, N, Hd], dh_T [N, Hd], dc_T [N, Hd]
//   outputs: dx, dh0, dc0, dw_ih, dw_hh, db [4*Hd] (the gradient of b_ih and
//            of b_hh alike).
//   fused (replicas = R): every input and output [R, ...].
// Walks the steps backwards keeping (dh, dc) for the state entering step t;
// the pre-activation gradients of all steps are kept so that dx, dw_ih,
// dw_hh and db are each one GEMM (or sum) over all T * N rows at the end.
class LstmBackwardOp : public OpDef {
 public:
  LstmBackwardOp() { DeclareLstmReplicas(DeclareAttrs()); }
  std::string name() const override { return kLstmBackward; }

  // The batch of every sequence and state; dw_ih, dw_hh and db partial sums.
  // The sequence: chunks from the last back (LstmSequenceSplit).
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return LstmSplits(attrs, in, out, true);
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    return PartReplicaCount(attrs, in[0], in_regions[0]);
  }

  // Chunk j (from the last): steps [j L, (j + 1) L), starting from the state
  // that entered it (h0, c0 for chunk 0, else row j L - 1 of y and cells)
  // and the state gradient chunk j + 1 hands back; the weight gradients
  // summed chunk by chunk, from the last.
  Status Expand(ExpandBuilder& b) const override {
    const int axis = ReplicaLead(b.attrs());
    const Shape& hs = b.type(b.input(1)).shape;
    const int64_t k = b.parts(), steps = b.type(b.input(0)).shape[axis] / k;
    ValueId dh = b.input(9), dc = b.input(10);
    std::vector<ValueId> dxs(static_cast<size_t>(k));
    std::vector<ValueId> weights(3, kNoValue);  // dw_ih, dw_hh, db
    for (int64_t j = k - 1; j >= 0; --j) {
      b.Pin(j);
      const std::string at = std::to_string(j);
      const int64_t first = j * steps, end = first + steps;
      auto rows = [&](int input, const std::string& name) {
        return SequenceRows(b, b.input(input), axis, first, end, name + at);
      };
      auto entering = [&](int input, const std::string& name) {
        const ValueId row = SequenceRows(b, b.input(input), axis, first - 1, first, name + at + "/row");
        return b.Emit("Reshape", {row}, AttrMap{{"shape", hs.dims()}}, name + at).at(0);
      };
      const ValueId h0 = j == 0 ? b.input(1) : entering(5, "h");
      const ValueId c0 = j == 0 ? b.input(2) : entering(7, "c");
      const std::vector<ValueId> o = b.Emit(kLstmBackward,
                                            {rows(0, "x"), h0, c0, b.input(3), b.input(4), rows(5, "y"),
                                             rows(6, "gates"), rows(7, "cells"), rows(8, "dy"), dh, dc},
                                            b.attrs(), "chunk" + at);
      dxs[static_cast<size_t>(j)] = o.at(0);
      dh = o.at(1);
      dc = o.at(2);
      const char* names[] = {"dw_ih", "dw_hh", "db"};
      for (size_t w = 0; w < 3; ++w)
        weights[w] = weights[w] == kNoValue ? o.at(3 + w)
                                            : b.Emit("Add", {weights[w], o.at(3 + w)}, {}, names[w] + at).at(0);
    }
    b.Pin(-1);
    b.SetOutput(0, JoinSequence(b, dxs, axis, "dx"));
    b.SetOutput(1, dh);
    b.SetOutput(2, dc);
    for (int w = 0; w < 3; ++w) b.SetOutput(3 + w, weights[static_cast<size_t>(w)]);
    return Status::Ok();
  }

  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs,
                                               const std::vector<TensorType>& in) const override {
    if (in.size() != 11)
      return InvalidArgument(kLstmBackward,
                             " takes (x, h0, c0, w_ih, w_hh, y, gates, cells, dy, dh_T, dc_T), got ", in.size(),
                             " inputs");
    LOOM_ASSIGN_OR_RETURN(const int64_t r, ReplicaCountAttr(kLstmBackward, attrs));
    const ReplicaShapes rs{r};
    LOOM_ASSIGN_OR_RETURN(const LstmDims n, CheckLstmCore(kLstmBackward, rs, in));
    const DType dt = in[0].dtype;
    const Shape seq = rs.Of({n.t, n.n, n.hd}), state = rs.Of({n.n, n.hd});
    LOOM_RETURN_IF_ERROR(ExpectShape(kLstmBackward, rs.Name("y [T, N, Hd]"), in[5], seq, dt));
    LOOM_RETURN_IF_ERROR(
        ExpectShape(kLstmBackward, rs.Name("gates [T, N, 4*Hd]"), in[6], rs.Of({n.t, n.n, n.gates()}), dt));
    LOOM_RETURN_IF_ERROR(ExpectShape(kLstmBackward, rs.Name("cells [T, N, Hd]"), in[7], seq, dt));
    LOOM_RETURN_IF_ERROR(ExpectShape(kLstmBackward, rs.Name("dy [T, N, Hd]"), in[8], seq, dt));
    LOOM_RETURN_IF_ERROR(ExpectShape(kLstmBackward, rs.Name("dh_T [N, Hd]"), in[9], state, dt));
    LOOM_RETURN_IF_ERROR(ExpectShape(kLstmBackward, rs.Name("dc_T [N, Hd]"), in[10], state, dt));
    return std::vector<TensorType>{in[0], in[1], in[2], in[3], in[4], {rs.Of({n.gates()}), dt}};
  }

  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const LstmDims n = LstmDimsOf(in[0].shape, in[1].shape);
    // Per hidden unit and step: tanh(c_t) again plus ~23 multiply/adds for
    // the gate and state gradients; per gate element one add for db.
    const double units = static_cast<double>(n.r * n.t * n.n * n.hd);
    c.flops = 2 * ProjectionFlops(n) + units * (kActivationFlops + 23 + 4);
    // The [T, N, 4Hd] pre-activation gradient scratch: written once, read by
    // the recurrent GEMM, dx, dw_ih, dw_hh and db.
    const double scratch = static_cast<double>(n.r * n.gates_stride() * DTypeSize(in[0].dtype));
    c.bytes_written += scratch;
    c.bytes_read += 5 * scratch;
    return c;
  }
};
LOOM_REGISTER_OP(LstmBackwardOp);

Status LstmBackwardKernel(KernelContext& ctx) {
  const Tensor &x_all = ctx.in(0), &h0_all = ctx.in(1);
  const LstmDims all = LstmDimsOf(x_all.shape(), h0_all.shape());
  const int64_t G = all.gates(), Hd = all.hd, rows = all.t * all.n;
  const int64_t group = ReplicasPerPass(all, DTypeSize(x_all.dtype()));
  // The pre-activation gradients of one group at a time.
  LOOM_ASSIGN_OR_RETURN(Tensor d_pre, Tensor::Empty({group, all.t, all.n, G}, x_all.dtype(), ctx.device));
  return DispatchFloat(x_all.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* dpre = d_pre.data<T>();  // [T, N, 4Hd] per replica of the group
    for (int64_t first = 0; first < all.r; first += group) {
      LstmDims n = all;  // this group's replicas
      n.r = std::min(group, all.r - first);
      auto in = [&](int i, int64_t stride) { return ctx.in(i).data<T>() + first * stride; };
      auto out = [&](int i, int64_t stride) { return ctx.out(i).data<T>() + first * stride; };
      const T* x = in(0, n.x_stride());
      const T* h0 = in(1, n.state_stride());
      const T* c0 = in(2, n.state_stride());
      const T* w_ih = in(3, n.w_ih_stride());
      const T* w_hh = in(4, n.w_hh_stride());
      const T* y = in(5, n.seq_stride());         // [T, N, Hd] per replica
      const T* gates = in(6, n.gates_stride());   // [T, N, 4Hd], activated
      const T* cells = in(7, n.seq_stride());     // [T, N, Hd]
      const T* dy = in(8, n.seq_stride());        // [T, N, Hd]
      // Running gradients of the state entering the current step; after
      // the loop they are dh0 and dc0.
      T* dh = out(1, n.state_stride());  // [N, Hd]
      T* dc = out(2, n.state_stride());  // [N, Hd]
      const size_t state_bytes = static_cast<size_t>(n.r * n.state_stride()) * sizeof(T);
      std::memcpy(dh, in(9, n.state_stride()), state_bytes);
      std::memcpy(dc, in(10, n.state_stride()), state_bytes);

      for (int64_t t = n.t - 1; t >= 0; --t) {
        const T* c_prev = t > 0 ? cells + (t - 1) * n.n * Hd : c0;
        const int64_t prev_stride = t > 0 ? n.seq_stride() : n.state_stride();
        const int64_t step = t * n.n;  // the step's first row in each replica
        ParallelRange(ctx.pool, n.r * n.n, [&](int64_t q0, int64_t q1) {
          for (int64_t q = q0; q < q1; ++q) {
            const int64_t rep = q / n.n, row = q % n.n;
            const T* gr = gates + rep * n.gates_stride() + (step + row) * G;
            T* dgr = dpre + rep * n.gates_stride() + (step + row) * G;
            const T* cr = cells + rep * n.seq_stride() + (step + row) * Hd;
            const T* dyr = dy + rep * n.seq_stride() + (step + row) * Hd;
            const T* cp = c_prev + rep * prev_stride + row * Hd;
            const T* dhr = dh + rep * n.state_stride() + row * Hd;
            T* dcr = dc + rep * n.state_stride() + row * Hd;
            LOOM_ELEMENTWISE_LOOP
            for (int64_t j = 0; j < Hd; ++j) {
              const T ig = gr[j], fg = gr[Hd + j], gg = gr[2 * Hd + j], og = gr[3 * Hd + j];
              const T tanh_c = Tanh(cr[j]);
              const T dh_t = dhr[j] + dyr[j];
              const T dc_t = dcr[j] + dh_t * og * (T(1) - tanh_c * tanh_c);
              dgr[j] = dc_t * gg * ig * (T(1) - ig);               // d pre_i
              dgr[Hd + j] = dc_t * cp[j] * fg * (T(1) - fg);       // d pre_f
              dgr[2 * Hd + j] = dc_t * ig * (T(1) - gg * gg);      // d pre_g
              dgr[3 * Hd + j] = dh_t * tanh_c * og * (T(1) - og);  // d pre_o
              dcr[j] = dc_t * fg;
            }
          }
        }, RowChunk(Hd));
        // dh_{t-1} = d pre_t W_hh: [N, 4Hd] x [4Hd, Hd].
        BatchedGemm<T>(false, false, n.r, n.n, Hd, G, T(1), dpre + step * G, G, n.gates_stride(), w_hh, Hd,
                       n.w_hh_stride(), T(0), dh, Hd, n.state_stride(), ctx.pool);
      }

      // dx = d pre W_ih: [T*N, 4Hd] x [4Hd, I].
      BatchedGemm<T>(false, false, n.r, rows, n.in, G, T(1), dpre, G, n.gates_stride(), w_ih, n.in,
                     n.w_ih_stride(), T(0), out(0, n.x_stride()), n.in, n.x_stride(), ctx.pool);
      // dw_ih = d pre^T x: [4Hd, T*N] x [T*N, I].
      BatchedGemm<T>(true, false, n.r, G, n.in, rows, T(1), dpre, G, n.gates_stride(), x, n.in, n.x_stride(), T(0),
                     out(3, n.w_ih_stride()), n.in, n.w_ih_stride(), ctx.pool);
      // dw_hh = sum_t d pre_t^T h_{t-1}: step 0 against h0, steps 1..
      // against y[0 .. T-2] as one [4Hd, (T-1)N] x [(T-1)N, Hd] product.
      T* dw_hh = out(4, n.w_hh_stride());
      if (n.t == 0) {
        std::fill(dw_hh, dw_hh + n.r * n.w_hh_stride(), T(0));
      } else {
        BatchedGemm<T>(true, false, n.r, G, Hd, n.n, T(1), dpre, G, n.gates_stride(), h0, Hd, n.state_stride(), T(0),
                       dw_hh, Hd, n.w_hh_stride(), ctx.pool);
        if (n.t > 1)
          BatchedGemm<T>(true, false, n.r, G, Hd, (n.t - 1) * n.n, T(1), dpre + n.n * G, G, n.gates_stride(), y, Hd,
                         n.seq_stride(), T(1), dw_hh, Hd, n.w_hh_stride(), ctx.pool);
      }
      // db = column sums of d pre, each in row order: blocks of columns
      // of every replica in parallel.
      T* db = out(5, G);
      constexpr int64_t kColumns = 256;
      const int64_t blocks_per_replica = (G + kColumns - 1) / kColumns;
      ParallelRange(ctx.pool, n.r * blocks_per_replica, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t rep = b / blocks_per_replica, j0 = b % blocks_per_replica * kColumns;
          const int64_t j1 = std::min(G, j0 + kColumns);
          T* sums = db + rep * G;
          const T* d = dpre + rep * n.gates_stride();
          std::fill(sums + j0, sums + j1, T(0));
          for (int64_t row = 0; row < rows; ++row) {
            LOOM_ELEMENTWISE_LOOP
            for (int64_t j = j0; j < j1; ++j) sums[j] += d[row * G + j];
          }
        }
      }, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, rows * kColumns)));
    }
  });
}
LOOM_REGISTER_KERNEL(kLstmBackward, DeviceType::kCpu, LstmBackwardKernel);

}  // namespace
}  // namespace loom
