// A fixed pool of worker threads for the CPU kernels. ParallelFor splits a
// range into contiguous chunks; the calling thread works too, so a pool of
// size 1 runs everything inline with no hand-off.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) in at most num_threads() chunks of at
  // least `min_chunk` items each; returns when all are done.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool (sized by SetDefaultThreads, else the core count).
  static ThreadPool& Default();
  static void SetDefaultThreads(int num_threads);

 private:
  void WorkerLoop(int worker);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> chunks_;
  int64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::mutex run_mu_;  // one ParallelFor at a time; nested calls run inline
};

}  // namespace loom
