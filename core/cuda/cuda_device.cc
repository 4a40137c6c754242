#include "core/cuda/cuda_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/logging.h"
#include "core/tensor.h"

namespace loom::cuda {

std::string CudaErrorMessage(cudaError_t error, const char* expr, const char* file, int line) {
  return StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error), ") in `", expr, "` at ", file, ":", line);
}

bool CudaOkOrLog(cudaError_t error, const char* expr, const char* file, int line) {
  if (error == cudaSuccess) return true;
  LOOM_LOG_ERROR("CUDA: {}", CudaErrorMessage(error, expr, file, line));
  return false;
}

namespace {

// The oldest architecture the kernels are compiled for (ops/cuda/BUILD).
constexpr int kMinComputeCapability = 80;

// What the process found out about CUDA, once.
struct DeviceTable {
  int count = 0;
  Status unavailable;               // why count is 0; OK otherwise
  std::vector<Status> usable;       // per device: OK or why it cannot run our kernels
  std::mutex mu;
  std::vector<cudaStream_t> streams;  // per device, created on first use; never destroyed
  std::vector<std::vector<cudaStream_t>> pooled;  // per device: idle work queue streams; never destroyed
};

DeviceTable& Table() {
  static DeviceTable* table = [] {
    auto* t = new DeviceTable;
    int n = 0;
    cudaError_t error = cudaGetDeviceCount(&n);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
      t->unavailable = NotFound("no usable CUDA device: ", CudaErrorMessage(error, "cudaGetDeviceCount(&n)", __FILE__, __LINE__));
      LOOM_LOG_INFO("{}", t->unavailable.message());
      n = 0;
    } else if (n == 0) {
      t->unavailable = NotFound("no CUDA device (cudaGetDeviceCount found none)");
    }
    t->count = n;
    t->streams.assign(n, nullptr);
    t->pooled.assign(n, {});
    for (int i = 0; i < n; ++i) {
      cudaDeviceProp prop;
      error = cudaGetDeviceProperties(&prop, i);
      if (error != cudaSuccess) {
        t->usable.push_back(Internal(CudaErrorMessage(error, "cudaGetDeviceProperties(&prop, i)", __FILE__, __LINE__)));
        continue;
      }
      int cc = prop.major * 10 + prop.minor;
      if (cc < kMinComputeCapability) {
        t->usable.push_back(FailedPrecondition("cuda:", i, " (", prop.name, ") is sm_", cc, "; loom's CUDA kernels need sm_",
                                               kMinComputeCapability, " or newer"));
      } else {
        t->usable.push_back(Status::Ok());
        LOOM_LOG_INFO("cuda:{}: {} (sm_{}, {} MiB)", i, prop.name, cc, prop.totalGlobalMem >> 20);
      }
    }
    return t;
  }();
  return *table;
}

}  // namespace

int DeviceCount() { return Table().count; }

Status ProbeDevice(int index) {
  DeviceTable& t = Table();
  if (index < 0 || index >= t.count) {
    if (!t.unavailable.ok()) return NotFound("cuda:", index, " is not present: ", t.unavailable.message());
    return NotFound("cuda:", index, " is not present (this machine has ", t.count, " CUDA device(s))");
  }
  return t.usable[index];
}

Status SetDevice(int index) {
  LOOM_RETURN_IF_ERROR(ProbeDevice(index));
  LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
  return Status::Ok();
}

StatusOr<cudaStream_t> DeviceStream(int index) {
  LOOM_RETURN_IF_ERROR(ProbeDevice(index));
  DeviceTable& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.streams[index]) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
    cudaStream_t stream = nullptr;
    // A blocking stream: it stays ordered with the legacy default stream, so
    // code that uses stream 0 (libraries, cudaMemcpy) cannot race with it.
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
    t.streams[index] = stream;
  }
  return t.streams[index];
}

namespace {
// The stream a work queue bound this thread to, and its device (-1: none).
thread_local int bound_device = -1;
thread_local cudaStream_t bound_stream = nullptr;
}  // namespace

StatusOr<cudaStream_t> TakePooledStream(int index) {
  LOOM_RETURN_IF_ERROR(SetDevice(index));
  DeviceTable& t = Table();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    if (!t.pooled[index].empty()) {
      cudaStream_t s = t.pooled[index].back();
      t.pooled[index].pop_back();
      return s;
    }
  }
  cudaStream_t stream = nullptr;
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  return stream;
}

void GiveBackPooledStream(int index, cudaStream_t stream) {
  DeviceTable& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.pooled[index].push_back(stream);
}

void BindThreadStream(int index, cudaStream_t stream) {
  bound_device = index;
  bound_stream = index < 0 ? nullptr : stream;
}

StatusOr<cudaStream_t> CurrentStream(int index) {
  if (index == bound_device) return bound_stream;
  return DeviceStream(index);
}

Status SynchronizeDevice(int index) {
  LOOM_RETURN_IF_ERROR(SetDevice(index));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, CurrentStream(index));
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  for (const Device& d : {dst_device, src_device}) {
    if (d.is_cuda()) {
      LOOM_RETURN_IF_ERROR(ProbeDevice(d.index));
    } else if (!d.is_cpu()) {
      return InvalidArgument("CUDA copy: unsupported device ", d.ToString());
    }
  }
  if (bytes == 0) return Status::Ok();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  // The copy runs on the calling thread's stream of the CUDA device involved
  // (the destination when both are; a work queue's when the thread is bound
  // to one), so it is ordered after the kernels that wrote the source.
  const int index = dst_device.is_cuda() ? dst_device.index : src_device.index;
  LOOM_RETURN_IF_ERROR(SetDevice(index));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, CurrentStream(index));
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    LOOM_RETURN_IF_ERROR(SynchronizeDevice(src_device.index));  // the source's writers run on its own stream
    LOOM_RETURN_IF_ERROR(SetDevice(index));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, stream));
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return Status::Ok();
  }
  cudaMemcpyKind kind = dst_device.is_cpu()   ? cudaMemcpyDeviceToHost
                        : src_device.is_cpu() ? cudaMemcpyHostToDevice
                                              : cudaMemcpyDeviceToDevice;
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  // Host memory is pageable and the caller may read or free it on return;
  // a device-to-device copy stays ordered on the stream.
  if (kind != cudaMemcpyDeviceToDevice) LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return Status::Ok();
}

CudaAllocator::CudaAllocator(int index) : index_(index) {
  const char* env = std::getenv("LOOM_CUDA_CACHING");
  caching_ = !(env && std::string(env) == "0");
}

CudaAllocator::~CudaAllocator() { ReleaseCached(); }

size_t CudaAllocator::RoundedSize(size_t bytes) {
  constexpr size_t kSmallStep = 512, kLargeStep = size_t{1} << 20;
  // Empty tensors get a real (minimal) block: Buffer reads nullptr as out of memory.
  bytes = std::max<size_t>(bytes, 1);
  const size_t step = bytes < kLargeStep ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

void* CudaAllocator::DeviceMalloc(size_t bytes) {
  void* ptr = nullptr;
  cudaError_t error = cudaMalloc(&ptr, bytes);
  if (error == cudaSuccess) return ptr;
  (void)cudaGetLastError();  // an allocation failure is not sticky: clear it
  if (!free_.empty()) {
    ReleaseCachedLocked();  // synchronizes the device first
    error = cudaMalloc(&ptr, bytes);
    if (error == cudaSuccess) return ptr;
    (void)cudaGetLastError();
  }
  LOOM_LOG_WARN("CUDA allocator: {} ({} bytes; {} in use on cuda:{})",
                CudaErrorMessage(error, "cudaMalloc(&ptr, bytes)", __FILE__, __LINE__), bytes, stats().current_bytes,
                index_);
  return nullptr;
}

void* CudaAllocator::Allocate(size_t bytes) {
  Status s = SetDevice(index_);
  if (!s.ok()) {
    LOOM_LOG_ERROR("CUDA allocator: {}", s.ToString());
    return nullptr;
  }
  StatusOr<cudaStream_t> stream = CurrentStream(index_);
  if (!stream.ok()) {
    LOOM_LOG_ERROR("CUDA allocator: {}", stream.status().ToString());
    return nullptr;
  }
  const size_t rounded = RoundedSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = nullptr;
  // The stream's own blocks first, then those any stream may take.
  for (cudaStream_t owner : {*stream, static_cast<cudaStream_t>(nullptr)}) {
    auto list = free_.find(owner);
    if (list == free_.end()) continue;
    auto it = list->second.find(rounded);
    if (it == list->second.end()) continue;
    ptr = it->second;
    list->second.erase(it);
    break;
  }
  if (!ptr) {
    ptr = DeviceMalloc(rounded);
    if (!ptr) return nullptr;
    reserved_ += rounded;
  }
  RecordAllocate(bytes);
  return ptr;
}

void CudaAllocator::Deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  const size_t rounded = RoundedSize(bytes);
  StatusOr<cudaStream_t> stream = caching_ ? CurrentStream(index_) : StatusOr<cudaStream_t>(nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  RecordDeallocate(bytes);
  if (caching_ && stream.ok()) {
    free_[*stream].emplace(rounded, ptr);
    return;
  }
  reserved_ -= rounded;
  if (SetDevice(index_).ok()) {
    cudaError_t error = cudaFree(ptr);
    // At process exit the runtime may already be gone, and the memory with it.
    if (error != cudaErrorCudartUnloading) CudaOkOrLog(error, "cudaFree(ptr)", __FILE__, __LINE__);
  }
}

size_t CudaAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

void CudaAllocator::ReleaseCached() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCachedLocked();
}

void CudaAllocator::ReleaseCachedLocked() {
  if (free_.empty()) return;
  if (SetDevice(index_).ok()) {
    // Kernels queued before the frees may still use the blocks.
    CudaOkOrLog(cudaDeviceSynchronize(), "cudaDeviceSynchronize()", __FILE__, __LINE__);
    for (const auto& [stream, blocks] : free_)
      for (const auto& [size, ptr] : blocks) {
        cudaError_t error = cudaFree(ptr);
        if (error != cudaErrorCudartUnloading) CudaOkOrLog(error, "cudaFree(ptr)", __FILE__, __LINE__);
        reserved_ -= size;
      }
  }
  free_.clear();
}

Status CudaAllocator::AllIdle() {
  LOOM_RETURN_IF_ERROR(SetDevice(index_));
  // The blocks freed so far: the work that used them was queued before, so
  // the device is done with them once synchronized. Blocks that other
  // threads free meanwhile (their streams' work may still be queued: ranks
  // played by threads share this allocator) stay on their streams' lists.
  std::map<cudaStream_t, std::multimap<size_t, void*>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [stream, blocks] : free_)
      if (stream != nullptr) idle[stream].swap(blocks);
  }
  const cudaError_t synced = cudaDeviceSynchronize();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [stream, blocks] : idle)  // back where they were when the device is not known idle
    free_[synced == cudaSuccess ? nullptr : stream].insert(blocks.begin(), blocks.end());
  LOOM_CUDA_RETURN_IF_ERROR(synced);
  return Status::Ok();
}

namespace {

// Static-time registration: cheap, touches no CUDA API (probing is lazy).
struct Registrar {
  Registrar() {
    RegisterAllocatorFactory(DeviceType::kCuda, [](int index) -> Allocator* {
      Status s = ProbeDevice(index);
      if (!s.ok()) {
        LOOM_LOG_INFO("{}", s.message());
        return nullptr;  // GetAllocator reports "device cuda:<index> is not present"
      }
      return new CudaAllocator(index);
    });
    RegisterDeviceCopy(DeviceType::kCuda, CopyBytes);
    RegisterDeviceSync(DeviceType::kCuda, SynchronizeDevice);
  }
};
Registrar registrar;

}  // namespace
}  // namespace loom::cuda
