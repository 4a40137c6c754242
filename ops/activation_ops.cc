// Element-wise activations (ReLU, ReLU6, LeakyReLU, GELU, Sigmoid, Tanh,
// Hardswish, Hardsigmoid, SiLU) and unary math (Exp, Log, Sqrt, Rsqrt, Abs),
// with PyTorch semantics. One table drives them all: a row names the op and
// says which tensor its derivative reads (the input x, or the output y when
// the derivative is cheaper from y, as for Sigmoid or Exp). The gradient of
// op "Foo" is one "FooBackward" node: dx = dy * f'(saved), where the masks of
// piecewise ops select dy rather than multiply it (so inf * 0 never
// appears, as in PyTorch's threshold_backward).
//
// Attributes: LeakyReLU negative_slope (default 0.01); GELU approximate,
// "none" (exact erf form, default) or "tanh". Backward ops carry the
// forward node's attributes.
//
// Types: every op takes f32 or f64. ReLU alone also takes i64 (forward only,
// on the CPU and on CUDA): max(x, 0) maps ids such as models::kIgnoreTarget
// (-100) to a valid index 0. It has no gradient (autodiff only
// differentiates floating values, and ReLU's gradient rule refuses an i64
// input).
#include <cmath>
#include <string>
#include <type_traits>

#include "ops/activation_attrs.h"
#include "ops/activation_formulas.h"
#include "ops/activation_params.h"
#include "ops/cpu_util.h"
#include "ops/op.h"

namespace loom {
namespace {

// What the backward op reads besides dy.
enum class Saved { kInput, kOutput };

// The attributes of a forward op of the table and of its backward op.
void DeclareUnaryAttrs(Unary kind, AttrSchema& s) {
  if (kind == Unary::kLeakyRelu) s.Default("negative_slope", 0.01, "slope for x < 0");
  if (kind == Unary::kGelu) s.Default("approximate", "none", "\"none\" (erf) or \"tanh\"");
}

// sqrt(2 / pi) and 1 / sqrt(2 pi), for GELU.
constexpr double kSqrt2OverPi = M_2_SQRTPI * M_SQRT1_2;
constexpr double kInvSqrt2Pi = 0.5 * M_2_SQRTPI * M_SQRT1_2;
constexpr double kGeluCubic = 0.044715;

// GELU's forms: each loop computes one of them. (A branch between them per
// element kept the loop scalar, its tanh a library call in either form.)
enum class GeluForm { kErf, kTanh };

// y = f(x). Comparisons are written so that NaN propagates (x < 0 is false
// for NaN, which then falls through to x). Sigmoid, Tanh, SiLU, Exp, Log
// and GELU take cpu_util.h's vector-lane functions in f32.
template <Unary K, GeluForm F, typename T>
T Forward(T x, T negative_slope) {
  if constexpr (K == Unary::kRelu) return activation::Relu(x);
  if constexpr (K == Unary::kRelu6) return activation::Relu6(x);
  if constexpr (K == Unary::kLeakyRelu) return x < T(0) ? negative_slope * x : x;
  if constexpr (K == Unary::kGelu && F == GeluForm::kTanh) {
    T u = static_cast<T>(kSqrt2OverPi) * (x + static_cast<T>(kGeluCubic) * x * x * x);
    return T(0.5) * x * (T(1) + Tanh(u));
  }
  if constexpr (K == Unary::kGelu && F == GeluForm::kErf) {
    // x Phi(x), Phi as erfc(-x / sqrt(2)) / 2: no cancellation for x < 0.
    if constexpr (std::is_same_v<T, float>) return x * NormalCdfPdfF(x).cdf;
    else return T(0.5) * x * std::erfc(-x * static_cast<T>(M_SQRT1_2));
  }
  if constexpr (K == Unary::kSigmoid) return Sigmoid(x);
  if constexpr (K == Unary::kTanh) return Tanh(x);
  if constexpr (K == Unary::kHardswish) return activation::Hardswish(x);
  if constexpr (K == Unary::kHardsigmoid) return x <= T(-3) ? T(0) : (x >= T(3) ? T(1) : x / T(6) + T(0.5));
  if constexpr (K == Unary::kSilu) return x * Sigmoid(x);
  if constexpr (K == Unary::kExp) return Exp(x);
  if constexpr (K == Unary::kLog) return Log(x);
  if constexpr (K == Unary::kSqrt) return std::sqrt(x);
  if constexpr (K == Unary::kRsqrt) return T(1) / std::sqrt(x);
  if constexpr (K == Unary::kAbs) return std::abs(x);
}

// dx given dy and the saved tensor s (x or y, per the table).
template <Unary K, GeluForm F, typename T>
T Backward(T dy, T s, T negative_slope) {
  if constexpr (K == Unary::kRelu) return activation::ReluGrad(dy, s);  // s = y
  if constexpr (K == Unary::kRelu6) return activation::Relu6Grad(dy, s);
  if constexpr (K == Unary::kLeakyRelu) return s > T(0) ? dy : negative_slope * dy;
  if constexpr (K == Unary::kGelu && F == GeluForm::kTanh) {
    T x2 = s * s;
    T t = Tanh(static_cast<T>(kSqrt2OverPi) * s * (T(1) + static_cast<T>(kGeluCubic) * x2));
    T du = static_cast<T>(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x2);
    return dy * (T(0.5) * (T(1) + t) + T(0.5) * s * (T(1) - t * t) * du);
  }
  if constexpr (K == Unary::kGelu && F == GeluForm::kErf) {
    // Phi(x) + x phi(x)
    if constexpr (std::is_same_v<T, float>) {
      const NormalCdfPdf n = NormalCdfPdfF(s);
      return dy * (n.cdf + s * n.pdf);
    } else {
      T cdf = T(0.5) * std::erfc(-s * static_cast<T>(M_SQRT1_2));
      T pdf = static_cast<T>(kInvSqrt2Pi) * std::exp(T(-0.5) * s * s);
      return dy * (cdf + s * pdf);
    }
  }
  if constexpr (K == Unary::kSigmoid) return dy * s * (T(1) - s);  // s = y
  if constexpr (K == Unary::kTanh) return dy * (T(1) - s * s);      // s = y
  if constexpr (K == Unary::kHardswish) return activation::HardswishGrad(dy, s);
  if constexpr (K == Unary::kHardsigmoid) return (s > T(-3) && s < T(3)) ? dy / T(6) : T(0);
  if constexpr (K == Unary::kSilu) {
    T sig = Sigmoid(s);
    return dy * sig * (T(1) + s * (T(1) - sig));
  }
  if constexpr (K == Unary::kExp) return dy * s;          // s = y
  if constexpr (K == Unary::kLog) return dy / s;          // s = x
  if constexpr (K == Unary::kSqrt) return dy / (T(2) * s);  // s = y
  if constexpr (K == Unary::kRsqrt) return T(-0.5) * dy * s * s * s;  // s = y = x^(-1/2)
  if constexpr (K == Unary::kAbs) return s > T(0) ? dy : (s < T(0) ? -dy : T(0));
}

// FLOPs per element, counting each arithmetic operation, comparison and
// transcendental call (exp, erf, tanh, log, sqrt) as one.
double ForwardFlops(Unary k, const UnaryParams& p) {
  switch (k) {
    case Unary::kRelu: return 1;
    case Unary::kRelu6: return 2;
    case Unary::kLeakyRelu: return 2;
    case Unary::kGelu: return p.gelu_tanh ? 9 : 5;
    case Unary::kSigmoid: return 4;     // neg, exp, add, div
    case Unary::kTanh: return 1;
    case Unary::kHardswish: return 5;   // add, clamp (2), mul, div
    case Unary::kHardsigmoid: return 4;
    case Unary::kSilu: return 5;
    case Unary::kExp: return 1;
    case Unary::kLog: return 1;
    case Unary::kSqrt: return 1;
    case Unary::kRsqrt: return 2;
    case Unary::kAbs: return 1;
  }
  return 1;
}

double BackwardFlops(Unary k, const UnaryParams& p) {
  switch (k) {
    case Unary::kRelu: return 1;
    case Unary::kRelu6: return 2;
    case Unary::kLeakyRelu: return 2;
    case Unary::kGelu: return p.gelu_tanh ? 14 : 10;
    case Unary::kSigmoid: return 3;
    case Unary::kTanh: return 3;
    case Unary::kHardswish: return 4;
    case Unary::kHardsigmoid: return 2;
    case Unary::kSilu: return 9;
    case Unary::kExp: return 1;
    case Unary::kLog: return 1;
    case Unary::kSqrt: return 2;
    case Unary::kRsqrt: return 4;
    case Unary::kAbs: return 2;
  }
  return 1;
}

// Whether op K also takes i64 inputs (forward only).
constexpr bool TakesI64(Unary k) { return k == Unary::kRelu; }

// Calls body(form) with GELU's form as a type (GeluForm constants), kErf for
// every other op (which then has one loop only).
template <Unary K, typename Body>
void WithGeluForm(const UnaryParams& p, Body body) {
  if constexpr (K == Unary::kGelu) {
    if (p.gelu_tanh) return body(std::integral_constant<GeluForm, GeluForm::kTanh>{});
  }
  body(std::integral_constant<GeluForm, GeluForm::kErf>{});
}

template <Unary K, typename T>
void ForwardLoop(KernelContext& ctx, const UnaryParams& p) {
  const T* x = ctx.in(0).data<T>();
  T* y = ctx.out(0).data<T>();
  // A value of the loop's own: a store through y could alias p's field and
  // keep the loop scalar.
  const T slope = static_cast<T>(p.negative_slope);
  WithGeluForm<K>(p, [&](auto form) {
    ParallelRange(ctx.pool, ctx.in(0).numel(), [x, y, slope](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = Forward<K, decltype(form)::value>(x[i], slope);
    });
  });
}

template <Unary K>
Status ForwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(const UnaryParams p, ParseUnaryParams(K, ctx.node ? ctx.node->op : "", *ctx.attrs));
  if constexpr (TakesI64(K)) {
    if (ctx.in(0).dtype() == DType::kI64) {
      ForwardLoop<K, int64_t>(ctx, p);
      return Status::Ok();
    }
  }
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) { ForwardLoop<K, decltype(zero)>(ctx, p); });
}

template <Unary K>
Status BackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(const UnaryParams p, ParseUnaryParams(K, ctx.node ? ctx.node->op : "", *ctx.attrs));
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* dy = ctx.in(0).data<T>();
    const T* saved = ctx.in(1).data<T>();
    T* dx = ctx.out(0).data<T>();
    const T slope = static_cast<T>(p.negative_slope);  // (see ForwardLoop)
    WithGeluForm<K>(p, [&](auto form) {
      ParallelRange(ctx.pool, ctx.in(0).numel(), [dy, saved, dx, slope](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) dx[i] = Backward<K, decltype(form)::value>(dy[i], saved[i], slope);
      });
    });
  });
}

struct UnaryRow {
  const char* name;
  Unary kind;
  Saved saved;
  Status (*forward)(KernelContext&);
  Status (*backward)(KernelContext&);
};

template <Unary K>
constexpr UnaryRow Row(const char* name, Saved saved) {
  return {name, K, saved, &ForwardKernel<K>, &BackwardKernel<K>};
}

constexpr UnaryRow kUnaryOps[] = {
    Row<Unary::kRelu>("ReLU", Saved::kOutput),
    Row<Unary::kRelu6>("ReLU6", Saved::kInput),
    Row<Unary::kLeakyRelu>("LeakyReLU", Saved::kInput),
    Row<Unary::kGelu>("GELU", Saved::kInput),
    Row<Unary::kSigmoid>("Sigmoid", Saved::kOutput),
    Row<Unary::kTanh>("Tanh", Saved::kOutput),
    Row<Unary::kHardswish>("Hardswish", Saved::kInput),
    Row<Unary::kHardsigmoid>("Hardsigmoid", Saved::kInput),
    Row<Unary::kSilu>("SiLU", Saved::kInput),
    Row<Unary::kExp>("Exp", Saved::kOutput),
    Row<Unary::kLog>("Log", Saved::kInput),
    Row<Unary::kSqrt>("Sqrt", Saved::kOutput),
    Row<Unary::kRsqrt>("Rsqrt", Saved::kOutput),
    Row<Unary::kAbs>("Abs", Saved::kInput),
};

// Forward op: x -> y, same type.
class UnaryOp : public ElementwiseOpDef {
 public:
  explicit UnaryOp(const UnaryRow& row) : row_(row) { DeclareUnaryAttrs(row.kind, DeclareAttrs()); }
  std::string name() const override { return row_.name; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, row_.name));
    if (!(TakesI64(row_.kind) && in[0].dtype == DType::kI64))
      LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], std::string(row_.name) + " input"));
    LOOM_RETURN_IF_ERROR(ParseUnaryParams(row_.kind, row_.name, attrs).status());
    return in;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    auto p = ParseUnaryParams(row_.kind, row_.name, a);
    c.flops = static_cast<double>(in[0].shape.numel()) * ForwardFlops(row_.kind, p.ok() ? *p : UnaryParams{});
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    // Autodiff never asks (an i64 output never requires a gradient); refuse
    // rather than emit a backward node that type inference would reject.
    const TensorType& x = g.type(g.input(0));
    if (!IsFloating(x.dtype))
      return InvalidArgument(row_.name, ": no gradient for a ", DTypeName(x.dtype), " input (integer ",
                             row_.name, " is forward only)");
    ValueId saved = row_.saved == Saved::kInput ? g.input(0) : g.output(0);
    g.SetInputGrad(0, g.Emit1(std::string(row_.name) + "Backward", {g.output_grad(0), saved}, g.attrs()));
    return Status::Ok();
  }

 private:
  UnaryRow row_;
};

// Backward op: (dy, saved) -> dx, all of one type.
class UnaryBackwardOp : public OpDef {
 public:
  explicit UnaryBackwardOp(const UnaryRow& row) : row_(row), name_(std::string(row.name) + "Backward") {
    DeclareUnaryAttrs(row.kind, DeclareAttrs());
  }
  std::string name() const override { return name_; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, name_ + " (dy, " + (row_.saved == Saved::kInput ? "x)" : "y)")));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], name_ + " dy"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], name_ + ": dy and the saved tensor differ"));
    LOOM_RETURN_IF_ERROR(ParseUnaryParams(row_.kind, name_, attrs).status());
    return std::vector<TensorType>{in[0]};
  }
  // Element-wise in dy and the saved tensor: any axis.
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules = SampleAlongBatch(in, out);
    rules.other = ElementwiseAxes(in, out, rules.sample ? 0 : -1);
    return rules;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    auto p = ParseUnaryParams(row_.kind, name_, a);
    c.flops = static_cast<double>(in[0].shape.numel()) * BackwardFlops(row_.kind, p.ok() ? *p : UnaryParams{});
    return c;
  }

 private:
  UnaryRow row_;
  std::string name_;
};

[[maybe_unused]] const bool kRegistered = [] {
  for (const UnaryRow& row : kUnaryOps) {
    OpRegistry::Global().RegisterOp(std::make_unique<UnaryOp>(row));
    OpRegistry::Global().RegisterOp(std::make_unique<UnaryBackwardOp>(row));
    OpRegistry::Global().RegisterKernel(row.name, DeviceType::kCpu, row.forward);
    OpRegistry::Global().RegisterKernel(std::string(row.name) + "Backward", DeviceType::kCpu, row.backward);
  }
  return true;
}();

}  // namespace
}  // namespace loom
