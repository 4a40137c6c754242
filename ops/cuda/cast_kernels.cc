// CUDA kernels of ops/cast_ops.cc (Cast between f32, f64, bf16 and f16) and
// ops/loss_scale_ops.cc (LossScaleUpdate, f32 and f64). The attributes are
// read as the CPU kernels read them; type inference validated them.
#include "ops/cuda/cast_kernels.h"

#include "ops/cuda/cuda_kernel_util.h"

namespace loom::cuda {
namespace {

StatusOr<CastType> ToCastType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return CastType::kF32;
    case DType::kF64: return CastType::kF64;
    case DType::kBF16: return CastType::kBF16;
    case DType::kF16: return CastType::kF16;
    default: return Unimplemented("no CUDA kernel for Cast on ", DTypeName(dtype), " (f32, f64, bf16 and f16 only)");
  }
}

LOOM_REGISTER_KERNEL("Cast", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  LOOM_ASSIGN_OR_RETURN(CastType from, ToCastType(ctx.in(0).dtype()));
  LOOM_ASSIGN_OR_RETURN(CastType to, ToCastType(ctx.out(0).dtype()));
  LOOM_CUDA_RETURN_IF_ERROR(LaunchCast(from, to, ctx.in(0).raw_data(), ctx.out(0).raw_data(), ctx.in(0).numel(), stream));
  return Status::Ok();
});
LOOM_REGISTER_KERNEL_SUPPORT("Cast", DeviceType::kCuda,
                             DTypeSupport({DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));

LOOM_REGISTER_KERNEL("LossScaleUpdate", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  LossScaleHyper hyper;
  hyper.growth_factor = ctx.attrs->Float("growth_factor");
  hyper.backoff_factor = ctx.attrs->Float("backoff_factor");
  hyper.growth_interval = ctx.attrs->Int("growth_interval");
  return DispatchCudaFloat(ctx.in(0).dtype(), "LossScaleUpdate", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchLossScaleUpdate(ctx.in(0).data<T>(), ctx.in(1).data<T>(), ctx.in(2).data<T>(),
                                                    ctx.out(0).data<T>(), ctx.out(1).data<T>(), ctx.in(0).numel(),
                                                    hyper, stream));
    return Status::Ok();
  });
});

}  // namespace
}  // namespace loom::cuda
