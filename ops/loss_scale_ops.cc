// LossScaleUpdate(scale, good_steps, finite) -> (new_scale, new_good_steps):
// dynamic loss scaling for f16 training, torch.cuda.amp.GradScaler's update
// (torch._amp_update_scale_) applied to each element independently, so that
// fused replicas ([R] tensors) each keep their own scaler: a replica whose
// gradients overflowed (finite[r] not > 0: 0 from IsFinite, or NaN) backs
// its scale off by backoff_factor and restarts its count; every other replica
// counts one more good step and, on reaching growth_interval, multiplies its
// scale by growth_factor (kept only if the product is finite) and restarts
// its count. The three inputs share one shape (a scalar, or [R]) and one
// float dtype (f32; f64 in gradient-check graphs). good_steps is a float
// tensor, not an integer one, so that the scaler's state is like every other
// optimizer state (float Buffers, fused [R], checkpointed and initialised the
// same way) and `finite` can come straight from IsFinite products; the count
// is exact because it never exceeds growth_interval <= 2^24.
//
// Attributes: growth_factor (2, > 1), backoff_factor (0.5, in (0, 1)),
// growth_interval (2000, in [1, 2^24]). Both outputs may be written over
// their inputs (InPlaceInput), so the state updates in place. No gradient.
#include <cmath>
#include <string>

#include "ops/cpu_util.h"
#include "ops/op.h"

namespace loom {
namespace {

constexpr int64_t kMaxGrowthInterval = int64_t{1} << 24;  // f32 counts are exact up to here

struct LossScaleParams {
  double growth_factor = 2;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

StatusOr<LossScaleParams> ParseLossScaleParams(const AttrMap& attrs) {
  LossScaleParams p;
  p.growth_factor = attrs.Float("growth_factor");
  p.backoff_factor = attrs.Float("backoff_factor");
  p.growth_interval = attrs.Int("growth_interval");
  if (!(p.growth_factor > 1) || !std::isfinite(p.growth_factor))
    return InvalidArgument("LossScaleUpdate: attribute growth_factor must be finite and > 1, got ", p.growth_factor);
  if (!(p.backoff_factor > 0 && p.backoff_factor < 1))
    return InvalidArgument("LossScaleUpdate: attribute backoff_factor must be in (0, 1), got ", p.backoff_factor);
  if (p.growth_interval < 1 || p.growth_interval > kMaxGrowthInterval)
    return InvalidArgument("LossScaleUpdate: attribute growth_interval must be in [1, ", kMaxGrowthInterval, "], got ",
                           p.growth_interval);
  return p;
}

class LossScaleUpdateOp : public OpDef {
 public:
  LossScaleUpdateOp() {
    DeclareAttrs()
        .Default("growth_factor", 2.0, "scale multiplier after growth_interval good steps in a row (> 1)")
        .Default("backoff_factor", 0.5, "scale multiplier after a step with inf / NaN gradients, in (0, 1)")
        .Default("growth_interval", int64_t{2000}, "good steps in a row before the scale grows");
  }
  std::string name() const override { return "LossScaleUpdate"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 3, "LossScaleUpdate (scale, good_steps, finite)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "LossScaleUpdate scale"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], "LossScaleUpdate good_steps must have scale's type"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[2], "LossScaleUpdate finite must have scale's type"));
    LOOM_RETURN_IF_ERROR(ParseLossScaleParams(attrs).status());
    return std::vector<TensorType>{in[0], in[1]};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 3.0 * static_cast<double>(in[0].shape.numel());  // compare, add, multiply
    return c;
  }
  int InPlaceInput(const AttrMap&, int output) const override { return output <= 1 ? output : -1; }
};
LOOM_REGISTER_OP(LossScaleUpdateOp);

LOOM_REGISTER_KERNEL("LossScaleUpdate", DeviceType::kCpu, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(LossScaleParams p, ParseLossScaleParams(*ctx.attrs));
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* scale = ctx.in(0).data<T>();
    const T* good = ctx.in(1).data<T>();
    const T* finite = ctx.in(2).data<T>();
    T* new_scale = ctx.out(0).data<T>();
    T* new_good = ctx.out(1).data<T>();
    const T growth = static_cast<T>(p.growth_factor), backoff = static_cast<T>(p.backoff_factor);
    const T interval = static_cast<T>(p.growth_interval);
    ParallelRange(ctx.pool, ctx.in(0).numel(), [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        const T s_i = scale[i], count = good[i] + T(1);
        if (!(finite[i] > T(0))) {
          new_scale[i] = s_i * backoff;
          new_good[i] = T(0);
        } else if (count >= interval) {
          const T grown = s_i * growth;
          new_scale[i] = std::isfinite(grown) ? grown : s_i;
          new_good[i] = T(0);
        } else {
          new_scale[i] = s_i;
          new_good[i] = count;
        }
      }
    });
  });
});

}  // namespace
}  // namespace loom
