// Element-wise, broadcasting and reducing kernels for the CUDA backend.
// Every kernel is a grid-stride loop over 64-bit indices, so any launch size
// covers any tensor; the launchers pick the grid and return the launch error.
// bf16 / f16 elements (core/half.h) are widened to f32 for the arithmetic and
// rounded once on the store; for f32 / f64 Widen and Narrow are the identity.
#include "ops/cuda/elementwise_kernels.h"

#include <algorithm>

#include "core/half.h"
#include "ops/cuda/device_util.cuh"

namespace loom::cuda {
namespace {

// The arithmetic type of T: float for bf16 / f16, T itself otherwise.
template <typename T>
using Acc = decltype(WidenFloat(T{}));

template <typename T>
__device__ inline T Narrow(Acc<T> x) {
  return NarrowFloat<T>::From(x);
}

template <BinaryKind kKind, typename T>
__device__ inline T ApplyBinary(T a, T b) {
  if constexpr (kKind == BinaryKind::kAdd) return a + b;
  if constexpr (kKind == BinaryKind::kSub) return a - b;
  if constexpr (kKind == BinaryKind::kMul) return a * b;
  if constexpr (kKind == BinaryKind::kDiv) return a / b;
}

template <UnaryKind kKind, typename T>
__device__ inline T ApplyUnary(T x, T value) {
  if constexpr (kKind == UnaryKind::kNeg) return -x;
  if constexpr (kKind == UnaryKind::kAddScalar) return x + value;
  if constexpr (kKind == UnaryKind::kMulScalar) return x * value;
  if constexpr (kKind == UnaryKind::kPowScalar) return Pow(x, value);
}

// Offset of output element i into operand k of a broadcast.
__device__ inline int64_t BroadcastOffset(const BroadcastIndex& index, int k, int64_t i) {
  int64_t offset = 0;
  for (int d = index.rank - 1; d >= 0; --d) {
    const int64_t extent = index.dims[d];
    offset += (i % extent) * index.strides[k][d];
    i /= extent;
  }
  return offset;
}

// Input offset of flat position i over `rank` dims with the given extents and strides.
__device__ inline int64_t StridedOffset(const int64_t* dims, const int64_t* strides, int rank, int64_t i) {
  int64_t offset = 0;
  for (int d = rank - 1; d >= 0; --d) {
    offset += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return offset;
}

template <BinaryKind kKind, typename T>
__global__ void BinaryKernel(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride())
    y[i] = Narrow<T>(ApplyBinary<kKind>(WidenFloat(a[i]), WidenFloat(b[i])));
}

template <BinaryKind kKind, typename T>
__global__ void BinaryBroadcastKernel(const T* a, const T* b, T* y, BroadcastIndex index, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride())
    y[i] = Narrow<T>(
        ApplyBinary<kKind>(WidenFloat(a[BroadcastOffset(index, 0, i)]), WidenFloat(b[BroadcastOffset(index, 1, i)])));
}

template <UnaryKind kKind, typename T>
__global__ void UnaryKernel(const T* x, T* y, int64_t n, T value) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) y[i] = ApplyUnary<kKind>(x[i], value);
}

template <typename T>
__global__ void FillKernel(T* y, int64_t n, T value) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) y[i] = value;
}

template <typename T>
__global__ void BiasAddKernel(T* y, const T* bias, int64_t n, int64_t cols) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride())
    y[i] = Narrow<T>(WidenFloat(y[i]) + WidenFloat(bias[i % cols]));
}

template <typename T>
__global__ void BroadcastToKernel(const T* x, T* y, BroadcastIndex index, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) y[i] = x[BroadcastOffset(index, 0, i)];
}

// SumToShape, one thread per output: for many outputs (adjacent threads read
// adjacent kept elements). The innermost reduced dim is walked in a plain
// loop, the outer reduced dims by index arithmetic.
template <typename T>
__global__ void SumToPerThreadKernel(const T* x, T* y, int64_t out_n, ReduceIndex index, int64_t outer_n) {
  const int last = index.reduced_rank - 1;
  const int64_t inner_n = index.reduced_dims[last], inner_stride = index.reduced_strides[last];
  for (int64_t o = FirstIndex(); o < out_n; o += GridStride()) {
    const int64_t base = StridedOffset(index.kept_dims, index.kept_strides, index.kept_rank, o);
    Acc<T> acc = 0;
    for (int64_t q = 0; q < outer_n; ++q) {
      const T* p = x + base + StridedOffset(index.reduced_dims, index.reduced_strides, last, q);
      for (int64_t t = 0; t < inner_n; ++t) acc += WidenFloat(p[t * inner_stride]);
    }
    y[o] = Narrow<T>(acc);
  }
}

// SumToShape, one block per output: for few outputs with long reductions
// (a bias gradient summed over the batch); a shared-memory tree sums the
// threads' partial sums in a fixed order.
template <typename T>
__global__ void SumToPerBlockKernel(const T* x, T* y, int64_t out_n, ReduceIndex index, int64_t reduced_n) {
  __shared__ Acc<T> partial[kThreads];
  for (int64_t o = blockIdx.x; o < out_n; o += gridDim.x) {
    const int64_t base = StridedOffset(index.kept_dims, index.kept_strides, index.kept_rank, o);
    Acc<T> acc = 0;
    for (int64_t j = threadIdx.x; j < reduced_n; j += blockDim.x)
      acc += WidenFloat(x[base + StridedOffset(index.reduced_dims, index.reduced_strides, index.reduced_rank, j)]);
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
      if (static_cast<int>(threadIdx.x) < s) partial[threadIdx.x] += partial[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) y[o] = Narrow<T>(partial[0]);
    __syncthreads();  // partial is reused for the next output
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchBinary(BinaryKind kind, const T* a, const T* b, T* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (kind) {
    case BinaryKind::kAdd: BinaryKernel<BinaryKind::kAdd><<<Blocks(n), kThreads, 0, stream>>>(a, b, y, n); break;
    case BinaryKind::kSub: BinaryKernel<BinaryKind::kSub><<<Blocks(n), kThreads, 0, stream>>>(a, b, y, n); break;
    case BinaryKind::kMul: BinaryKernel<BinaryKind::kMul><<<Blocks(n), kThreads, 0, stream>>>(a, b, y, n); break;
    case BinaryKind::kDiv: BinaryKernel<BinaryKind::kDiv><<<Blocks(n), kThreads, 0, stream>>>(a, b, y, n); break;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchBinaryBroadcast(BinaryKind kind, const T* a, const T* b, T* y, const BroadcastIndex& index,
                                  cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < index.rank; ++d) n *= index.dims[d];
  if (n == 0) return cudaSuccess;
  switch (kind) {
    case BinaryKind::kAdd:
      BinaryBroadcastKernel<BinaryKind::kAdd><<<Blocks(n), kThreads, 0, stream>>>(a, b, y, index, n);
      break;
    case BinaryKind::kSub:
      BinaryBroadcastKernel<BinaryKind::kSub><<<Blocks(n), kThreads, 0, stream>>>(a, b, y, index, n);
      break;
    case BinaryKind::kMul:
      BinaryBroadcastKernel<BinaryKind::kMul><<<Blocks(n), kThreads, 0, stream>>>(a, b, y, index, n);
      break;
    case BinaryKind::kDiv:
      BinaryBroadcastKernel<BinaryKind::kDiv><<<Blocks(n), kThreads, 0, stream>>>(a, b, y, index, n);
      break;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchUnary(UnaryKind kind, const T* x, T* y, int64_t n, T value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (kind) {
    case UnaryKind::kNeg: UnaryKernel<UnaryKind::kNeg><<<Blocks(n), kThreads, 0, stream>>>(x, y, n, value); break;
    case UnaryKind::kAddScalar:
      UnaryKernel<UnaryKind::kAddScalar><<<Blocks(n), kThreads, 0, stream>>>(x, y, n, value);
      break;
    case UnaryKind::kMulScalar:
      UnaryKernel<UnaryKind::kMulScalar><<<Blocks(n), kThreads, 0, stream>>>(x, y, n, value);
      break;
    case UnaryKind::kPowScalar:
      UnaryKernel<UnaryKind::kPowScalar><<<Blocks(n), kThreads, 0, stream>>>(x, y, n, value);
      break;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchFill(T* y, int64_t n, T value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<Blocks(n), kThreads, 0, stream>>>(y, n, value);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchBiasAdd(T* y, const T* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  BiasAddKernel<<<Blocks(n), kThreads, 0, stream>>>(y, bias, n, cols);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchBroadcastTo(const T* x, T* y, const BroadcastIndex& index, cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < index.rank; ++d) n *= index.dims[d];
  if (n == 0) return cudaSuccess;
  BroadcastToKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, index, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchSumTo(const T* x, T* y, int64_t out_n, const ReduceIndex& index, cudaStream_t stream) {
  if (out_n == 0) return cudaSuccess;
  ReduceIndex r = index;
  if (r.reduced_rank == 0) {  // nothing summed: one term per output
    r.reduced_rank = 1;
    r.reduced_dims[0] = 1;
    r.reduced_strides[0] = 0;
  }
  int64_t reduced_n = 1;
  for (int d = 0; d < r.reduced_rank; ++d) reduced_n *= r.reduced_dims[d];
  if (reduced_n == 0) return LaunchFill(y, out_n, T{}, stream);  // sums over nothing: +0 (all bits clear)
  // Enough outputs to fill the GPU with one thread each, or reductions too
  // short to share out: a thread per output. Otherwise a block per output.
  constexpr int64_t kManyOutputs = 16384, kShortReduction = 64;
  if (out_n >= kManyOutputs || reduced_n <= kShortReduction) {
    const int64_t outer_n = reduced_n / r.reduced_dims[r.reduced_rank - 1];
    SumToPerThreadKernel<<<Blocks(out_n), kThreads, 0, stream>>>(x, y, out_n, r, outer_n);
  } else {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(out_n, kMaxBlocks));
    SumToPerBlockKernel<<<blocks, kThreads, 0, stream>>>(x, y, out_n, r, reduced_n);
  }
  return cudaGetLastError();
}

#define LOOM_INSTANTIATE_FLOAT_KERNELS(T)                                                                         \
  template cudaError_t LaunchBinary<T>(BinaryKind, const T*, const T*, T*, int64_t, cudaStream_t);               \
  template cudaError_t LaunchBinaryBroadcast<T>(BinaryKind, const T*, const T*, T*, const BroadcastIndex&,        \
                                                cudaStream_t);                                                    \
  template cudaError_t LaunchUnary<T>(UnaryKind, const T*, T*, int64_t, T, cudaStream_t);                         \
  template cudaError_t LaunchBiasAdd<T>(T*, const T*, int64_t, int64_t, cudaStream_t);                            \
  template cudaError_t LaunchBroadcastTo<T>(const T*, T*, const BroadcastIndex&, cudaStream_t);                   \
  template cudaError_t LaunchSumTo<T>(const T*, T*, int64_t, const ReduceIndex&, cudaStream_t);

LOOM_INSTANTIATE_FLOAT_KERNELS(float)
LOOM_INSTANTIATE_FLOAT_KERNELS(double)

template cudaError_t LaunchFill<float>(float*, int64_t, float, cudaStream_t);
template cudaError_t LaunchFill<double>(double*, int64_t, double, cudaStream_t);
template cudaError_t LaunchFill<int32_t>(int32_t*, int64_t, int32_t, cudaStream_t);
template cudaError_t LaunchFill<int64_t>(int64_t*, int64_t, int64_t, cudaStream_t);
template cudaError_t LaunchFill<bool>(bool*, int64_t, bool, cudaStream_t);

// bf16 / f16: what the half GEMMs' kernels and their gradients need (Linear's
// bias, SumToShape, the Add that accumulates gradients).
#define LOOM_INSTANTIATE_HALF_KERNELS(T)                                                                          \
  template cudaError_t LaunchBinary<T>(BinaryKind, const T*, const T*, T*, int64_t, cudaStream_t);               \
  template cudaError_t LaunchBinaryBroadcast<T>(BinaryKind, const T*, const T*, T*, const BroadcastIndex&,        \
                                                cudaStream_t);                                                    \
  template cudaError_t LaunchBiasAdd<T>(T*, const T*, int64_t, int64_t, cudaStream_t);                            \
  template cudaError_t LaunchBroadcastTo<T>(const T*, T*, const BroadcastIndex&, cudaStream_t);                   \
  template cudaError_t LaunchSumTo<T>(const T*, T*, int64_t, const ReduceIndex&, cudaStream_t);                   \
  template cudaError_t LaunchFill<T>(T*, int64_t, T, cudaStream_t);

LOOM_INSTANTIATE_HALF_KERNELS(BFloat16)
LOOM_INSTANTIATE_HALF_KERNELS(Float16)

}  // namespace loom::cuda
