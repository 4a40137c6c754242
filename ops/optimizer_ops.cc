// Parameter updates as graph ops, so the update step is part of the task
// graph (costed by the simulator, partitioned by the search) and runs on the
// parameter's device. Hyper-parameters that change during training (lr, the
// step count for bias correction) are scalar inputs fed each step; the rest
// are attributes. Semantics follow torch.optim.
#include <cmath>

#include "ops/cpu_util.h"
#include "ops/op.h"

namespace loom {
namespace {

Status ExpectScalar(const TensorType& t, const std::string& what) {
  if (t.shape.numel() != 1) return InvalidArgument(what, " must be a scalar, got ", t.shape.ToString());
  return Status::Ok();
}

// Inputs: param, grad, then `state` tensors shaped like param, then scalars.
Status CheckUpdateInputs(const std::string& op, const std::vector<TensorType>& in, size_t state, size_t scalars,
                         const char* scalar_names) {
  LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2 + state + scalars, op));
  LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], op + " param"));
  for (size_t i = 1; i < 2 + state; ++i)
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[i], op + " input " + std::to_string(i) + " must match the param"));
  for (size_t i = 2 + state; i < in.size(); ++i)
    LOOM_RETURN_IF_ERROR(ExpectScalar(in[i], op + " " + scalar_names));
  return Status::Ok();
}

// SgdUpdate(param, grad, momentum_buf, lr, step) -> (new_param, new_momentum_buf)
// attrs: momentum, dampening, weight_decay, nesterov. On step 1 the buffer
// starts as the gradient itself, as torch.optim.SGD does.
class SgdUpdateOp : public OpDef {
 public:
  std::string name() const override { return "SgdUpdate"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(CheckUpdateInputs("SgdUpdate", in, 1, 2, "lr and step"));
    if (attrs.Float("momentum") < 0) return InvalidArgument("SgdUpdate: momentum must be >= 0");
    if (attrs.Bool("nesterov") && (attrs.Float("momentum") <= 0 || attrs.Float("dampening") != 0))
      return InvalidArgument("SgdUpdate: nesterov needs momentum > 0 and dampening = 0");
    return std::vector<TensorType>{in[0], in[0]};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 6.0 * static_cast<double>(in[0].shape.numel());
    return c;
  }
};
LOOM_REGISTER_OP(SgdUpdateOp);

LOOM_REGISTER_KERNEL("SgdUpdate", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = ctx.in(0).data<T>();
    const T* g = ctx.in(1).data<T>();
    const T* buf = ctx.in(2).data<T>();
    const T lr = ctx.in(3).data<T>()[0];
    const bool first_step = ctx.in(4).data<T>()[0] <= T(1);
    T* new_p = ctx.out(0).data<T>();
    T* new_buf = ctx.out(1).data<T>();
    const T momentum = static_cast<T>(ctx.attrs->Float("momentum"));
    const T dampening = static_cast<T>(ctx.attrs->Float("dampening"));
    const T wd = static_cast<T>(ctx.attrs->Float("weight_decay"));
    const bool nesterov = ctx.attrs->Bool("nesterov");
    ParallelRange(ctx.pool, ctx.in(0).numel(), [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        T d = g[i] + wd * p[i];
        T b = first_step ? d : momentum * buf[i] + (T(1) - dampening) * d;
        if (momentum != T(0)) d = nesterov ? d + momentum * b : b;
        new_buf[i] = b;
        new_p[i] = p[i] - lr * d;
      }
    });
  });
});

// AdamUpdate(param, grad, m, v, lr, step) -> (new_param, new_m, new_v)
// attrs: beta1, beta2, eps, weight_decay, decoupled (true = AdamW). `step`
// is the 1-based count of this update, for bias correction.
class AdamUpdateOp : public OpDef {
 public:
  std::string name() const override { return "AdamUpdate"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(CheckUpdateInputs("AdamUpdate", in, 2, 2, "lr and step"));
    for (const char* b : {"beta1", "beta2"}) {
      double v = attrs.Float(b, 0.9);
      if (v < 0 || v >= 1) return InvalidArgument("AdamUpdate: ", b, " must be in [0, 1), got ", v);
    }
    return std::vector<TensorType>{in[0], in[0], in[0]};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 12.0 * static_cast<double>(in[0].shape.numel());
    return c;
  }
};
LOOM_REGISTER_OP(AdamUpdateOp);

LOOM_REGISTER_KERNEL("AdamUpdate", DeviceType::kCpu, [](KernelContext& ctx) {
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = ctx.in(0).data<T>();
    const T* g = ctx.in(1).data<T>();
    const T* m = ctx.in(2).data<T>();
    const T* v = ctx.in(3).data<T>();
    const T lr = ctx.in(4).data<T>()[0];
    const double step = static_cast<double>(ctx.in(5).data<T>()[0]);
    T* new_p = ctx.out(0).data<T>();
    T* new_m = ctx.out(1).data<T>();
    T* new_v = ctx.out(2).data<T>();
    const double b1 = ctx.attrs->Float("beta1", 0.9), b2 = ctx.attrs->Float("beta2", 0.999);
    const T eps = static_cast<T>(ctx.attrs->Float("eps", 1e-8));
    const T wd = static_cast<T>(ctx.attrs->Float("weight_decay"));
    const bool decoupled = ctx.attrs->Bool("decoupled");
    const T bc1 = static_cast<T>(1.0 - std::pow(b1, step));
    const T sqrt_bc2 = static_cast<T>(std::sqrt(1.0 - std::pow(b2, step)));
    const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2);
    ParallelRange(ctx.pool, ctx.in(0).numel(), [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        T pi = p[i];
        T gi = g[i];
        if (decoupled) pi -= lr * wd * pi;  // AdamW: decay the weight itself
        else gi += wd * pi;                 // Adam: L2 through the gradient
        T mi = tb1 * m[i] + (T(1) - tb1) * gi;
        T vi = tb2 * v[i] + (T(1) - tb2) * gi * gi;
        new_m[i] = mi;
        new_v[i] = vi;
        new_p[i] = pi - (lr / bc1) * mi / (std::sqrt(vi) / sqrt_bc2 + eps);
      }
    });
  });
});

}  // namespace
}  // namespace loom
