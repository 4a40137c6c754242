// What every CUDA kernel wrapper shares: the device and stream it queues on,
// the per-device cuBLAS and cuDNN handles with their check macros, dtype
// dispatch and the index structures of the broadcasting kernels built from
// loom shapes.
#pragma once

#include <cublas_v2.h>
#include <cudnn.h>

#include <mutex>
#include <string>

#include "core/cuda/cuda_device.h"
#include "core/half.h"
#include "ops/cuda/elementwise_kernels.h"
#include "ops/op.h"

namespace loom::cuda {

// Makes the kernel's device current and returns the stream to queue work
// on: ctx.stream when the executor set one, else the device's own stream.
// Fails (instead of faulting on the GPU) if a tensor is not on that device.
StatusOr<cudaStream_t> KernelStream(const KernelContext& ctx);

// "CUBLAS_STATUS_INVALID_VALUE (an invalid value was used as an argument) in
// `expr` at file:line".
std::string CublasErrorMessage(cublasStatus_t status, const char* expr, const char* file, int line);

// A library handle of one device (cuBLAS, cuDNN), bound to a stream for as
// long as the lease lives; the lease holds the handle's lock so that another
// thread cannot rebind it before this one has queued its calls. Handles are
// created on first use and kept for the life of the process.
template <typename Handle>
class HandleLease {
 public:
  HandleLease(std::unique_lock<std::mutex> lock, Handle handle) : lock_(std::move(lock)), handle_(handle) {}
  Handle handle() const { return handle_; }

 private:
  std::unique_lock<std::mutex> lock_;
  Handle handle_;
};
using CublasLease = HandleLease<cublasHandle_t>;
using CudnnLease = HandleLease<cudnnHandle_t>;

// cuBLAS in full FP32 math (no TF32), so results match the CPU.
StatusOr<CublasLease> AcquireCublas(int device, cudaStream_t stream);
StatusOr<CudnnLease> AcquireCudnn(int device, cudaStream_t stream);

// "CUDNN_STATUS_BAD_PARAM (...) in `expr` at file:line".
std::string CudnnErrorMessage(cudnnStatus_t status, const char* expr, const char* file, int line);

// Output 0 = input 0, byte for byte (Identity, Reshape, Flatten, an
// unchanged Transpose): a device-to-device copy, or nothing when the memory
// plan placed the output on the input.
Status CopyKernel(KernelContext& ctx);

// Calls fn(T{}) with T = float or double; fn returns a Status.
template <typename Fn>
Status DispatchCudaFloat(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(float{});
    case DType::kF64: return fn(double{});
    default: return Unimplemented("no CUDA kernel for ", op, " on ", DTypeName(dtype), " (f32 and f64 only)");
  }
}

// Calls fn(T{}) with T = float, double, BFloat16 or Float16 (kernels that
// compute half types in f32); fn returns a Status.
template <typename Fn>
Status DispatchCudaFloatOrHalf(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(float{});
    case DType::kF64: return fn(double{});
    case DType::kBF16: return fn(BFloat16{});
    case DType::kF16: return fn(Float16{});
    default: return Unimplemented("no CUDA kernel for ", op, " on ", DTypeName(dtype));
  }
}

// The index of y = f(operands...) with numpy broadcasting (operands right-
// aligned to `out`), with size-1 dims dropped and adjacent dims merged where
// every operand walks them contiguously. Fails past kMaxKernelRank dims.
StatusOr<BroadcastIndex> MakeBroadcastIndex(const Shape& out, const std::vector<Shape>& operands);

// The index of SumToShape from `in` down to `target` (which broadcasts to in).
StatusOr<ReduceIndex> MakeReduceIndex(const Shape& in, const Shape& target);

}  // namespace loom::cuda

#define LOOM_CUBLAS_RETURN_IF_ERROR(expr)                                                                   \
  do {                                                                                                      \
    cublasStatus_t loom_cublas_status_ = (expr);                                                            \
    if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      return ::loom::Internal(::loom::cuda::CublasErrorMessage(loom_cublas_status_, #expr, __FILE__, __LINE__)); \
  } while (0)

#define LOOM_CUDNN_RETURN_IF_ERROR(expr)                                                                  \
  do {                                                                                                    \
    cudnnStatus_t loom_cudnn_status_ = (expr);                                                            \
    if (loom_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                                       \
      return ::loom::Internal(::loom::cuda::CudnnErrorMessage(loom_cudnn_status_, #expr, __FILE__, __LINE__)); \
  } while (0)
