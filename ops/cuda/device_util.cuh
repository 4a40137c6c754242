// Device-side helpers every .cu file of the CUDA backend shares: the launch
// shape of grid-stride loops, float/double overloads of the math functions,
// and deterministic block reductions (a fixed tree, no atomics, so a kernel
// gives the same bits on every run). Included only by nvcc-compiled files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace loom::cuda {

constexpr int kThreads = 256;                        // threads per block of the flat kernels
constexpr int64_t kMaxBlocks = int64_t{1} << 20;     // grid-stride loops cover the rest

// Blocks for a grid-stride loop over n elements (at least one).
inline unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)));
}
// Blocks for one block per item (rows, channels, outputs), capped.
inline unsigned BlocksPerItem(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(items, kMaxBlocks)));
}

__device__ inline int64_t FirstIndex() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t GridStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Overloads so templates over T call the right-precision function.
__device__ inline float Exp(float x) { return expf(x); }
__device__ inline double Exp(double x) { return exp(x); }
__device__ inline float Log(float x) { return logf(x); }
__device__ inline double Log(double x) { return log(x); }
__device__ inline float Log1p(float x) { return log1pf(x); }
__device__ inline double Log1p(double x) { return log1p(x); }
__device__ inline float Sqrt(float x) { return sqrtf(x); }
__device__ inline double Sqrt(double x) { return sqrt(x); }
__device__ inline float Rsqrt(float x) { return rsqrtf(x); }
__device__ inline double Rsqrt(double x) { return rsqrt(x); }
__device__ inline float Tanh(float x) { return tanhf(x); }
__device__ inline double Tanh(double x) { return tanh(x); }
__device__ inline float Erfc(float x) { return erfcf(x); }
__device__ inline double Erfc(double x) { return erfc(x); }
__device__ inline float Pow(float x, float y) { return powf(x, y); }
__device__ inline double Pow(double x, double y) { return pow(x, y); }
__device__ inline float Abs(float x) { return fabsf(x); }
__device__ inline double Abs(double x) { return fabs(x); }

// The sum of every thread's `value` over the block, returned to all of its
// threads. blockDim.x must be a power of two <= kThreads; `scratch` holds
// blockDim.x elements of shared memory. The tree is fixed, so the result
// depends only on the values, not on timing.
template <typename T>
__device__ inline T BlockSum(T value, T* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] += scratch[threadIdx.x + s];
    __syncthreads();
  }
  const T total = scratch[0];
  __syncthreads();  // scratch may be reused right after
  return total;
}

// The same for the maximum; a NaN anywhere makes the result NaN.
template <typename T>
__device__ inline T BlockMax(T value, T* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const T other = scratch[threadIdx.x + s];
      if (other > scratch[threadIdx.x] || other != other) scratch[threadIdx.x] = other;
    }
    __syncthreads();
  }
  const T total = scratch[0];
  __syncthreads();
  return total;
}

}  // namespace loom::cuda
