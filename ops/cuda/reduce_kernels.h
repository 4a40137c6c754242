// Launchers of the reduce family's device code (reduce_kernels.cu): ReduceSum,
// ReduceMean, ReduceMax, ReduceMaxBackward and the softmax family. Every
// reduction is deterministic: fixed per-block trees and, when one output's
// reduction is split over blocks, partial results combined in split order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// The most kept and the most reduced dim groups a reduction indexes.
constexpr int kReduceMaxGroups = 8;

// x seen as out_n = rows * inner outputs: output (row, j) folds the `reduced`
// elements x[KeptOffset(row) + ReducedOffset(r) + j], r < reduced, where the
// offsets decompose row over kept_dims and r over red_dims (row-major, with
// their strides). Unit dims are dropped and adjacent dims of one kind merged;
// inner is the trailing run of kept dims (1 when the last dim is reduced).
struct ReduceDims {
  int64_t rows = 1, inner = 1, reduced = 1;
  int kept_rank = 0;
  int64_t kept_dims[kReduceMaxGroups] = {};
  int64_t kept_strides[kReduceMaxGroups] = {};
  int red_rank = 1;  // never 0: nothing reduced is one reduced dim of extent 1
  int64_t red_dims[kReduceMaxGroups] = {1};
  int64_t red_strides[kReduceMaxGroups] = {0};
};

enum class ReduceKind : int { kSum, kMean, kMax };

// 8-byte elements of device workspace the reductions over `dims` need (for
// partial results of split reductions); 0: none, pass nullptr.
int64_t ReduceWorkspaceElems(const ReduceDims& dims);

// y[o] = sum, mean or max of output o's elements (sums in double; the mean of
// an empty reduction is NaN; the max propagates NaN).
template <typename T>
cudaError_t LaunchReduce(ReduceKind kind, const T* x, T* y, const ReduceDims& dims, void* workspace,
                         cudaStream_t stream);

// index[o] = the first (lowest) reduced index of output o's elements equal
// to y[o] (NaN matches NaN): ReduceMax's second output.
template <typename T>
cudaError_t LaunchReduceMaxIndex(const T* x, const T* y, int64_t* index, const ReduceDims& dims, void* workspace,
                                 cudaStream_t stream);

// dx = dy at each output's index, 0 elsewhere; x_numel elements of dx are
// written.
template <typename T>
cudaError_t LaunchReduceMaxBackward(const int64_t* index, const T* dy, T* dx, int64_t x_numel, const ReduceDims& dims,
                                    cudaStream_t stream);

// x seen as [outer, len, inner] around the softmax axis.
struct SoftmaxDims {
  int64_t outer = 1, len = 1, inner = 1;
};

// Softmax: exp(x - max) / sum; LogSoftmax: (x - max) - log(sum).
template <typename T>
cudaError_t LaunchSoftmax(bool log, const T* x, T* y, const SoftmaxDims& dims, cudaStream_t stream);

// Softmax: dx = y * (dy - sum(dy * y)); LogSoftmax: dx = dy - exp(y) * sum(dy).
template <typename T>
cudaError_t LaunchSoftmaxBackward(bool log, const T* y, const T* dy, T* dx, const SoftmaxDims& dims,
                                  cudaStream_t stream);

}  // namespace loom::cuda
