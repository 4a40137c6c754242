// Launchers of the activation family's device code (activation_kernels.cu):
// the element-wise activations and unary math of ops/activation_ops.cc,
// forward y = f(x) and backward dx = dy * f'(saved), with the CPU's formulas.
// Each launcher queues one kernel on `stream` and returns the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/activation_params.h"

namespace loom::cuda {

// The rows of the CPU table and the attributes the formulas read (parsed and
// validated by the .cc), as the CPU kernels see them.
using ActivationKind = Unary;
using ActivationParams = UnaryParams;

// y[i] = f(x[i]), i < n (T: float, double).
template <typename T>
cudaError_t LaunchActivationForward(ActivationKind kind, const T* x, T* y, int64_t n, ActivationParams params,
                                    cudaStream_t stream);

// dx[i] = f'(dy[i], saved[i]), where saved is x or y as the CPU table says (T: float, double).
template <typename T>
cudaError_t LaunchActivationBackward(ActivationKind kind, const T* dy, const T* saved, T* dx, int64_t n,
                                     ActivationParams params, cudaStream_t stream);

// ReLU on i64 ids (forward only): y[i] = max(x[i], 0).
cudaError_t LaunchReluInt64(const int64_t* x, int64_t* y, int64_t n, cudaStream_t stream);

}  // namespace loom::cuda
