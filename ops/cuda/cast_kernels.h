// Launchers of the cast family's device code (cast_kernels.cu): Cast between
// the four float dtypes (ops/cast_ops.cc), bit-exact with the CPU kernel
// through core/half.h, and LossScaleUpdate (ops/loss_scale_ops.cc), f32 and
// f64. Plain C++, so the gcc-compiled registrations can call them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// The element types Cast converts between (device code sees no loom::DType).
enum class CastType : int { kF32, kF64, kBF16, kF16 };

// y[i] = x[i] converted from `from` to `to`, i < n; a copy when they are equal.
cudaError_t LaunchCast(CastType from, CastType to, const void* x, void* y, int64_t n, cudaStream_t stream);

// LossScaleUpdate's attributes (validated by its type inference).
struct LossScaleHyper {
  double growth_factor = 2;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// Element-wise over n scalers; outputs may alias their inputs (in place).
template <typename T>
cudaError_t LaunchLossScaleUpdate(const T* scale, const T* good_steps, const T* finite, T* new_scale,
                                  T* new_good_steps, int64_t n, const LossScaleHyper& hyper, cudaStream_t stream);

}  // namespace loom::cuda
