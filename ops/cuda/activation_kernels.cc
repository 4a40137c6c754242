// CUDA kernels of ops/activation_ops.cc: every forward op of the CPU table and
// its "Backward" op, f32 and f64; ReLU also on i64 (forward only, as on the
// CPU). Attributes are read and validated by the CPU kernels' ParseUnaryParams.
#include <string>

#include "ops/activation_attrs.h"
#include "ops/cuda/activation_kernels.h"
#include "ops/cuda/cuda_kernel_util.h"

namespace loom::cuda {
namespace {

using K = ActivationKind;

std::string OpName(const KernelContext& ctx, const char* fallback) { return ctx.node ? ctx.node->op : fallback; }

template <K kKind>
Status ForwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const std::string op = OpName(ctx, "activation");
  LOOM_ASSIGN_OR_RETURN(const ActivationParams p, ParseUnaryParams(kKind, op, *ctx.attrs));
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  if (kKind == K::kRelu && x.dtype() == DType::kI64) {
    LOOM_CUDA_RETURN_IF_ERROR(LaunchReluInt64(x.data<int64_t>(), y.data<int64_t>(), x.numel(), stream));
    return Status::Ok();
  }
  return DispatchCudaFloat(x.dtype(), op.c_str(), [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchActivationForward(kKind, x.data<T>(), y.data<T>(), x.numel(), p, stream));
    return Status::Ok();
  });
}

// (dy, saved) -> dx.
template <K kKind>
Status BackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const std::string op = OpName(ctx, "activation backward");
  LOOM_ASSIGN_OR_RETURN(const ActivationParams p, ParseUnaryParams(kKind, op, *ctx.attrs));
  const Tensor& dy = ctx.in(0);
  return DispatchCudaFloat(dy.dtype(), op.c_str(), [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchActivationBackward(kKind, dy.data<T>(), ctx.in(1).data<T>(), ctx.out(0).data<T>(),
                                                       dy.numel(), p, stream));
    return Status::Ok();
  });
}

struct Row {
  const char* name;
  Status (*forward)(KernelContext&);
  Status (*backward)(KernelContext&);
};

template <K kKind>
constexpr Row MakeRow(const char* name) {
  return {name, &ForwardKernel<kKind>, &BackwardKernel<kKind>};
}

constexpr Row kRows[] = {
    MakeRow<K::kRelu>("ReLU"),           MakeRow<K::kRelu6>("ReLU6"),   MakeRow<K::kLeakyRelu>("LeakyReLU"),
    MakeRow<K::kGelu>("GELU"),           MakeRow<K::kSigmoid>("Sigmoid"), MakeRow<K::kTanh>("Tanh"),
    MakeRow<K::kHardswish>("Hardswish"), MakeRow<K::kHardsigmoid>("Hardsigmoid"), MakeRow<K::kSilu>("SiLU"),
    MakeRow<K::kExp>("Exp"),             MakeRow<K::kLog>("Log"),       MakeRow<K::kSqrt>("Sqrt"),
    MakeRow<K::kRsqrt>("Rsqrt"),         MakeRow<K::kAbs>("Abs"),
};

[[maybe_unused]] const bool kRegistered = [] {
  for (const Row& row : kRows) {
    OpRegistry::Global().RegisterKernel(row.name, DeviceType::kCuda, row.forward);
    OpRegistry::Global().RegisterKernel(std::string(row.name) + "Backward", DeviceType::kCuda, row.backward);
  }
  // i64 ids as well as floats; every other op is float-only by type inference.
  OpRegistry::Global().RegisterKernelSupport("ReLU", DeviceType::kCuda,
                                             DTypeSupport({DType::kF32, DType::kF64, DType::kI64}));
  return true;
}();

}  // namespace
}  // namespace loom::cuda
