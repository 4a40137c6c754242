// 16-byte vector accesses shared by the activation and optimizer kernels:
// a pack of T loaded or stored as one access, and the alignment test that
// decides whether a pointer may be read that way. Included only by
// nvcc-compiled files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda {

// 16 bytes of T, loaded and stored as one vector access.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kLanes = 16 / sizeof(T);
  T v[kLanes];
};

__host__ __device__ inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace loom::cuda
