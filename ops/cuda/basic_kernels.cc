// CUDA kernels of the basic ops (ops/basic_ops.cc): Fill, Identity, Reshape,
// the broadcasting Add/Sub/Mul/Div, BroadcastTo, SumToShape and the scalar
// ops Neg/AddScalar/MulScalar/PowScalar. Same semantics as the CPU kernels.
// Add and SumToShape also take bf16 / f16 (f32 arithmetic, rounded once), for
// the gradients of the half-precision GEMMs.
#include "core/half.h"
#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/elementwise_kernels.h"

namespace loom::cuda {
namespace {

// DispatchCudaFloat plus BFloat16 and Float16.
template <typename Fn>
Status DispatchCudaFloatOrHalf(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kBF16: return fn(BFloat16{});
    case DType::kF16: return fn(Float16{});
    default: return DispatchCudaFloat(dtype, op, std::forward<Fn>(fn));
  }
}

Status FillKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  Tensor& y = ctx.out(0);
  const double value = ctx.attrs->Float("value");
  const int64_t n = y.numel();
  switch (y.dtype()) {
    case DType::kF32:
      LOOM_CUDA_RETURN_IF_ERROR(LaunchFill(y.data<float>(), n, static_cast<float>(value), stream));
      break;
    case DType::kF64:
      LOOM_CUDA_RETURN_IF_ERROR(LaunchFill(y.data<double>(), n, value, stream));
      break;
    case DType::kI32:
      LOOM_CUDA_RETURN_IF_ERROR(LaunchFill(y.data<int32_t>(), n, static_cast<int32_t>(value), stream));
      break;
    case DType::kI64:
      LOOM_CUDA_RETURN_IF_ERROR(LaunchFill(y.data<int64_t>(), n, static_cast<int64_t>(value), stream));
      break;
    case DType::kBool:
      LOOM_CUDA_RETURN_IF_ERROR(LaunchFill(y.data<bool>(), n, static_cast<bool>(value), stream));
      break;
    default:
      return Unimplemented("no CUDA kernel for Fill on ", DTypeName(y.dtype()));
  }
  return Status::Ok();
}
LOOM_REGISTER_KERNEL("Fill", DeviceType::kCuda, FillKernel);
LOOM_REGISTER_KERNEL_SUPPORT("Fill", DeviceType::kCuda,
                             DTypeSupport({DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kBool}));

LOOM_REGISTER_KERNEL("Identity", DeviceType::kCuda, CopyKernel);
LOOM_REGISTER_KERNEL("Reshape", DeviceType::kCuda, CopyKernel);
LOOM_REGISTER_KERNEL_SUPPORT("Identity", DeviceType::kCuda, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Reshape", DeviceType::kCuda, AnyDTypeSupport());

template <BinaryKind kKind>
Status BinaryKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  Tensor& y = ctx.out(0);
  const char* op = ctx.node ? ctx.node->op.c_str() : "a binary op";
  // The support predicates admit half types for Add only.
  return DispatchCudaFloatOrHalf(y.dtype(), op, [&](auto zero) -> Status {
    using T = decltype(zero);
    if (a.shape() == b.shape()) {  // the common case: no index arithmetic
      LOOM_CUDA_RETURN_IF_ERROR(LaunchBinary(kKind, a.data<T>(), b.data<T>(), y.data<T>(), y.numel(), stream));
      return Status::Ok();
    }
    LOOM_ASSIGN_OR_RETURN(BroadcastIndex index, MakeBroadcastIndex(y.shape(), {a.shape(), b.shape()}));
    LOOM_CUDA_RETURN_IF_ERROR(LaunchBinaryBroadcast(kKind, a.data<T>(), b.data<T>(), y.data<T>(), index, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("Add", DeviceType::kCuda, BinaryKernel<BinaryKind::kAdd>);
LOOM_REGISTER_KERNEL("Sub", DeviceType::kCuda, BinaryKernel<BinaryKind::kSub>);
LOOM_REGISTER_KERNEL("Mul", DeviceType::kCuda, BinaryKernel<BinaryKind::kMul>);
LOOM_REGISTER_KERNEL("Div", DeviceType::kCuda, BinaryKernel<BinaryKind::kDiv>);
LOOM_REGISTER_KERNEL_SUPPORT("Add", DeviceType::kCuda,
                             DTypeSupport({DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));
LOOM_REGISTER_KERNEL_SUPPORT("Sub", DeviceType::kCuda, DTypeSupport({DType::kF32, DType::kF64}));
LOOM_REGISTER_KERNEL_SUPPORT("Mul", DeviceType::kCuda, DTypeSupport({DType::kF32, DType::kF64}));
LOOM_REGISTER_KERNEL_SUPPORT("Div", DeviceType::kCuda, DTypeSupport({DType::kF32, DType::kF64}));

LOOM_REGISTER_KERNEL("BroadcastTo", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  return DispatchCudaFloatOrHalf(y.dtype(), "BroadcastTo", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_ASSIGN_OR_RETURN(BroadcastIndex index, MakeBroadcastIndex(y.shape(), {x.shape()}));
    LOOM_CUDA_RETURN_IF_ERROR(LaunchBroadcastTo(x.data<T>(), y.data<T>(), index, stream));
    return Status::Ok();
  });
});

LOOM_REGISTER_KERNEL_SUPPORT("BroadcastTo", DeviceType::kCuda, HalfFloatKernelSupport());

LOOM_REGISTER_KERNEL("SumToShape", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  return DispatchCudaFloatOrHalf(y.dtype(), "SumToShape", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_ASSIGN_OR_RETURN(ReduceIndex index, MakeReduceIndex(x.shape(), y.shape()));
    LOOM_CUDA_RETURN_IF_ERROR(LaunchSumTo(x.data<T>(), y.data<T>(), y.numel(), index, stream));
    return Status::Ok();
  });
});
LOOM_REGISTER_KERNEL_SUPPORT("SumToShape", DeviceType::kCuda,
                             DTypeSupport({DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));

template <UnaryKind kKind>
Status ScalarKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  return DispatchCudaFloat(y.dtype(), ctx.node ? ctx.node->op.c_str() : "a scalar op", [&](auto zero) -> Status {
    using T = decltype(zero);
    const T value = static_cast<T>(ctx.attrs->Float("value"));
    LOOM_CUDA_RETURN_IF_ERROR(LaunchUnary(kKind, x.data<T>(), y.data<T>(), x.numel(), value, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("Neg", DeviceType::kCuda, ScalarKernel<UnaryKind::kNeg>);
LOOM_REGISTER_KERNEL("AddScalar", DeviceType::kCuda, ScalarKernel<UnaryKind::kAddScalar>);
LOOM_REGISTER_KERNEL("MulScalar", DeviceType::kCuda, ScalarKernel<UnaryKind::kMulScalar>);
LOOM_REGISTER_KERNEL("PowScalar", DeviceType::kCuda, ScalarKernel<UnaryKind::kPowScalar>);

}  // namespace
}  // namespace loom::cuda
