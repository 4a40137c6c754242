// Launchers of the pool family's device code (pool_kernels.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// `planes` planes [H, W] pooled to [OH, OW]. Sliding windows: output o of an
// axis starts at o * stride - padding and takes `kernel` taps `dilation`
// apart (average pools: dilation 1); include_pad makes an average divide by
// the padded window (PyTorch's count_include_pad). Adaptive pools use only
// the extents: window o of an axis of extent H is [floor(o * H / OH),
// ceil((o + 1) * H / OH)).
struct PoolGeom {
  int64_t planes = 0, h = 0, w = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  bool include_pad = true;
  int64_t index_offset = 0;  // added to max-pool indices: a row split's part counts in the whole plane
};

// y, idx [planes, OH, OW]: each window's maximum and the flat h * W + w of
// it in its plane, plus index_offset (NaN wins, ties keep the first; -inf
// and -1 for a window with no input element).
template <typename T>
cudaError_t LaunchMaxPoolForward(const PoolGeom& g, const T* x, T* y, int64_t* idx, cudaStream_t stream);
// dx [planes, H, W]: the sum of the dy whose idx names the element.
template <typename T>
cudaError_t LaunchMaxPoolBackward(const PoolGeom& g, const T* dy, const int64_t* idx, T* dx, cudaStream_t stream);
template <typename T>
cudaError_t LaunchAvgPoolForward(const PoolGeom& g, const T* x, T* y, cudaStream_t stream);
template <typename T>
cudaError_t LaunchAvgPoolBackward(const PoolGeom& g, const T* dy, T* dx, cudaStream_t stream);
template <typename T>
cudaError_t LaunchAdaptiveAvgPoolForward(const PoolGeom& g, const T* x, T* y, cudaStream_t stream);
template <typename T>
cudaError_t LaunchAdaptiveAvgPoolBackward(const PoolGeom& g, const T* dy, T* dx, cudaStream_t stream);

}  // namespace loom::cuda
