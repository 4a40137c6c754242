// What every CUDA kernel wrapper shares: the device and stream it queues on,
// the per-device cuBLAS handle with its check macro, dtype dispatch and the
// index structures of the broadcasting kernels built from loom shapes.
#pragma once

#include <cublas_v2.h>

#include <mutex>
#include <string>

#include "core/cuda/cuda_device.h"
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

// The cuBLAS handle of one device, bound to a stream for as long as the
// lease lives; the lease holds the handle's lock so that another thread
// cannot rebind it before this one has queued its calls.
class CublasLease {
 public:
  static StatusOr<CublasLease> Acquire(int device, cudaStream_t stream);
  cublasHandle_t handle() const { return handle_; }

 private:
  CublasLease(std::unique_lock<std::mutex> lock, cublasHandle_t handle) : lock_(std::move(lock)), handle_(handle) {}
  std::unique_lock<std::mutex> lock_;
  cublasHandle_t handle_;
};

// Calls fn(T{}) with T = float or double; fn returns a Status.
template <typename Fn>
Status DispatchCudaFloat(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(float{});
    case DType::kF64: return fn(double{});
    default: return Unimplemented("no CUDA kernel for ", op, " on ", DTypeName(dtype), " (f32 and f64 only)");
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
