// Pooling kernels, one thread per output element forward and one per input
// element backward. The backward passes gather: each input element walks
// the outputs whose windows cover it in ascending output order and adds
// their gradients, which is the CPU's scatter order, so the sums round the
// same way and no atomics are needed.
#include "ops/cuda/pool_kernels.h"

#include <limits>

#include "ops/cuda/device_util.cuh"
#include "ops/pool_window.h"

namespace loom::cuda {
namespace {

// The windows of ops/pool_window.h, as the CPU kernels compute them.
using pool::AdaptiveBegin;
using pool::AdaptiveEnd;
using pool::SlidingWindow;
using AxisWindow = pool::Window;

template <typename T>
__global__ void MaxPoolForwardKernel(PoolGeom g, const T* x, T* y, int64_t* idx, int64_t total) {
  for (int64_t i = FirstIndex(); i < total; i += GridStride()) {
    const int64_t ox = i % g.ow, rest = i / g.ow;
    const int64_t oy = rest % g.oh, p = rest / g.oh;
    const AxisWindow r = SlidingWindow(oy, g.h, g.kh, g.sh, g.ph, g.dh, true);
    const AxisWindow c = SlidingWindow(ox, g.w, g.kw, g.sw, g.pw, g.dw, true);
    if (r.count == 0 || c.count == 0) {
      y[i] = -std::numeric_limits<T>::infinity();
      idx[i] = -1;
      continue;
    }
    const T* plane = x + p * g.h * g.w;
    int64_t arg = r.first * g.w + c.first;
    T best = plane[arg];
    for (int64_t a = 0; a < r.count; ++a) {
      const int64_t line = (r.first + a * g.dh) * g.w + c.first;
      for (int64_t b = 0; b < c.count; ++b) {
        const int64_t j = line + b * g.dw;
        const T v = plane[j];
        if (v > best || v != v) {  // NaN wins, as in PyTorch
          best = v;
          arg = j;
        }
      }
    }
    y[i] = best;
    idx[i] = arg + g.index_offset;
  }
}

// Outputs oy whose window holds row iy: oy * s - p + a * d = iy for a tap
// a; descending a gives ascending oy.
template <typename T>
__global__ void MaxPoolBackwardKernel(PoolGeom g, const T* dy, const int64_t* idx, T* dx, int64_t total) {
  for (int64_t i = FirstIndex(); i < total; i += GridStride()) {
    const int64_t ix = i % g.w, rest = i / g.w;
    const int64_t iy = rest % g.h, p = rest / g.h;
    const int64_t target = iy * g.w + ix;
    const T* dyp = dy + p * g.oh * g.ow;
    const int64_t* ip = idx + p * g.oh * g.ow;
    T acc = 0;
    for (int64_t a = g.kh - 1; a >= 0; --a) {
      const int64_t t = iy + g.ph - a * g.dh;
      if (t < 0 || t % g.sh != 0 || t / g.sh >= g.oh) continue;
      const int64_t row = (t / g.sh) * g.ow;
      for (int64_t b = g.kw - 1; b >= 0; --b) {
        const int64_t u = ix + g.pw - b * g.dw;
        if (u < 0 || u % g.sw != 0 || u / g.sw >= g.ow) continue;
        const int64_t o = row + u / g.sw;
        if (ip[o] == target) acc += dyp[o];
      }
    }
    dx[i] = acc;
  }
}

template <typename T>
__global__ void AvgPoolForwardKernel(PoolGeom g, const T* x, T* y, int64_t total) {
  for (int64_t i = FirstIndex(); i < total; i += GridStride()) {
    const int64_t ox = i % g.ow, rest = i / g.ow;
    const int64_t oy = rest % g.oh, p = rest / g.oh;
    const AxisWindow r = SlidingWindow(oy, g.h, g.kh, g.sh, g.ph, 1, g.include_pad);
    const AxisWindow c = SlidingWindow(ox, g.w, g.kw, g.sw, g.pw, 1, g.include_pad);
    const T* plane = x + p * g.h * g.w;
    T sum = 0;
    for (int64_t iy = r.first; iy < r.first + r.count; ++iy)
      for (int64_t ix = c.first; ix < c.first + c.count; ++ix) sum += plane[iy * g.w + ix];
    y[i] = sum / static_cast<T>(r.extent * c.extent);
  }
}

// Outputs whose (unclipped) window [o * s - p, o * s - p + k) holds row i.
__device__ inline void CoveringRange(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out, int64_t* lo,
                                     int64_t* hi) {
  const int64_t first = i + p - k + 1;
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  *hi = min(out, (i + p) / s + 1);
}

template <typename T>
__global__ void AvgPoolBackwardKernel(PoolGeom g, const T* dy, T* dx, int64_t total) {
  for (int64_t i = FirstIndex(); i < total; i += GridStride()) {
    const int64_t ix = i % g.w, rest = i / g.w;
    const int64_t iy = rest % g.h, p = rest / g.h;
    int64_t oy0, oy1, ox0, ox1;
    CoveringRange(iy, g.kh, g.sh, g.ph, g.oh, &oy0, &oy1);
    CoveringRange(ix, g.kw, g.sw, g.pw, g.ow, &ox0, &ox1);
    const T* dyp = dy + p * g.oh * g.ow;
    T acc = 0;
    for (int64_t oy = oy0; oy < oy1; ++oy) {
      const int64_t er = SlidingWindow(oy, g.h, g.kh, g.sh, g.ph, 1, g.include_pad).extent;
      for (int64_t ox = ox0; ox < ox1; ++ox) {
        const int64_t ec = SlidingWindow(ox, g.w, g.kw, g.sw, g.pw, 1, g.include_pad).extent;
        acc += dyp[oy * g.ow + ox] / static_cast<T>(er * ec);
      }
    }
    dx[i] = acc;
  }
}

template <typename T>
__global__ void AdaptiveAvgPoolForwardKernel(PoolGeom g, const T* x, T* y, int64_t total) {
  for (int64_t i = FirstIndex(); i < total; i += GridStride()) {
    const int64_t ox = i % g.ow, rest = i / g.ow;
    const int64_t oy = rest % g.oh, p = rest / g.oh;
    const int64_t r0 = AdaptiveBegin(oy, g.h, g.oh), r1 = AdaptiveEnd(oy, g.h, g.oh);
    const int64_t c0 = AdaptiveBegin(ox, g.w, g.ow), c1 = AdaptiveEnd(ox, g.w, g.ow);
    const T* plane = x + p * g.h * g.w;
    T sum = 0;
    for (int64_t iy = r0; iy < r1; ++iy)
      for (int64_t ix = c0; ix < c1; ++ix) sum += plane[iy * g.w + ix];
    y[i] = sum / static_cast<T>((r1 - r0) * (c1 - c0));
  }
}

// Windows holding row i are o in [floor(i * out / in), ceil((i + 1) * out /
// in)); each is checked against its exact bounds all the same.
template <typename T>
__global__ void AdaptiveAvgPoolBackwardKernel(PoolGeom g, const T* dy, T* dx, int64_t total) {
  for (int64_t i = FirstIndex(); i < total; i += GridStride()) {
    const int64_t ix = i % g.w, rest = i / g.w;
    const int64_t iy = rest % g.h, p = rest / g.h;
    const int64_t oy0 = iy * g.oh / g.h, oy1 = min(g.oh, ((iy + 1) * g.oh + g.h - 1) / g.h);
    const int64_t ox0 = ix * g.ow / g.w, ox1 = min(g.ow, ((ix + 1) * g.ow + g.w - 1) / g.w);
    const T* dyp = dy + p * g.oh * g.ow;
    T acc = 0;
    for (int64_t oy = oy0; oy < oy1; ++oy) {
      const int64_t r0 = AdaptiveBegin(oy, g.h, g.oh), r1 = AdaptiveEnd(oy, g.h, g.oh);
      if (iy < r0 || iy >= r1) continue;
      for (int64_t ox = ox0; ox < ox1; ++ox) {
        const int64_t c0 = AdaptiveBegin(ox, g.w, g.ow), c1 = AdaptiveEnd(ox, g.w, g.ow);
        if (ix < c0 || ix >= c1) continue;
        acc += dyp[oy * g.ow + ox] / static_cast<T>((r1 - r0) * (c1 - c0));
      }
    }
    dx[i] = acc;
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchMaxPoolForward(const PoolGeom& g, const T* x, T* y, int64_t* idx, cudaStream_t stream) {
  const int64_t total = g.planes * g.oh * g.ow;
  if (total == 0) return cudaSuccess;
  MaxPoolForwardKernel<T><<<Blocks(total), kThreads, 0, stream>>>(g, x, y, idx, total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMaxPoolBackward(const PoolGeom& g, const T* dy, const int64_t* idx, T* dx, cudaStream_t stream) {
  const int64_t total = g.planes * g.h * g.w;
  if (total == 0) return cudaSuccess;
  MaxPoolBackwardKernel<T><<<Blocks(total), kThreads, 0, stream>>>(g, dy, idx, dx, total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchAvgPoolForward(const PoolGeom& g, const T* x, T* y, cudaStream_t stream) {
  const int64_t total = g.planes * g.oh * g.ow;
  if (total == 0) return cudaSuccess;
  AvgPoolForwardKernel<T><<<Blocks(total), kThreads, 0, stream>>>(g, x, y, total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchAvgPoolBackward(const PoolGeom& g, const T* dy, T* dx, cudaStream_t stream) {
  const int64_t total = g.planes * g.h * g.w;
  if (total == 0) return cudaSuccess;
  AvgPoolBackwardKernel<T><<<Blocks(total), kThreads, 0, stream>>>(g, dy, dx, total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchAdaptiveAvgPoolForward(const PoolGeom& g, const T* x, T* y, cudaStream_t stream) {
  const int64_t total = g.planes * g.oh * g.ow;
  if (total == 0) return cudaSuccess;
  AdaptiveAvgPoolForwardKernel<T><<<Blocks(total), kThreads, 0, stream>>>(g, x, y, total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchAdaptiveAvgPoolBackward(const PoolGeom& g, const T* dy, T* dx, cudaStream_t stream) {
  const int64_t total = g.planes * g.h * g.w;
  if (total == 0) return cudaSuccess;
  AdaptiveAvgPoolBackwardKernel<T><<<Blocks(total), kThreads, 0, stream>>>(g, dy, dx, total);
  return cudaGetLastError();
}

#define LOOM_INSTANTIATE_POOL(T)                                                                                 \
  template cudaError_t LaunchMaxPoolForward<T>(const PoolGeom&, const T*, T*, int64_t*, cudaStream_t);          \
  template cudaError_t LaunchMaxPoolBackward<T>(const PoolGeom&, const T*, const int64_t*, T*, cudaStream_t);   \
  template cudaError_t LaunchAvgPoolForward<T>(const PoolGeom&, const T*, T*, cudaStream_t);                    \
  template cudaError_t LaunchAvgPoolBackward<T>(const PoolGeom&, const T*, T*, cudaStream_t);                   \
  template cudaError_t LaunchAdaptiveAvgPoolForward<T>(const PoolGeom&, const T*, T*, cudaStream_t);            \
  template cudaError_t LaunchAdaptiveAvgPoolBackward<T>(const PoolGeom&, const T*, T*, cudaStream_t);
LOOM_INSTANTIATE_POOL(float)
LOOM_INSTANTIATE_POOL(double)
#undef LOOM_INSTANTIATE_POOL

}  // namespace loom::cuda
