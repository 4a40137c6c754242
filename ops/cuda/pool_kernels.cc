// CUDA kernels of ops/pool_ops.cc: MaxPool2d (with its argmax indices),
// AvgPool2d, AdaptiveAvgPool2d and their backward ops, f32 and f64. The
// attributes are the CPU kernels' own (ops/pool_geometry.h); the output extents
// (ceil_mode included) come from the shapes InferTypes gave the tensors.
#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/pool_kernels.h"
#include "ops/pool_geometry.h"

namespace loom::cuda {
namespace {

using pool::PoolKind;

// x [N, C, H, W] pooled to y [N, C, OH, OW].
StatusOr<PoolGeom> MakePoolGeom(PoolKind kind, const AttrMap& attrs, const Shape& x, const Shape& y) {
  if (x.rank() != 4 || y.rank() != 4)
    return InvalidArgument("pool kernel: expected [N, C, H, W] tensors, got ", x.ToString(), " and ", y.ToString());
  PoolGeom g;
  g.planes = x[0] * x[1];
  g.h = x[2];
  g.w = x[3];
  g.oh = y[2];
  g.ow = y[3];
  if (kind == PoolKind::kAdaptiveAvg) return g;
  LOOM_ASSIGN_OR_RETURN(pool::SlidingAttrs a, pool::ParseSlidingAttrs(kind, "pool kernel", attrs));
  g.kh = a.kernel[0];
  g.kw = a.kernel[1];
  g.sh = a.stride[0];
  g.sw = a.stride[1];
  g.ph = a.padding[0];
  g.pw = a.padding[1];
  g.dh = a.dilation[0];
  g.dw = a.dilation[1];
  g.include_pad = a.include_pad;  // true for max pools, which divide by no extent
  g.index_offset = a.row_offset * g.w;
  return g;
}

template <PoolKind kKind, bool kBackward>
Status PoolKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Shape& xs = kBackward ? ctx.out(0).shape() : ctx.in(0).shape();
  const Shape& ys = kBackward ? ctx.in(0).shape() : ctx.out(0).shape();
  LOOM_ASSIGN_OR_RETURN(PoolGeom g, MakePoolGeom(kKind, *ctx.attrs, xs, ys));
  const char* op = ctx.node ? ctx.node->op.c_str() : "pool";
  return DispatchCudaFloat(ctx.in(0).dtype(), op, [&](auto zero) -> Status {
    using T = decltype(zero);
    const T* in = ctx.in(0).data<T>();
    T* out = ctx.out(0).data<T>();
    if constexpr (kKind == PoolKind::kMax && !kBackward) {
      LOOM_CUDA_RETURN_IF_ERROR(LaunchMaxPoolForward<T>(g, in, out, ctx.out(1).data<int64_t>(), stream));
    } else if constexpr (kKind == PoolKind::kMax) {
      LOOM_CUDA_RETURN_IF_ERROR(LaunchMaxPoolBackward<T>(g, in, ctx.in(1).data<int64_t>(), out, stream));
    } else if constexpr (kKind == PoolKind::kAvg && !kBackward) {
      LOOM_CUDA_RETURN_IF_ERROR(LaunchAvgPoolForward<T>(g, in, out, stream));
    } else if constexpr (kKind == PoolKind::kAvg) {
      LOOM_CUDA_RETURN_IF_ERROR(LaunchAvgPoolBackward<T>(g, in, out, stream));
    } else if constexpr (!kBackward) {
      LOOM_CUDA_RETURN_IF_ERROR(LaunchAdaptiveAvgPoolForward<T>(g, in, out, stream));
    } else {
      LOOM_CUDA_RETURN_IF_ERROR(LaunchAdaptiveAvgPoolBackward<T>(g, in, out, stream));
    }
    return Status::Ok();
  });
}

LOOM_REGISTER_KERNEL("MaxPool2d", DeviceType::kCuda, PoolKernel<PoolKind::kMax, false>);
LOOM_REGISTER_KERNEL("MaxPool2dBackward", DeviceType::kCuda, PoolKernel<PoolKind::kMax, true>);
LOOM_REGISTER_KERNEL("AvgPool2d", DeviceType::kCuda, PoolKernel<PoolKind::kAvg, false>);
LOOM_REGISTER_KERNEL("AvgPool2dBackward", DeviceType::kCuda, PoolKernel<PoolKind::kAvg, true>);
LOOM_REGISTER_KERNEL("AdaptiveAvgPool2d", DeviceType::kCuda, PoolKernel<PoolKind::kAdaptiveAvg, false>);
LOOM_REGISTER_KERNEL("AdaptiveAvgPool2dBackward", DeviceType::kCuda, PoolKernel<PoolKind::kAdaptiveAvg, true>);

}  // namespace
}  // namespace loom::cuda
