// Row kernels of ScaledDotProductAttention (ops/attention_ops.cc): the masked
// softmax of the scores and its backward. Rows up to kMaxWarpRow keys go to
// one warp each and stay in registers (one read, one write per score);
// longer rows get a block each and pass over the row in global memory (L2).
// Reductions are fixed shuffle trees plus a fixed-order sum over warps, so
// the results do not depend on timing.
#include <limits>

#include "ops/attention_causal.h"
#include "ops/cuda/attention_kernels.h"
#include "ops/cuda/device_util.cuh"

namespace loom::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr int64_t kMaxWarpRow = 32 * kWarp;  // 32 values per lane

// The CPU's std::max(acc, value): a NaN value never becomes the maximum.
template <typename T>
__device__ inline T MaxOf(T acc, T value) {
  return acc < value ? value : acc;
}

// The combiners of the reductions below.
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return MaxOf(a, b);
  }
};

// Butterfly reduction over a warp; the result is lane 0's, broadcast, so
// every lane holds the same bits. Every lane of the warp must call it.
template <typename T, typename Op>
__device__ inline T WarpReduce(T v, Op op) {
  for (int s = kWarp / 2; s > 0; s >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, s));
  return __shfl_sync(0xffffffffu, v, 0);
}

// Over a block of kThreads: warp trees, then every thread combines the
// warps' results in the same order. Called by every thread of the block.
template <typename T, typename Op>
__device__ inline T BlockReduceOfWarps(T v, T* scratch, Op op) {
  v = WarpReduce(v, op);
  if (threadIdx.x % kWarp == 0) scratch[threadIdx.x / kWarp] = v;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < kWarpsPerBlock; ++w) total = op(total, scratch[w]);
  __syncthreads();  // scratch is reused by the next reduction
  return total;
}

// Read as stored, like the CPU's `m != M(0)` (a NaN float counts as padded).
__device__ inline bool IsPadded(const KeyPaddingMask& m, int64_t i) {
  switch (m.dtype) {
    case MaskDType::kNone: return false;
    case MaskDType::kBool: return static_cast<const uint8_t*>(m.data)[i] != 0;
    case MaskDType::kI32: return static_cast<const int32_t*>(m.data)[i] != 0;
    case MaskDType::kI64: return static_cast<const int64_t*>(m.data)[i] != 0;
    case MaskDType::kF32: return static_cast<const float*>(m.data)[i] != 0.0f;
    case MaskDType::kF64: return static_cast<const double*>(m.data)[i] != 0.0;
  }
  return false;
}

// Where row r's query sits: its batch's mask row and its last visible key
// (LastVisibleKey, as on the CPU; may be < 0).
struct RowView {
  int64_t mask_offset, last;
};
__device__ inline RowView ViewOf(const SoftmaxRows& s, int64_t r) {
  return {(r / (s.heads * s.tq)) * s.tk, LastVisibleKey(s.causal, r % s.tq, s.query_offset, s.tk)};
}

__device__ inline bool Visible(const KeyPaddingMask& mask, const RowView& view, int64_t j) {
  return j <= view.last && !IsPadded(mask, view.mask_offset + j);
}

// As the CPU: e_j = exp(s_j - max) on visible keys, 0 elsewhere, each times
// 1 / sum; max == -inf (nothing visible) zeroes the row.
template <typename T, int kPerLane>
__global__ void MaskedSoftmaxWarpKernel(T* scores, SoftmaxRows s, KeyPaddingMask mask) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; r < s.rows; r += stride) {
    T* row = scores + r * s.tk;
    const RowView view = ViewOf(s, r);
    T v[kPerLane];
    bool visible[kPerLane];
    T max = neg_inf;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t j = lane + e * kWarp;
      visible[e] = j < s.tk && Visible(mask, view, j);
      v[e] = visible[e] ? row[j] : neg_inf;
      if (visible[e]) max = MaxOf(max, v[e]);
    }
    max = WarpReduce(max, MaxOp());
    if (max == neg_inf) {  // uniform over the warp
#pragma unroll
      for (int e = 0; e < kPerLane; ++e)
        if (lane + e * kWarp < s.tk) row[lane + e * kWarp] = T(0);
      continue;
    }
    T sum = 0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      v[e] = visible[e] ? Exp(v[e] - max) : T(0);
      sum += v[e];
    }
    const T inv = T(1) / WarpReduce(sum, SumOp());
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
      if (lane + e * kWarp < s.tk) row[lane + e * kWarp] = v[e] * inv;
  }
}

template <typename T>
__global__ void MaskedSoftmaxBlockKernel(T* scores, SoftmaxRows s, KeyPaddingMask mask) {
  __shared__ T scratch[kWarpsPerBlock];
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    T* row = scores + r * s.tk;
    const RowView view = ViewOf(s, r);
    T max = neg_inf;
    for (int64_t j = threadIdx.x; j < s.tk; j += blockDim.x)
      if (Visible(mask, view, j)) max = MaxOf(max, row[j]);
    max = BlockReduceOfWarps(max, scratch, MaxOp());
    if (max == neg_inf) {  // uniform over the block; no barrier is skipped
      for (int64_t j = threadIdx.x; j < s.tk; j += blockDim.x) row[j] = T(0);
      continue;
    }
    T sum = 0;
    for (int64_t j = threadIdx.x; j < s.tk; j += blockDim.x) {
      const T e = Visible(mask, view, j) ? Exp(row[j] - max) : T(0);
      row[j] = e;
      sum += e;
    }
    const T inv = T(1) / BlockReduceOfWarps(sum, scratch, SumOp());
    for (int64_t j = threadIdx.x; j < s.tk; j += blockDim.x) row[j] *= inv;
  }
}

template <typename T, int kPerLane>
__global__ void SoftmaxBackwardWarpKernel(const T* probs, T* grad, int64_t rows, int64_t tk) {
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; r < rows; r += stride) {
    const T* p = probs + r * tk;
    T* g = grad + r * tk;
    T pv[kPerLane], gv[kPerLane];
    T dot = 0;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t j = lane + e * kWarp;
      pv[e] = j < tk ? p[j] : T(0);
      gv[e] = j < tk ? g[j] : T(0);
      dot += pv[e] * gv[e];
    }
    dot = WarpReduce(dot, SumOp());
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
      if (lane + e * kWarp < tk) g[lane + e * kWarp] = pv[e] * (gv[e] - dot);
  }
}

template <typename T>
__global__ void SoftmaxBackwardBlockKernel(const T* probs, T* grad, int64_t rows, int64_t tk) {
  __shared__ T scratch[kWarpsPerBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* p = probs + r * tk;
    T* g = grad + r * tk;
    T dot = 0;
    for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) dot += p[j] * g[j];
    dot = BlockReduceOfWarps(dot, scratch, SumOp());
    for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) g[j] = p[j] * (g[j] - dot);
  }
}

inline unsigned WarpRowBlocks(int64_t rows) { return BlocksPerItem((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// The smallest power-of-two count of values per lane that covers tk <= kMaxWarpRow.
inline int PerLane(int64_t tk) {
  int per_lane = 1;
  while (per_lane * kWarp < tk) per_lane *= 2;
  return per_lane;
}

template <typename T, int kPerLane>
void SoftmaxWarp(T* scores, const SoftmaxRows& s, KeyPaddingMask mask, cudaStream_t stream) {
  MaskedSoftmaxWarpKernel<T, kPerLane><<<WarpRowBlocks(s.rows), kThreads, 0, stream>>>(scores, s, mask);
}

template <typename T, int kPerLane>
void BackwardWarp(const T* probs, T* grad, int64_t rows, int64_t tk, cudaStream_t stream) {
  SoftmaxBackwardWarpKernel<T, kPerLane><<<WarpRowBlocks(rows), kThreads, 0, stream>>>(probs, grad, rows, tk);
}

}  // namespace

template <typename T>
cudaError_t LaunchMaskedSoftmax(T* scores, const SoftmaxRows& s, KeyPaddingMask mask, cudaStream_t stream) {
  if (s.rows == 0 || s.tk == 0) return cudaSuccess;
  if (s.tk > kMaxWarpRow) {
    MaskedSoftmaxBlockKernel<T><<<BlocksPerItem(s.rows), kThreads, 0, stream>>>(scores, s, mask);
    return cudaGetLastError();
  }
  switch (PerLane(s.tk)) {
    case 1: SoftmaxWarp<T, 1>(scores, s, mask, stream); break;
    case 2: SoftmaxWarp<T, 2>(scores, s, mask, stream); break;
    case 4: SoftmaxWarp<T, 4>(scores, s, mask, stream); break;
    case 8: SoftmaxWarp<T, 8>(scores, s, mask, stream); break;
    case 16: SoftmaxWarp<T, 16>(scores, s, mask, stream); break;
    default: SoftmaxWarp<T, 32>(scores, s, mask, stream); break;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchSoftmaxBackward(const T* probs, T* grad, int64_t rows, int64_t tk, cudaStream_t stream) {
  if (rows == 0 || tk == 0) return cudaSuccess;
  if (tk > kMaxWarpRow) {
    SoftmaxBackwardBlockKernel<T><<<BlocksPerItem(rows), kThreads, 0, stream>>>(probs, grad, rows, tk);
    return cudaGetLastError();
  }
  switch (PerLane(tk)) {
    case 1: BackwardWarp<T, 1>(probs, grad, rows, tk, stream); break;
    case 2: BackwardWarp<T, 2>(probs, grad, rows, tk, stream); break;
    case 4: BackwardWarp<T, 4>(probs, grad, rows, tk, stream); break;
    case 8: BackwardWarp<T, 8>(probs, grad, rows, tk, stream); break;
    case 16: BackwardWarp<T, 16>(probs, grad, rows, tk, stream); break;
    default: BackwardWarp<T, 32>(probs, grad, rows, tk, stream); break;
  }
  return cudaGetLastError();
}

template cudaError_t LaunchMaskedSoftmax<float>(float*, const SoftmaxRows&, KeyPaddingMask, cudaStream_t);
template cudaError_t LaunchMaskedSoftmax<double>(double*, const SoftmaxRows&, KeyPaddingMask, cudaStream_t);
template cudaError_t LaunchSoftmaxBackward<float>(const float*, float*, int64_t, int64_t, cudaStream_t);
template cudaError_t LaunchSoftmaxBackward<double>(const double*, double*, int64_t, int64_t, cudaStream_t);

}  // namespace loom::cuda
