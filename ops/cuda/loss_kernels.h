// Launchers of the loss family's device code (loss_kernels.cu): the losses of
// ops/loss_ops.cc and their backward ops. Forward losses reduce to a scalar
// deterministically (per-sample terms, fixed per-block partial sums in
// double, then one block adding the partials in order); no float atomics.
// Each launcher queues its kernels on `stream` and returns the launch error.
// T: float or double; I (class targets): int32_t or int64_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// Scores [N, C, inner...] (or [C]) and targets [N, inner...]: the score of
// sample i = n * inner + s for class c is at (n * classes + c) * inner + s.
struct ClassShape {
  int64_t batch = 1, classes = 1, inner = 1;
  constexpr int64_t samples() const { return batch * inner; }
};

// What a class-loss forward leaves at the start of its scratch for the host:
// the first (lowest) flat position of a target outside [0, C) that is not
// ignore_index, -1 if none, and that target's value.
struct TargetCheck {
  int64_t bad_position = -1;
  int64_t bad_value = 0;
};

// Scratch of the forward launchers, in 8-byte words, from Tensor::Empty
// (the TargetCheck comes first).
int64_t ClassLossScratchWords(int64_t samples, bool cross_entropy);
int64_t SumLossScratchWords(int64_t n);

// loss[0] = the mean (over non-ignored targets) or sum of
// (1 - eps) * -log p[target] + eps / C * sum_c -log p[c], p = softmax over C.
template <typename T, typename I>
cudaError_t LaunchCrossEntropy(const T* logits, const I* targets, ClassShape shape, int64_t ignore_index,
                               double label_smoothing, bool mean, T* loss, void* scratch, cudaStream_t stream);

// dlogits = scale * (softmax - eps / C - (1 - eps) * onehot(target)), zero
// rows for ignored targets, NaN rows for out-of-range ones; scale is dy[0]
// over the count of counted targets for "mean". count_scratch: one word.
template <typename T, typename I>
cudaError_t LaunchCrossEntropyBackward(const T* logits, const I* targets, const T* dy, ClassShape shape,
                                       int64_t ignore_index, double label_smoothing, bool mean, T* dlogits,
                                       void* count_scratch, cudaStream_t stream);

// loss[0] = mean or sum of -log_probs[target].
template <typename T, typename I>
cudaError_t LaunchNll(const T* log_probs, const I* targets, ClassShape shape, int64_t ignore_index, bool mean, T* loss,
                      void* scratch, cudaStream_t stream);

// dlog_probs: -scale at each counted target, 0 elsewhere (NaN over every
// class of a sample with an out-of-range target). count_scratch: one word.
template <typename T, typename I>
cudaError_t LaunchNllBackward(const I* targets, const T* dy, ClassShape shape, int64_t ignore_index, bool mean,
                              T* dlog_probs, void* count_scratch, cudaStream_t stream);

// loss[0] = mean or sum of (prediction - target)^2 over n elements.
template <typename T>
cudaError_t LaunchMse(const T* prediction, const T* target, int64_t n, bool mean, T* loss, void* scratch,
                      cudaStream_t stream);

// dprediction = 2 * scale * (prediction - target).
template <typename T>
cudaError_t LaunchMseBackward(const T* prediction, const T* target, const T* dy, int64_t n, bool mean,
                              T* dprediction, cudaStream_t stream);

constexpr int kBceMaxRank = 8;

// Where element i of the logits finds its pos_weight: merged logits dims
// and pos_weight's strides along them (0 where it broadcasts).
struct PosWeightIndex {
  int rank = 0;
  int64_t dims[kBceMaxRank] = {};
  int64_t strides[kBceMaxRank] = {};
};

// loss[0] = mean or sum of (1 - t) * x + (1 + (pw - 1) * t) * softplus(-x);
// pos_weight may be null (pw = 1).
template <typename T>
cudaError_t LaunchBceWithLogits(const T* logits, const T* targets, const T* pos_weight, const PosWeightIndex& index,
                                int64_t n, bool mean, T* loss, void* scratch, cudaStream_t stream);

enum class BceWrt : int { kLogits, kTargets, kPosWeight };

// The per-element gradient wrt logits, targets or pos_weight (the latter
// still to be summed to pos_weight's shape), times scale.
template <typename T>
cudaError_t LaunchBceWithLogitsBackward(const T* dy, const T* logits, const T* targets, const T* pos_weight,
                                        const PosWeightIndex& index, int64_t n, bool mean, BceWrt wrt, T* grad,
                                        cudaStream_t stream);

}  // namespace loom::cuda
