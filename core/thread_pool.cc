#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace loom {

namespace {
thread_local bool in_parallel_region = false;
std::mutex default_mu;
std::unique_ptr<ThreadPool> default_pool;
int default_threads = 0;
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int worker) {
  int64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    std::pair<int64_t, int64_t> chunk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (worker >= static_cast<int>(chunks_.size())) continue;
      job = job_;
      chunk = chunks_[worker];
    }
    in_parallel_region = true;
    (*job)(chunk.first, chunk.second);
    in_parallel_region = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t parts = std::min<int64_t>(num_threads_, std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk)));
  if (parts <= 1 || in_parallel_region) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  std::vector<std::pair<int64_t, int64_t>> chunks(parts);
  for (int64_t p = 0; p < parts; ++p) chunks[p] = {n * p / parts, n * (p + 1) / parts};
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    chunks_ = chunks;
    pending_ = static_cast<int>(parts) - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  in_parallel_region = true;
  fn(chunks[0].first, chunks[0].second);
  in_parallel_region = false;
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

ThreadPool& ThreadPool::Default() {
  std::lock_guard<std::mutex> lock(default_mu);
  if (!default_pool) {
    int n = default_threads > 0 ? default_threads : static_cast<int>(std::thread::hardware_concurrency());
    default_pool = std::make_unique<ThreadPool>(n);
  }
  return *default_pool;
}

void ThreadPool::SetDefaultThreads(int num_threads) {
  std::lock_guard<std::mutex> lock(default_mu);
  default_threads = num_threads;
  default_pool.reset();
}

}  // namespace loom
