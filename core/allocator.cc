#include "core/allocator.h"

#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace loom {

namespace {

constexpr size_t kCpuAlign = 64;
// Blocks of at least this many bytes start on a 2 MiB boundary and ask the
// kernel for transparent huge pages (where THP is "madvise", as on Debian):
// a step streams through activations of tens of MB, and with 4 KiB pages
// every 4 KiB of them is another TLB miss.
constexpr size_t kHugePage = size_t{2} << 20;
size_t CpuBlockBytes(size_t bytes) { return bytes == 0 ? kCpuAlign : (bytes + kCpuAlign - 1) / kCpuAlign * kCpuAlign; }

// A block of `block` bytes (CpuBlockBytes), or null.
void* AllocateCpuBlock(size_t block) {
  if (block < kHugePage) return std::aligned_alloc(kCpuAlign, block);
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, block) != 0) return nullptr;
  madvise(p, block, MADV_HUGEPAGE);  // advice: without THP the pages stay small, the block as good
  return p;
}

}  // namespace

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
  void* p = AllocateCpuBlock(CpuBlockBytes(bytes));
  if (p) RecordAllocate(bytes);
  return p;
}

void CpuAllocator::Deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  std::free(ptr);
  RecordDeallocate(bytes);
}

struct CachingCpuAllocator::Cache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free;  // by block size
  int64_t cached = 0;
};

CachingCpuAllocator::CachingCpuAllocator() : cache_(std::make_unique<Cache>()) {}

CachingCpuAllocator::~CachingCpuAllocator() { ReleaseCached(); }

void* CachingCpuAllocator::Allocate(size_t bytes) {
  const size_t block = CpuBlockBytes(bytes);
  Cache& c = *cache_;
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free.find(block);
    if (it != c.free.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      c.cached -= static_cast<int64_t>(block);
    }
  }
  if (p == nullptr) {
    p = AllocateCpuBlock(block);
    if (p == nullptr) {  // out of memory: give the cache back and try once more
      ReleaseCached();
      p = AllocateCpuBlock(block);
    }
  }
  if (p) RecordAllocate(bytes);
  return p;
}

void CachingCpuAllocator::Deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  const size_t block = CpuBlockBytes(bytes);
  Cache& c = *cache_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.free[block].push_back(ptr);
    c.cached += static_cast<int64_t>(block);
  }
  RecordDeallocate(bytes);
}

void CachingCpuAllocator::ReleaseCached() {
  Cache& c = *cache_;
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [block, blocks] : c.free)
    for (void* p : blocks) std::free(p);
  c.free.clear();
  c.cached = 0;
}

int64_t CachingCpuAllocator::cached_bytes() const {
  Cache& c = *cache_;
  std::lock_guard<std::mutex> lock(c.mu);
  return c.cached;
}

CachingCpuAllocator& CpuDeviceAllocator(int index) {
  static std::mutex mu;
  static auto* allocators = new std::map<int, std::unique_ptr<CachingCpuAllocator>>;  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<CachingCpuAllocator>& a = (*allocators)[index];
  if (!a) a = std::make_unique<CachingCpuAllocator>();
  return *a;
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
