// WorkQueue (core/work_queue.h) on a GPU: a CUDA stream of its own and one
// event per marker. Registered for DeviceType::kCuda when //core/cuda is
// linked.
#include <vector>

#include "core/cuda/cuda_device.h"
#include "core/logging.h"
#include "core/work_queue.h"

namespace loom::cuda {

namespace {

class CudaWorkQueue final : public WorkQueue {
 public:
  static StatusOr<std::unique_ptr<WorkQueue>> Create(int index, int markers) {
    LOOM_RETURN_IF_ERROR(SetDevice(index));
    std::unique_ptr<CudaWorkQueue> q(new CudaWorkQueue(index));
    // Blocking like DeviceStream: ordered with the legacy default stream
    // that libraries and cudaMemcpy may use, never with the other queues.
    LOOM_ASSIGN_OR_RETURN(q->stream_, TakePooledStream(index));
    q->events_.assign(static_cast<size_t>(markers), nullptr);
    for (cudaEvent_t& e : q->events_) LOOM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return std::unique_ptr<WorkQueue>(std::move(q));
  }

  ~CudaWorkQueue() override {
    if (!SetDevice(index_).ok()) return;
    if (stream_ && LOOM_CUDA_OK(cudaStreamSynchronize(stream_))) GiveBackPooledStream(index_, stream_);
    for (cudaEvent_t e : events_)
      if (e) LOOM_CUDA_OK(cudaEventDestroy(e));
  }

  Device device() const override { return Device::Cuda(index_); }
  void* stream() const override { return stream_; }

  Status BindThread() override {
    LOOM_RETURN_IF_ERROR(SetDevice(index_));
    BindThreadStream(index_, stream_);
    return Status::Ok();
  }
  void UnbindThread() override { BindThreadStream(-1, nullptr); }

  Status Copy2D(void* dst, Device dst_device, size_t dst_pitch, const void* src, Device src_device, size_t src_pitch,
                size_t row_bytes, size_t height) override {
    for (const Device& d : {dst_device, src_device})
      if (d.is_cuda()) LOOM_RETURN_IF_ERROR(ProbeDevice(d.index));
    if (row_bytes == 0 || height == 0) return Status::Ok();
    LOOM_RETURN_IF_ERROR(SetDevice(index_));
    if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
      // Between two GPUs: peer to peer where they can, else through the host.
      cudaMemcpy3DPeerParms p = {};
      p.srcPtr = cudaPitchedPtr{const_cast<void*>(src), src_pitch, row_bytes, height};
      p.srcDevice = src_device.index;
      p.dstPtr = cudaPitchedPtr{dst, dst_pitch, row_bytes, height};
      p.dstDevice = dst_device.index;
      p.extent = cudaExtent{row_bytes, height, 1};
      LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpy3DPeerAsync(&p, stream_));
      return Status::Ok();
    }
    // cudaMemcpyDefault: unified addressing tells host from device. One
    // contiguous block as a plain copy: a 2-D copy's pitch may not pass
    // cudaDevAttrMaxPitch (about 2 GiB).
    if (height == 1 || (src_pitch == row_bytes && dst_pitch == row_bytes)) {
      LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, row_bytes * height, cudaMemcpyDefault, stream_));
    } else {
      LOOM_CUDA_RETURN_IF_ERROR(
          cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, height, cudaMemcpyDefault, stream_));
    }
    // Pageable host memory may be read or freed once this returns.
    if (dst_device.is_cpu() || src_device.is_cpu()) LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

  Status Zero(void* dst, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    LOOM_RETURN_IF_ERROR(SetDevice(index_));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, bytes, stream_));
    return Status::Ok();
  }

  Status Mark(int id) override {
    LOOM_RETURN_IF_ERROR(CheckMarker(id));
    LOOM_RETURN_IF_ERROR(SetDevice(index_));
    LOOM_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[static_cast<size_t>(id)], stream_));
    return Status::Ok();
  }

  Status WaitFor(const WorkQueue& other, int id) override {
    if (&other == this) return Status::Ok();  // a stream is ordered with itself
    if (!other.device().is_cuda())
      return InvalidArgument("a CUDA queue cannot wait for a marker of ", other.device().ToString(), "'s queue");
    const auto& o = static_cast<const CudaWorkQueue&>(other);
    LOOM_RETURN_IF_ERROR(o.CheckMarker(id));
    LOOM_RETURN_IF_ERROR(SetDevice(index_));
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, o.events_[static_cast<size_t>(id)], 0));
    return Status::Ok();
  }

  Status Synchronize() override {
    LOOM_RETURN_IF_ERROR(SetDevice(index_));
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

  Status AllIdle() override {
    LOOM_ASSIGN_OR_RETURN(Allocator * allocator, GetAllocator(Device::Cuda(index_)));
    return static_cast<CudaAllocator*>(allocator)->AllIdle();
  }

 private:
  explicit CudaWorkQueue(int index) : index_(index) {}
  Status CheckMarker(int id) const {
    if (id < 0 || static_cast<size_t>(id) >= events_.size())
      return Internal("marker ", id, " of a CUDA queue with ", events_.size());
    return Status::Ok();
  }

  int index_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

struct Registrar {
  Registrar() { RegisterWorkQueueFactory(DeviceType::kCuda, CudaWorkQueue::Create); }
};
Registrar registrar;

}  // namespace
}  // namespace loom::cuda
