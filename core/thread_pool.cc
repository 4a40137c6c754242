#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>

namespace loom {

namespace {
thread_local bool in_parallel_region = false;
std::mutex default_mu;
std::unique_ptr<ThreadPool> default_pool;
int default_threads = 0;

// Spins until done() holds or `limit` has passed; whether done() holds.
template <typename Done>
bool SpinUntil(Done done, std::chrono::microseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}
}  // namespace

ThreadPool::ThreadPool(int num_threads, Unstarted) : num_threads_(std::max(1, num_threads)) {}

ThreadPool::ThreadPool(int num_threads) : ThreadPool(num_threads, Unstarted{}) {
  const Status started = Start();
  LOOM_CHECK(started.ok(), "", started.message(), " (ThreadPool::Create returns this as an error)");
}

StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(int num_threads) {
  std::unique_ptr<ThreadPool> pool(new ThreadPool(num_threads, Unstarted{}));
  LOOM_RETURN_IF_ERROR(pool->Start());
  return pool;
}

Status ThreadPool::Start() {
  try {
    workers_.reserve(num_threads_ - 1);
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
  } catch (const std::exception& e) {  // std::system_error from std::thread, bad_alloc from reserve
    const size_t started = workers_.size();
    Stop();  // a joinable std::thread left in workers_ would std::terminate
    return ResourceExhausted("cannot start ", num_threads_, " threads (started ", started + 1, "): ", e.what());
  }
  return Status::Ok();
}

void ThreadPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() { Stop(); }

void ThreadPool::WorkerLoop(int worker) {
  int64_t seen = 0;
  for (;;) {
    SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; }, kSpin);
    const std::function<void(int64_t, int64_t)>* job;
    std::pair<int64_t, int64_t> chunk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_relaxed) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_relaxed);
      if (worker >= static_cast<int>(chunks_.size())) continue;
      job = job_;
      chunk = chunks_[worker];
    }
    in_parallel_region = true;
    (*job)(chunk.first, chunk.second);
    in_parallel_region = false;
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the lock: the caller tests pending_ under it before it sleeps.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
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
    pending_.store(static_cast<int>(parts) - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_cv_.notify_all();
  in_parallel_region = true;
  fn(chunks[0].first, chunks[0].second);
  in_parallel_region = false;
  if (SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; }, kSpin)) return;
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
}

namespace {

// Starts the default pool if it is not running; default_mu is held.
Status StartDefaultLocked() {
  if (default_pool) return Status::Ok();
  const int n = default_threads > 0 ? default_threads : static_cast<int>(std::thread::hardware_concurrency());
  LOOM_ASSIGN_OR_RETURN(default_pool, ThreadPool::Create(n));
  return Status::Ok();
}

}  // namespace

ThreadPool& ThreadPool::Default() {
  std::lock_guard<std::mutex> lock(default_mu);
  const Status started = StartDefaultLocked();
  LOOM_CHECK(started.ok(), "", started.message(), " (ThreadPool::StartDefault returns this as an error)");
  return *default_pool;
}

Status ThreadPool::StartDefault() {
  std::lock_guard<std::mutex> lock(default_mu);
  return StartDefaultLocked();
}

void ThreadPool::SetDefaultThreads(int num_threads) {
  std::lock_guard<std::mutex> lock(default_mu);
  default_threads = num_threads;
  default_pool.reset();
}

}  // namespace loom
