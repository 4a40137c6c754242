// One output position's pooling window along one axis, shared by the CPU
// kernels (ops/pool_ops.cc) and the CUDA kernels (ops/cuda/pool_kernels.cu).
// Header-only, no loom dependencies, usable from CUDA device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_POOL_HOST_DEVICE __host__ __device__
#else
#define LOOM_POOL_HOST_DEVICE
#endif

namespace loom::pool {

// The input taps first + t * step for t in [0, count) (only those inside
// the input), and the extent a mean divides by (which counts padding under
// count_include_pad).
struct Window {
  int64_t first = 0, count = 0, extent = 0;
};

// Sliding windows: output o's taps start at o * s - p, `k` of them `d`
// apart, over an axis of extent `in`.
LOOM_POOL_HOST_DEVICE inline Window SlidingWindow(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d,
                                                  bool include_pad) {
  const int64_t start = o * s - p;
  const int64_t t_lo = start >= 0 ? 0 : (-start + d - 1) / d;  // first tap at or after 0
  const int64_t taps_before_in = (in - start + d - 1) / d;
  const int64_t t_hi = start >= in ? 0 : (k < taps_before_in ? k : taps_before_in);  // taps before in
  Window w;
  w.count = t_hi - t_lo > 0 ? t_hi - t_lo : 0;
  w.first = start + t_lo * d;
  // PyTorch: the padded window ends at min(start + k, in + p).
  w.extent = include_pad ? (start + k < in + p ? start + k : in + p) - start : w.count;
  return w;
}

// Adaptive windows: window o of an axis of extent `in` pooled to `out` is
// [floor(o * in / out), ceil((o + 1) * in / out)).
LOOM_POOL_HOST_DEVICE inline int64_t AdaptiveBegin(int64_t o, int64_t in, int64_t out) { return o * in / out; }
LOOM_POOL_HOST_DEVICE inline int64_t AdaptiveEnd(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

}  // namespace loom::pool

#undef LOOM_POOL_HOST_DEVICE
