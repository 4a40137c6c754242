// Launchers of the dropout_embedding family's device code (dropout_embedding_kernels.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// Where each element of a Dropout input draws: replica r = (at / inner) %
// replicas of flat position `at` uses key r, at counter offset + n, n its
// index among replica r's elements (unfused: replicas = 1, n = at); offset
// is the Dropout's attr (a part's first draw index in the whole tensor);
// unfused, a part in runs of `run` elements (attr run, 0: one run) draws
// at offset + (at / run) * run_stride + at % run.
// Up to kInlineKeys keys travel in the kernel's parameters; more are read
// from `keys` (device).
struct DropoutIndex {
  static constexpr int kInlineKeys = 32;
  int64_t replicas = 1, inner = 1;
  int64_t run = 0, run_stride = 0;
  uint64_t offset = 0;
  // Element n is dropped iff (CounterU64(key, offset + n) >> 11) <
  // threshold, which is CounterUniform(key, offset + n) < p exactly:
  // threshold = ceil(p * 2^53).
  uint64_t threshold = 0;
  uint64_t inline_keys[kInlineKeys] = {};
  const uint64_t* keys = nullptr;
};

// y = x * mask, mask = 0 (dropped) or scale, over n elements.
template <typename T>
cudaError_t LaunchDropout(const T* x, T* y, T* mask, int64_t n, T scale, const DropoutIndex& index,
                          cudaStream_t stream);

// y[i, :] = weight[indices[i], :] for i < n, rows of row_bytes bytes. An
// index outside [0, num_embeddings) writes a zero row and lowers
// *first_bad (a device u64, preset to ~0) to its position i.
template <typename I>
cudaError_t LaunchEmbedding(const I* indices, const void* weight, void* y, int64_t n, int64_t num_embeddings,
                            int64_t row_bytes, unsigned long long* first_bad, cudaStream_t stream);

// Device scratch bytes LaunchEmbeddingBackward needs for n indices.
size_t EmbeddingBackwardWorkspaceBytes(int64_t n, int64_t num_embeddings);

// dw[r, :] = sum of dy[i, :] over the i with indices[i] == r, in increasing
// i (0 for padding_idx and unused rows); deterministic, no float atomics.
// Bad indices lower *first_bad as in LaunchEmbedding and add nowhere.
template <typename T, typename I>
cudaError_t LaunchEmbeddingBackward(const T* dy, const I* indices, T* dw, int64_t n, int64_t num_embeddings,
                                    int64_t dim, int64_t padding_idx, void* workspace, size_t workspace_bytes,
                                    unsigned long long* first_bad, cudaStream_t stream);

}  // namespace loom::cuda
