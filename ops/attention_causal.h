// The causal mask of ScaledDotProductAttention, shared by the CPU kernel
// (ops/attention_ops.cc) and the CUDA row kernels (ops/cuda/attention_kernels.cu).
// Header-only, no loom dependencies, usable from CUDA device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_ATTENTION_HOST_DEVICE __host__ __device__
#else
#define LOOM_ATTENTION_HOST_DEVICE
#endif

namespace loom {

// Last key index visible to query i (may be < 0: no key visible). Causal
// masking is aligned bottom-right: query i sits at key position
// i + (Tk - Tq), so with Tq == Tk it is the usual j <= i, and with Tq < Tk
// the queries are the last Tq positions of the key sequence (incremental
// decoding). With Tq > Tk the first Tq - Tk queries see no key at all.
LOOM_ATTENTION_HOST_DEVICE inline int64_t LastVisibleKey(bool causal, int64_t i, int64_t tq, int64_t tk) {
  if (!causal) return tk - 1;
  const int64_t last = i + tk - tq;
  return last < tk - 1 ? last : tk - 1;
}

}  // namespace loom

#undef LOOM_ATTENTION_HOST_DEVICE
