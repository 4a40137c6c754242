// CUDA kernels of ops/reduce_ops.cc.
//
// Reductions and softmaxes share one work shape: a block is a tile of `lanes`
// outputs (columns) times `parts` threads per output, which fold strided
// shares of the output's elements and are then combined by a fixed shared-
// memory tree. The threads along the contiguous direction are the fastest in
// the block (parts when the reduced dim is the last one, else lanes), so
// loads coalesce either way. Long reductions with few outputs are also split
// over gridDim.y blocks; their partial results go to a workspace and are
// combined in split order by a second kernel. No atomics anywhere.
#include "ops/cuda/reduce_kernels.h"

#include <algorithm>
#include <limits>

#include "ops/cuda/device_util.cuh"
#include "ops/cuda/tile_reduce.cuh"

namespace loom::cuda {
namespace {

// Splits long reductions over blocks when the tiles alone leave the GPU idle.
TilePlan PlanReduceTiles(const ReduceDims& d) {
  TilePlan p = PlanTiles(d.rows * d.inner, d.reduced, d.inner == 1);
  SplitOver(p, d.reduced, d.reduced);
  return p;
}

// The offset of row-major index i over `rank` dims with these strides.
__device__ inline int64_t StridedOffset(int rank, const int64_t* dims, const int64_t* strides, int64_t i) {
  int64_t offset = 0;
  for (int k = rank - 1; k >= 0; --k) {
    offset += (i % dims[k]) * strides[k];
    i /= dims[k];
  }
  return offset;
}

__device__ inline int64_t KeptOffset(const ReduceDims& d, int64_t row) {
  return StridedOffset(d.kept_rank, d.kept_dims, d.kept_strides, row);
}

__device__ inline int64_t ReducedOffset(const ReduceDims& d, int64_t r) {
  if (d.red_rank == 1) return r * d.red_strides[0];  // the common case: no divisions
  return StridedOffset(d.red_rank, d.red_dims, d.red_strides, r);
}

__device__ inline int64_t OutputBase(const ReduceDims& d, int64_t o) {
  const int64_t row = o / d.inner;
  return KeptOffset(d, row) + (o - row * d.inner);
}

// NaN wins, as MaxStep in ops/reduce_ops.cc.
template <typename T>
__device__ inline T MaxStep(T a, T v) {
  return (v > a || v != v) ? v : a;
}

// Whether v is the maximum m (NaN matches NaN), as IsMax in ops/reduce_ops.cc.
template <typename T>
__device__ inline bool IsMax(T v, T m) {
  return v == m || (v != v && m != m);
}

// Reducers: Init, Ref(o) (a per-output value Step sees), Step(acc, v, ref, r),
// Combine, Finish(o, acc) (writes the output).
template <typename T>
struct SumReducer {
  using Acc = double;  // as the CPU kernel: f32 sums over long axes keep their digits
  T* y;
  double scale;
  __device__ Acc Init() const { return 0; }
  __device__ T Ref(int64_t) const { return T(0); }
  __device__ Acc Step(Acc a, T v, T, int64_t) const { return a + static_cast<double>(v); }
  __device__ Acc Combine(Acc a, Acc b) const { return a + b; }
  __device__ void Finish(int64_t o, Acc a) const { y[o] = static_cast<T>(a * scale); }
};

template <typename T>
struct MaxReducer {
  using Acc = T;
  T* y;
  __device__ Acc Init() const { return -std::numeric_limits<T>::infinity(); }
  __device__ T Ref(int64_t) const { return T(0); }
  __device__ Acc Step(Acc a, T v, T, int64_t) const { return MaxStep(a, v); }
  __device__ Acc Combine(Acc a, Acc b) const { return MaxStep(a, b); }
  __device__ void Finish(int64_t o, Acc a) const { y[o] = a; }
};

// The lowest reduced index holding the maximum y[o] (ReduceMax's index
// output; `reduced` if none, which a maximum of the elements never is).
template <typename T>
struct FirstMaxReducer {
  using Acc = int64_t;
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const T* y;
  int64_t* index;
  int64_t reduced;
  __device__ Acc Init() const { return kNone; }
  __device__ T Ref(int64_t o) const { return y[o]; }
  // Each thread walks its indices upwards, so its first hit is its lowest.
  __device__ Acc Step(Acc a, T v, T m, int64_t r) const { return a == kNone && IsMax(v, m) ? r : a; }
  __device__ Acc Combine(Acc a, Acc b) const { return a < b ? a : b; }
  __device__ void Finish(int64_t o, Acc a) const { index[o] = a == kNone ? reduced : a; }
};

// dx at each output's index = its dy (dx zeroed before); an index outside
// the reduction sends nothing, as on the CPU.
template <typename T>
__global__ void ScatterMaxKernel(const int64_t* index, const T* dy, T* dx, ReduceDims d) {
  const int64_t out_n = d.rows * d.inner;
  for (int64_t o = FirstIndex(); o < out_n; o += GridStride()) {
    const int64_t r = index[o];
    if (r >= 0 && r < d.reduced) dx[OutputBase(d, o) + ReducedOffset(d, r)] = dy[o];
  }
}

template <typename T, typename R>
__global__ void ReduceTilesKernel(const T* x, ReduceDims d, R reducer, TilePlan p, typename R::Acc* partial) {
  using Acc = typename R::Acc;
  __shared__ Acc scratch[kThreads];
  int lane, part;
  LanePart(p, lane, part);
  const int64_t out_n = d.rows * d.inner;
  const int64_t split = blockIdx.y;
  const int64_t r0 = split * p.split_len, r1 = r0 + p.split_len < d.reduced ? r0 + p.split_len : d.reduced;
  auto combine = [&](Acc a, Acc b) { return reducer.Combine(a, b); };
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const int64_t o = t * p.lanes + lane;
    Acc acc = reducer.Init();
    if (o < out_n) {
      const int64_t base = OutputBase(d, o);
      const T ref = reducer.Ref(o);
      for (int64_t r = r0 + part; r < r1; r += p.parts) acc = reducer.Step(acc, x[base + ReducedOffset(d, r)], ref, r);
    }
    acc = TileReduce(acc, scratch, p, lane, part, combine);
    if (part == 0 && o < out_n) {
      if (p.splits == 1) reducer.Finish(o, acc);
      else partial[split * out_n + o] = acc;
    }
  }
}

// Combines each output's split partial results in split order.
template <typename R>
__global__ void ReduceFinishKernel(const typename R::Acc* partial, int64_t splits, int64_t out_n, R reducer) {
  for (int64_t o = FirstIndex(); o < out_n; o += GridStride()) {
    typename R::Acc acc = reducer.Init();
    for (int64_t s = 0; s < splits; ++s) acc = reducer.Combine(acc, partial[s * out_n + o]);
    reducer.Finish(o, acc);
  }
}

template <typename T, typename R>
cudaError_t RunReduction(const T* x, const ReduceDims& d, const R& reducer, void* workspace, cudaStream_t stream) {
  const int64_t out_n = d.rows * d.inner;
  if (out_n == 0) return cudaSuccess;
  const TilePlan p = PlanReduceTiles(d);
  auto* partial = static_cast<typename R::Acc*>(workspace);
  if (p.splits > 1 && partial == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(BlocksPerItem(p.tiles), static_cast<unsigned>(p.splits));
  ReduceTilesKernel<<<grid, p.lanes * p.parts, 0, stream>>>(x, d, reducer, p, partial);
  if (p.splits > 1) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    ReduceFinishKernel<<<Blocks(out_n), kThreads, 0, stream>>>(partial, p.splits, out_n, reducer);
  }
  return cudaGetLastError();
}

// ------------------------------------------------------------------ softmax

// Column q of [outer, len, inner] starts at (q / inner) * len * inner + q % inner
// and steps by inner.
__device__ inline int64_t ColumnBase(const SoftmaxDims& d, int64_t q) {
  const int64_t o = q / d.inner;
  return o * d.len * d.inner + (q - o * d.inner);
}

template <typename T>
__device__ inline T MaxIgnoringNan(T a, T b) {
  return a < b ? b : a;  // std::max, as the CPU kernel: a NaN row comes out NaN through exp anyway
}

template <typename T, bool kLog>
__global__ void SoftmaxKernel(const T* x, T* y, SoftmaxDims d, TilePlan p) {
  __shared__ double scratch[kThreads];
  T* max_scratch = reinterpret_cast<T*>(scratch);
  int lane, part;
  LanePart(p, lane, part);
  const int64_t columns = d.outer * d.inner;
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const int64_t q = t * p.lanes + lane;
    const bool valid = q < columns;
    const int64_t base = valid ? ColumnBase(d, q) : 0;
    T m = -std::numeric_limits<T>::infinity();
    if (valid)
      for (int64_t c = part; c < d.len; c += p.parts) m = MaxIgnoringNan(m, x[base + c * d.inner]);
    m = TileReduce(m, max_scratch, p, lane, part, [](T a, T b) { return MaxIgnoringNan(a, b); });
    double s = 0;
    if (valid)
      for (int64_t c = part; c < d.len; c += p.parts) s += static_cast<double>(Exp(x[base + c * d.inner] - m));
    s = TileReduce(s, scratch, p, lane, part, [](double a, double b) { return a + b; });
    if (!valid) continue;
    if constexpr (kLog) {
      // (x - max) - log(sum): the shifted value is small, so f32 keeps its digits.
      const T log_sum = static_cast<T>(log(s));
      for (int64_t c = part; c < d.len; c += p.parts) {
        const int64_t at = base + c * d.inner;
        y[at] = (x[at] - m) - log_sum;
      }
    } else {
      const T inv = static_cast<T>(1.0 / s);
      for (int64_t c = part; c < d.len; c += p.parts) {
        const int64_t at = base + c * d.inner;
        y[at] = Exp(x[at] - m) * inv;
      }
    }
  }
}

template <typename T, bool kLog>
__global__ void SoftmaxBackwardKernel(const T* y, const T* dy, T* dx, SoftmaxDims d, TilePlan p) {
  __shared__ double scratch[kThreads];
  int lane, part;
  LanePart(p, lane, part);
  const int64_t columns = d.outer * d.inner;
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const int64_t q = t * p.lanes + lane;
    const bool valid = q < columns;
    const int64_t base = valid ? ColumnBase(d, q) : 0;
    double s = 0;
    if (valid) {
      for (int64_t c = part; c < d.len; c += p.parts) {
        const int64_t at = base + c * d.inner;
        if constexpr (kLog) s += static_cast<double>(dy[at]);
        else s += static_cast<double>(dy[at] * y[at]);
      }
    }
    s = TileReduce(s, scratch, p, lane, part, [](double a, double b) { return a + b; });
    if (!valid) continue;
    const T sum = static_cast<T>(s);
    for (int64_t c = part; c < d.len; c += p.parts) {
      const int64_t at = base + c * d.inner;
      if constexpr (kLog) dx[at] = dy[at] - Exp(y[at]) * sum;
      else dx[at] = y[at] * (dy[at] - sum);
    }
  }
}

TilePlan PlanSoftmax(const SoftmaxDims& d) { return PlanTiles(d.outer * d.inner, d.len, d.inner == 1); }

}  // namespace

int64_t ReduceWorkspaceElems(const ReduceDims& dims) {
  const TilePlan p = PlanReduceTiles(dims);
  return p.splits > 1 ? p.splits * dims.rows * dims.inner : 0;
}

template <typename T>
cudaError_t LaunchReduce(ReduceKind kind, const T* x, T* y, const ReduceDims& dims, void* workspace,
                         cudaStream_t stream) {
  static_assert(sizeof(T) <= 8, "partial results live in 8-byte workspace slots");
  switch (kind) {
    case ReduceKind::kSum: return RunReduction(x, dims, SumReducer<T>{y, 1.0}, workspace, stream);
    case ReduceKind::kMean:
      // 1 / 0 = inf makes the mean of an empty reduction 0 * inf = NaN, as on the CPU.
      return RunReduction(x, dims, SumReducer<T>{y, 1.0 / static_cast<double>(dims.reduced)}, workspace, stream);
    case ReduceKind::kMax: return RunReduction(x, dims, MaxReducer<T>{y}, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t LaunchReduceMaxIndex(const T* x, const T* y, int64_t* index, const ReduceDims& dims, void* workspace,
                                 cudaStream_t stream) {
  return RunReduction(x, dims, FirstMaxReducer<T>{y, index, dims.reduced}, workspace, stream);
}

template <typename T>
cudaError_t LaunchReduceMaxBackward(const int64_t* index, const T* dy, T* dx, int64_t x_numel, const ReduceDims& dims,
                                    cudaStream_t stream) {
  if (x_numel == 0) return cudaSuccess;
  const cudaError_t err = cudaMemsetAsync(dx, 0, static_cast<size_t>(x_numel) * sizeof(T), stream);
  if (err != cudaSuccess) return err;
  const int64_t out_n = dims.rows * dims.inner;
  if (out_n == 0) return cudaSuccess;
  ScatterMaxKernel<<<Blocks(out_n), kThreads, 0, stream>>>(index, dy, dx, dims);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchSoftmax(bool log, const T* x, T* y, const SoftmaxDims& dims, cudaStream_t stream) {
  if (dims.outer * dims.len * dims.inner == 0) return cudaSuccess;
  const TilePlan p = PlanSoftmax(dims);
  const unsigned blocks = BlocksPerItem(p.tiles);
  if (log) SoftmaxKernel<T, true><<<blocks, p.lanes * p.parts, 0, stream>>>(x, y, dims, p);
  else SoftmaxKernel<T, false><<<blocks, p.lanes * p.parts, 0, stream>>>(x, y, dims, p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchSoftmaxBackward(bool log, const T* y, const T* dy, T* dx, const SoftmaxDims& dims,
                                  cudaStream_t stream) {
  if (dims.outer * dims.len * dims.inner == 0) return cudaSuccess;
  const TilePlan p = PlanSoftmax(dims);
  const unsigned blocks = BlocksPerItem(p.tiles);
  if (log) SoftmaxBackwardKernel<T, true><<<blocks, p.lanes * p.parts, 0, stream>>>(y, dy, dx, dims, p);
  else SoftmaxBackwardKernel<T, false><<<blocks, p.lanes * p.parts, 0, stream>>>(y, dy, dx, dims, p);
  return cudaGetLastError();
}

#define LOOM_INSTANTIATE_REDUCE_KERNELS(T)                                                                       \
  template cudaError_t LaunchReduce<T>(ReduceKind, const T*, T*, const ReduceDims&, void*, cudaStream_t);       \
  template cudaError_t LaunchReduceMaxIndex<T>(const T*, const T*, int64_t*, const ReduceDims&, void*,          \
                                               cudaStream_t);                                                   \
  template cudaError_t LaunchReduceMaxBackward<T>(const int64_t*, const T*, T*, int64_t, const ReduceDims&,       \
                                                  cudaStream_t);                                                \
  template cudaError_t LaunchSoftmax<T>(bool, const T*, T*, const SoftmaxDims&, cudaStream_t);                  \
  template cudaError_t LaunchSoftmaxBackward<T>(bool, const T*, const T*, T*, const SoftmaxDims&, cudaStream_t);

LOOM_INSTANTIATE_REDUCE_KERNELS(float)
LOOM_INSTANTIATE_REDUCE_KERNELS(double)

}  // namespace loom::cuda
