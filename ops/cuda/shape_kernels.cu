// CUDA kernels of ops/shape_ops.cc.
#include "ops/cuda/shape_kernels.h"

#include "ops/cuda/device_util.cuh"

namespace loom::cuda {
namespace {

// 32-bit index arithmetic (much cheaper divisions) when the grid-stride
// loop's index cannot wrap: total plus one grid's threads below 2^32.
bool Fits32(int64_t total) { return total <= (int64_t{1} << 31); }

// The widest copy unit (16, 8, 4, 2 or 1 bytes) dividing every byte count
// and both pointers' addresses.
int64_t WidestUnit(const void* a, const void* b, const int64_t* byte_counts, int count) {
  for (int64_t unit = 16; unit > 1; unit /= 2) {
    bool ok = reinterpret_cast<uintptr_t>(a) % unit == 0 && reinterpret_cast<uintptr_t>(b) % unit == 0;
    for (int i = 0; ok && i < count; ++i) ok = byte_counts[i] % unit == 0;
    if (ok) return unit;
  }
  return 1;
}

// Calls fn(U{}) with an unsigned type of `bytes` bytes.
template <typename Fn>
cudaError_t DispatchUnit(int64_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint2{});
    case 16: return fn(uint4{});
    default: return cudaErrorInvalidValue;
  }
}

// ------------------------------------------------------------ StridedCopy

template <typename U, typename Index>
__global__ void StridedCopyKernel(const U* src, U* dst, Index d1, Index d2, int64_t s0, int64_t s1, int64_t t0,
                                  int64_t t1, Index total) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const Index i2 = e % d2, rows = e / d2;
    const Index i1 = rows % d1, i0 = rows / d1;
    const int64_t a = static_cast<int64_t>(i0), b = static_cast<int64_t>(i1), c = static_cast<int64_t>(i2);
    dst[a * t0 + b * t1 + c] = src[a * s0 + b * s1 + c];
  }
}

// ------------------------------------------------------------------ Permute

template <typename U, typename Index>
__global__ void GatherKernel(const U* x, U* y, PermuteIndex index, Index total) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    Index rest = e;
    int64_t at = 0;
    for (int d = index.rank - 1; d >= 0; --d) {
      const Index extent = static_cast<Index>(index.dims[d]);
      const Index q = rest / extent;
      at += static_cast<int64_t>(rest - q * extent) * index.x_strides[d];
      rest = q;
    }
    y[e] = x[at];
  }
}

constexpr int kTile = 32, kTileRows = 8;  // blocks of kTile x kTileRows threads

// A batch of 2-d transposes: output dim a (x stride 1) against output dim l
// (y's last, y stride 1); the other dims are the batch.
struct TileIndex {
  int batch_rank = 0;
  int64_t batch_dims[kMaxPermuteRank] = {};
  int64_t batch_x_strides[kMaxPermuteRank] = {};
  int64_t batch_y_strides[kMaxPermuteRank] = {};
  int64_t len_a = 0, len_l = 0, x_stride_l = 0, y_stride_a = 0;
  int64_t tiles_a = 0, tiles_l = 0, tiles = 0;
};

// Reads a tile along a (coalesced in x), writes it along l (coalesced in y).
template <typename U>
__global__ void TiledTransposeKernel(const U* x, U* y, TileIndex t) {
  __shared__ U tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  for (int64_t id = blockIdx.x; id < t.tiles; id += gridDim.x) {  // uniform across the block
    const int64_t tl = id % t.tiles_l, q = id / t.tiles_l;
    const int64_t ta = q % t.tiles_a;
    int64_t b = q / t.tiles_a, x_base = 0, y_base = 0;
    for (int d = t.batch_rank - 1; d >= 0; --d) {
      const int64_t i = b % t.batch_dims[d];
      b /= t.batch_dims[d];
      x_base += i * t.batch_x_strides[d];
      y_base += i * t.batch_y_strides[d];
    }
    const int64_t a0 = ta * kTile, l0 = tl * kTile;
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t a = a0 + threadIdx.x, l = l0 + k;
      if (a < t.len_a && l < t.len_l) tile[k][threadIdx.x] = x[x_base + a + l * t.x_stride_l];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t l = l0 + threadIdx.x, a = a0 + k;
      if (a < t.len_a && l < t.len_l) y[y_base + a * t.y_stride_a + l] = tile[threadIdx.x][k];
    }
    __syncthreads();  // the tile is refilled next iteration
  }
}

}  // namespace

cudaError_t LaunchStridedCopy(const void* src, void* dst, int64_t elem_size, const StridedCopy& copy,
                              cudaStream_t stream) {
  int64_t d0 = copy.dims[0], d1 = copy.dims[1], d2 = copy.dims[2];
  int64_t s0 = copy.src_strides[0], s1 = copy.src_strides[1], t0 = copy.dst_strides[0], t1 = copy.dst_strides[1];
  if (d0 == 0 || d1 == 0 || d2 == 0) return cudaSuccess;
  // Merge dims both sides walk contiguously.
  if (d1 == 1 || (s1 == d2 && t1 == d2)) {
    d2 *= d1;
    d1 = 1;
    s1 = t1 = 0;
  }
  if (d1 == 1 && (d0 == 1 || (s0 == d2 && t0 == d2))) {
    d2 *= d0;
    d0 = 1;
    s0 = t0 = 0;
  }
  if (d0 == 1 && d1 == 1)
    return cudaMemcpyAsync(dst, src, static_cast<size_t>(d2 * elem_size), cudaMemcpyDeviceToDevice, stream);
  const int64_t bytes[5] = {d2 * elem_size, s0 * elem_size, s1 * elem_size, t0 * elem_size, t1 * elem_size};
  const int64_t unit = WidestUnit(src, dst, bytes, 5);
  if (unit > elem_size) {
    const int64_t widen = unit / elem_size;
    d2 /= widen;
    s0 /= widen;
    s1 /= widen;
    t0 /= widen;
    t1 /= widen;
  } else if (unit < elem_size) {  // a view misaligned for its dtype: smaller units
    const int64_t split = elem_size / unit;
    d2 *= split;
    s0 *= split;
    s1 *= split;
    t0 *= split;
    t1 *= split;
  }
  const int64_t total = d0 * d1 * d2;
  return DispatchUnit(unit, [&](auto zero) -> cudaError_t {
    using U = decltype(zero);
    const U* s = static_cast<const U*>(src);
    U* t = static_cast<U*>(dst);
    if (Fits32(total)) {
      StridedCopyKernel<U, uint32_t><<<Blocks(total), kThreads, 0, stream>>>(
          s, t, static_cast<uint32_t>(d1), static_cast<uint32_t>(d2), s0, s1, t0, t1, static_cast<uint32_t>(total));
    } else {
      StridedCopyKernel<U, uint64_t><<<Blocks(total), kThreads, 0, stream>>>(
          s, t, static_cast<uint64_t>(d1), static_cast<uint64_t>(d2), s0, s1, t0, t1, static_cast<uint64_t>(total));
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchPermute(const void* x, void* y, int64_t elem_size, const PermuteIndex& index, cudaStream_t stream) {
  if (index.rank < 1 || index.rank > kMaxPermuteRank) return cudaErrorInvalidValue;
  int64_t total = 1;
  for (int d = 0; d < index.rank; ++d) total *= index.dims[d];
  if (total == 0) return cudaSuccess;
  const int last = index.rank - 1;
  int a = -1;  // the output dim x walks contiguously
  for (int d = 0; d < index.rank; ++d)
    if (index.x_strides[d] == 1) a = d;
  constexpr int64_t kMinTileExtent = 16;  // below it most of a tile would idle
  if (a >= 0 && a != last && index.dims[a] >= kMinTileExtent && index.dims[last] >= kMinTileExtent) {
    TileIndex t;
    int64_t y_stride = 1;
    int64_t y_strides[kMaxPermuteRank];
    for (int d = last; d >= 0; --d) {
      y_strides[d] = y_stride;
      y_stride *= index.dims[d];
    }
    for (int d = 0; d < last; ++d) {
      if (d == a) continue;
      t.batch_dims[t.batch_rank] = index.dims[d];
      t.batch_x_strides[t.batch_rank] = index.x_strides[d];
      t.batch_y_strides[t.batch_rank] = y_strides[d];
      ++t.batch_rank;
    }
    t.len_a = index.dims[a];
    t.len_l = index.dims[last];
    t.x_stride_l = index.x_strides[last];
    t.y_stride_a = y_strides[a];
    t.tiles_a = (t.len_a + kTile - 1) / kTile;
    t.tiles_l = (t.len_l + kTile - 1) / kTile;
    t.tiles = t.tiles_a * t.tiles_l * (total / (t.len_a * t.len_l));
    const dim3 block(kTile, kTileRows);
    return DispatchUnit(elem_size, [&](auto zero) -> cudaError_t {
      using U = decltype(zero);
      TiledTransposeKernel<U><<<BlocksPerItem(t.tiles), block, 0, stream>>>(static_cast<const U*>(x),
                                                                            static_cast<U*>(y), t);
      return cudaGetLastError();
    });
  }
  // A gather; when y's last dim is contiguous in x, in runs of wide units.
  PermuteIndex g = index;
  int64_t unit = elem_size;
  if (index.x_strides[last] == 1) {
    int64_t bytes[kMaxPermuteRank];
    bytes[0] = index.dims[last] * elem_size;
    for (int d = 0; d < last; ++d) bytes[d + 1] = index.x_strides[d] * elem_size;
    const int64_t widest = WidestUnit(x, y, bytes, index.rank);
    if (widest > elem_size) {
      const int64_t widen = widest / elem_size;
      unit = widest;
      g.dims[last] /= widen;
      for (int d = 0; d < last; ++d) g.x_strides[d] /= widen;
      total /= widen;
    }
  }
  return DispatchUnit(unit, [&](auto zero) -> cudaError_t {
    using U = decltype(zero);
    if (Fits32(total)) {
      GatherKernel<U, uint32_t><<<Blocks(total), kThreads, 0, stream>>>(static_cast<const U*>(x), static_cast<U*>(y),
                                                                        g, static_cast<uint32_t>(total));
    } else {
      GatherKernel<U, uint64_t><<<Blocks(total), kThreads, 0, stream>>>(static_cast<const U*>(x), static_cast<U*>(y),
                                                                        g, static_cast<uint64_t>(total));
    }
    return cudaGetLastError();
  });
}

}  // namespace loom::cuda
