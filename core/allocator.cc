#include "core/allocator.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

namespace loom {

MemoryStats Allocator::stats() const { return {current_.load(), peak_.load(), count_.load()}; }

void Allocator::ResetPeak() { peak_.store(current_.load()); }

void Allocator::RecordAllocate(size_t bytes) {
  int64_t now = current_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  count_.fetch_add(1);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void Allocator::RecordDeallocate(size_t bytes) { current_.fetch_sub(static_cast<int64_t>(bytes)); }

void* CpuAllocator::Allocate(size_t bytes) {
  constexpr size_t kAlign = 64;
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p) RecordAllocate(bytes);
  return p;
}

void CpuAllocator::Deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  std::free(ptr);
  RecordDeallocate(bytes);
}

namespace {
struct Registry {
  std::mutex mu;
  std::map<DeviceType, std::function<Allocator*(int)>> factories;
  std::map<std::pair<int, int>, std::unique_ptr<Allocator>> allocators;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}
}  // namespace

void RegisterAllocatorFactory(DeviceType type, std::function<Allocator*(int index)> factory) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().factories[type] = std::move(factory);
}

StatusOr<Allocator*> GetAllocator(Device device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto key = std::make_pair(static_cast<int>(device.type), device.index);
  if (auto it = r.allocators.find(key); it != r.allocators.end()) return it->second.get();
  Allocator* made = nullptr;
  if (device.is_cpu()) {
    if (device.index != 0) return NotFound("there is one CPU device (cpu:0), not ", device.ToString());
    made = new CpuAllocator;
  } else {
    auto f = r.factories.find(device.type);
    if (f == r.factories.end())
      return FailedPrecondition("no backend for ", device.ToString(), " in this build (build with --config=cuda)");
    made = f->second(device.index);
    if (!made) return NotFound("device ", device.ToString(), " is not present");
  }
  r.allocators[key].reset(made);
  return made;
}

}  // namespace loom
