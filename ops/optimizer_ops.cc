// Parameter updates and gradient clipping as graph ops, so the update step is
// part of the task graph (costed by the simulator, partitioned by the search)
// and runs on the parameter's device. Semantics follow torch.optim and
// torch.nn.utils.clip_grad_norm_; docs/optimizers.md has the formulas.
//
// Every update op has the signature
//   (param, grad, slot_1 .. slot_k, lr, step) -> (new_param, new_slot_1 .. new_slot_k)
// where the slots are optimizer state shaped like the param and k follows
// from the attributes (SGD without momentum keeps no buffer). Hyper-parameters
// that change during training (lr, the 1-based step count) are scalar inputs
// fed each step; the rest are attributes. Every op takes lr and step, used or
// not, so that the training graph wires all optimizers the same way.
//
// Fused replicas (horizontal fusion): with the int attribute replicas = R >= 1
// every tensor is [R, ...] and replica r owns the contiguous chunk r. The
// signature becomes
//   (param, grad, slot_1 .. slot_k, lr[R], step, active[R]) -> (new_param, new_slot_1 .. new_slot_k)
// each float attribute is one float or a list of R floats, and replica r is
// updated by the unfused kernel's own loop with its own scalars when
// active[r] != 0, and copied unchanged (frozen) when active[r] == 0.
// An unfused op may take a scalar `active` as a last input too (a
// loss-scaled step skips its update after an overflow the same way).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <type_traits>
#include <variant>

#include "ops/cpu_util.h"
#include "ops/op.h"
#include "ops/optimizer_replicas.h"

namespace loom {
namespace {

Status ExpectScalar(const TensorType& t, const std::string& what) {
  if (t.shape.numel() != 1) return InvalidArgument(what, " must be a scalar, got ", t.shape.ToString());
  return Status::Ok();
}

// `!(v >= lo)` so that NaN fails too.
Status ExpectAtLeast(const std::string& op, const std::string& attr, double v, double lo) {
  if (!(v >= lo)) return InvalidArgument(op, ": ", attr, " must be >= ", lo, ", got ", v);
  return Status::Ok();
}

Status ExpectInRange(const std::string& op, const std::string& attr, double v, double lo, double hi, bool hi_open) {
  if (!(v >= lo && (hi_open ? v < hi : v <= hi)))
    return InvalidArgument(op, ": ", attr, " must be in [", lo, ", ", hi, hi_open ? ")" : "]", ", got ", v);
  return Status::Ok();
}

// ---- Replicas (horizontal fusion) ----

// Reading `replicas` and per-replica float attributes (shared with the CUDA
// kernels).
using optimizer::FloatList;
using optimizer::ReplicaCount;
using optimizer::ReplicaFloat;
using optimizer::Replicas;

// The `replicas` attribute: 0 for an unfused op, else R >= 1. Every op of
// this file declares it; graph/training.cc sets it on fused ones.
AttrSchema& DeclareReplicas(AttrSchema& s) {
  return s.Default("replicas", int64_t{0}, "fused: R, and float attributes may hold one value per replica");
}

// A float hyper-parameter of an update op: one float, or (fused) one per replica.
AttrSchema& DeclareRate(AttrSchema& s, const char* name, double def, const char* doc) {
  return s.Default(name, AttrType::kFloatOrFloats, def, doc);
}

Status CheckReplicas(const std::string& op, const AttrMap& attrs) {
  const int64_t r = Replicas(attrs);
  if (r < 0) return InvalidArgument(op, ": replicas must be >= 1 (absent or 0 = unfused), got ", r);
  return Status::Ok();
}

// A list-valued float attribute needs replicas = R and exactly R values.
Status CheckFloatAttrs(const std::string& op, const AttrMap& attrs, const std::vector<std::string>& names) {
  const int64_t replicas = Replicas(attrs);
  for (const std::string& name : names) {
    auto list = FloatList(attrs, name);
    if (!list) continue;
    const auto len = static_cast<int64_t>(list->size());
    if (replicas == 0)
      return InvalidArgument(op, ": attribute ", name, " is a list of ", len,
                             " value(s); per-replica values need the attribute replicas");
    if (len != replicas)
      return InvalidArgument(op, ": attribute ", name, " must be one float or a list of replicas = ", replicas,
                             " floats, got a list of ", len);
  }
  return Status::Ok();
}

// The attribute's name in a message: "momentum", or "momentum[2]" for
// replica 2 of a fused op.
std::string AttrLabel(const std::string& name, const AttrMap& attrs, int64_t r) {
  return Replicas(attrs) > 0 ? name + "[" + std::to_string(r) + "]" : name;
}

// Fused tensors are [R, ...]: rank >= 1 and dim 0 == R.
Status ExpectReplicaDim(const TensorType& t, int64_t replicas, const std::string& what) {
  if (t.shape.rank() < 1 || t.shape[0] != replicas)
    return InvalidArgument(what, " must have dim 0 == replicas = ", replicas, ", got shape ", t.shape.ToString());
  return Status::Ok();
}

Status ExpectShape(const TensorType& t, const Shape& shape, const std::string& what) {
  if (t.shape != shape) return InvalidArgument(what, " must have shape ", shape.ToString(), ", got ", t.shape.ToString());
  return Status::Ok();
}

// The shared shape of every update op: attribute checks, slot count and
// per-element FLOPs are what differ.
class UpdateOpDef : public OpDef {
 public:
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const final {
    const std::string op = name();
    LOOM_RETURN_IF_ERROR(CheckReplicas(op, attrs));
    LOOM_RETURN_IF_ERROR(CheckFloatAttrs(op, attrs, FloatAttrs()));
    for (int64_t r = 0; r < ReplicaCount(attrs); ++r) LOOM_RETURN_IF_ERROR(CheckAttrs(attrs, r));
    const size_t slots = NumSlots(attrs);
    const int64_t replicas = Replicas(attrs);
    if (replicas == 0) {
      if (in.size() != 5 + slots)
        LOOM_RETURN_IF_ERROR(ExpectInputs(in, 4 + slots, op + " (param, grad, " + std::to_string(slots) +
                                                             " state tensor(s), lr, step[, active])"));
    } else {
      LOOM_RETURN_IF_ERROR(ExpectInputs(in, 5 + slots, op + " (param, grad, " + std::to_string(slots) +
                                                           " state tensor(s), lr[R], step, active[R]) with replicas = " +
                                                           std::to_string(replicas)));
    }
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], op + " param"));
    if (replicas > 0)
      for (size_t i = 0; i < 2 + slots; ++i)
        LOOM_RETURN_IF_ERROR(ExpectReplicaDim(
            in[i], replicas, op + (i == 0 ? " param" : i == 1 ? " grad" : " state input " + std::to_string(i))));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], op + " grad must match the param"));
    for (size_t i = 2; i < 2 + slots; ++i)
      LOOM_RETURN_IF_ERROR(
          ExpectSameType(in[0], in[i], op + " state input " + std::to_string(i) + " must match the param"));
    if (replicas == 0) {
      LOOM_RETURN_IF_ERROR(ExpectScalar(in[2 + slots], op + " lr"));
    } else {
      LOOM_RETURN_IF_ERROR(ExpectShape(in[2 + slots], Shape{replicas}, op + " lr (one per replica)"));
    }
    LOOM_RETURN_IF_ERROR(ExpectScalar(in[3 + slots], op + " step"));
    if (replicas > 0) {
      LOOM_RETURN_IF_ERROR(ExpectShape(in[4 + slots], Shape{replicas}, op + " active (one flag per replica)"));
    } else if (in.size() == 5 + slots) {
      LOOM_RETURN_IF_ERROR(ExpectScalar(in[4 + slots], op + " active"));
    }
    for (size_t i = 2 + slots; i < in.size(); ++i)
      if (in[i].dtype != in[0].dtype)
        return InvalidArgument(op, in.size() > 4 + slots ? ": lr, step and active" : ": lr and step",
                               " must have the param's dtype ", DTypeName(in[0].dtype), ", got ",
                               DTypeName(in[i].dtype));
    return std::vector<TensorType>(1 + slots, in[0]);
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const final {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = FlopsPerElement(a) * static_cast<double>(in[0].shape.numel());
    return c;
  }
  // The new param and slots may overwrite the old ones: every kernel is
  // element-wise (see the *Chunk functions).
  int InPlaceInput(const AttrMap&, int output) const final { return output == 0 ? 0 : output + 1; }
  // Element-wise, so any axis of the param, its gradient and slots, the
  // scalars read whole. Fused, a part along dim 0 is a run of replicas with
  // their own lr and active flags (PartAttrs gives it their attributes).
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const final {
    SplitRules rules;
    const size_t tensors = 2 + NumSlots(attrs);
    const bool fused = Replicas(attrs) > 0;
    for (int a = 0; a < in[0].shape.rank(); ++a) {
      if (in[0].shape[a] < 2) continue;
      DimSplit d = SplitAlong(a, in.size(), out.size());
      for (size_t i = tensors; i < in.size(); ++i) {
        const bool per_replica = fused && a == 0 && i != tensors + 1;  // lr and active, not step
        d.inputs[i].axis = per_replica ? 0 : -1;
      }
      rules.other.push_back(d);
    }
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const final {
    if (Replicas(attrs) == 0 || in_regions[0].shape()[0] == in[0].shape[0]) return attrs;
    const int64_t lo = in_regions[0].lo[0], hi = in_regions[0].hi[0];
    AttrMap part = attrs;
    part.Set("replicas", hi - lo);
    for (const std::string& name : FloatAttrs())
      if (auto list = FloatList(attrs, name))
        part.Set(name, std::vector<double>(list->begin() + lo, list->begin() + hi));
    return part;
  }

 protected:
  // The float attributes, each one float or (fused) a list of R floats.
  virtual std::vector<std::string> FloatAttrs() const = 0;
  // Range checks of replica r's values (r = 0 when unfused).
  virtual Status CheckAttrs(const AttrMap& attrs, int64_t r) const = 0;
  virtual size_t NumSlots(const AttrMap& attrs) const = 0;
  virtual double FlopsPerElement(const AttrMap& attrs) const = 0;
};

// One contiguous piece of an update: the whole tensors of an unfused op, or
// one replica's chunk of a fused one, with that piece's lr. The chunk
// functions below copy what their loops read into locals first: read
// through the chunk, every store to a T could have changed `lr` (a T
// member), so each element reloaded it and no loop vectorised (SGD's update
// ran at a fifth of the memory bandwidth, 17% of the MLP's step). For the
// same reason each loop is a [=] lambda: inside the Branch lambdas' [&]
// captures it would read those locals through references.
template <typename T>
struct UpdateChunk {
  int64_t n = 0;
  const T* p = nullptr;
  const T* g = nullptr;
  T* new_p = nullptr;
  std::vector<const T*> slot;
  std::vector<T*> new_slot;
  T lr = 0;
  double step = 0;
};

// Calls fn(std::true_type()) or fn(std::false_type()): the update loops
// below give each choice its own loop, since a condition (a store under it
// most of all) inside keeps a loop from vectorising.
template <typename Fn>
void Branch(bool flag, Fn&& fn) {
  if (flag) fn(std::true_type());
  else fn(std::false_type());
}

void CopyChunk(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

// One piece of an update kernel's work: a node's whole tensors (unfused) or
// one replica's chunk of them, with the node and replica it belongs to. A
// frozen piece (active[r] == 0, or an unfused op's scalar active == 0) gets a
// bit-exact copy of its param and slots.
template <typename T>
struct UpdatePiece {
  UpdateChunk<T> chunk;
  const KernelContext* ctx = nullptr;
  int64_t r = 0;
  bool frozen = false;
};

template <typename T>
void AppendPieces(const KernelContext& ctx, std::vector<UpdatePiece<T>>* pieces) {
  const size_t slots = ctx.outputs.size() - 1;
  const T* lr = ctx.in(static_cast<int>(2 + slots)).data<T>();
  const double step = static_cast<double>(ctx.in(static_cast<int>(3 + slots)).data<T>()[0]);
  const T* active = ctx.inputs.size() > 4 + slots ? ctx.in(static_cast<int>(4 + slots)).data<T>() : nullptr;
  const int64_t chunks = ReplicaCount(*ctx.attrs);
  const int64_t n = ctx.in(0).numel() / chunks;
  for (int64_t r = 0; r < chunks; ++r) {
    const int64_t at = r * n;
    UpdatePiece<T> piece;
    UpdateChunk<T>& c = piece.chunk;
    c.n = n;
    c.p = ctx.in(0).data<T>() + at;
    c.g = ctx.in(1).data<T>() + at;
    c.new_p = ctx.out(0).data<T>() + at;
    for (size_t k = 0; k < slots; ++k) {
      c.slot.push_back(ctx.in(static_cast<int>(2 + k)).data<T>() + at);
      c.new_slot.push_back(ctx.out(static_cast<int>(1 + k)).data<T>() + at);
    }
    c.lr = lr[r];
    c.step = step;
    piece.ctx = &ctx;
    piece.r = r;
    piece.frozen = active != nullptr && !(active[r] != T(0));  // a NaN flag updates, as `active[r] != 0`
    pieces->push_back(std::move(piece));
  }
}

// Elements [lo, hi) of a chunk.
template <typename T>
UpdateChunk<T> SliceChunk(const UpdateChunk<T>& c, int64_t lo, int64_t hi) {
  UpdateChunk<T> part = c;
  part.n = hi - lo;
  part.p += lo;
  part.g += lo;
  part.new_p += lo;
  for (size_t k = 0; k < c.slot.size(); ++k) {
    part.slot[k] += lo;
    part.new_slot[k] += lo;
  }
  return part;
}

// Runs update(chunk, ctx, r) over every piece of every node of the group,
// with the pieces laid end to end and split across the pool by one
// ParallelRange: a model's many small updates, each below ParallelRange's
// threshold on its own, share the threads in one hand-off instead of running
// one after another on the calling thread. update runs its slice inline (no
// pool). Every rule is element-wise, so the results do not depend on where
// the splits fall (nor on the thread count).
template <typename T, typename Update>
void ForEachPiece(std::vector<KernelContext>& group, Update&& update) {
  std::vector<UpdatePiece<T>> pieces;
  for (const KernelContext& ctx : group) AppendPieces(ctx, &pieces);
  std::vector<int64_t> begin(pieces.size() + 1, 0);
  for (size_t k = 0; k < pieces.size(); ++k) begin[k + 1] = begin[k] + pieces[k].chunk.n;
  ParallelRange(group[0].pool, begin.back(), [&](int64_t s, int64_t e) {
    size_t k = static_cast<size_t>(std::upper_bound(begin.begin(), begin.end(), s) - begin.begin()) - 1;
    for (; k < pieces.size() && begin[k] < e; ++k) {
      const int64_t lo = std::max(s, begin[k]) - begin[k], hi = std::min(e, begin[k + 1]) - begin[k];
      if (hi <= lo) continue;
      const UpdateChunk<T> part = SliceChunk(pieces[k].chunk, lo, hi);
      if (!pieces[k].frozen) {
        update(part, *pieces[k].ctx, pieces[k].r);
        continue;
      }
      const size_t bytes = static_cast<size_t>(part.n) * sizeof(T);
      CopyChunk(part.new_p, part.p, bytes);
      for (size_t j = 0; j < part.slot.size(); ++j) CopyChunk(part.new_slot[j], part.slot[j], bytes);
    }
  });
}

// ---- SGD ----

// SgdUpdate(param, grad, [momentum_buffer], lr, step). The buffer exists only
// when momentum != 0 (fused: in any replica); on step 1 it starts as the
// gradient itself, as in torch.optim.SGD.
struct SgdAttrs {
  double momentum, dampening, weight_decay;
  bool nesterov;
  explicit SgdAttrs(const AttrMap& a, int64_t r = 0)
      : momentum(ReplicaFloat(a, "momentum", r)),
        dampening(ReplicaFloat(a, "dampening", r)),
        weight_decay(ReplicaFloat(a, "weight_decay", r)),
        nesterov(a.Bool("nesterov")) {}
};

class SgdUpdateOp : public UpdateOpDef {
 public:
  SgdUpdateOp() {
    AttrSchema& s = DeclareReplicas(DeclareAttrs());
    DeclareRate(s, "momentum", 0, "momentum factor; > 0 adds the momentum buffer");
    DeclareRate(s, "dampening", 0, "dampening of the momentum");
    DeclareRate(s, "weight_decay", 0, "L2 penalty");
    s.Default("nesterov", false, "Nesterov momentum");
  }
  std::string name() const override { return "SgdUpdate"; }

 protected:
  std::vector<std::string> FloatAttrs() const override { return {"momentum", "dampening", "weight_decay"}; }
  Status CheckAttrs(const AttrMap& attrs, int64_t r) const override {
    SgdAttrs a(attrs, r);
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), AttrLabel("momentum", attrs, r), a.momentum, 0));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), AttrLabel("weight_decay", attrs, r), a.weight_decay, 0));
    if (a.nesterov && (a.momentum <= 0 || a.dampening != 0)) {
      if (Replicas(attrs) == 0) return InvalidArgument("SgdUpdate: nesterov needs momentum > 0 and dampening = 0");
      return InvalidArgument("SgdUpdate: nesterov needs momentum > 0 and dampening = 0 in every replica; replica ", r,
                             " has momentum ", a.momentum, " and dampening ", a.dampening);
    }
    return Status::Ok();
  }
  size_t NumSlots(const AttrMap& attrs) const override {
    for (int64_t r = 0; r < ReplicaCount(attrs); ++r)
      if (SgdAttrs(attrs, r).momentum != 0) return 1;
    return 0;
  }
  double FlopsPerElement(const AttrMap& attrs) const override { return NumSlots(attrs) ? 7.0 : 4.0; }
};
LOOM_REGISTER_OP(SgdUpdateOp);

// One piece of an SGD update; the momentum buffer is slot 0 when has_buf.
template <typename T>
void SgdChunk(const UpdateChunk<T>& u, const SgdAttrs& a, bool has_buf) {
  const T momentum = static_cast<T>(a.momentum), dampening = static_cast<T>(a.dampening);
  const T wd = static_cast<T>(a.weight_decay), lr = u.lr;
  const bool first_step = u.step <= 1, nesterov = a.nesterov;
  const T* p = u.p;
  const T* g = u.g;
  T* new_p = u.new_p;
  const T* buf = has_buf ? u.slot[0] : nullptr;
  T* new_buf = has_buf ? u.new_slot[0] : nullptr;
  Branch(has_buf, [&](auto with_buf) {
    const auto loop = [=](int64_t s, int64_t e) {
      LOOM_ELEMENTWISE_LOOP
      for (int64_t i = s; i < e; ++i) {
        const T d = g[i] + wd * p[i];
        if constexpr (with_buf) {
          const T b = first_step ? d : momentum * buf[i] + (T(1) - dampening) * d;
          new_buf[i] = b;
          new_p[i] = p[i] - lr * (nesterov ? d + momentum * b : b);
        } else {
          new_p[i] = p[i] - lr * d;
        }
      }
    };
    loop(0, u.n);
  });
}

Status SgdGroup(std::vector<KernelContext>& group) {
  return DispatchFloat(group[0].in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    ForEachPiece<T>(group, [&](const UpdateChunk<T>& u, const KernelContext& ctx, int64_t r) {
      const SgdAttrs a(*ctx.attrs, r);
      // A fused replica without momentum is plain SGD; its buffer chunk stays.
      const bool has_buf = Replicas(*ctx.attrs) == 0 ? !u.slot.empty() : a.momentum != 0;
      if (!has_buf && !u.slot.empty())
        CopyChunk(u.new_slot[0], u.slot[0], static_cast<size_t>(u.n) * sizeof(T));
      SgdChunk(u, a, has_buf);
    });
  });
}
LOOM_REGISTER_GROUP_KERNEL("SgdUpdate", DeviceType::kCpu, SgdGroup);

// ---- Adam, AdamW ----

// AdamUpdate(param, grad, exp_avg, exp_avg_sq, [max_exp_avg_sq], lr, step):
// the last slot only with amsgrad. decoupled = true is AdamW. `step` is the
// 1-based count of this update, for bias correction.
struct AdamAttrs {
  double beta1, beta2, eps, weight_decay;
  bool decoupled, amsgrad;
  explicit AdamAttrs(const AttrMap& a, int64_t r = 0)
      : beta1(ReplicaFloat(a, "beta1", r)),
        beta2(ReplicaFloat(a, "beta2", r)),
        eps(ReplicaFloat(a, "eps", r)),
        weight_decay(ReplicaFloat(a, "weight_decay", r)),
        decoupled(a.Bool("decoupled")),
        amsgrad(a.Bool("amsgrad")) {}
};

class AdamUpdateOp : public UpdateOpDef {
 public:
  AdamUpdateOp() {
    AttrSchema& s = DeclareReplicas(DeclareAttrs());
    DeclareRate(s, "beta1", 0.9, "decay of the first moment, in [0, 1)");
    DeclareRate(s, "beta2", 0.999, "decay of the second moment, in [0, 1)");
    DeclareRate(s, "eps", 1e-8, "added to the denominator");
    DeclareRate(s, "weight_decay", 0, "L2 penalty (decoupled: AdamW's)");
    s.Default("decoupled", false, "AdamW: decay the weights directly")
        .Default("amsgrad", false, "keep the maximum second moment (adds a slot)");
  }
  std::string name() const override { return "AdamUpdate"; }

 protected:
  std::vector<std::string> FloatAttrs() const override { return {"beta1", "beta2", "eps", "weight_decay"}; }
  Status CheckAttrs(const AttrMap& attrs, int64_t r) const override {
    AdamAttrs a(attrs, r);
    LOOM_RETURN_IF_ERROR(ExpectInRange(name(), AttrLabel("beta1", attrs, r), a.beta1, 0, 1, true));
    LOOM_RETURN_IF_ERROR(ExpectInRange(name(), AttrLabel("beta2", attrs, r), a.beta2, 0, 1, true));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), AttrLabel("eps", attrs, r), a.eps, 0));
    return ExpectAtLeast(name(), AttrLabel("weight_decay", attrs, r), a.weight_decay, 0);
  }
  size_t NumSlots(const AttrMap& attrs) const override { return AdamAttrs(attrs).amsgrad ? 3 : 2; }
  double FlopsPerElement(const AttrMap& attrs) const override { return NumSlots(attrs) == 3 ? 13.0 : 12.0; }
};
LOOM_REGISTER_OP(AdamUpdateOp);

template <typename T>
void AdamChunk(const UpdateChunk<T>& u, const AdamAttrs& a) {
  const T eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay), lr = u.lr;
  // Bias corrections in double: beta^step underflows gracefully there.
  const T bc1 = static_cast<T>(1.0 - std::pow(a.beta1, u.step));
  const T sqrt_bc2 = static_cast<T>(std::sqrt(1.0 - std::pow(a.beta2, u.step)));
  const T b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
  const T* p = u.p;
  const T* g = u.g;
  T* new_p = u.new_p;
  const T *m = u.slot[0], *v = u.slot[1], *v_max = a.amsgrad ? u.slot[2] : nullptr;
  T *new_m = u.new_slot[0], *new_v = u.new_slot[1], *new_v_max = a.amsgrad ? u.new_slot[2] : nullptr;
  auto update = [&](auto decoupled, auto amsgrad) {
    const auto loop = [=](int64_t s, int64_t e) {
      LOOM_ELEMENTWISE_LOOP
      for (int64_t i = s; i < e; ++i) {
        T pi = p[i];
        T gi = g[i];
        if constexpr (decoupled) pi -= lr * wd * pi;  // AdamW: decay the weight itself
        else gi += wd * pi;                           // Adam: L2 through the gradient
        const T mi = b1 * m[i] + (T(1) - b1) * gi;
        const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
        new_m[i] = mi;
        new_v[i] = vi;
        T v_used = vi;
        if constexpr (amsgrad) v_used = new_v_max[i] = std::max(v_max[i], vi);
        new_p[i] = pi - (lr / bc1) * mi / (std::sqrt(v_used) / sqrt_bc2 + eps);
      }
    };
    loop(0, u.n);
  };
  Branch(a.decoupled,
         [&](auto decoupled) { Branch(a.amsgrad, [&](auto amsgrad) { update(decoupled, amsgrad); }); });
}

Status AdamGroup(std::vector<KernelContext>& group) {
  return DispatchFloat(group[0].in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    ForEachPiece<T>(group, [&](const UpdateChunk<T>& u, const KernelContext& ctx, int64_t r) {
      AdamChunk(u, AdamAttrs(*ctx.attrs, r));
    });
  });
}
LOOM_REGISTER_GROUP_KERNEL("AdamUpdate", DeviceType::kCpu, AdamGroup);

// ---- Adadelta ----

// AdadeltaUpdate(param, grad, square_avg, acc_delta, lr, step); step unused.
struct AdadeltaAttrs {
  double rho, eps, weight_decay;
  explicit AdadeltaAttrs(const AttrMap& a, int64_t r = 0)
      : rho(ReplicaFloat(a, "rho", r)), eps(ReplicaFloat(a, "eps", r)), weight_decay(ReplicaFloat(a, "weight_decay", r)) {}
};

class AdadeltaUpdateOp : public UpdateOpDef {
 public:
  AdadeltaUpdateOp() {
    AttrSchema& s = DeclareReplicas(DeclareAttrs());
    DeclareRate(s, "rho", 0.9, "decay of the running averages, in [0, 1]");
    DeclareRate(s, "eps", 1e-6, "added inside the square roots");
    DeclareRate(s, "weight_decay", 0, "L2 penalty");
  }
  std::string name() const override { return "AdadeltaUpdate"; }

 protected:
  std::vector<std::string> FloatAttrs() const override { return {"rho", "eps", "weight_decay"}; }
  Status CheckAttrs(const AttrMap& attrs, int64_t r) const override {
    AdadeltaAttrs a(attrs, r);
    LOOM_RETURN_IF_ERROR(ExpectInRange(name(), AttrLabel("rho", attrs, r), a.rho, 0, 1, false));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), AttrLabel("eps", attrs, r), a.eps, 0));
    return ExpectAtLeast(name(), AttrLabel("weight_decay", attrs, r), a.weight_decay, 0);
  }
  size_t NumSlots(const AttrMap&) const override { return 2; }
  double FlopsPerElement(const AttrMap&) const override { return 16.0; }
};
LOOM_REGISTER_OP(AdadeltaUpdateOp);

template <typename T>
void AdadeltaChunk(const UpdateChunk<T>& u, const AdadeltaAttrs& a) {
  const T rho = static_cast<T>(a.rho), eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay), lr = u.lr;
  const T* p = u.p;
  const T* g = u.g;
  T* new_p = u.new_p;
  const T *square_avg = u.slot[0], *acc_delta = u.slot[1];
  T *new_square_avg = u.new_slot[0], *new_acc_delta = u.new_slot[1];
  const auto loop = [=](int64_t s, int64_t e) {
    LOOM_ELEMENTWISE_LOOP
    for (int64_t i = s; i < e; ++i) {
      const T gi = g[i] + wd * p[i];
      const T sq = rho * square_avg[i] + (T(1) - rho) * gi * gi;
      const T delta = std::sqrt(acc_delta[i] + eps) / std::sqrt(sq + eps) * gi;
      new_square_avg[i] = sq;
      new_acc_delta[i] = rho * acc_delta[i] + (T(1) - rho) * delta * delta;
      new_p[i] = p[i] - lr * delta;
    }
  };
  loop(0, u.n);
}

Status AdadeltaGroup(std::vector<KernelContext>& group) {
  return DispatchFloat(group[0].in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    ForEachPiece<T>(group, [&](const UpdateChunk<T>& u, const KernelContext& ctx, int64_t r) {
      AdadeltaChunk(u, AdadeltaAttrs(*ctx.attrs, r));
    });
  });
}
LOOM_REGISTER_GROUP_KERNEL("AdadeltaUpdate", DeviceType::kCpu, AdadeltaGroup);

// ---- RMSprop ----

// RmspropUpdate(param, grad, square_avg, [momentum_buffer], [grad_avg], lr,
// step): the momentum buffer only when momentum > 0 (fused: in any replica),
// the gradient average only when centered; step unused.
struct RmspropAttrs {
  double alpha, eps, weight_decay, momentum;
  bool centered;
  explicit RmspropAttrs(const AttrMap& a, int64_t r = 0)
      : alpha(ReplicaFloat(a, "alpha", r)),
        eps(ReplicaFloat(a, "eps", r)),
        weight_decay(ReplicaFloat(a, "weight_decay", r)),
        momentum(ReplicaFloat(a, "momentum", r)),
        centered(a.Bool("centered")) {}
};

bool RmspropHasBuffer(const AttrMap& attrs) {
  for (int64_t r = 0; r < ReplicaCount(attrs); ++r)
    if (RmspropAttrs(attrs, r).momentum > 0) return true;
  return false;
}

class RmspropUpdateOp : public UpdateOpDef {
 public:
  RmspropUpdateOp() {
    AttrSchema& s = DeclareReplicas(DeclareAttrs());
    DeclareRate(s, "alpha", 0.99, "decay of the squared-gradient average");
    DeclareRate(s, "eps", 1e-8, "added to the denominator");
    DeclareRate(s, "weight_decay", 0, "L2 penalty");
    DeclareRate(s, "momentum", 0, "momentum factor; > 0 adds the momentum buffer");
    s.Default("centered", false, "normalize by the variance estimate (adds the gradient average)");
  }
  std::string name() const override { return "RmspropUpdate"; }

 protected:
  std::vector<std::string> FloatAttrs() const override { return {"alpha", "eps", "weight_decay", "momentum"}; }
  Status CheckAttrs(const AttrMap& attrs, int64_t r) const override {
    RmspropAttrs a(attrs, r);
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), AttrLabel("alpha", attrs, r), a.alpha, 0));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), AttrLabel("eps", attrs, r), a.eps, 0));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), AttrLabel("weight_decay", attrs, r), a.weight_decay, 0));
    return ExpectAtLeast(name(), AttrLabel("momentum", attrs, r), a.momentum, 0);
  }
  size_t NumSlots(const AttrMap& attrs) const override {
    return 1 + (RmspropHasBuffer(attrs) ? 1 : 0) + (RmspropAttrs(attrs).centered ? 1 : 0);
  }
  double FlopsPerElement(const AttrMap& attrs) const override {
    return 4.0 + 3.0 * static_cast<double>(NumSlots(attrs));
  }
};
LOOM_REGISTER_OP(RmspropUpdateOp);

// One piece of an RMSprop update: square_avg is slot 0, the momentum buffer
// slot buf_slot (when has_buf), the gradient average slot avg_slot (when
// centered).
template <typename T>
void RmspropChunk(const UpdateChunk<T>& u, const RmspropAttrs& a, bool has_buf, size_t buf_slot, size_t avg_slot) {
  const T alpha = static_cast<T>(a.alpha), eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay);
  const T momentum = static_cast<T>(a.momentum), lr = u.lr;
  const T* p = u.p;
  const T* g = u.g;
  T* new_p = u.new_p;
  const T* square_avg = u.slot[0];
  T* new_square_avg = u.new_slot[0];
  const T* grad_avg = a.centered ? u.slot[avg_slot] : nullptr;
  T* new_grad_avg = a.centered ? u.new_slot[avg_slot] : nullptr;
  const T* buf = has_buf ? u.slot[buf_slot] : nullptr;
  T* new_buf = has_buf ? u.new_slot[buf_slot] : nullptr;
  auto update = [&](auto centered, auto with_buf) {
    const auto loop = [=](int64_t s, int64_t e) {
      LOOM_ELEMENTWISE_LOOP
      for (int64_t i = s; i < e; ++i) {
        const T gi = g[i] + wd * p[i];
        const T sq = alpha * square_avg[i] + (T(1) - alpha) * gi * gi;
        new_square_avg[i] = sq;
        T var = sq;
        if constexpr (centered) {
          const T ga = alpha * grad_avg[i] + (T(1) - alpha) * gi;
          new_grad_avg[i] = ga;
          // Non-negative in exact arithmetic; the clamp keeps rounding from
          // turning a vanishing variance into NaN.
          var = std::max(T(0), sq - ga * ga);
        }
        const T step_dir = gi / (std::sqrt(var) + eps);
        if constexpr (with_buf) {
          const T b = momentum * buf[i] + step_dir;
          new_buf[i] = b;
          new_p[i] = p[i] - lr * b;
        } else {
          new_p[i] = p[i] - lr * step_dir;
        }
      }
    };
    loop(0, u.n);
  };
  Branch(a.centered, [&](auto centered) { Branch(has_buf, [&](auto with_buf) { update(centered, with_buf); }); });
}

Status RmspropGroup(std::vector<KernelContext>& group) {
  return DispatchFloat(group[0].in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    // The group's nodes have equal attributes, so one slot layout.
    const bool op_has_buf = RmspropHasBuffer(*group[0].attrs);
    const size_t buf_slot = 1, avg_slot = op_has_buf ? 2 : 1;
    ForEachPiece<T>(group, [&](const UpdateChunk<T>& u, const KernelContext& ctx, int64_t r) {
      const RmspropAttrs a(*ctx.attrs, r);
      // A fused replica without momentum leaves its buffer chunk as it is.
      const bool has_buf = a.momentum > 0;
      if (op_has_buf && !has_buf)
        CopyChunk(u.new_slot[buf_slot], u.slot[buf_slot], static_cast<size_t>(u.n) * sizeof(T));
      RmspropChunk(u, a, has_buf, buf_slot, avg_slot);
    });
  });
}
LOOM_REGISTER_GROUP_KERNEL("RmspropUpdate", DeviceType::kCpu, RmspropGroup);

// ---- Gradient clipping by global norm ----

// SquaredNorm(x_1, ..., x_n) -> scalar sum of squares of every element of
// every input (any shapes, one float dtype). Partial results of several
// SquaredNorm nodes add up, so the reduction can be split across devices.
// With replicas = R every input is [R, ...] and the output is [R]: entry r
// sums replica r's chunks only.
class SquaredNormOp : public OpDef {
 public:
  SquaredNormOp() { DeclareReplicas(DeclareAttrs()); }
  std::string name() const override { return "SquaredNorm"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs,
                                               const std::vector<TensorType>& in) const override {
    if (in.empty()) return InvalidArgument("SquaredNorm needs at least one input");
    LOOM_RETURN_IF_ERROR(CheckReplicas("SquaredNorm", attrs));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "SquaredNorm input 0"));
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i].dtype != in[0].dtype)
        return InvalidArgument("SquaredNorm: input ", i, " is ", DTypeName(in[i].dtype), ", input 0 is ",
                               DTypeName(in[0].dtype));
    const int64_t replicas = Replicas(attrs);
    if (replicas == 0) return std::vector<TensorType>{{Shape{}, in[0].dtype}};
    for (size_t i = 0; i < in.size(); ++i)
      LOOM_RETURN_IF_ERROR(ExpectReplicaDim(in[i], replicas, "SquaredNorm input " + std::to_string(i)));
    return std::vector<TensorType>{{Shape{replicas}, in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    for (const TensorType& t : in) c.flops += 2.0 * static_cast<double>(t.shape.numel());
    return c;
  }
  // Fused: a run of replicas (dim 0 of every input and of the output).
  // Unfused: a part of dim 0 of every input, each part a partial sum.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>&) const override {
    SplitRules rules;
    for (const TensorType& t : in)
      if (t.shape.rank() == 0) return rules;
    DimSplit d = SplitAlong(0, in.size(), 1);
    if (Replicas(attrs) == 0) {
      d.outputs[0].axis = -1;
      d.partial_sums = true;
    }
    rules.other.push_back(d);
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&, const std::vector<TensorType>&,
                              const std::vector<Region>&, const std::vector<Region>& out) const override {
    AttrMap part = attrs;
    if (Replicas(attrs) > 0) part.Set("replicas", out[0].shape()[0]);
    return part;
  }
};
LOOM_REGISTER_OP(SquaredNormOp);

// The sum of squares of p[0, n) in double, in 32 lanes (lane l takes the
// elements l mod 32), then the tail, then the lanes in order: a fixed
// order, so the result is an exact function of the data. The lanes are
// eight Double4s: as four 64-byte vectors they went through the stack on
// AVX2 (7 GB/s on one core). Eight chains keep up with the loads (an FMA
// waits 4 cycles for the last).
template <typename T>
double SquaresSum(const T* p, int64_t n) {
  constexpr int kVectors = 8, kLanes = kVectors * 4;
  Double4 part[kVectors] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 8
    for (int k = 0; k < kVectors; ++k) {
      Double4 v;
      WidenFour(p + i + k * 4, &v);
      part[k] += v * v;
    }
  }
  double sum = 0;
  for (; i < n; ++i) sum += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  for (int k = 0; k < kVectors; ++k)
    for (int l = 0; l < 4; ++l) sum += part[k][l];
  return sum;
}

// Sums of squares in double over fixed blocks of every (replica, input)
// chunk, all blocks in one parallel pass (a fused step has R x inputs
// chunks, most of them small); each chunk's blocks are added in block
// order and the chunks in input order, so the result does not depend on
// the thread count.
LOOM_REGISTER_KERNEL("SquaredNorm", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    constexpr int64_t kBlock = 1 << 14;
    // Unfused: one sum over whole tensors; fused: one per replica's chunks,
    // each exactly the unfused sum of those chunks.
    const int64_t sums = std::max<int64_t>(1, Replicas(*ctx.attrs));
    struct Block {
      const T* x;
      int64_t n;
    };
    std::vector<Block> blocks;
    std::vector<size_t> chunk_end;  // per (replica, input): one past its last block
    for (int64_t r = 0; r < sums; ++r)
      for (const Tensor* t : ctx.inputs) {
        const int64_t n = t->numel() / sums;
        const T* x = t->data<T>() + r * n;
        for (int64_t b = 0; b < n; b += kBlock) blocks.push_back({x + b, std::min(kBlock, n - b)});
        chunk_end.push_back(blocks.size());
      }
    std::vector<double> partial(blocks.size(), 0.0);
    ParallelRange(
        ctx.pool, static_cast<int64_t>(blocks.size()),
        [&](int64_t s, int64_t e) {
          for (int64_t b = s; b < e; ++b) {
            const Block& block = blocks[static_cast<size_t>(b)];
            partial[static_cast<size_t>(b)] = SquaresSum(block.x, block.n);
          }
        },
        /*min_chunk=*/2);
    size_t first = 0, chunk = 0;
    for (int64_t r = 0; r < sums; ++r) {
      double total = 0;
      for (size_t i = 0; i < ctx.inputs.size(); ++i, ++chunk) {
        total += std::accumulate(partial.begin() + static_cast<std::ptrdiff_t>(first),
                                 partial.begin() + static_cast<std::ptrdiff_t>(chunk_end[chunk]), 0.0);
        first = chunk_end[chunk];
      }
      ctx.out(0).data<T>()[r] = static_cast<T>(total);
    }
  });
});

// ClipScale(total_norm) -> min(1, max_norm / (total_norm + 1e-6)), the factor
// torch.nn.utils.clip_grad_norm_ multiplies every gradient by. A NaN norm
// gives a NaN factor, as in torch (error_if_nonfinite = False). Unfused the
// norm is a scalar; with replicas = R it is [R] (one norm per replica), the
// output has its shape and max_norm is one float or a list of R floats.
constexpr double kClipEps = 1e-6;

class ClipScaleOp : public OpDef {
 public:
  ClipScaleOp() {
    DeclareReplicas(DeclareAttrs())
        .Required("max_norm", AttrType::kFloatOrFloats, "the gradient norm clipped to, > 0 (fused: one per replica)");
  }
  std::string name() const override { return "ClipScale"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "ClipScale (total_norm)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "ClipScale total_norm"));
    LOOM_RETURN_IF_ERROR(CheckReplicas("ClipScale", attrs));
    const int64_t replicas = Replicas(attrs);
    if (replicas == 0 && in[0].shape.numel() != 1)
      return InvalidArgument("ClipScale total_norm must be a scalar, got ", in[0].shape.ToString(),
                             " (per-replica norms [R] need the attribute replicas = R)");
    if (replicas > 0)
      LOOM_RETURN_IF_ERROR(ExpectShape(in[0], Shape{replicas}, "ClipScale total_norm (one norm per replica)"));
    LOOM_RETURN_IF_ERROR(CheckFloatAttrs("ClipScale", attrs, {"max_norm"}));
    for (int64_t r = 0; r < ReplicaCount(attrs); ++r) {
      const double max_norm = ReplicaFloat(attrs, "max_norm", r);
      if (!(max_norm > 0))
        return InvalidArgument("ClipScale: ", AttrLabel("max_norm", attrs, r), " must be > 0, got ", max_norm);
    }
    return std::vector<TensorType>{{replicas == 0 ? Shape{} : in[0].shape, in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 3.0 * static_cast<double>(out[0].shape.numel());
    return c;
  }
};
LOOM_REGISTER_OP(ClipScaleOp);

LOOM_REGISTER_KERNEL("ClipScale", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* norm = ctx.in(0).data<T>();
    T* out = ctx.out(0).data<T>();
    for (int64_t r = 0; r < ReplicaCount(*ctx.attrs); ++r) {
      const double coef = ReplicaFloat(*ctx.attrs, "max_norm", r) / (static_cast<double>(norm[r]) + kClipEps);
      out[r] = static_cast<T>(coef > 1 ? 1.0 : coef);  // NaN stays NaN
    }
  });
});

// ---- Divergence detection ----

// IsFinite(x) -> 1 where x is finite, 0 where it is NaN or +-inf (same shape
// and dtype). Fused training freezes a diverged replica with
//   active = IsFinite(squared grad norm[R]) * IsFinite(loss[R]) * mask[R].
// No gradient: it only feeds the update ops' `active` input.
class IsFiniteOp : public OpDef {
 public:
  IsFiniteOp() { DeclareAttrs(); }
  std::string name() const override { return "IsFinite"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "IsFinite (x)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "IsFinite x"));
    return std::vector<TensorType>{in[0]};
  }
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    rules.other = ElementwiseAxes(in, out);
    return rules;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = static_cast<double>(in[0].shape.numel());
    return c;
  }
};
LOOM_REGISTER_OP(IsFiniteOp);

LOOM_REGISTER_KERNEL("IsFinite", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = ctx.in(0).data<T>();
    T* y = ctx.out(0).data<T>();
    ParallelRange(ctx.pool, ctx.in(0).numel(), [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = std::isfinite(x[i]) ? T(1) : T(0);
    });
  });
});

}  // namespace
}  // namespace loom
