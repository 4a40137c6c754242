// Allocators account every byte they hand out: current and peak, per device.
// Backends register an allocator for their device type (CUDA does so from
// its own library, so core never links CUDA).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"

namespace loom {

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;  // number of Allocate calls so far
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns nullptr when the device is out of memory.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* ptr, size_t bytes) = 0;

  MemoryStats stats() const;
  void ResetPeak();

 protected:
  void RecordAllocate(size_t bytes);
  void RecordDeallocate(size_t bytes);

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, count_{0};
};

// 64-byte aligned host memory.
class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu(); }
  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;
};

// Host memory that keeps freed blocks for reuse, by size (rounded to 64
// bytes). A training step asks for the same sizes every step, and fresh
// pages cost a fault each: the task runtime's per-task tensors went from
// 1.12x to 1.71x one device under data parallelism on 2 cores once they
// came from here (docs/benchmarks.md). Thread-safe; blocks may be freed on
// any thread.
class CachingCpuAllocator final : public Allocator {
 public:
  CachingCpuAllocator();
  ~CachingCpuAllocator() override;
  Device device() const override { return Device::Cpu(); }
  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;
  // Frees the cached blocks (blocks in use return to the cache when freed).
  void ReleaseCached();
  int64_t cached_bytes() const;

 private:
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

// The allocator of CPU device `index` of the task runtimes of this process
// (`--devices cpu:N`): one caching allocator per device index, living as
// long as the process, so tensors a runtime hands out may outlive it.
CachingCpuAllocator& CpuDeviceAllocator(int index);

// The allocator of a device; fails if no backend registered one.
StatusOr<Allocator*> GetAllocator(Device device);
// Called once by a backend at start-up (e.g. the CUDA library).
void RegisterAllocatorFactory(DeviceType type, std::function<Allocator*(int index)> factory);

}  // namespace loom
