// Cast(x; to) -> x converted to the float dtype `to` (f32, f64, bf16 or f16),
// element by element; a copy when x already has that dtype. Narrowing rounds
// once to nearest even with PyTorch's NaN / inf / subnormal behaviour
// (core/half.h); widening is exact. The gradient is dy cast back to x's
// dtype (what autocast's casts do in PyTorch). The mixed-precision pass
// (graph/mixed_precision.h) puts these around the FLOP-heavy ops.
#include <cstring>
#include <type_traits>
#include <string>

#include "core/half.h"
#include "core/half_convert.h"
#include "ops/cpu_util.h"
#include "ops/op.h"

namespace loom {
namespace {

bool IsCastDType(DType d) { return IsFloating(d); }

StatusOr<DType> CastTarget(const AttrMap& attrs) {
  const std::string to = attrs.Str("to");
  StatusOr<DType> dtype = ParseDType(to);
  if (!dtype.ok() || !IsCastDType(*dtype))
    return InvalidArgument("Cast: attribute to must be f32, f64, bf16 or f16, got '", to, "'");
  return *dtype;
}

class CastOp : public ElementwiseOpDef {
 public:
  CastOp() { DeclareAttrs().Required("to", AttrType::kString, "the output dtype: f32, f64, bf16 or f16"); }
  std::string name() const override { return "Cast"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "Cast (x)"));
    if (!IsCastDType(in[0].dtype))
      return InvalidArgument("Cast input must be f32, f64, bf16 or f16, got ", DTypeName(in[0].dtype));
    LOOM_ASSIGN_OR_RETURN(DType to, CastTarget(attrs));
    return std::vector<TensorType>{{in[0].shape, to}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = static_cast<double>(in[0].shape.numel());  // one conversion per element
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    ValueId dy = g.output_grad(0);
    if (dy == kNoValue || !g.NeedsInputGrad(0)) return Status::Ok();
    g.SetInputGrad(0, g.Emit1("Cast", {dy}, {{"to", std::string(DTypeName(g.type(g.input(0)).dtype))}}));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(CastOp);

template <typename From, typename To>
void CastElements(ThreadPool* pool, const void* src, void* dst, int64_t n) {
  const From* x = static_cast<const From*>(src);
  To* y = static_cast<To*>(dst);
  ParallelRange(pool, n, [&](int64_t s, int64_t e) {
    if constexpr (std::is_same_v<From, Float16> && std::is_same_v<To, float>) {
      WidenF16(x + s, y + s, e - s);
    } else if constexpr (std::is_same_v<From, float> && std::is_same_v<To, Float16>) {
      NarrowToF16(x + s, y + s, e - s);
    } else {
      for (int64_t i = s; i < e; ++i) y[i] = ConvertFloat<To>(x[i]);
    }
  });
}

// Calls fn(T{}) with T the element type of a float dtype (bf16 / f16 as
// their storage structs).
template <typename Fn>
void DispatchCastType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: fn(float{}); break;
    case DType::kF64: fn(double{}); break;
    case DType::kBF16: fn(BFloat16{}); break;
    default: fn(Float16{}); break;  // kF16: type inference admits nothing else
  }
}

LOOM_REGISTER_KERNEL("Cast", DeviceType::kCpu, [](KernelContext& ctx) -> Status {
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  if (x.dtype() == y.dtype()) {
    if (x.nbytes() > 0 && x.raw_data() != y.raw_data()) std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
    return Status::Ok();
  }
  DispatchCastType(x.dtype(), [&](auto from) {
    DispatchCastType(y.dtype(), [&](auto to) {
      CastElements<decltype(from), decltype(to)>(ctx.pool, x.raw_data(), y.raw_data(), x.numel());
    });
  });
  return Status::Ok();
});
LOOM_REGISTER_KERNEL_SUPPORT("Cast", DeviceType::kCpu,
                             DTypeSupport({DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));

}  // namespace
}  // namespace loom
