#include "core/work_queue.h"

#include <cstring>
#include <map>
#include <mutex>

namespace loom {
namespace {

// The CPU runs work when it is queued: copies are memcpys, markers are
// passed as soon as they are recorded.
class CpuWorkQueue final : public WorkQueue {
 public:
  Device device() const override { return Device::Cpu(); }
  void* stream() const override { return nullptr; }
  Status BindThread() override { return Status::Ok(); }
  void UnbindThread() override {}
  Status Copy2D(void* dst, Device dst_device, size_t dst_pitch, const void* src, Device src_device, size_t src_pitch,
                size_t row_bytes, size_t height) override {
    if (!dst_device.is_cpu() || !src_device.is_cpu())
      return InvalidArgument("the CPU's queue copies between host tensors, not ", src_device.ToString(), " to ",
                             dst_device.ToString());
    CopyRows(dst, dst_pitch, src, src_pitch, row_bytes, height);
    return Status::Ok();
  }
  Status Zero(void* dst, size_t bytes) override {
    std::memset(dst, 0, bytes);
    return Status::Ok();
  }
  Status Mark(int) override { return Status::Ok(); }
  Status WaitFor(const WorkQueue&, int) override { return Status::Ok(); }
  Status Synchronize() override { return Status::Ok(); }
  bool done_when_queued() const override { return true; }
  Status AllIdle() override { return Status::Ok(); }
};

std::mutex& factories_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<DeviceType, WorkQueueFactory>& factories() {
  static auto* f = new std::map<DeviceType, WorkQueueFactory>;
  return *f;
}

}  // namespace

void RegisterWorkQueueFactory(DeviceType type, WorkQueueFactory factory) {
  std::lock_guard<std::mutex> lock(factories_mu());
  factories()[type] = std::move(factory);
}

StatusOr<std::unique_ptr<WorkQueue>> CreateWorkQueue(Device device, int markers) {
  if (markers < 0) return InvalidArgument("a work queue needs markers >= 0, got ", markers);
  if (device.is_cpu()) return std::unique_ptr<WorkQueue>(new CpuWorkQueue());
  WorkQueueFactory factory;
  {
    std::lock_guard<std::mutex> lock(factories_mu());
    auto it = factories().find(device.type);
    if (it == factories().end()) return FailedPrecondition("no backend for ", device.ToString(), " in this build");
    factory = it->second;
  }
  return factory(device.index, markers);
}

Status CopyRegionOn(WorkQueue& queue, const Tensor& src, const Region& src_region, Tensor* dst,
                    const Region& dst_region, const Region& box) {
  LOOM_ASSIGN_OR_RETURN(RegionCopy copy, PlanRegionCopy(src, src_region, *dst, dst_region, box));
  return queue.Run([&queue, src, to = *dst, copy = std::move(copy)]() -> Status {
    const char* s = static_cast<const char*>(src.raw_data());
    char* d = static_cast<char*>(to.raw_data());
    for (size_t k = 0; k < copy.src_offsets.size(); ++k)
      LOOM_RETURN_IF_ERROR(queue.Copy2D(d + copy.dst_offsets[k], to.device(), copy.dst_pitch, s + copy.src_offsets[k],
                                        src.device(), copy.src_pitch, copy.row_bytes, copy.height));
    return Status::Ok();
  });
}

}  // namespace loom
