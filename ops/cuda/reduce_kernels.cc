// CUDA kernels of ops/reduce_ops.cc: ReduceSum, ReduceMean, ReduceMax,
// ReduceMaxBackward, Softmax, LogSoftmax, SoftmaxBackward and
// LogSoftmaxBackward, f32 and f64, with the CPU kernels' semantics.
#include "ops/cuda/reduce_kernels.h"

#include <vector>

#include "ops/cuda/cuda_kernel_util.h"

namespace loom::cuda {
namespace {

// Which axes of x are reduced (attribute axes; empty: all), as the CPU kernel.
StatusOr<std::vector<bool>> ReducedAxes(const std::string& op, const AttrMap& attrs, const Shape& x) {
  const std::vector<int64_t> axes = attrs.Ints("axes");
  std::vector<bool> mask(x.rank(), axes.empty());
  for (int64_t a : axes) {
    auto axis = NormalizeAxis(a, x.rank());
    if (!axis.ok()) return InvalidArgument(op, ": axis ", a, " is out of range for input of shape ", x.ToString());
    mask[*axis] = true;
  }
  return mask;
}

// The CPU kernel's ReduceLayout as the device index: unit dims dropped,
// adjacent dims of one kind merged, trailing kept dims as `inner`.
StatusOr<ReduceDims> MakeReduceDims(const std::string& op, const Shape& x, const std::vector<bool>& mask) {
  const std::vector<int64_t> strides = x.Strides();
  struct Group {
    bool reduced;
    int64_t size, stride;
  };
  std::vector<Group> groups;
  for (int d = 0; d < x.rank(); ++d) {
    if (x[d] == 1) continue;
    if (!groups.empty() && groups.back().reduced == mask[d]) {
      groups.back().size *= x[d];
      groups.back().stride = strides[d];
    } else {
      groups.push_back({static_cast<bool>(mask[d]), x[d], strides[d]});
    }
  }
  ReduceDims r;
  if (!groups.empty() && !groups.back().reduced) {
    r.inner = groups.back().size;
    groups.pop_back();
  }
  r.red_rank = 0;
  for (const Group& g : groups) {
    int& rank = g.reduced ? r.red_rank : r.kept_rank;
    if (rank == kReduceMaxGroups)
      return Unimplemented(op, " on CUDA: input ", x.ToString(), " alternates reduced and kept dims more than ",
                           kReduceMaxGroups, " times");
    (g.reduced ? r.red_dims : r.kept_dims)[rank] = g.size;
    (g.reduced ? r.red_strides : r.kept_strides)[rank] = g.stride;
    (g.reduced ? r.reduced : r.rows) *= g.size;
    ++rank;
  }
  if (r.red_rank == 0) {  // nothing (or only unit dims) reduced
    r.red_rank = 1;
    r.red_dims[0] = 1;
    r.red_strides[0] = 0;
  }
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
  LOOM_ASSIGN_OR_RETURN(std::vector<bool> mask, ReducedAxes(op, *ctx.attrs, x.shape()));
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
LOOM_REGISTER_KERNEL("ReduceMax", DeviceType::kCuda, ReduceKernel<ReduceKind::kMax>);

Status ReduceMaxBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  LOOM_ASSIGN_OR_RETURN(std::vector<bool> mask, ReducedAxes("ReduceMaxBackward", *ctx.attrs, x.shape()));
  LOOM_ASSIGN_OR_RETURN(ReduceDims dims, MakeReduceDims("ReduceMaxBackward", x.shape(), mask));
  LOOM_ASSIGN_OR_RETURN(Tensor workspace, ReduceWorkspace(dims, ctx.device));
  return DispatchCudaFloat(x.dtype(), "ReduceMaxBackward", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchReduceMaxBackward(x.data<T>(), ctx.in(1).data<T>(), ctx.in(2).data<T>(),
                                                      ctx.out(0).data<T>(), x.numel(), dims, WorkspacePtr(workspace),
                                                      stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("ReduceMaxBackward", DeviceType::kCuda, ReduceMaxBackwardKernel);

StatusOr<SoftmaxDims> SoftmaxDimsOf(const char* op, const AttrMap& attrs, const Shape& x) {
  const int64_t given = attrs.Int("axis");
  auto axis = NormalizeAxis(given, x.rank());
  if (!axis.ok()) return InvalidArgument(op, ": attribute 'axis' = ", given, " is out of range for ", x.ToString());
  SoftmaxDims d;
  for (int k = 0; k < x.rank(); ++k) {
    if (k < *axis) d.outer *= x[k];
    else if (k > *axis) d.inner *= x[k];
  }
  d.len = x[*axis];
  return d;
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
