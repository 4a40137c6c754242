// Launchers of the optimizer family's device code (optimizer_kernels.cu):
// the update ops of ops/optimizer_ops.cc, the clipping norm and factor and
// IsFinite. T is float or double.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

constexpr int kMaxOptimizerSlots = 3;
// Float attributes of an update op, in the order the op declares them.
constexpr int kMaxUpdateHyper = 4;
// Per-replica scalars and the nodes' pointers travel in the kernel's
// parameters (no host-to-device copy, under 4 KiB); more replicas or nodes
// than these take more launches.
constexpr int kMaxReplicasPerLaunch = 32;
constexpr int kMaxNodesPerLaunch = 24;

enum class UpdateRule { kSgd, kAdam, kAdadelta, kRmsprop };

// Op-level (not per-replica) boolean attributes.
struct UpdateFlags {
  bool nesterov = false;   // SGD
  bool decoupled = false;  // Adam: AdamW
  bool centered = false;   // RMSprop: the last slot is the gradient average
};

// Replica r's float attributes:
//   SGD      momentum, dampening, weight_decay
//   Adam     beta1, beta2, eps, weight_decay (amsgrad = 3 slots)
//   Adadelta rho, eps, weight_decay
//   RMSprop  alpha, eps, weight_decay, momentum
struct UpdateHyper {
  double v[kMaxUpdateHyper] = {0, 0, 0, 0};
};

// The tensors of one update node. Every tensor is [replicas * n] with
// replica r owning [r * n, (r + 1) * n); unfused, replicas = 1 and n is the
// whole tensor. lr has one entry per replica, step is one scalar, active is
// null when unfused. Outputs may alias their inputs (in place).
template <typename T>
struct UpdateTensors {
  int64_t n = 0;
  const T* p = nullptr;
  const T* g = nullptr;
  T* new_p = nullptr;
  const T* slot[kMaxOptimizerSlots] = {};
  T* new_slot[kMaxOptimizerSlots] = {};
  const T* lr = nullptr;
  const T* step = nullptr;
  const T* active = nullptr;
};

// Updates `count` nodes of one rule with equal attributes (flags, `slots`
// state slots, `replicas` and their hyper-parameters) in one launch per
// kMaxNodesPerLaunch nodes and kMaxReplicasPerLaunch replicas: a model's
// optimizer step as a few multi-tensor launches instead of one per
// parameter. lr, step and active are read on the device. No node may write
// what another reads.
template <typename T>
cudaError_t LaunchUpdate(UpdateRule rule, const UpdateFlags& flags, int slots, const UpdateTensors<T>* nodes,
                         int count, const UpdateHyper* hyper, int64_t replicas, cudaStream_t stream);

// SquaredNorm: elements per tile, each tile's sum is one partial.
constexpr int64_t kSquaredNormTile = 16384;

// The partials per sum (columns of the temporary): tiles over every chunk.
inline int64_t SquaredNormPartials(const int64_t* chunk_n, int count) {
  int64_t tiles = 0;
  for (int i = 0; i < count; ++i) tiles += (chunk_n[i] + kSquaredNormTile - 1) / kSquaredNormTile;
  return tiles;
}

// out[r] = sum over inputs k of sum of x_k[r * chunk_n[k] + j]^2, j < chunk_n[k],
// for r < sums, accumulated in double. Two passes without atomics: each tile
// of each chunk sums into partial[r * P + tile] (P = SquaredNormPartials),
// then one block per r adds its P partials in a fixed order. partial holds
// sums * P doubles (may be null when P = 0).
template <typename T>
cudaError_t LaunchSquaredNorm(const T* const* x, const int64_t* chunk_n, int count, int64_t sums, double* partial,
                              T* out, cudaStream_t stream);

// out[r] = min(1, max_norm[r] / (norm[r] + 1e-6)) in double; NaN stays NaN.
template <typename T>
cudaError_t LaunchClipScale(const T* norm, T* out, const double* max_norm, int64_t count, cudaStream_t stream);

// y[i] = 1 where x[i] is finite, else 0.
template <typename T>
cudaError_t LaunchIsFinite(const T* x, T* y, int64_t n, cudaStream_t stream);

}  // namespace loom::cuda
