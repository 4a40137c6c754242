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

// Last key index visible to query i (may be < 0: no key visible). Under
// the causal mask query i sits at key position i + query_offset and sees
// the keys up to it. The op's default offset is Tk - Tq (aligned
// bottom-right): with Tq == Tk the usual j <= i, with Tq < Tk the queries
// are the last Tq positions of the key sequence (incremental decoding), with
// Tq > Tk the first Tq - Tk queries see no key at all. A part of the query
// rows (a sequence split) keeps its rows' positions in the whole.
LOOM_ATTENTION_HOST_DEVICE inline int64_t LastVisibleKey(bool causal, int64_t i, int64_t query_offset, int64_t tk) {
  if (!causal) return tk - 1;
  const int64_t last = i + query_offset;
  return last < tk - 1 ? last : tk - 1;
}

}  // namespace loom

#undef LOOM_ATTENTION_HOST_DEVICE
