// Device code of the conv family beyond cuDNN: channel biases, the bias
// gradient (a fixed-order two-pass reduction, no atomics) and the plane
// re-windowing that feeds cuDNN the images of transposed convolutions whose
// output_padding reaches past the stride. bf16 / f16 elements are widened to
// f32 for the arithmetic and rounded once on the store.
#include "ops/cuda/conv_kernels.h"

#include <algorithm>

#include "ops/cuda/device_util.cuh"

namespace loom::cuda {
namespace {

template <typename T>
__device__ inline T Narrow(ConvAcc<T> x) {
  return NarrowFloat<T>::From(x);
}

// Planes go on grid y (strided past 65535), each plane's elements on grid x.
template <typename T>
__global__ void ChannelBiasKernel(T* y, const T* bias, int64_t planes, int64_t c, int64_t hw, bool accumulate) {
  for (int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    const ConvAcc<T> b = bias ? WidenFloat(bias[p % c]) : ConvAcc<T>(0);
    T* plane = y + p * hw;
    for (int64_t i = FirstIndex(); i < hw; i += GridStride())
      plane[i] = Narrow<T>(accumulate ? WidenFloat(plane[i]) + b : b);
  }
}

template <typename T>
__global__ void PlaneWindowKernel(PlaneWindow win, const T* src, const T* bias, T* dst, int64_t total) {
  for (int64_t i = FirstIndex(); i < total; i += GridStride()) {
    const int64_t x = i % win.dst_w, rest = i / win.dst_w;
    const int64_t y = rest % win.dst_h, p = rest / win.dst_h;
    const int64_t sy = y + win.off_h, sx = x + win.off_w;
    ConvAcc<T> v = (sy >= 0 && sy < win.src_h && sx >= 0 && sx < win.src_w)
                       ? WidenFloat(src[(p * win.src_h + sy) * win.src_w + sx])
                       : ConvAcc<T>(0);
    if (bias) v += WidenFloat(bias[p % win.channels]);
    dst[i] = Narrow<T>(v);
  }
}

// One block per (channel, slice): slice k of channel ch is the flat range
// [m * k / chunks, m * (k + 1) / chunks) of its m = n * s elements. Each
// thread walks its elements in order, then the block tree adds the threads.
// Out is db itself (one chunk) or the partial sums in the arithmetic type.
template <typename T, typename Out>
__global__ void ChannelSumKernel(const T* dy, int64_t n, int64_t c, int64_t s, int64_t chunks, Out* out) {
  using Acc = ConvAcc<T>;
  __shared__ Acc scratch[kThreads];
  const int64_t m = n * s;
  const int64_t step_n = blockDim.x / s, step_s = blockDim.x % s;  // (n, s) advance per blockDim elements
  for (int64_t item = blockIdx.x; item < c * chunks; item += gridDim.x) {  // uniform over the block
    const int64_t ch = item / chunks, k = item % chunks;
    const int64_t j1 = m * (k + 1) / chunks;
    int64_t j = m * k / chunks + threadIdx.x;
    int64_t in = j / s, is = j % s;
    Acc sum = 0;
    for (; j < j1; j += blockDim.x) {
      sum += WidenFloat(dy[(in * c + ch) * s + is]);
      in += step_n;
      is += step_s;
      if (is >= s) {
        is -= s;
        ++in;
      }
    }
    sum = BlockSum(sum, scratch);
    if (threadIdx.x == 0) out[item] = NarrowFloat<Out>::From(sum);
  }
}

template <typename T>
__global__ void SumChunksKernel(const ConvAcc<T>* partial, int64_t c, int64_t chunks, T* db) {
  for (int64_t ch = FirstIndex(); ch < c; ch += GridStride()) {
    ConvAcc<T> total = 0;
    for (int64_t k = 0; k < chunks; ++k) total += partial[ch * chunks + k];
    db[ch] = Narrow<T>(total);
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchChannelBias(T* y, const T* bias, int64_t n, int64_t c, int64_t hw, bool accumulate,
                              cudaStream_t stream) {
  const int64_t planes = n * c;
  if (planes == 0 || hw == 0) return cudaSuccess;
  // Small planes (7x7 maps) get small blocks rather than idle threads.
  const int threads = hw >= kThreads ? kThreads : static_cast<int>((hw + 31) / 32 * 32);
  // About 64K blocks in all: many planes share out over grid y, few long
  // planes over grid x.
  const int64_t grid_y = std::min<int64_t>(planes, 65535);
  const int64_t grid_x = std::min<int64_t>((hw + threads - 1) / threads, std::max<int64_t>(1, 65536 / grid_y));
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  ChannelBiasKernel<T><<<grid, threads, 0, stream>>>(y, bias, planes, c, hw, accumulate);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchPlaneWindowCopy(const PlaneWindow& window, const T* src, const T* bias, T* dst, cudaStream_t stream) {
  const int64_t total = window.planes * window.dst_h * window.dst_w;
  if (total == 0) return cudaSuccess;
  PlaneWindowKernel<T><<<Blocks(total), kThreads, 0, stream>>>(window, src, bias, dst, total);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchChannelSum(const T* dy, int64_t n, int64_t c, int64_t s, int64_t chunks, ConvAcc<T>* partial, T* db,
                             cudaStream_t stream) {
  if (c == 0) return cudaSuccess;
  if (n * s == 0) return cudaMemsetAsync(db, 0, static_cast<size_t>(c) * sizeof(T), stream);  // +0.0 in every type
  if (chunks == 1) {
    ChannelSumKernel<T, T><<<BlocksPerItem(c), kThreads, 0, stream>>>(dy, n, c, s, 1, db);
    return cudaGetLastError();
  }
  ChannelSumKernel<T, ConvAcc<T>><<<BlocksPerItem(c * chunks), kThreads, 0, stream>>>(dy, n, c, s, chunks, partial);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SumChunksKernel<T><<<Blocks(c), kThreads, 0, stream>>>(partial, c, chunks, db);
  return cudaGetLastError();
}

#define LOOM_INSTANTIATE_CONV(T)                                                                                \
  template cudaError_t LaunchChannelBias<T>(T*, const T*, int64_t, int64_t, int64_t, bool, cudaStream_t);      \
  template cudaError_t LaunchPlaneWindowCopy<T>(const PlaneWindow&, const T*, const T*, T*, cudaStream_t);    \
  template cudaError_t LaunchChannelSum<T>(const T*, int64_t, int64_t, int64_t, int64_t, ConvAcc<T>*, T*,        \
                                           cudaStream_t);
LOOM_INSTANTIATE_CONV(float)
LOOM_INSTANTIATE_CONV(double)
LOOM_INSTANTIATE_CONV(BFloat16)
LOOM_INSTANTIATE_CONV(Float16)
#undef LOOM_INSTANTIATE_CONV

}  // namespace loom::cuda
