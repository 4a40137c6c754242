// Device code of the cast family. The conversions are core/half.h's integer
// ones rather than the hardware's cvt instructions, so that every bit
// (NaN patterns included) matches the CPU kernel; Cast is memory-bound, so
// the extra integer work is hidden behind the loads.
#include "ops/cuda/cast_kernels.h"

#include "core/half.h"
#include "ops/cuda/device_util.cuh"

namespace loom::cuda {
namespace {

template <typename From, typename To>
__global__ void CastKernel(const From* __restrict__ x, To* __restrict__ y, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) y[i] = ConvertFloat<To>(x[i]);
}

template <typename From, typename To>
cudaError_t LaunchCastAs(const void* x, void* y, int64_t n, cudaStream_t stream) {
  CastKernel<From, To><<<Blocks(n), kThreads, 0, stream>>>(static_cast<const From*>(x), static_cast<To*>(y), n);
  return cudaGetLastError();
}

template <typename From>
cudaError_t LaunchCastFrom(CastType to, const void* x, void* y, int64_t n, cudaStream_t stream) {
  switch (to) {
    case CastType::kF32: return LaunchCastAs<From, float>(x, y, n, stream);
    case CastType::kF64: return LaunchCastAs<From, double>(x, y, n, stream);
    case CastType::kBF16: return LaunchCastAs<From, BFloat16>(x, y, n, stream);
    case CastType::kF16: return LaunchCastAs<From, Float16>(x, y, n, stream);
  }
  return cudaErrorInvalidValue;
}

size_t CastTypeSize(CastType t) {
  switch (t) {
    case CastType::kF32: return 4;
    case CastType::kF64: return 8;
    default: return 2;
  }
}

// GradScaler's update per element (ops/loss_scale_ops.cc), in T as the CPU
// kernel computes it: one multiply, so the results are bit-identical.
template <typename T>
__global__ void LossScaleUpdateKernel(const T* scale, const T* good_steps, const T* finite, T* new_scale,
                                      T* new_good_steps, int64_t n, T growth, T backoff, T interval) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const T s = scale[i], count = good_steps[i] + T(1);
    if (!(finite[i] > T(0))) {
      new_scale[i] = s * backoff;
      new_good_steps[i] = T(0);
    } else if (count >= interval) {
      const T grown = s * growth;
      new_scale[i] = isfinite(grown) ? grown : s;
      new_good_steps[i] = T(0);
    } else {
      new_scale[i] = s;
      new_good_steps[i] = count;
    }
  }
}

}  // namespace

cudaError_t LaunchCast(CastType from, CastType to, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (from == to) {
    if (x == y) return cudaSuccess;
    return cudaMemcpyAsync(y, x, static_cast<size_t>(n) * CastTypeSize(from), cudaMemcpyDeviceToDevice, stream);
  }
  switch (from) {
    case CastType::kF32: return LaunchCastFrom<float>(to, x, y, n, stream);
    case CastType::kF64: return LaunchCastFrom<double>(to, x, y, n, stream);
    case CastType::kBF16: return LaunchCastFrom<BFloat16>(to, x, y, n, stream);
    case CastType::kF16: return LaunchCastFrom<Float16>(to, x, y, n, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t LaunchLossScaleUpdate(const T* scale, const T* good_steps, const T* finite, T* new_scale,
                                  T* new_good_steps, int64_t n, const LossScaleHyper& hyper, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  LossScaleUpdateKernel<T><<<Blocks(n), kThreads, 0, stream>>>(
      scale, good_steps, finite, new_scale, new_good_steps, n, static_cast<T>(hyper.growth_factor),
      static_cast<T>(hyper.backoff_factor), static_cast<T>(hyper.growth_interval));
  return cudaGetLastError();
}

template cudaError_t LaunchLossScaleUpdate<float>(const float*, const float*, const float*, float*, float*, int64_t,
                                                  const LossScaleHyper&, cudaStream_t);
template cudaError_t LaunchLossScaleUpdate<double>(const double*, const double*, const double*, double*, double*,
                                                   int64_t, const LossScaleHyper&, cudaStream_t);

}  // namespace loom::cuda
