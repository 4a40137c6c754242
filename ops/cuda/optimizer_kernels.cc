// CUDA kernels of ops/optimizer_ops.cc: SgdUpdate, AdamUpdate,
// AdadeltaUpdate, RmspropUpdate (unfused, or fused over replicas with
// per-replica hyper-parameters and active flags), SquaredNorm, ClipScale and
// IsFinite, f32 and f64. The attributes are read as the CPU kernels read
// them; lr, step and active stay on the device.
#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/optimizer_kernels.h"
#include "ops/optimizer_replicas.h"

namespace loom::cuda {
namespace {

using optimizer::ReplicaCount;
using optimizer::ReplicaFloat;
using optimizer::Replicas;

// Every replica's float attributes `names`, in the launcher's order.
std::vector<UpdateHyper> Hyper(const AttrMap& attrs, const std::vector<std::string>& names) {
  std::vector<UpdateHyper> hyper(static_cast<size_t>(ReplicaCount(attrs)));
  for (size_t r = 0; r < hyper.size(); ++r)
    for (size_t h = 0; h < names.size(); ++h) hyper[r].v[h] = ReplicaFloat(attrs, names[h], static_cast<int64_t>(r));
  return hyper;
}

// The state slots of an update node: its outputs but the new param.
StatusOr<int> Slots(const KernelContext& ctx) {
  const int slots = static_cast<int>(ctx.outputs.size()) - 1;
  if (slots < 0 || slots > kMaxOptimizerSlots) return Internal("an update op with ", slots, " state slots");
  return slots;
}

// (param, grad, slots..., lr, step[, active]) -> (new_param, new_slots...).
template <typename T>
StatusOr<UpdateTensors<T>> Tensors(KernelContext& ctx) {
  UpdateTensors<T> t;
  LOOM_ASSIGN_OR_RETURN(const int slots, Slots(ctx));
  t.n = ctx.in(0).numel() / ReplicaCount(*ctx.attrs);
  t.p = ctx.in(0).data<T>();
  t.g = ctx.in(1).data<T>();
  t.new_p = ctx.out(0).data<T>();
  for (int k = 0; k < slots; ++k) {
    t.slot[k] = ctx.in(2 + k).data<T>();
    t.new_slot[k] = ctx.out(1 + k).data<T>();
  }
  t.lr = ctx.in(2 + slots).data<T>();
  t.step = ctx.in(3 + slots).data<T>();
  // Fused ops always, unfused ones optionally (a loss-scaled step), take active.
  if (ctx.inputs.size() > static_cast<size_t>(4 + slots)) t.active = ctx.in(4 + slots).data<T>();
  return t;
}

// A group of update nodes (runtime/executor.h: equal attributes, none
// reading what another writes) as multi-tensor launches; one node is a group
// of one.
template <UpdateRule kRule>
Status UpdateGroupKernel(std::vector<KernelContext>& group) {
  KernelContext& first = group[0];
  const AttrMap& attrs = *first.attrs;
  UpdateFlags flags;
  std::vector<UpdateHyper> hyper;
  switch (kRule) {
    case UpdateRule::kSgd:
      flags.nesterov = attrs.Bool("nesterov");
      hyper = Hyper(attrs, {"momentum", "dampening", "weight_decay"});
      break;
    case UpdateRule::kAdam:
      flags.decoupled = attrs.Bool("decoupled");
      hyper = Hyper(attrs, {"beta1", "beta2", "eps", "weight_decay"});
      break;
    case UpdateRule::kAdadelta: hyper = Hyper(attrs, {"rho", "eps", "weight_decay"}); break;
    case UpdateRule::kRmsprop:
      flags.centered = attrs.Bool("centered");
      hyper = Hyper(attrs, {"alpha", "eps", "weight_decay", "momentum"});
      break;
  }
  const char* op = first.node ? first.node->op.c_str() : "an update op";
  LOOM_ASSIGN_OR_RETURN(const int slots, Slots(first));
  return DispatchCudaFloat(first.in(0).dtype(), op, [&](auto zero) -> Status {
    using T = decltype(zero);
    std::vector<UpdateTensors<T>> nodes;
    cudaStream_t stream = nullptr;
    for (KernelContext& ctx : group) {
      // Each node's tensors on its device, and every node on the first one's stream.
      LOOM_ASSIGN_OR_RETURN(cudaStream_t own, KernelStream(ctx));
      if (nodes.empty()) stream = own;
      else if (own != stream) return Internal(op, ": a group's nodes run on different streams");
      LOOM_ASSIGN_OR_RETURN(UpdateTensors<T> t, Tensors<T>(ctx));
      nodes.push_back(t);
    }
    LOOM_CUDA_RETURN_IF_ERROR(LaunchUpdate(kRule, flags, slots, nodes.data(), static_cast<int>(nodes.size()),
                                           hyper.data(), static_cast<int64_t>(hyper.size()), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_GROUP_KERNEL("SgdUpdate", DeviceType::kCuda, UpdateGroupKernel<UpdateRule::kSgd>);
LOOM_REGISTER_GROUP_KERNEL("AdamUpdate", DeviceType::kCuda, UpdateGroupKernel<UpdateRule::kAdam>);
LOOM_REGISTER_GROUP_KERNEL("AdadeltaUpdate", DeviceType::kCuda, UpdateGroupKernel<UpdateRule::kAdadelta>);
LOOM_REGISTER_GROUP_KERNEL("RmspropUpdate", DeviceType::kCuda, UpdateGroupKernel<UpdateRule::kRmsprop>);

// Unfused: one sum over every element of every input; fused: one per
// replica over its chunks of every input.
LOOM_REGISTER_KERNEL("SquaredNorm", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  return DispatchCudaFloat(ctx.in(0).dtype(), "SquaredNorm", [&](auto zero) -> Status {
    using T = decltype(zero);
    const int64_t sums = ReplicaCount(*ctx.attrs);
    std::vector<const T*> x;
    std::vector<int64_t> chunk_n;
    for (const Tensor* t : ctx.inputs) {
      x.push_back(t->data<T>());
      chunk_n.push_back(t->numel() / sums);
    }
    const int count = static_cast<int>(x.size());
    const int64_t cols = SquaredNormPartials(chunk_n.data(), count);
    LOOM_ASSIGN_OR_RETURN(Tensor partial, Tensor::Empty(Shape{std::max<int64_t>(1, sums * cols)}, DType::kF64,
                                                         ctx.device));
    LOOM_CUDA_RETURN_IF_ERROR(LaunchSquaredNorm(x.data(), chunk_n.data(), count, sums, partial.data<double>(),
                                                ctx.out(0).data<T>(), stream));
    return Status::Ok();
  });
});

LOOM_REGISTER_KERNEL("ClipScale", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  return DispatchCudaFloat(ctx.in(0).dtype(), "ClipScale", [&](auto zero) -> Status {
    using T = decltype(zero);
    const int64_t count = ReplicaCount(*ctx.attrs);
    std::vector<double> max_norm;
    for (int64_t r = 0; r < count; ++r) max_norm.push_back(ReplicaFloat(*ctx.attrs, "max_norm", r));
    LOOM_CUDA_RETURN_IF_ERROR(
        LaunchClipScale(ctx.in(0).data<T>(), ctx.out(0).data<T>(), max_norm.data(), count, stream));
    return Status::Ok();
  });
});

LOOM_REGISTER_KERNEL("IsFinite", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  return DispatchCudaFloat(ctx.in(0).dtype(), "IsFinite", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchIsFinite(ctx.in(0).data<T>(), ctx.out(0).data<T>(), ctx.in(0).numel(), stream));
    return Status::Ok();
  });
});

}  // namespace
}  // namespace loom::cuda
