// A WorkQueue on the CPU that does its work later, in order, on a thread of
// its own, pausing at random: what a GPU's stream does to the host's order.
// The task runtime run on these queues (TaskRuntimeOptions::make_queue)
// orders its devices' work by markers alone, as it must on CUDA streams, so
// a missing wait or a tensor freed while queued work still uses it shows up
// on the CPU as a wrong result or a sanitizer report.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/work_queue.h"

namespace loom::testing {

class AsyncWorkQueue final : public WorkQueue {
 public:
  AsyncWorkQueue(int markers, uint64_t seed)
      : recorded_(static_cast<size_t>(markers)), completed_(static_cast<size_t>(markers), 0), rng_(seed) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~AsyncWorkQueue() override {
    (void)Synchronize();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    thread_.join();
  }

  Device device() const override { return Device::Cpu(); }
  void* stream() const override { return nullptr; }
  Status BindThread() override { return Status::Ok(); }
  void UnbindThread() override {}

  Status Run(std::function<Status()> work) override {
    Push(std::move(work), false);
    return Status::Ok();
  }
  // Called by queued work, on the queue's thread: done at once.
  Status Copy2D(void* dst, Device, size_t dst_pitch, const void* src, Device, size_t src_pitch, size_t row_bytes,
                size_t height) override {
    CopyRows(dst, dst_pitch, src, src_pitch, row_bytes, height);
    return Status::Ok();
  }
  Status Zero(void* dst, size_t bytes) override {
    std::memset(dst, 0, bytes);
    return Status::Ok();
  }

  // As a CUDA event: a wait is for the marker's latest record before it.
  Status Mark(int id) override {
    const int64_t value = ++recorded_[static_cast<size_t>(id)];
    Push(
        [this, id, value] {
          {
            std::lock_guard<std::mutex> lock(mu_);
            completed_[static_cast<size_t>(id)] = value;
          }
          marker_cv_.notify_all();
          return Status::Ok();
        },
        true);
    return Status::Ok();
  }
  Status WaitFor(const WorkQueue& other, int id) override {
    if (&other == this) return Status::Ok();
    auto& o = const_cast<AsyncWorkQueue&>(static_cast<const AsyncWorkQueue&>(other));
    const int64_t value = o.recorded_[static_cast<size_t>(id)].load();
    Push(
        [&o, id, value] {
          std::unique_lock<std::mutex> lock(o.mu_);
          o.marker_cv_.wait(lock, [&] { return o.completed_[static_cast<size_t>(id)] >= value; });
          return Status::Ok();
        },
        true);
    return Status::Ok();
  }

  Status Synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return items_.empty() && !busy_; });
    Status error = error_;
    error_ = Status::Ok();
    return error;
  }
  Status AllIdle() override { return Synchronize(); }

 private:
  struct Item {
    std::function<Status()> work;
    bool marker;  // runs even after an error, so other queues do not wait forever
  };
  void Push(std::function<Status()> work, bool marker) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back({std::move(work), marker});
    }
    work_cv_.notify_all();
  }
  void Loop() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
        if (items_.empty()) return;  // stop_
        item = std::move(items_.front());
        items_.pop_front();
        busy_ = true;
      }
      // The host runs ahead; sometimes far ahead.
      if (rng_() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 200));
      const bool skip = !item.marker && !error_ok();
      Status s = skip ? Status::Ok() : item.work();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!s.ok() && error_.ok()) error_ = s;
        busy_ = false;
      }
      idle_cv_.notify_all();
    }
  }
  bool error_ok() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_.ok();
  }

  std::vector<std::atomic<int64_t>> recorded_;  // by marker: records queued (host side)
  std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_, marker_cv_;
  std::deque<Item> items_;
  std::vector<int64_t> completed_;  // by marker: the latest record done
  bool busy_ = false, stop_ = false;
  Status error_ = Status::Ok();
  std::mt19937_64 rng_;
  std::thread thread_;
};

// TaskRuntimeOptions::make_queue for these queues: device d's pauses drawn
// from seed * 31 + d.
inline std::function<StatusOr<std::unique_ptr<WorkQueue>>(int64_t, int)> AsyncQueueMaker(uint64_t seed) {
  return [seed](int64_t device, int markers) -> StatusOr<std::unique_ptr<WorkQueue>> {
    return std::unique_ptr<WorkQueue>(new AsyncWorkQueue(markers, seed * 31 + static_cast<uint64_t>(device)));
  };
}

}  // namespace loom::testing
