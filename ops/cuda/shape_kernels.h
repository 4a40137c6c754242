// Launchers of the shape family's device code (shape_kernels.cu). The shape
// ops only move elements, so the launchers take element sizes (1, 2, 4 or 8
// bytes), not types, and copy in the widest units the layout allows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

constexpr int kMaxPermuteRank = 12;

// y (contiguous, extents dims in row-major order) gathers
// y[i0, ..., ik] = x[sum of i_d * x_strides[d]] (strides in elements).
struct PermuteIndex {
  int rank = 0;
  int64_t dims[kMaxPermuteRank] = {};
  int64_t x_strides[kMaxPermuteRank] = {};
};

// y = the permuted x. Dims must be merged and unit dims dropped (rank >= 2).
// A tiled shared-memory transpose when x's contiguous dim is not y's last,
// otherwise a gather of contiguous runs.
cudaError_t LaunchPermute(const void* x, void* y, int64_t elem_size, const PermuteIndex& index, cudaStream_t stream);

// dst[i0 * dst_strides[0] + i1 * dst_strides[1] + i2] = src[i0 * src_strides[0] + i1 * src_strides[1] + i2]
// for i < dims, strides in elements: Concat, Split, Slice and SliceBackward
// as [outer, count, inner] slabs.
struct StridedCopy {
  int64_t dims[3] = {};
  int64_t src_strides[2] = {};
  int64_t dst_strides[2] = {};
};

cudaError_t LaunchStridedCopy(const void* src, void* dst, int64_t elem_size, const StridedCopy& copy,
                              cudaStream_t stream);

}  // namespace loom::cuda
