// A fixed pool of worker threads for the CPU kernels. ParallelFor splits a
// range into contiguous chunks; the calling thread works too, so a pool of
// size 1 runs everything inline with no hand-off.
//
// A training step hands the pool a job every few microseconds (an MLP step
// of 1 ms has dozens of kernels), and waking a thread asleep on a condition
// variable costs a system call on each side, tens of microseconds on a VM.
// So a worker that finished a job, and the caller waiting for the workers,
// spin for a while (kSpin) before they sleep.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"

namespace loom {

class ThreadPool {
 public:
  // Starts num_threads - 1 workers. A count the system cannot start (ulimit,
  // a container's pids limit, address space) is an error, not an exception.
  static StatusOr<std::unique_ptr<ThreadPool>> Create(int num_threads);
  // The same for counts that must start (tests, small fixed pools): a failure
  // is a LOOM_CHECK failure.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) in at most num_threads() chunks of at
  // least `min_chunk` items each; returns when all are done.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool (sized by SetDefaultThreads, else the core count),
  // started on first use; call StartDefault first where a failure to start
  // must be an error rather than a LOOM_CHECK failure.
  static ThreadPool& Default();
  static void SetDefaultThreads(int num_threads);
  // Starts the default pool now if it is not running; on an error the
  // default stays unstarted (the next Default() tries again).
  static Status StartDefault();

 private:
  struct Unstarted {};
  ThreadPool(int num_threads, Unstarted);
  Status Start();
  void Stop();  // joins the workers
  void WorkerLoop(int worker);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> chunks_;
  static constexpr std::chrono::microseconds kSpin{50};
  // Written under mu_; read without it while spinning.
  std::atomic<int64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  std::mutex run_mu_;  // one ParallelFor at a time; nested calls run inline
};

}  // namespace loom
