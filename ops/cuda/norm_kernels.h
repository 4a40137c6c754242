// Launchers of the norm family's device code (norm_kernels.cu): BatchNorm,
// BatchNormBackward, the pieces of a BatchNorm split along the batch
// (BatchNormPivot, BatchNormStats, BatchNormApply, BatchNormBackwardStats,
// BatchNormBackwardApply), LayerNorm and LayerNormBackward. Statistics
// accumulate in double, as on the CPU; per-channel and per-column sums are
// split over blocks in a fixed way and combined in a fixed order (no
// atomics). A training BatchNorm is its sums followed by what
// BatchNormApply does with them (the same device code), and likewise its
// backward.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// BatchNorm's x viewed as [n, c, s]: batch, channels, flattened spatial dims.
struct ChannelDims {
  int64_t n = 0, c = 0, s = 1;
};

// LayerNorm's x viewed as [rows, d]; row r reads row r / block % replicas of
// gamma and beta [replicas, d] (ops/norm_geometry.h's RowLayout).
struct RowDims {
  int64_t rows = 0, d = 1, replicas = 1, block = 1;
};

// Doubles of device workspace LaunchBatchNorm and LaunchBatchNormBackward need.
int64_t BatchNormWorkspaceSize(const ChannelDims& dims);
// Doubles LaunchBatchNormStats and LaunchBatchNormBackwardStats need (0 when
// the sums are not split over blocks).
int64_t BatchNormStatsWorkspaceSize(const ChannelDims& dims);
// Doubles LaunchBatchNormApply and LaunchBatchNormBackwardApply need.
int64_t BatchNormApplyWorkspaceSize(const ChannelDims& dims);

// Attr activation of the BatchNorm ops, applied in their own passes: y =
// act(x * scale + shift), scale and shift made from the saved statistics as
// stored; backward, dy taken through the activation's backward at z = x *
// scale + shift, rebuilt from x, beta and the saved statistics by the same
// arithmetic (ops/activation_formulas.h, as the activations' own kernels).
enum class NormActivation { kNone, kRelu, kRelu6, kHardswish };

struct BatchNormArgs {
  const void* x;
  const void* gamma;
  const void* beta;
  const void* running_mean;
  const void* running_var;
  void* y;
  void* new_running_mean;
  void* new_running_var;
  void* saved_mean;
  void* saved_invstd;
  NormActivation activation = NormActivation::kNone;
};

// Training: batch statistics (biased variance normalizes, unbiased variance
// moves the running one by momentum); eval: the running statistics. saved_*
// are the statistics used. Pointers are T arrays.
template <typename T>
cudaError_t LaunchBatchNorm(bool training, double momentum, double eps, const ChannelDims& dims,
                            const BatchNormArgs& args, double* workspace, cudaStream_t stream);

// BatchNormPivot: pivot[ch] = x[0, ch, 0...] when `first` (and the batch is
// not empty), else 0.
template <typename T>
cudaError_t LaunchBatchNormPivot(bool first, const ChannelDims& dims, const void* x, void* pivot,
                                 cudaStream_t stream);

// BatchNormStats: sums [2, c] (device doubles) = per channel, the sum of d
// and of d^2 over x's values, d = x - pivot[ch].
template <typename T>
cudaError_t LaunchBatchNormStats(const ChannelDims& dims, const void* x, const void* pivot, double* sums,
                                 double* workspace, cudaStream_t stream);

// BatchNormApply: LaunchBatchNorm's training outputs with the statistics of
// `sums` ([2, c], around `pivot`) over `count` values per channel.
template <typename T>
cudaError_t LaunchBatchNormApply(double momentum, double eps, int64_t count, const ChannelDims& dims,
                                 const BatchNormArgs& args, const void* pivot, const double* sums, double* workspace,
                                 cudaStream_t stream);

struct BatchNormBackwardArgs {
  const void* dy;
  const void* x;
  const void* gamma;
  const void* saved_mean;
  const void* saved_invstd;
  void* dx;
  void* dgamma;
  void* dbeta;
  const void* beta = nullptr;  // the BatchNorm's, with an activation (the mask's z)
  NormActivation activation = NormActivation::kNone;
};

template <typename T>
cudaError_t LaunchBatchNormBackward(bool training, const ChannelDims& dims, const BatchNormBackwardArgs& args,
                                    double* workspace, cudaStream_t stream);

// BatchNormBackwardStats: sums [2, c] = per channel, the sum of dy and of
// dy * (x - mean[ch]), dy masked as `args.activation` says; args' outputs
// are not used.
template <typename T>
cudaError_t LaunchBatchNormBackwardStats(const ChannelDims& dims, const BatchNormBackwardArgs& args, double* sums,
                                         double* workspace, cudaStream_t stream);

// BatchNormBackwardApply: LaunchBatchNormBackward's training outputs with
// `sums` ([2, c], as BatchNormBackwardStats) over `count` values per channel.
template <typename T>
cudaError_t LaunchBatchNormBackwardApply(int64_t count, const ChannelDims& dims, const BatchNormBackwardArgs& args,
                                         const double* sums, double* workspace, cudaStream_t stream);

// LayerNorm over rows of d elements; gamma and beta may be null.
template <typename T>
cudaError_t LaunchLayerNorm(const RowDims& dims, double eps, const T* x, const T* gamma, const T* beta, T* y,
                            T* saved_mean, T* saved_rstd, cudaStream_t stream);

// Doubles of device workspace LaunchLayerNormBackward needs with gamma.
int64_t LayerNormBackwardWorkspaceSize(const RowDims& dims);

// dx always; dgamma and dbeta [replicas, d] (and the workspace) only when
// gamma is given.
template <typename T>
cudaError_t LaunchLayerNormBackward(const RowDims& dims, const T* dy, const T* x, const T* mean, const T* rstd,
                                    const T* gamma, T* dx, T* dgamma, T* dbeta, double* workspace,
                                    cudaStream_t stream);

}  // namespace loom::cuda
