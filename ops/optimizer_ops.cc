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
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/cpu_util.h"
#include "ops/op.h"

namespace loom {
namespace {

Status ExpectScalar(const TensorType& t, const std::string& what) {
  if (t.shape.numel() != 1) return InvalidArgument(what, " must be a scalar, got ", t.shape.ToString());
  return Status::Ok();
}

// `!(v >= lo)` so that NaN fails too.
Status ExpectAtLeast(const std::string& op, const char* attr, double v, double lo) {
  if (!(v >= lo)) return InvalidArgument(op, ": ", attr, " must be >= ", lo, ", got ", v);
  return Status::Ok();
}

Status ExpectInRange(const std::string& op, const char* attr, double v, double lo, double hi, bool hi_open) {
  if (!(v >= lo && (hi_open ? v < hi : v <= hi)))
    return InvalidArgument(op, ": ", attr, " must be in [", lo, ", ", hi, hi_open ? ")" : "]", ", got ", v);
  return Status::Ok();
}

// The shared shape of every update op: attribute checks, slot count and
// per-element FLOPs are what differ.
class UpdateOpDef : public OpDef {
 public:
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const final {
    LOOM_RETURN_IF_ERROR(CheckAttrs(attrs));
    const size_t slots = NumSlots(attrs);
    const std::string op = name();
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 4 + slots, op + " (param, grad, " + std::to_string(slots) +
                                                         " state tensor(s), lr, step)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], op + " param"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], op + " grad must match the param"));
    for (size_t i = 2; i < 2 + slots; ++i)
      LOOM_RETURN_IF_ERROR(
          ExpectSameType(in[0], in[i], op + " state input " + std::to_string(i) + " must match the param"));
    LOOM_RETURN_IF_ERROR(ExpectScalar(in[2 + slots], op + " lr"));
    LOOM_RETURN_IF_ERROR(ExpectScalar(in[3 + slots], op + " step"));
    for (size_t i = 2 + slots; i < in.size(); ++i)
      if (in[i].dtype != in[0].dtype)
        return InvalidArgument(op, ": lr and step must have the param's dtype ", DTypeName(in[0].dtype), ", got ",
                               DTypeName(in[i].dtype));
    return std::vector<TensorType>(1 + slots, in[0]);
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const final {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = FlopsPerElement(a) * static_cast<double>(in[0].shape.numel());
    return c;
  }

 protected:
  virtual Status CheckAttrs(const AttrMap& attrs) const = 0;
  virtual size_t NumSlots(const AttrMap& attrs) const = 0;
  virtual double FlopsPerElement(const AttrMap& attrs) const = 0;
};

// What every update kernel reads: the param, its gradient, the slots (in and
// out), lr and step.
template <typename T>
struct UpdateArgs {
  explicit UpdateArgs(KernelContext& ctx)
      : n(ctx.in(0).numel()), p(ctx.in(0).data<T>()), g(ctx.in(1).data<T>()), new_p(ctx.out(0).data<T>()) {
    const size_t slots = ctx.outputs.size() - 1;
    for (size_t k = 0; k < slots; ++k) {
      slot.push_back(ctx.in(static_cast<int>(2 + k)).data<T>());
      new_slot.push_back(ctx.out(static_cast<int>(1 + k)).data<T>());
    }
    lr = ctx.in(static_cast<int>(2 + slots)).data<T>()[0];
    step = static_cast<double>(ctx.in(static_cast<int>(3 + slots)).data<T>()[0]);
  }
  int64_t n;
  const T* p;
  const T* g;
  T* new_p;
  std::vector<const T*> slot;
  std::vector<T*> new_slot;
  T lr;
  double step;
};

// ---- SGD ----

// SgdUpdate(param, grad, [momentum_buffer], lr, step). The buffer exists only
// when momentum != 0; on step 1 it starts as the gradient itself, as in
// torch.optim.SGD.
struct SgdAttrs {
  double momentum, dampening, weight_decay;
  bool nesterov;
  explicit SgdAttrs(const AttrMap& a)
      : momentum(a.Float("momentum")),
        dampening(a.Float("dampening")),
        weight_decay(a.Float("weight_decay")),
        nesterov(a.Bool("nesterov")) {}
};

class SgdUpdateOp : public UpdateOpDef {
 public:
  std::string name() const override { return "SgdUpdate"; }

 protected:
  Status CheckAttrs(const AttrMap& attrs) const override {
    SgdAttrs a(attrs);
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), "momentum", a.momentum, 0));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), "weight_decay", a.weight_decay, 0));
    if (a.nesterov && (a.momentum <= 0 || a.dampening != 0))
      return InvalidArgument("SgdUpdate: nesterov needs momentum > 0 and dampening = 0");
    return Status::Ok();
  }
  size_t NumSlots(const AttrMap& attrs) const override { return SgdAttrs(attrs).momentum != 0 ? 1 : 0; }
  double FlopsPerElement(const AttrMap& attrs) const override { return NumSlots(attrs) ? 7.0 : 4.0; }
};
LOOM_REGISTER_OP(SgdUpdateOp);

LOOM_REGISTER_KERNEL("SgdUpdate", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const UpdateArgs<T> u(ctx);
    const SgdAttrs a(*ctx.attrs);
    const T momentum = static_cast<T>(a.momentum), dampening = static_cast<T>(a.dampening);
    const T wd = static_cast<T>(a.weight_decay);
    const bool has_buf = !u.slot.empty();
    const bool first_step = u.step <= 1;
    ParallelRange(ctx.pool, u.n, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        T d = u.g[i] + wd * u.p[i];
        if (has_buf) {
          const T b = first_step ? d : momentum * u.slot[0][i] + (T(1) - dampening) * d;
          u.new_slot[0][i] = b;
          d = a.nesterov ? d + momentum * b : b;
        }
        u.new_p[i] = u.p[i] - u.lr * d;
      }
    });
  });
});

// ---- Adam, AdamW ----

// AdamUpdate(param, grad, exp_avg, exp_avg_sq, [max_exp_avg_sq], lr, step):
// the last slot only with amsgrad. decoupled = true is AdamW. `step` is the
// 1-based count of this update, for bias correction.
struct AdamAttrs {
  double beta1, beta2, eps, weight_decay;
  bool decoupled, amsgrad;
  explicit AdamAttrs(const AttrMap& a)
      : beta1(a.Float("beta1", 0.9)),
        beta2(a.Float("beta2", 0.999)),
        eps(a.Float("eps", 1e-8)),
        weight_decay(a.Float("weight_decay")),
        decoupled(a.Bool("decoupled")),
        amsgrad(a.Bool("amsgrad")) {}
};

class AdamUpdateOp : public UpdateOpDef {
 public:
  std::string name() const override { return "AdamUpdate"; }

 protected:
  Status CheckAttrs(const AttrMap& attrs) const override {
    AdamAttrs a(attrs);
    LOOM_RETURN_IF_ERROR(ExpectInRange(name(), "beta1", a.beta1, 0, 1, true));
    LOOM_RETURN_IF_ERROR(ExpectInRange(name(), "beta2", a.beta2, 0, 1, true));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), "eps", a.eps, 0));
    return ExpectAtLeast(name(), "weight_decay", a.weight_decay, 0);
  }
  size_t NumSlots(const AttrMap& attrs) const override { return AdamAttrs(attrs).amsgrad ? 3 : 2; }
  double FlopsPerElement(const AttrMap& attrs) const override { return NumSlots(attrs) == 3 ? 13.0 : 12.0; }
};
LOOM_REGISTER_OP(AdamUpdateOp);

LOOM_REGISTER_KERNEL("AdamUpdate", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const UpdateArgs<T> u(ctx);
    const AdamAttrs a(*ctx.attrs);
    const T eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay);
    // Bias corrections in double: beta^step underflows gracefully there.
    const T bc1 = static_cast<T>(1.0 - std::pow(a.beta1, u.step));
    const T sqrt_bc2 = static_cast<T>(std::sqrt(1.0 - std::pow(a.beta2, u.step)));
    const T b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
    ParallelRange(ctx.pool, u.n, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        T pi = u.p[i];
        T gi = u.g[i];
        if (a.decoupled) pi -= u.lr * wd * pi;  // AdamW: decay the weight itself
        else gi += wd * pi;                     // Adam: L2 through the gradient
        const T mi = b1 * u.slot[0][i] + (T(1) - b1) * gi;
        const T vi = b2 * u.slot[1][i] + (T(1) - b2) * gi * gi;
        u.new_slot[0][i] = mi;
        u.new_slot[1][i] = vi;
        T v_used = vi;
        if (a.amsgrad) v_used = u.new_slot[2][i] = std::max(u.slot[2][i], vi);
        u.new_p[i] = pi - (u.lr / bc1) * mi / (std::sqrt(v_used) / sqrt_bc2 + eps);
      }
    });
  });
});

// ---- Adadelta ----

// AdadeltaUpdate(param, grad, square_avg, acc_delta, lr, step); step unused.
struct AdadeltaAttrs {
  double rho, eps, weight_decay;
  explicit AdadeltaAttrs(const AttrMap& a)
      : rho(a.Float("rho", 0.9)), eps(a.Float("eps", 1e-6)), weight_decay(a.Float("weight_decay")) {}
};

class AdadeltaUpdateOp : public UpdateOpDef {
 public:
  std::string name() const override { return "AdadeltaUpdate"; }

 protected:
  Status CheckAttrs(const AttrMap& attrs) const override {
    AdadeltaAttrs a(attrs);
    LOOM_RETURN_IF_ERROR(ExpectInRange(name(), "rho", a.rho, 0, 1, false));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), "eps", a.eps, 0));
    return ExpectAtLeast(name(), "weight_decay", a.weight_decay, 0);
  }
  size_t NumSlots(const AttrMap&) const override { return 2; }
  double FlopsPerElement(const AttrMap&) const override { return 16.0; }
};
LOOM_REGISTER_OP(AdadeltaUpdateOp);

LOOM_REGISTER_KERNEL("AdadeltaUpdate", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const UpdateArgs<T> u(ctx);
    const AdadeltaAttrs a(*ctx.attrs);
    const T rho = static_cast<T>(a.rho), eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay);
    ParallelRange(ctx.pool, u.n, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const T gi = u.g[i] + wd * u.p[i];
        const T sq = rho * u.slot[0][i] + (T(1) - rho) * gi * gi;
        const T delta = std::sqrt(u.slot[1][i] + eps) / std::sqrt(sq + eps) * gi;
        u.new_slot[0][i] = sq;
        u.new_slot[1][i] = rho * u.slot[1][i] + (T(1) - rho) * delta * delta;
        u.new_p[i] = u.p[i] - u.lr * delta;
      }
    });
  });
});

// ---- RMSprop ----

// RmspropUpdate(param, grad, square_avg, [momentum_buffer], [grad_avg], lr,
// step): the momentum buffer only when momentum > 0, the gradient average
// only when centered; step unused.
struct RmspropAttrs {
  double alpha, eps, weight_decay, momentum;
  bool centered;
  explicit RmspropAttrs(const AttrMap& a)
      : alpha(a.Float("alpha", 0.99)),
        eps(a.Float("eps", 1e-8)),
        weight_decay(a.Float("weight_decay")),
        momentum(a.Float("momentum")),
        centered(a.Bool("centered")) {}
};

class RmspropUpdateOp : public UpdateOpDef {
 public:
  std::string name() const override { return "RmspropUpdate"; }

 protected:
  Status CheckAttrs(const AttrMap& attrs) const override {
    RmspropAttrs a(attrs);
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), "alpha", a.alpha, 0));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), "eps", a.eps, 0));
    LOOM_RETURN_IF_ERROR(ExpectAtLeast(name(), "weight_decay", a.weight_decay, 0));
    return ExpectAtLeast(name(), "momentum", a.momentum, 0);
  }
  size_t NumSlots(const AttrMap& attrs) const override {
    RmspropAttrs a(attrs);
    return 1 + (a.momentum > 0 ? 1 : 0) + (a.centered ? 1 : 0);
  }
  double FlopsPerElement(const AttrMap& attrs) const override {
    return 4.0 + 3.0 * static_cast<double>(NumSlots(attrs));
  }
};
LOOM_REGISTER_OP(RmspropUpdateOp);

LOOM_REGISTER_KERNEL("RmspropUpdate", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const UpdateArgs<T> u(ctx);
    const RmspropAttrs a(*ctx.attrs);
    const T alpha = static_cast<T>(a.alpha), eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay);
    const T momentum = static_cast<T>(a.momentum);
    const bool has_buf = a.momentum > 0;
    const size_t buf_slot = 1, avg_slot = has_buf ? 2 : 1;
    ParallelRange(ctx.pool, u.n, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const T gi = u.g[i] + wd * u.p[i];
        const T sq = alpha * u.slot[0][i] + (T(1) - alpha) * gi * gi;
        u.new_slot[0][i] = sq;
        T var = sq;
        if (a.centered) {
          const T ga = alpha * u.slot[avg_slot][i] + (T(1) - alpha) * gi;
          u.new_slot[avg_slot][i] = ga;
          // Non-negative in exact arithmetic; the clamp keeps rounding from
          // turning a vanishing variance into NaN.
          var = std::max(T(0), sq - ga * ga);
        }
        const T step_dir = gi / (std::sqrt(var) + eps);
        if (has_buf) {
          const T b = momentum * u.slot[buf_slot][i] + step_dir;
          u.new_slot[buf_slot][i] = b;
          u.new_p[i] = u.p[i] - u.lr * b;
        } else {
          u.new_p[i] = u.p[i] - u.lr * step_dir;
        }
      }
    });
  });
});

// ---- Gradient clipping by global norm ----

// SquaredNorm(x_1, ..., x_n) -> scalar sum of squares of every element of
// every input (any shapes, one float dtype). Partial results of several
// SquaredNorm nodes add up, so the reduction can be split across devices.
class SquaredNormOp : public OpDef {
 public:
  std::string name() const override { return "SquaredNorm"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    if (in.empty()) return InvalidArgument("SquaredNorm needs at least one input");
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "SquaredNorm input 0"));
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i].dtype != in[0].dtype)
        return InvalidArgument("SquaredNorm: input ", i, " is ", DTypeName(in[i].dtype), ", input 0 is ",
                               DTypeName(in[0].dtype));
    return std::vector<TensorType>{{Shape{}, in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    for (const TensorType& t : in) c.flops += 2.0 * static_cast<double>(t.shape.numel());
    return c;
  }
};
LOOM_REGISTER_OP(SquaredNormOp);

// Sums in double over fixed blocks added in block order, so the result does
// not depend on the thread count.
template <typename T>
double SumOfSquares(const T* x, int64_t n, ThreadPool* pool) {
  constexpr int64_t kBlock = 1 << 14;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
  ParallelRange(
      pool, blocks,
      [&](int64_t s, int64_t e) {
        for (int64_t b = s; b < e; ++b) {
          double acc = 0;
          for (int64_t i = b * kBlock, end = std::min(n, i + kBlock); i < end; ++i)
            acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
          partial[b] = acc;
        }
      },
      /*min_chunk=*/2);
  return std::accumulate(partial.begin(), partial.end(), 0.0);
}

LOOM_REGISTER_KERNEL("SquaredNorm", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    double total = 0;
    for (const Tensor* t : ctx.inputs) total += SumOfSquares(t->data<T>(), t->numel(), ctx.pool);
    ctx.out(0).data<T>()[0] = static_cast<T>(total);
  });
});

// ClipScale(total_norm) -> scalar min(1, max_norm / (total_norm + 1e-6)), the
// factor torch.nn.utils.clip_grad_norm_ multiplies every gradient by. A NaN
// norm gives a NaN factor, as in torch (error_if_nonfinite = False).
constexpr double kClipEps = 1e-6;

class ClipScaleOp : public OpDef {
 public:
  std::string name() const override { return "ClipScale"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "ClipScale (total_norm)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "ClipScale total_norm"));
    LOOM_RETURN_IF_ERROR(ExpectScalar(in[0], "ClipScale total_norm"));
    const double max_norm = attrs.Float("max_norm");
    if (!(max_norm > 0)) return InvalidArgument("ClipScale: max_norm must be > 0, got ", max_norm);
    return std::vector<TensorType>{{Shape{}, in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 3;
    return c;
  }
};
LOOM_REGISTER_OP(ClipScaleOp);

LOOM_REGISTER_KERNEL("ClipScale", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const double coef = ctx.attrs->Float("max_norm") / (static_cast<double>(ctx.in(0).data<T>()[0]) + kClipEps);
    ctx.out(0).data<T>()[0] = static_cast<T>(coef > 1 ? 1.0 : coef);  // NaN stays NaN
  });
});

}  // namespace
}  // namespace loom
