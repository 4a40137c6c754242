// Element-wise CUDA kernels (elementwise_kernels.cu, compiled by nvcc) and
// their launchers. Plain C++ declarations, so gcc-compiled kernel wrappers
// can call them. Each launcher queues one kernel on `stream` and returns the
// launch's error (cudaSuccess or why the launch failed); faults inside the
// kernel surface at the next synchronizing call. T is float or double; the
// binary, bias-add, broadcast, sum and fill launchers also take BFloat16 and
// Float16 (core/half.h), computing in f32 and rounding once per element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// The highest rank the broadcasting and reducing kernels index.
constexpr int kMaxKernelRank = 8;

// Output extents and, per operand, its strides in elements (0 along a
// broadcast dim), right-aligned to the output's rank.
struct BroadcastIndex {
  int rank = 0;
  int64_t dims[kMaxKernelRank] = {};
  int64_t strides[2][kMaxKernelRank] = {};
};

// How SumToShape walks its input: the kept dims (one per output coordinate,
// in output order) and the summed dims, each with its extent and its stride
// in the input.
struct ReduceIndex {
  int kept_rank = 0;
  int64_t kept_dims[kMaxKernelRank] = {};
  int64_t kept_strides[kMaxKernelRank] = {};
  int reduced_rank = 0;
  int64_t reduced_dims[kMaxKernelRank] = {};
  int64_t reduced_strides[kMaxKernelRank] = {};
};

enum class BinaryKind : int { kAdd, kSub, kMul, kDiv };
enum class UnaryKind : int { kNeg, kAddScalar, kMulScalar, kPowScalar };

// y[i] = a[i] (op) b[i], i < n: operands of equal shape.
template <typename T>
cudaError_t LaunchBinary(BinaryKind kind, const T* a, const T* b, T* y, int64_t n, cudaStream_t stream);

// y = a (op) b with numpy broadcasting; a uses index.strides[0], b strides[1].
template <typename T>
cudaError_t LaunchBinaryBroadcast(BinaryKind kind, const T* a, const T* b, T* y, const BroadcastIndex& index,
                                  cudaStream_t stream);

// y[i] = f(x[i]; value): -x, x + value, x * value, x ^ value.
template <typename T>
cudaError_t LaunchUnary(UnaryKind kind, const T* x, T* y, int64_t n, T value, cudaStream_t stream);

// y[i] = value (T: float, double, int32_t, int64_t, bool).
template <typename T>
cudaError_t LaunchFill(T* y, int64_t n, T value, cudaStream_t stream);

// y[r, c] += bias[c] over a row-major [rows, cols] y (Linear's bias).
template <typename T>
cudaError_t LaunchBiasAdd(T* y, const T* bias, int64_t rows, int64_t cols, cudaStream_t stream);

// y = x repeated along broadcast dims to index.dims (x strides in strides[0]).
template <typename T>
cudaError_t LaunchBroadcastTo(const T* x, T* y, const BroadcastIndex& index, cudaStream_t stream);

// y[o] = sum of x over the reduced dims at kept coordinate o (out_n outputs).
// Deterministic: a fixed summation order, no atomics.
template <typename T>
cudaError_t LaunchSumTo(const T* x, T* y, int64_t out_n, const ReduceIndex& index, cudaStream_t stream);

}  // namespace loom::cuda
