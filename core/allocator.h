// Allocators account every byte they hand out: current and peak, per device.
// Backends register an allocator for their device type (CUDA does so from
// its own library, so core never links CUDA).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

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

// The allocator of a device; fails if no backend registered one.
StatusOr<Allocator*> GetAllocator(Device device);
// Called once by a backend at start-up (e.g. the CUDA library).
void RegisterAllocatorFactory(DeviceType type, std::function<Allocator*(int index)> factory);

}  // namespace loom
