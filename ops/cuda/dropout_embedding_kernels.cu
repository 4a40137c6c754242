// CUDA kernels of ops/dropout_embedding_ops.cc.
#include "ops/cuda/dropout_embedding_kernels.h"

#include <cub/device/device_radix_sort.cuh>

#include "core/counter_rng.h"
#include "ops/cuda/device_util.cuh"

namespace loom::cuda {
namespace {

// ---------------------------------------------------------------- Dropout

template <typename T>
__global__ void DropoutKernel(const T* x, T* y, T* mask, int64_t n, T scale, DropoutIndex index) {
  for (int64_t at = FirstIndex(); at < n; at += GridStride()) {
    int64_t r = 0, counter = at;
    if (index.replicas > 1) {  // fused: the element's replica and its index among that replica's elements
      const int64_t q = at / index.inner;
      r = q % index.replicas;
      counter = (q / index.replicas) * index.inner + (at - q * index.inner);
    } else if (index.run > 0) {  // a part in runs of the whole's draw order
      counter = (at / index.run) * index.run_stride + at % index.run;
    }
    const uint64_t key = index.keys ? index.keys[r] : index.inline_keys[r];
    const bool drop = (CounterU64(key, index.offset + static_cast<uint64_t>(counter)) >> 11) < index.threshold;
    const T m = drop ? T(0) : scale;
    const T v = x[at];  // read before writing: y may be x
    mask[at] = m;
    y[at] = v * m;
  }
}

// -------------------------------------------------------------- Embedding

template <typename I>
__device__ inline bool BadIndex(I v, int64_t num) {
  return v < 0 || static_cast<int64_t>(v) >= num;
}

// Rows copied in units of U (16, 8, 4 or 1 bytes, whatever the row size
// and the pointers' alignment allow): `units` per row.
template <typename I, typename U>
__global__ void EmbeddingKernel(const I* indices, const U* w, U* y, int64_t total, int64_t units, int64_t num,
                                unsigned long long* first_bad) {
  for (int64_t e = FirstIndex(); e < total; e += GridStride()) {
    const int64_t i = e / units, k = e - i * units;
    const I row = indices[i];
    if (BadIndex(row, num)) {
      if (k == 0) atomicMin(first_bad, static_cast<unsigned long long>(i));
      y[e] = U{};
      continue;
    }
    y[e] = w[static_cast<int64_t>(row) * units + k];
  }
}

// Only the range check (rows of zero bytes).
template <typename I>
__global__ void ValidateIndicesKernel(const I* indices, int64_t n, int64_t num, unsigned long long* first_bad) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride())
    if (BadIndex(indices[i], num)) atomicMin(first_bad, static_cast<unsigned long long>(i));
}

template <typename I, typename U>
cudaError_t LaunchEmbeddingUnits(const I* indices, const void* weight, void* y, int64_t n, int64_t num,
                                 int64_t row_bytes, unsigned long long* first_bad, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  const int64_t total = n * units;
  EmbeddingKernel<I, U><<<Blocks(total), kThreads, 0, stream>>>(indices, static_cast<const U*>(weight),
                                                                  static_cast<U*>(y), total, units, num, first_bad);
  return cudaGetLastError();
}

bool Aligned(const void* p, int64_t bytes, size_t unit) {
  return reinterpret_cast<uintptr_t>(p) % unit == 0 && bytes % static_cast<int64_t>(unit) == 0;
}

// ----------------------------------------------------- EmbeddingBackward

// Narrow keys and positions when they fit: half the sort's traffic.
bool NarrowSort(int64_t n, int64_t num) { return n <= INT32_MAX && num < int64_t{UINT32_MAX}; }

// Bits of the sort keys: they are in [0, num], num the bad indices' key.
int KeyBits(int64_t num) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= num) ++bits;
  return bits;
}

constexpr size_t kAlign = 256;
size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The workspace: sort keys and positions in and out, the num + 1 row
// offsets into the sorted order, then CUB's scratch.
template <typename K, typename P>
struct BackwardLayout {
  size_t keys_in = 0, keys_out = 0, pos_in = 0, pos_out = 0, offsets = 0, cub = 0, cub_bytes = 0, total = 0;
  cudaError_t error = cudaSuccess;

  BackwardLayout(int64_t n, int64_t num) {
    const size_t key_bytes = AlignUp(static_cast<size_t>(n) * sizeof(K));
    const size_t pos_bytes = AlignUp(static_cast<size_t>(n) * sizeof(P));
    keys_out = keys_in + key_bytes;
    pos_in = keys_out + key_bytes;
    pos_out = pos_in + pos_bytes;
    offsets = pos_out + pos_bytes;
    cub = offsets + AlignUp(static_cast<size_t>(num + 1) * sizeof(P));
    error = cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const K*>(nullptr),
                                            static_cast<K*>(nullptr), static_cast<const P*>(nullptr),
                                            static_cast<P*>(nullptr), static_cast<P>(n), 0, KeyBits(num));
    total = cub + AlignUp(cub_bytes);
  }
};

// keys[i] = indices[i] (num for a bad one, which sorts past every row),
// positions[i] = i.
template <typename I, typename K, typename P>
__global__ void SortInputsKernel(const I* indices, K* keys, P* positions, int64_t n, int64_t num,
                                 unsigned long long* first_bad) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const I v = indices[i];
    if (BadIndex(v, num)) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      keys[i] = static_cast<K>(num);
    } else {
      keys[i] = static_cast<K>(v);
    }
    positions[i] = static_cast<P>(i);
  }
}

// offsets[r] = the first sorted position whose key is >= r, r <= num: row
// r's entries are [offsets[r], offsets[r + 1]).
template <typename K, typename P>
__global__ void RowOffsetsKernel(const K* sorted_keys, P* offsets, int64_t n, int64_t num) {
  for (int64_t r = FirstIndex(); r <= num; r += GridStride()) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (static_cast<int64_t>(sorted_keys[mid]) < r) lo = mid + 1; else hi = mid;
    }
    offsets[r] = static_cast<P>(lo);
  }
}

// One thread per dw element, summing its row's dy entries in increasing
// position (the sort is stable), the CPU kernel's order. The loads of a
// chunk are issued before its adds, which stay in order.
template <typename T, typename P>
__global__ void SegmentSumKernel(const T* dy, const P* sorted_positions, const P* offsets, T* dw, int64_t num,
                                 int64_t dim, int64_t padding_idx) {
  constexpr int kChunk = 8;
  const int64_t total = num * dim;
  for (int64_t e = FirstIndex(); e < total; e += GridStride()) {
    const int64_t r = e / dim, j = e - r * dim;
    T acc = T(0);
    if (r != padding_idx) {
      const int64_t begin = offsets[r], end = offsets[r + 1];
      int64_t s = begin;
      for (; s + kChunk <= end; s += kChunk) {
        T v[kChunk];
#pragma unroll
        for (int c = 0; c < kChunk; ++c) v[c] = dy[static_cast<int64_t>(sorted_positions[s + c]) * dim + j];
#pragma unroll
        for (int c = 0; c < kChunk; ++c) acc += v[c];
      }
      for (; s < end; ++s) acc += dy[static_cast<int64_t>(sorted_positions[s]) * dim + j];
    }
    dw[e] = acc;
  }
}

template <typename T, typename I, typename K, typename P>
cudaError_t EmbeddingBackwardSorted(const T* dy, const I* indices, T* dw, int64_t n, int64_t num, int64_t dim,
                                    int64_t padding_idx, void* workspace, size_t workspace_bytes,
                                    unsigned long long* first_bad, cudaStream_t stream) {
  const BackwardLayout<K, P> layout(n, num);
  if (layout.error != cudaSuccess) return layout.error;
  if (workspace_bytes < layout.total) return cudaErrorInvalidValue;
  char* base = static_cast<char*>(workspace);
  K* keys_in = reinterpret_cast<K*>(base + layout.keys_in);
  K* keys_out = reinterpret_cast<K*>(base + layout.keys_out);
  P* pos_in = reinterpret_cast<P*>(base + layout.pos_in);
  P* pos_out = reinterpret_cast<P*>(base + layout.pos_out);
  P* offsets = reinterpret_cast<P*>(base + layout.offsets);
  SortInputsKernel<<<Blocks(n), kThreads, 0, stream>>>(indices, keys_in, pos_in, n, num, first_bad);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  size_t cub_bytes = layout.cub_bytes;
  err = cub::DeviceRadixSort::SortPairs(base + layout.cub, cub_bytes, keys_in, keys_out, pos_in, pos_out,
                                        static_cast<P>(n), 0, KeyBits(num), stream);
  if (err != cudaSuccess) return err;
  RowOffsetsKernel<<<Blocks(num + 1), kThreads, 0, stream>>>(keys_out, offsets, n, num);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SegmentSumKernel<<<Blocks(num * dim), kThreads, 0, stream>>>(dy, pos_out, offsets, dw, num, dim, padding_idx);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t LaunchDropout(const T* x, T* y, T* mask, int64_t n, T scale, const DropoutIndex& index,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DropoutKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, mask, n, scale, index);
  return cudaGetLastError();
}

template <typename I>
cudaError_t LaunchEmbedding(const I* indices, const void* weight, void* y, int64_t n, int64_t num_embeddings,
                            int64_t row_bytes, unsigned long long* first_bad, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (row_bytes == 0) {
    ValidateIndicesKernel<<<Blocks(n), kThreads, 0, stream>>>(indices, n, num_embeddings, first_bad);
    return cudaGetLastError();
  }
  if (Aligned(weight, row_bytes, 16) && Aligned(y, row_bytes, 16))
    return LaunchEmbeddingUnits<I, uint4>(indices, weight, y, n, num_embeddings, row_bytes, first_bad, stream);
  if (Aligned(weight, row_bytes, 8) && Aligned(y, row_bytes, 8))
    return LaunchEmbeddingUnits<I, uint2>(indices, weight, y, n, num_embeddings, row_bytes, first_bad, stream);
  if (Aligned(weight, row_bytes, 4) && Aligned(y, row_bytes, 4))
    return LaunchEmbeddingUnits<I, uint32_t>(indices, weight, y, n, num_embeddings, row_bytes, first_bad, stream);
  return LaunchEmbeddingUnits<I, unsigned char>(indices, weight, y, n, num_embeddings, row_bytes, first_bad, stream);
}

size_t EmbeddingBackwardWorkspaceBytes(int64_t n, int64_t num_embeddings) {
  if (NarrowSort(n, num_embeddings)) return BackwardLayout<uint32_t, int32_t>(n, num_embeddings).total;
  return BackwardLayout<uint64_t, int64_t>(n, num_embeddings).total;
}

template <typename T, typename I>
cudaError_t LaunchEmbeddingBackward(const T* dy, const I* indices, T* dw, int64_t n, int64_t num_embeddings,
                                    int64_t dim, int64_t padding_idx, void* workspace, size_t workspace_bytes,
                                    unsigned long long* first_bad, cudaStream_t stream) {
  if (num_embeddings * dim == 0 || n == 0) {  // nothing to sum: only the range check and the zeros
    if (n > 0) {
      ValidateIndicesKernel<<<Blocks(n), kThreads, 0, stream>>>(indices, n, num_embeddings, first_bad);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
    const size_t bytes = static_cast<size_t>(num_embeddings * dim) * sizeof(T);
    return bytes == 0 ? cudaSuccess : cudaMemsetAsync(dw, 0, bytes, stream);  // zero bits are 0.0
  }
  if (NarrowSort(n, num_embeddings))
    return EmbeddingBackwardSorted<T, I, uint32_t, int32_t>(dy, indices, dw, n, num_embeddings, dim, padding_idx,
                                                            workspace, workspace_bytes, first_bad, stream);
  return EmbeddingBackwardSorted<T, I, uint64_t, int64_t>(dy, indices, dw, n, num_embeddings, dim, padding_idx,
                                                          workspace, workspace_bytes, first_bad, stream);
}

template cudaError_t LaunchDropout<float>(const float*, float*, float*, int64_t, float, const DropoutIndex&,
                                          cudaStream_t);
template cudaError_t LaunchDropout<double>(const double*, double*, double*, int64_t, double, const DropoutIndex&,
                                           cudaStream_t);
template cudaError_t LaunchEmbedding<int32_t>(const int32_t*, const void*, void*, int64_t, int64_t, int64_t,
                                              unsigned long long*, cudaStream_t);
template cudaError_t LaunchEmbedding<int64_t>(const int64_t*, const void*, void*, int64_t, int64_t, int64_t,
                                              unsigned long long*, cudaStream_t);

#define LOOM_INSTANTIATE_EMBEDDING_BACKWARD(T, I)                                                              \
  template cudaError_t LaunchEmbeddingBackward<T, I>(const T*, const I*, T*, int64_t, int64_t, int64_t, int64_t, \
                                                     void*, size_t, unsigned long long*, cudaStream_t);
LOOM_INSTANTIATE_EMBEDDING_BACKWARD(float, int32_t)
LOOM_INSTANTIATE_EMBEDDING_BACKWARD(float, int64_t)
LOOM_INSTANTIATE_EMBEDDING_BACKWARD(double, int32_t)
LOOM_INSTANTIATE_EMBEDDING_BACKWARD(double, int64_t)
#undef LOOM_INSTANTIATE_EMBEDDING_BACKWARD

}  // namespace loom::cuda
