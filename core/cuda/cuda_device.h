// The CUDA device seat: probing, one stream per device, the device allocator
// (cudaMalloc/cudaFree with byte accounting) and host<->device copies.
// Linking //core/cuda (alwayslink) registers the allocator factory and the
// copy function for DeviceType::kCuda; nothing touches CUDA before first use,
// so a binary without a GPU or driver starts and fails GetAllocator cleanly.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "core/allocator.h"
#include "core/status.h"

namespace loom::cuda {

// "cudaErrorInvalidValue (invalid argument) in `expr` at file:line".
std::string CudaErrorMessage(cudaError_t error, const char* expr, const char* file, int line);
// Logs a failed call with CudaErrorMessage; returns whether it succeeded.
bool CudaOkOrLog(cudaError_t error, const char* expr, const char* file, int line);

// Number of CUDA devices this process can use: 0 when there is no GPU, no
// driver or a driver too old for the runtime (the reason is in ProbeDevice).
int DeviceCount();
// OK when cuda:index exists and can run loom's kernels; otherwise why not.
Status ProbeDevice(int index);
// Makes cuda:index current for the calling thread.
Status SetDevice(int index);
// The stream that kernels and copies on cuda:index run on, created on first
// use and kept for the life of the process.
StatusOr<cudaStream_t> DeviceStream(int index);
// Waits for the work queued on cuda:index's stream.
Status SynchronizeDevice(int index);

// Copies bytes between any two of host and CUDA devices; returns when the
// destination can be read (host) or is ordered on the device's stream.
Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// cudaMalloc / cudaFree on one device, with the Allocator's byte accounting.
// Returns nullptr when the device is out of memory.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}
  Device device() const override { return Device::Cuda(index_); }
  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;

 private:
  int index_;
};

}  // namespace loom::cuda

// Returns an Internal status naming the CUDA error, the call and file:line.
#define LOOM_CUDA_RETURN_IF_ERROR(expr)                                                               \
  do {                                                                                                \
    cudaError_t loom_cuda_error_ = (expr);                                                            \
    if (loom_cuda_error_ != cudaSuccess)                                                              \
      return ::loom::Internal(::loom::cuda::CudaErrorMessage(loom_cuda_error_, #expr, __FILE__, __LINE__)); \
  } while (0)

// For calls whose failure is a bug in loom (no Status to return): aborts.
#define LOOM_CUDA_CHECK(expr)                                                                           \
  do {                                                                                                  \
    cudaError_t loom_cuda_error_ = (expr);                                                              \
    if (loom_cuda_error_ != cudaSuccess)                                                                \
      ::loom::CheckFailed(__FILE__, __LINE__, #expr, ::loom::cuda::CudaErrorMessage(loom_cuda_error_, #expr, __FILE__, __LINE__)); \
  } while (0)

// For calls in functions that cannot return a Status (Deallocate): logs.
#define LOOM_CUDA_OK(expr) ::loom::cuda::CudaOkOrLog((expr), #expr, __FILE__, __LINE__)
