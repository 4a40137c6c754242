// An ordered queue of a device's work, for a runtime that runs several at
// once: the task runtime gives each of its devices one, and several of them
// may share one GPU (a CUDA stream each). Work queued on a queue runs in the
// order it was queued; a marker recorded on one queue after some work lets
// another queue's later work wait for that work (a CUDA event).
//
// A runtime hands the queue host work with Run (a kernel call, a region
// copy): the CPU's and CUDA's queues call it at once, on the calling thread
// (the CPU does the work there; CUDA's kernels and copies queue themselves
// on the stream, KernelContext::stream), and the work keeps every tensor it
// uses in its closure. Copy2D and Zero are called from such work.
//
// The CPU's queue does everything at once (its copies are memcpys, its
// markers need no waiting), so a runtime written against WorkQueue runs the
// same code on both kinds of device; a test's queue that runs its work on a
// thread of its own, later, checks the order the markers give
// (tests/async_work_queue.h). A backend registers its queues with
// RegisterWorkQueueFactory (//core/cuda for CUDA).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.h"
#include "core/region.h"
#include "core/status.h"
#include "core/tensor.h"

namespace loom {

class WorkQueue {
 public:
  virtual ~WorkQueue() = default;
  virtual Device device() const = 0;
  // What kernels queue their work on (KernelContext::stream): a
  // cudaStream_t, null on the CPU.
  virtual void* stream() const = 0;
  // Makes this queue the calling thread's queue for its device: blocks that
  // this thread frees go back to the device's allocator as blocks of this
  // queue, handed out again only to work of this queue (so they are reused
  // in the queue's order) until AllIdle(). UnbindThread undoes it.
  virtual Status BindThread() = 0;
  virtual void UnbindThread() = 0;

  // Host work queued in order with the rest: called now by the CPU's and
  // CUDA's queues (returning its status), later by an asynchronous one
  // (whose Synchronize returns its first error).
  virtual Status Run(std::function<Status()> work) { return work(); }

  // `height` rows of `row_bytes`, `src_pitch` and `dst_pitch` bytes apart,
  // after the work queued so far; either side may be on another device.
  virtual Status Copy2D(void* dst, Device dst_device, size_t dst_pitch, const void* src, Device src_device,
                        size_t src_pitch, size_t row_bytes, size_t height) = 0;
  virtual Status Zero(void* dst, size_t bytes) = 0;

  // Marker `id` (in [0, markers) of CreateWorkQueue) now stands after the
  // work queued so far.
  virtual Status Mark(int id) = 0;
  // Work queued on this queue from now on waits for `other`'s marker `id`
  // (recorded before this call).
  virtual Status WaitFor(const WorkQueue& other, int id) = 0;
  // Returns when the queue's work is done, with its first error.
  virtual Status Synchronize() = 0;
  // Whether work is done by the time the call that queued it returns (the
  // CPU's queue): the host may then read what it made, and overwrite what it
  // read, at once.
  virtual bool done_when_queued() const { return false; }
  // Waits for all work on the queue's device (every queue's); then the
  // blocks each queue kept for itself (BindThread) may go to any queue.
  virtual Status AllIdle() = 0;
};

// A queue on `device` with `markers` markers.
StatusOr<std::unique_ptr<WorkQueue>> CreateWorkQueue(Device device, int markers);

using WorkQueueFactory = std::function<StatusOr<std::unique_ptr<WorkQueue>>(int index, int markers)>;
void RegisterWorkQueueFactory(DeviceType type, WorkQueueFactory factory);

// CopyRegion (core/region.h) queued on `queue`: src and dst may be on any
// devices the queue can copy between. The work holds both tensors.
Status CopyRegionOn(WorkQueue& queue, const Tensor& src, const Region& src_region, Tensor* dst,
                    const Region& dst_region, const Region& box);

}  // namespace loom
