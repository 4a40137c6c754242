// Launchers of the conv family's device code (conv_kernels.cu): the parts of
// the convolution ops that cuDNN does not do as the CPU ops define them
// (per-channel biases, the bias gradient, re-windowing image planes).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "core/half.h"

namespace loom::cuda {

// The arithmetic type of T: float for bf16 / f16 (widened, rounded once on
// the store), T itself for f32 / f64.
template <typename T>
using ConvAcc = decltype(WidenFloat(T{}));

// y [n, c, hw] = bias[c] + (accumulate ? y : 0); a null bias adds nothing
// (with accumulate false: y = 0).
template <typename T>
cudaError_t LaunchChannelBias(T* y, const T* bias, int64_t n, int64_t c, int64_t hw, bool accumulate,
                              cudaStream_t stream);

// dst [planes, dst_h, dst_w] = src [planes, src_h, src_w] read at (y + off_h,
// x + off_w), zero where that falls outside src, plus bias[plane % channels]
// when a bias is given.
struct PlaneWindow {
  int64_t planes = 0, channels = 1;
  int64_t src_h = 0, src_w = 0, dst_h = 0, dst_w = 0;
  int64_t off_h = 0, off_w = 0;
};
template <typename T>
cudaError_t LaunchPlaneWindowCopy(const PlaneWindow& window, const T* src, const T* bias, T* dst, cudaStream_t stream);

// The bias gradient db [c] = the sum of dy [n, c, s] over n and s, in
// `chunks` fixed slices per channel (partial [c, chunks], summed in slice
// order): deterministic, and enough blocks for a few channels of long sums.
constexpr int64_t kChannelSumMinPerBlock = 4096;
inline int64_t ChannelSumChunks(int64_t per_channel, int64_t channels) {
  const int64_t wanted = (per_channel + kChannelSumMinPerBlock - 1) / kChannelSumMinPerBlock;
  const int64_t for_occupancy = std::max<int64_t>(1, (1024 + channels - 1) / std::max<int64_t>(1, channels));
  return std::clamp<int64_t>(std::min(wanted, for_occupancy), 1, 256);
}
// partial holds c * chunks elements of the arithmetic type (unused when
// chunks == 1), so that half sums round once.
template <typename T>
cudaError_t LaunchChannelSum(const T* dy, int64_t n, int64_t c, int64_t s, int64_t chunks, ConvAcc<T>* partial, T* db,
                             cudaStream_t stream);

}  // namespace loom::cuda
