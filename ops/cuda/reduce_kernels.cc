// CUDA kernels of ops/reduce_ops.cc: ReduceSum, ReduceMean, ReduceMax,
// ReduceMaxBackward, Softmax, LogSoftmax, SoftmaxBackward and
// LogSoftmaxBackward, f32 and f64, with the CPU kernels' semantics.
#include "ops/cuda/reduce_kernels.h"

#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_kernel_util.h"
#include "ops/reduce_geometry.h"

namespace loom::cuda {
namespace {

// ReduceGroupsOf (ops/reduce_geometry.h, the CPU kernel's layout) as the
// device index, which takes up to kReduceMaxGroups groups of each kind.
StatusOr<ReduceDims> MakeReduceDims(const std::string& op, const Shape& x, const std::vector<bool>& mask) {
  const ReduceGroups g = ReduceGroupsOf(x, mask);
  if (g.kept_dims.size() > static_cast<size_t>(kReduceMaxGroups) ||
      g.red_dims.size() > static_cast<size_t>(kReduceMaxGroups))
    return Unimplemented(op, " on CUDA: input ", x.ToString(), " alternates reduced and kept dims more than ",
                         kReduceMaxGroups, " times");
  ReduceDims r;
  r.rows = g.rows;
  r.inner = g.inner;
  r.reduced = g.reduced;
  r.kept_rank = static_cast<int>(g.kept_dims.size());
  std::copy(g.kept_dims.begin(), g.kept_dims.end(), r.kept_dims);
  std::copy(g.kept_strides.begin(), g.kept_strides.end(), r.kept_strides);
  r.red_rank = static_cast<int>(g.red_dims.size());
  std::copy(g.red_dims.begin(), g.red_dims.end(), r.red_dims);
  std::copy(g.red_strides.begin(), g.red_strides.end(), r.red_strides);
  return r;
}

const char* OpName(const KernelContext& ctx, const char* fallback) {
  return ctx.node ? ctx.node->op.c_str() : fallback;
}

// Device scratch for split reductions' partial results (undefined when none).
StatusOr<Tensor> ReduceWorkspace(const ReduceDims& dims, const Device& device) {
  const int64_t elems = ReduceWorkspaceElems(dims);
  if (elems == 0) return Tensor();
  return Tensor::Empty(Shape({elems}), DType::kF64, device);
}

void* WorkspacePtr(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

template <ReduceKind kKind>
Status ReduceKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const char* op = OpName(ctx, "Reduce");
  const Tensor& x = ctx.in(0);
  LOOM_ASSIGN_OR_RETURN(std::vector<bool> mask, ResolveReduceAxes(op, *ctx.attrs, x.shape()));
  LOOM_ASSIGN_OR_RETURN(ReduceDims dims, MakeReduceDims(op, x.shape(), mask));
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, ReduceWorkspace(dims, ctx.device));
  return DispatchCudaFloat(x.dtype(), op, [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(
        LaunchReduce(kKind, x.data<T>(), ctx.out(0).data<T>(), dims, WorkspacePtr(workspace), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("ReduceSum", DeviceType::kCuda, ReduceKernel<ReduceKind::kSum>);
LOOM_REGISTER_KERNEL("ReduceMean", DeviceType::kCuda, ReduceKernel<ReduceKind::kMean>);

// y and index (the first maximum's reduced index): the maximum, then a
// second pass for where it is first met.
Status ReduceMaxKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  LOOM_ASSIGN_OR_RETURN(std::vector<bool> mask, ResolveReduceAxes("ReduceMax", *ctx.attrs, x.shape()));
  LOOM_ASSIGN_OR_RETURN(ReduceDims dims, MakeReduceDims("ReduceMax", x.shape(), mask));
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, ReduceWorkspace(dims, ctx.device));
  return DispatchCudaFloat(x.dtype(), "ReduceMax", [&](auto zero) -> Status {
    using T = decltype(zero);
    T* y = ctx.out(0).data<T>();
    LOOM_CUDA_RETURN_IF_ERROR(LaunchReduce(ReduceKind::kMax, x.data<T>(), y, dims, WorkspacePtr(workspace), stream));
    LOOM_CUDA_RETURN_IF_ERROR(
        LaunchReduceMaxIndex(x.data<T>(), y, ctx.out(1).data<int64_t>(), dims, WorkspacePtr(workspace), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("ReduceMax", DeviceType::kCuda, ReduceMaxKernel);

Status ReduceMaxBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  LOOM_ASSIGN_OR_RETURN(std::vector<bool> mask, ResolveReduceAxes("ReduceMaxBackward", *ctx.attrs, x.shape()));
  LOOM_ASSIGN_OR_RETURN(ReduceDims dims, MakeReduceDims("ReduceMaxBackward", x.shape(), mask));
  return DispatchCudaFloat(x.dtype(), "ReduceMaxBackward", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchReduceMaxBackward(ctx.in(1).data<int64_t>(), ctx.in(2).data<T>(),
                                                      ctx.out(0).data<T>(), x.numel(), dims, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("ReduceMaxBackward", DeviceType::kCuda, ReduceMaxBackwardKernel);

StatusOr<SoftmaxDims> SoftmaxDimsOf(const char* op, const AttrMap& attrs, const Shape& x) {
  LOOM_ASSIGN_OR_RETURN(const AxisLayout L, ResolveSoftmaxAxis(op, attrs, x));
  return SoftmaxDims{L.outer, L.len, L.inner};
}

template <bool kLog>
Status SoftmaxKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const char* op = kLog ? "LogSoftmax" : "Softmax";
  const Tensor& x = ctx.in(0);
  LOOM_ASSIGN_OR_RETURN(SoftmaxDims dims, SoftmaxDimsOf(op, *ctx.attrs, x.shape()));
  return DispatchCudaFloat(x.dtype(), op, [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchSoftmax(kLog, x.data<T>(), ctx.out(0).data<T>(), dims, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("Softmax", DeviceType::kCuda, SoftmaxKernel<false>);
LOOM_REGISTER_KERNEL("LogSoftmax", DeviceType::kCuda, SoftmaxKernel<true>);

template <bool kLog>
Status SoftmaxBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const char* op = kLog ? "LogSoftmaxBackward" : "SoftmaxBackward";
  const Tensor& y = ctx.in(0);
  LOOM_ASSIGN_OR_RETURN(SoftmaxDims dims, SoftmaxDimsOf(op, *ctx.attrs, y.shape()));
  return DispatchCudaFloat(y.dtype(), op, [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(
        LaunchSoftmaxBackward(kLog, y.data<T>(), ctx.in(1).data<T>(), ctx.out(0).data<T>(), dims, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("SoftmaxBackward", DeviceType::kCuda, SoftmaxBackwardKernel<false>);
LOOM_REGISTER_KERNEL("LogSoftmaxBackward", DeviceType::kCuda, SoftmaxBackwardKernel<true>);

}  // namespace
}  // namespace loom::cuda
