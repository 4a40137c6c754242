// Launchers of the attention family's device code (attention_kernels.cu):
// the masked row softmax of ScaledDotProductAttention and its backward. The
// GEMMs around them are cuBLAS calls in attention_kernels.cc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// The dtype of a key padding mask; the kernel reads it as it is stored.
enum class MaskDType : int { kNone, kBool, kI32, kI64, kF32, kF64 };

// key_padding_mask [B, Tk] (nonzero = padded key), or none.
struct KeyPaddingMask {
  const void* data = nullptr;
  MaskDType dtype = MaskDType::kNone;
};

// Extents of the score rows: rows = B * H * Tq rows of Tk, row r is query
// r % tq of batch r / (heads * tq).
struct SoftmaxRows {
  int64_t rows = 0, heads = 0, tq = 0, tk = 0;
  bool causal = false;      // query i sees keys j <= i + query_offset
  int64_t query_offset = 0;  // ResolveQueryOffset: tk - tq unless set
};

// In place: each row of `scores` becomes the softmax over its visible keys
// (causal and not padded), 0 elsewhere; a row with no visible key becomes 0.
template <typename T>
cudaError_t LaunchMaskedSoftmax(T* scores, const SoftmaxRows& shape, KeyPaddingMask mask, cudaStream_t stream);

// In place: grad[r, j] = probs[r, j] * (grad[r, j] - sum_j' probs[r, j'] grad[r, j']).
template <typename T>
cudaError_t LaunchSoftmaxBackward(const T* probs, T* grad, int64_t rows, int64_t tk, cudaStream_t stream);

}  // namespace loom::cuda
