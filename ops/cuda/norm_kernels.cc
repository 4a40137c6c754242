// CUDA kernels of ops/norm_ops.cc: BatchNorm (train and eval, [N, C],
// [N, C, L], [N, C, H, W]), BatchNormBackward, the pieces of a BatchNorm
// split along the batch (BatchNormPivot, BatchNormStats, BatchNormApply,
// BatchNormBackwardStats, BatchNormBackwardApply), LayerNorm and
// LayerNormBackward, f32 and f64, with the CPU kernels' semantics. Own
// kernels rather than cuDNN: they keep the CPU's statistics exactly (double
// accumulation, the same saved invstd and unbiased running variance for
// every layout) and run deterministically.
#include "ops/cuda/norm_kernels.h"

#include <string>

#include "ops/cuda/cuda_kernel_util.h"
#include "ops/norm_geometry.h"

namespace loom::cuda {
namespace {

ChannelDims ChannelDimsOf(const Shape& x) {
  const ChannelLayout l = ChannelLayoutOf(x);
  return {l.n, l.c, l.s};
}

StatusOr<Tensor> Workspace(int64_t doubles, const Device& device) {
  return Tensor::Empty(Shape({doubles}), DType::kF64, device);
}

// Attr activation, done in the kernels' own passes (the executors fold a
// ReLU, ReLU6 or Hardswish that alone reads a BatchNorm's y into it).
NormActivation ActivationOf(const KernelContext& ctx) {
  const std::string a = ctx.attrs->Str("activation");
  if (a == "relu") return NormActivation::kRelu;
  if (a == "relu6") return NormActivation::kRelu6;
  if (a == "hardswish") return NormActivation::kHardswish;
  return NormActivation::kNone;
}

// BatchNorm's and BatchNormApply's arguments: inputs 0..4 (x, gamma, beta,
// running_mean, running_var), outputs 0..4, the activation.
BatchNormArgs ForwardArgs(const KernelContext& ctx) {
  return {ctx.in(0).raw_data(),  ctx.in(1).raw_data(),  ctx.in(2).raw_data(),  ctx.in(3).raw_data(),
          ctx.in(4).raw_data(),  ctx.out(0).raw_data(), ctx.out(1).raw_data(), ctx.out(2).raw_data(),
          ctx.out(3).raw_data(), ctx.out(4).raw_data(), ActivationOf(ctx)};
}

// A backward kernel's arguments: inputs 0..4 (dy, x, gamma, saved_mean,
// saved_invstd), outputs 0..2 (dx, dgamma, dbeta; none for
// BatchNormBackwardStats), and with an activation the BatchNorm's beta
// (input `beta`), with which the mask is rebuilt.
BatchNormBackwardArgs BackwardArgs(const KernelContext& ctx, int beta) {
  const NormActivation activation = ActivationOf(ctx);
  const bool grads = ctx.outputs.size() == 3;
  return {ctx.in(0).raw_data(),
          ctx.in(1).raw_data(),
          ctx.in(2).raw_data(),
          ctx.in(3).raw_data(),
          ctx.in(4).raw_data(),
          grads ? ctx.out(0).raw_data() : nullptr,
          grads ? ctx.out(1).raw_data() : nullptr,
          grads ? ctx.out(2).raw_data() : nullptr,
          activation == NormActivation::kNone ? nullptr : ctx.in(beta).raw_data(),
          activation};
}

Status BatchNormKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const bool training = ctx.attrs->Bool("training");
  const double momentum = ctx.attrs->Float("momentum"), eps = ctx.attrs->Float("eps");
  const ChannelDims dims = ChannelDimsOf(ctx.in(0).shape());
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, Workspace(BatchNormWorkspaceSize(dims), ctx.device));
  const BatchNormArgs args = ForwardArgs(ctx);
  return DispatchCudaFloat(ctx.in(0).dtype(), "BatchNorm", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(
        LaunchBatchNorm<T>(training, momentum, eps, dims, args, workspace.data<double>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BatchNorm", DeviceType::kCuda, BatchNormKernel);

Status BatchNormBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const bool training = ctx.attrs->Bool("training");
  const ChannelDims dims = ChannelDimsOf(ctx.in(1).shape());
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, Workspace(BatchNormWorkspaceSize(dims), ctx.device));
  const BatchNormBackwardArgs args = BackwardArgs(ctx, 5);
  return DispatchCudaFloat(ctx.in(0).dtype(), "BatchNormBackward", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchBatchNormBackward<T>(training, dims, args, workspace.data<double>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BatchNormBackward", DeviceType::kCuda, BatchNormBackwardKernel);

// ---- BatchNorm split along the batch (ops/norm_ops.cc's header comment)

Status BatchNormPivotKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const bool first = ctx.attrs->Bool("first");
  const ChannelDims dims = ChannelDimsOf(ctx.in(0).shape());
  return DispatchCudaFloat(ctx.in(0).dtype(), "BatchNormPivot", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchBatchNormPivot<T>(first, dims, ctx.in(0).raw_data(), ctx.out(0).raw_data(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BatchNormPivot", DeviceType::kCuda, BatchNormPivotKernel);

// (x, pivot) -> sums [2, C] f64.
Status BatchNormStatsKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const ChannelDims dims = ChannelDimsOf(ctx.in(0).shape());
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, Workspace(BatchNormStatsWorkspaceSize(dims), ctx.device));
  return DispatchCudaFloat(ctx.in(0).dtype(), "BatchNormStats", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchBatchNormStats<T>(dims, ctx.in(0).raw_data(), ctx.in(1).raw_data(),
                                                      ctx.out(0).data<double>(), workspace.data<double>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BatchNormStats", DeviceType::kCuda, BatchNormStatsKernel);

// (x, gamma, beta, running_mean, running_var, sums, pivot) -> BatchNorm's
// outputs; attrs momentum, eps, count, activation.
Status BatchNormApplyKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const double momentum = ctx.attrs->Float("momentum"), eps = ctx.attrs->Float("eps");
  const int64_t count = ctx.attrs->Int("count");
  const ChannelDims dims = ChannelDimsOf(ctx.in(0).shape());
  const Tensor& pivot = ctx.in(6);
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, Workspace(BatchNormApplyWorkspaceSize(dims), ctx.device));
  const BatchNormArgs args = ForwardArgs(ctx);
  return DispatchCudaFloat(ctx.in(0).dtype(), "BatchNormApply", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchBatchNormApply<T>(momentum, eps, count, dims, args, pivot.raw_data(),
                                                      ctx.in(5).data<double>(), workspace.data<double>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BatchNormApply", DeviceType::kCuda, BatchNormApplyKernel);

// (dy, x, gamma, saved_mean, saved_invstd[, beta]) -> sums [2, C] f64;
// attr activation.
Status BatchNormBackwardStatsKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const ChannelDims dims = ChannelDimsOf(ctx.in(1).shape());
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, Workspace(BatchNormStatsWorkspaceSize(dims), ctx.device));
  const BatchNormBackwardArgs args = BackwardArgs(ctx, 5);
  return DispatchCudaFloat(ctx.in(0).dtype(), "BatchNormBackwardStats", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchBatchNormBackwardStats<T>(dims, args, ctx.out(0).data<double>(),
                                                              workspace.data<double>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BatchNormBackwardStats", DeviceType::kCuda, BatchNormBackwardStatsKernel);

// (dy, x, gamma, saved_mean, saved_invstd, sums[, beta]) -> (dx, dgamma,
// dbeta); attrs count, activation.
Status BatchNormBackwardApplyKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const int64_t count = ctx.attrs->Int("count");
  const ChannelDims dims = ChannelDimsOf(ctx.in(1).shape());
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, Workspace(BatchNormApplyWorkspaceSize(dims), ctx.device));
  const BatchNormBackwardArgs args = BackwardArgs(ctx, 6);
  return DispatchCudaFloat(ctx.in(0).dtype(), "BatchNormBackwardApply", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchBatchNormBackwardApply<T>(count, dims, args, ctx.in(5).data<double>(),
                                                              workspace.data<double>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BatchNormBackwardApply", DeviceType::kCuda, BatchNormBackwardApplyKernel);

RowDims RowsOf(const KernelContext& ctx, const Shape& x) {
  const RowLayout l = LayerNormRowsOf(x, *ctx.attrs);
  return {l.rows, l.d, l.replicas, l.block};
}

Status LayerNormKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const double eps = ctx.attrs->Float("eps");
  const Tensor& x = ctx.in(0);
  const RowDims l = RowsOf(ctx, x.shape());
  return DispatchCudaFloat(x.dtype(), "LayerNorm", [&](auto zero) -> Status {
    using T = decltype(zero);
    const T* gamma = ctx.inputs.size() > 1 ? ctx.in(1).data<T>() : nullptr;
    const T* beta = ctx.inputs.size() > 2 ? ctx.in(2).data<T>() : nullptr;
    LOOM_CUDA_RETURN_IF_ERROR(LaunchLayerNorm(l, eps, x.data<T>(), gamma, beta, ctx.out(0).data<T>(),
                                              ctx.out(1).data<T>(), ctx.out(2).data<T>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("LayerNorm", DeviceType::kCuda, LayerNormKernel);

Status LayerNormBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const RowDims l = RowsOf(ctx, ctx.in(1).shape());
  const bool affine = ctx.inputs.size() == 5;
  Tensor workspace;
  if (affine) {
    LOOM_ASSIGN_OR_RETURN(workspace, Workspace(LayerNormBackwardWorkspaceSize(l), ctx.device));
  }
  return DispatchCudaFloat(ctx.in(0).dtype(), "LayerNormBackward", [&](auto zero) -> Status {
    using T = decltype(zero);
    const T* gamma = affine ? ctx.in(4).data<T>() : nullptr;
    T* dgamma = affine ? ctx.out(1).data<T>() : nullptr;
    T* dbeta = affine ? ctx.out(2).data<T>() : nullptr;
    double* scratch = affine ? workspace.data<double>() : nullptr;
    LOOM_CUDA_RETURN_IF_ERROR(LaunchLayerNormBackward(l, ctx.in(0).data<T>(), ctx.in(1).data<T>(),
                                                      ctx.in(2).data<T>(), ctx.in(3).data<T>(), gamma,
                                                      ctx.out(0).data<T>(), dgamma, dbeta, scratch, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("LayerNormBackward", DeviceType::kCuda, LayerNormBackwardKernel);

}  // namespace
}  // namespace loom::cuda
