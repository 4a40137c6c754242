// CUDA kernels of ops/loss_ops.cc: CrossEntropy, NLL, MSE, BCEWithLogits and
// their backward ops, f32 and f64, class targets i32 or i64, fused
// CrossEntropy and BCEWithLogits too. Attributes, layouts, reductions and
// mean denominators are the CPU kernels'.
//
// Out-of-range class targets: the CPU fails the forward op with
// InvalidArgument naming the first bad position. The forward kernels find
// that position on the device (never reading out of bounds) and the wrapper
// copies back a 16-byte record and waits for it: the one stream sync of
// these kernels, because the op's contract is an error from this call and
// there is no deferred device-error path in the executor. The backward ops
// do not sync: their forward op has already checked the same targets, and
// a bad target there turns its gradient row into NaN instead.
#include <algorithm>
#include <string>
#include <vector>

#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/loss_kernels.h"
#include "ops/loss_geometry.h"

namespace loom::cuda {
namespace {

// The CPU's ClassLayoutOf (ops/loss_geometry.h) as the launchers' shape.
ClassShape ClassShapeOf(const Shape& scores) {
  const ClassLayout L = ClassLayoutOf(scores);
  return {L.batch, L.classes, L.inner};
}

// Calls fn(T{}, I{}) for the float dtype of the scores and the index dtype of the targets.
template <typename Fn>
Status DispatchFloatIndex(DType float_dtype, DType index_dtype, const char* op, Fn&& fn) {
  return DispatchCudaFloat(float_dtype, op, [&](auto zf) -> Status {
    switch (index_dtype) {
      case DType::kI32: return fn(zf, int32_t{});
      case DType::kI64: return fn(zf, int64_t{});
      default: return Unimplemented("no CUDA kernel for ", op, " with index dtype ", DTypeName(index_dtype));
    }
  });
}

StatusOr<Tensor> Scratch(int64_t words, const KernelContext& ctx) {
  return Tensor::Empty(Shape{std::max<int64_t>(1, words)}, DType::kI64, ctx.device);
}

// Waits for the forward kernels' TargetChecks (one per replica, `words`
// apart in the scratch) and turns the first bad target into the CPU's error,
// its position in the whole targets tensor.
Status CheckTargets(const std::string& op, const Tensor& scratch, int64_t words, const LossReplicas& rep,
                    const Tensor& targets, int64_t classes, int64_t ignore, cudaStream_t stream) {
  std::vector<TargetCheck> checks(static_cast<size_t>(rep.count));
  for (int64_t r = 0; r < rep.count; ++r)
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&checks[r], scratch.data<int64_t>() + r * words, sizeof(TargetCheck),
                                              cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  for (int64_t r = 0; r < rep.count; ++r)
    if (checks[r].bad_position >= 0)
      return TargetOutOfRange(op, checks[r].bad_value, r * rep.target_stride + checks[r].bad_position,
                              targets.shape(), classes, ignore);
  return Status::Ok();
}

// ------------------------------------------------------------- CrossEntropy

// A fused loss (attribute replicas) runs the unfused launches once per
// replica on its chunks, each with its own scratch; one sync checks all.
Status CrossEntropyKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  const Tensor& t = ctx.in(1);
  const LossReplicas rep = LossReplicasOf(*ctx.attrs, x.shape(), t.shape());
  const ClassShape shape = ClassShapeOf(rep.scores);
  const int64_t ignore = ctx.attrs->Int("ignore_index");
  const double eps = ctx.attrs->Float("label_smoothing");
  const int64_t words = ClassLossScratchWords(shape.samples(), true);
  LOOM_ASSIGN_OR_RETURN(Tensor scratch, Scratch(rep.count * words, ctx));
  LOOM_RETURN_IF_ERROR(DispatchFloatIndex(x.dtype(), t.dtype(), "CrossEntropy", [&](auto zf, auto zi) -> Status {
    using T = decltype(zf);
    using I = decltype(zi);
    for (int64_t r = 0; r < rep.count; ++r)
      LOOM_CUDA_RETURN_IF_ERROR(LaunchCrossEntropy(x.data<T>() + r * rep.scores.numel(),
                                                   t.data<I>() + r * rep.target_stride, shape, ignore, eps,
                                                   IsMeanReduction(*ctx.attrs), ctx.out(0).data<T>() + r,
                                                   scratch.data<int64_t>() + r * words, stream));
    return Status::Ok();
  }));
  return CheckTargets("CrossEntropy", scratch, words, rep, t, shape.classes, ignore, stream);
}
LOOM_REGISTER_KERNEL("CrossEntropy", DeviceType::kCuda, CrossEntropyKernel);

Status CrossEntropyBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  const Tensor& t = ctx.in(1);
  const LossReplicas rep = LossReplicasOf(*ctx.attrs, x.shape(), t.shape());
  const ClassShape shape = ClassShapeOf(rep.scores);
  const int64_t ignore = ctx.attrs->Int("ignore_index");
  const double eps = ctx.attrs->Float("label_smoothing");
  LOOM_ASSIGN_OR_RETURN(Tensor count, Scratch(rep.count, ctx));  // a word per replica
  return DispatchFloatIndex(x.dtype(), t.dtype(), "CrossEntropyBackward", [&](auto zf, auto zi) -> Status {
    using T = decltype(zf);
    using I = decltype(zi);
    const int64_t per = rep.scores.numel();
    for (int64_t r = 0; r < rep.count; ++r)
      LOOM_CUDA_RETURN_IF_ERROR(LaunchCrossEntropyBackward(
          x.data<T>() + r * per, t.data<I>() + r * rep.target_stride, ctx.in(2).data<T>() + r, shape, ignore, eps,
          IsMeanReduction(*ctx.attrs), ctx.out(0).data<T>() + r * per, count.data<int64_t>() + r, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("CrossEntropyBackward", DeviceType::kCuda, CrossEntropyBackwardKernel);

// CountTargets: the targets (a batch's class indices, small) are copied to
// the host and counted there with the CPU's check, like the forward losses'
// one sync.
Status CountTargetsKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& t = ctx.in(0);
  const int64_t classes = ctx.attrs->Int("classes"), ignore = ctx.attrs->Int("ignore_index");
  const LossReplicas rep = StackedTargets(ctx.attrs->Int("replicas"), t.shape());  // [R] counts when fused
  StatusOr<std::vector<int64_t>> counts = Internal("CountTargets: index dtype ", DTypeName(t.dtype()));
  auto count_as = [&](auto zero) -> Status {
    using I = decltype(zero);
    std::vector<I> host(static_cast<size_t>(t.numel()));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), t.raw_data(), t.nbytes(), cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    counts = CountReplicaTargets("CountTargets", host.data(), t.shape(), rep, classes, ignore);
    return Status::Ok();
  };
  if (t.dtype() == DType::kI32) LOOM_RETURN_IF_ERROR(count_as(int32_t{}));
  else if (t.dtype() == DType::kI64) LOOM_RETURN_IF_ERROR(count_as(int64_t{}));
  LOOM_RETURN_IF_ERROR(counts.status());
  return DispatchCudaFloat(ctx.out(0).dtype(), "CountTargets", [&](auto zero) -> Status {
    using T = decltype(zero);
    const std::vector<T> values(counts->begin(), counts->end());
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ctx.out(0).raw_data(), values.data(), values.size() * sizeof(T),
                                              cudaMemcpyHostToDevice, stream));
    // `values` lives on this stack: wait for the copy before it goes.
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("CountTargets", DeviceType::kCuda, CountTargetsKernel);

// ---------------------------------------------------------------------- NLL

Status NllKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& lp = ctx.in(0);
  const Tensor& t = ctx.in(1);
  const ClassShape shape = ClassShapeOf(lp.shape());
  const int64_t ignore = ctx.attrs->Int("ignore_index");
  LOOM_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ClassLossScratchWords(shape.samples(), false), ctx));
  LOOM_RETURN_IF_ERROR(DispatchFloatIndex(lp.dtype(), t.dtype(), "NLL", [&](auto zf, auto zi) -> Status {
    using T = decltype(zf);
    using I = decltype(zi);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchNll(lp.data<T>(), t.data<I>(), shape, ignore, IsMeanReduction(*ctx.attrs),
                                        ctx.out(0).data<T>(), scratch.raw_data(), stream));
    return Status::Ok();
  }));
  return CheckTargets("NLL", scratch, 0, LossReplicas{}, t, shape.classes, ignore, stream);
}
LOOM_REGISTER_KERNEL("NLL", DeviceType::kCuda, NllKernel);

Status NllBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& t = ctx.in(0);
  Tensor& dlp = ctx.out(0);
  const ClassShape shape = ClassShapeOf(dlp.shape());
  const int64_t ignore = ctx.attrs->Int("ignore_index");
  LOOM_ASSIGN_OR_RETURN(Tensor count, Scratch(1, ctx));
  return DispatchFloatIndex(dlp.dtype(), t.dtype(), "NLLBackward", [&](auto zf, auto zi) -> Status {
    using T = decltype(zf);
    using I = decltype(zi);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchNllBackward(t.data<I>(), ctx.in(1).data<T>(), shape, ignore,
                                                IsMeanReduction(*ctx.attrs), dlp.data<T>(), count.raw_data(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("NLLBackward", DeviceType::kCuda, NllBackwardKernel);

// ---------------------------------------------------------------------- MSE

Status MseKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& p = ctx.in(0);
  LOOM_ASSIGN_OR_RETURN(Tensor scratch, Scratch(SumLossScratchWords(p.numel()), ctx));
  return DispatchCudaFloat(p.dtype(), "MSE", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchMse(p.data<T>(), ctx.in(1).data<T>(), p.numel(), IsMeanReduction(*ctx.attrs),
                                        ctx.out(0).data<T>(), scratch.raw_data(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("MSE", DeviceType::kCuda, MseKernel);

Status MseBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& p = ctx.in(0);
  return DispatchCudaFloat(p.dtype(), "MSEBackward", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchMseBackward(p.data<T>(), ctx.in(1).data<T>(), ctx.in(2).data<T>(), p.numel(),
                                                IsMeanReduction(*ctx.attrs), ctx.out(0).data<T>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("MSEBackward", DeviceType::kCuda, MseBackwardKernel);

// ------------------------------------------------------------ BCEWithLogits

// pos_weight's offsets against the logits (unused without pos_weight).
StatusOr<PosWeightIndex> PosWeightIndexOf(const Shape& logits, const Tensor* pos_weight) {
  PosWeightIndex index;
  if (pos_weight == nullptr) return index;
  LOOM_ASSIGN_OR_RETURN(BroadcastIndex b, MakeBroadcastIndex(logits, {pos_weight->shape()}));
  static_assert(kBceMaxRank == kMaxKernelRank, "PosWeightIndex mirrors BroadcastIndex");
  index.rank = b.rank;
  for (int d = 0; d < b.rank; ++d) {
    index.dims[d] = b.dims[d];
    index.strides[d] = b.strides[0][d];
  }
  return index;
}

// A fused op (attribute replicas) launches the unfused kernels once per
// replica, on its slabs.
Status BceWithLogitsKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  const Tensor* pw = ctx.inputs.size() == 3 ? &ctx.in(2) : nullptr;
  const BceReplicas rep = BceReplicasOf(*ctx.attrs, x.shape(), ctx.in(1).shape());
  LOOM_ASSIGN_OR_RETURN(const PosWeightIndex index, PosWeightIndexOf(rep.logits, pw));
  // Stream-ordered launches: each replica's reduction reuses the scratch.
  LOOM_ASSIGN_OR_RETURN(Tensor scratch, Scratch(SumLossScratchWords(rep.logits.numel()), ctx));
  return DispatchCudaFloat(x.dtype(), "BCEWithLogits", [&](auto zero) -> Status {
    using T = decltype(zero);
    for (int64_t r = 0; r < rep.count; ++r)
      LOOM_CUDA_RETURN_IF_ERROR(LaunchBceWithLogits(
          x.data<T>() + r * rep.logits_stride, ctx.in(1).data<T>() + r * rep.targets_stride,
          pw ? pw->data<T>() : nullptr, index, rep.logits.numel(), IsMeanReduction(*ctx.attrs),
          ctx.out(0).data<T>() + r, scratch.raw_data(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BCEWithLogits", DeviceType::kCuda, BceWithLogitsKernel);

Status BceWithLogitsBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(1);
  const Tensor* pw = ctx.inputs.size() == 4 ? &ctx.in(3) : nullptr;
  const std::string wrt_name = ctx.attrs->Str("wrt");
  const BceWrt wrt = wrt_name == "targets"      ? BceWrt::kTargets
                     : wrt_name == "pos_weight" ? BceWrt::kPosWeight
                                                : BceWrt::kLogits;
  const BceReplicas rep = BceReplicasOf(*ctx.attrs, x.shape(), ctx.in(2).shape());
  LOOM_ASSIGN_OR_RETURN(const PosWeightIndex index, PosWeightIndexOf(rep.logits, pw));
  return DispatchCudaFloat(x.dtype(), "BCEWithLogitsBackward", [&](auto zero) -> Status {
    using T = decltype(zero);
    for (int64_t r = 0; r < rep.count; ++r)
      LOOM_CUDA_RETURN_IF_ERROR(LaunchBceWithLogitsBackward(
          ctx.in(0).data<T>() + r, x.data<T>() + r * rep.logits_stride, ctx.in(2).data<T>() + r * rep.targets_stride,
          pw ? pw->data<T>() : nullptr, index, rep.logits.numel(), IsMeanReduction(*ctx.attrs), wrt,
          ctx.out(0).data<T>() + r * rep.logits_stride, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("BCEWithLogitsBackward", DeviceType::kCuda, BceWithLogitsBackwardKernel);

}  // namespace
}  // namespace loom::cuda
