// The CUDA device seat: probing, one stream per device, the device allocator
// (cudaMalloc/cudaFree with byte accounting) and host<->device copies.
// Linking //core/cuda (alwayslink) registers the allocator factory and the
// copy function for DeviceType::kCuda; nothing touches CUDA before first use,
// so a binary without a GPU or driver starts and fails GetAllocator cleanly.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
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
// The calling thread's stream on cuda:index: the stream a work queue bound
// the thread to (core/work_queue.h, BindThread), else DeviceStream(index).
StatusOr<cudaStream_t> CurrentStream(int index);
// From now on CurrentStream(index) is `stream` on the calling thread;
// index -1 unbinds the thread.
void BindThreadStream(int index, cudaStream_t stream);
// A stream of cuda:index besides DeviceStream (blocking, like it), from a
// pool: streams given back are handed out again, so their library handles
// (cuBLAS, cuDNN: one per stream) are made once. Give it back idle.
StatusOr<cudaStream_t> TakePooledStream(int index);
void GiveBackPooledStream(int index, cudaStream_t stream);
// Waits for the work queued on cuda:index's stream.
Status SynchronizeDevice(int index);

// Copies bytes between any two of host and CUDA devices; returns when the
// destination can be read (host) or is ordered on the device's stream.
Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// The device allocator of one GPU: a caching allocator over cudaMalloc.
// Freed blocks go back to a free list by rounded size (512-byte steps below
// 1 MiB, 1 MiB steps above) and are handed out again without a cudaMalloc,
// so temporaries (kernel workspaces, per-step buffers) cost nothing after
// the first step. A block freed on the host while a kernel that uses it is
// still queued must only go to work queued after that kernel: each stream
// has its own free list, a block joins the list of the freeing thread's
// stream (CurrentStream) and is handed out to that stream's work only, in
// its order. After the whole device is idle (AllIdle) every cached block
// may go to any stream.
// When cudaMalloc fails the device is synchronized, the cache released and
// the call retried; it returns nullptr only when the device is really out
// of memory.
// stats() counts the bytes asked for (what the memory plan predicts);
// reserved_bytes() is what the device gave, cached blocks included. LOOM_CUDA_CACHING=0 turns the cache off (every free is a
// cudaFree), for compute-sanitizer runs.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index);
  ~CudaAllocator() override;
  Device device() const override { return Device::Cuda(index_); }
  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;

  // Bytes obtained from cudaMalloc and not yet returned: in use plus cached.
  size_t reserved_bytes() const;
  // Returns every cached block to the device.
  void ReleaseCached();
  // Waits for every stream of the device; then any stream may reuse any
  // cached block.
  Status AllIdle();
  // The size a request of `bytes` is rounded up to.
  static size_t RoundedSize(size_t bytes);

 private:
  void* DeviceMalloc(size_t bytes);
  void ReleaseCachedLocked();

  int index_;
  bool caching_;
  mutable std::mutex mu_;
  // By the stream that freed them (nullptr: blocks any stream may take):
  // rounded size -> cached block.
  std::map<cudaStream_t, std::multimap<size_t, void*>> free_;
  size_t reserved_ = 0;
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
