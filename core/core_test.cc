#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <set>
#include <thread>

#include "core/allocator.h"
#include "core/device.h"
#include "core/hash.h"
#include "core/rng.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace loom {

TEST_CASE("Status carries code, message and context") {
  Status s = InvalidArgument("got ", 3, " dims");
  CHECK_FALSE(s.ok());
  CHECK(s.ToString() == "INVALID_ARGUMENT: got 3 dims");
  CHECK(s.WithContext("layer fc1").message() == "layer fc1: got 3 dims");
  StatusOr<int> v = 5;
  CHECK(*v == 5);
  StatusOr<int> e = NotFound("x");
  CHECK(e.status().code() == StatusCode::kNotFound);
}

TEST_CASE("Hash64 hashes a small value as its bytes") {
  // A value of up to 8 bytes takes a shortcut past the byte loop; both
  // must give the same hash, or fingerprints made both ways would differ.
  auto bytes = [](const void* p, size_t n) {
    Hash64 h;
    h.Add(p, n);
    return h.value();
  };
  auto value = [](const auto& v) {
    Hash64 h;
    h.Add(v);
    return h.value();
  };
  const uint64_t u64 = 0x0123456789ABCDEFull;
  const int32_t i32 = -7;
  const double f64 = 2.5;
  const uint8_t u8 = 200;
  CHECK(value(u64) == bytes(&u64, 8));
  CHECK(value(i32) == bytes(&i32, 4));
  CHECK(value(f64) == bytes(&f64, 8));
  CHECK(value(u8) == bytes(&u8, 1));
  CHECK(value(i32) != value(int64_t{-7}));  // the length is hashed
  const std::vector<int> list = {1, 2, 3};
  Hash64 all;
  all.AddAll(list);
  CHECK(all.value() != value(list.size()));
}

TEST_CASE("Shape broadcasting and axes") {
  CHECK(BroadcastShapes({2, 1, 4}, {3, 1}).value() == Shape({2, 3, 4}));
  auto bad = BroadcastShapes({2, 3}, {4});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("[2, 3] and [4]") != std::string::npos);
  CHECK(NormalizeAxis(-1, 4).value() == 3);
  CHECK_FALSE(NormalizeAxis(4, 4).ok());
  CHECK(Shape({2, 3, 4}).Strides() == std::vector<int64_t>{12, 4, 1});
}

TEST_CASE("CPU allocator accounts current and peak bytes") {
  Allocator* a = GetAllocator(Device::Cpu()).value();
  int64_t base = a->stats().current_bytes;
  a->ResetPeak();
  {
    Tensor t = Tensor::Zeros({1000}, DType::kF32);
    CHECK(a->stats().current_bytes == base + 4000);
    Tensor u = Tensor::Zeros({10}, DType::kF64);
    CHECK(a->stats().peak_bytes == base + 4080);
  }
  CHECK(a->stats().current_bytes == base);
  CHECK(a->stats().peak_bytes == base + 4080);
}

TEST_CASE("the caching CPU allocator reuses freed blocks by size, from any thread") {
  CachingCpuAllocator a;
  void* first = nullptr;
  {
    Tensor t = Tensor::Empty({1000}, DType::kF32, &a).value();
    first = t.raw_data();
    CHECK(reinterpret_cast<uintptr_t>(first) % 64 == 0);
    CHECK(a.stats().current_bytes == 4000);
  }
  CHECK(a.stats().current_bytes == 0);
  CHECK(a.cached_bytes() == 4032);  // rounded to 64 bytes
  {
    Tensor same = Tensor::Empty({1000}, DType::kF32, &a).value();  // the freed block again
    CHECK(same.raw_data() == first);
    Tensor other = Tensor::Empty({10}, DType::kF32, &a).value();  // another size: a new block
    CHECK(other.raw_data() != first);
    CHECK(a.cached_bytes() == 0);
  }
  CHECK(a.cached_bytes() == 4032 + 64);
  a.ReleaseCached();
  CHECK(a.cached_bytes() == 0);
  // Blocks made on one thread and freed on others, at once.
  std::vector<Tensor> made;
  for (int i = 0; i < 64; ++i) made.push_back(Tensor::Empty({i + 1}, DType::kF64, &a).value());
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int i = k; i < 64; i += 4) made[static_cast<size_t>(i)] = Tensor();
      for (int i = 0; i < 200; ++i) Tensor t = Tensor::Empty({(i % 7) + 1}, DType::kF64, &a).value();
    });
  for (std::thread& t : threads) t.join();
  CHECK(a.stats().current_bytes == 0);
  CHECK(&CpuDeviceAllocator(3) == &CpuDeviceAllocator(3));
  CHECK(&CpuDeviceAllocator(3) != &CpuDeviceAllocator(4));
}

TEST_CASE("Tensor views, reshape, cast") {
  Tensor t = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor r = t.Reshape({3, 2}).value();
  CHECK(r.raw_data() == t.raw_data());
  CHECK_FALSE(t.Reshape({4}).ok());
  Tensor d = t.Cast(DType::kF64).value();
  CHECK(d.data<double>()[5] == 6.0);
  Tensor c = Tensor::Zeros({2, 3});
  REQUIRE(c.CopyFrom(t).ok());
  CHECK(c.ScalarAt(4) == 5.0);
  CHECK_FALSE(c.CopyFrom(d).ok());
}

TEST_CASE("Tensor rows: views, gathers and stacks") {
  Tensor t = Tensor::FromVector<float>({3, 2}, {1, 2, 3, 4, 5, 6});
  auto row = t.Row(1);
  REQUIRE(row.ok());
  CHECK(row->shape() == Shape({2}));
  CHECK(row->ToDoubleVector() == std::vector<double>{3, 4});
  row->data<float>()[0] = 30;  // a view: writes reach the tensor
  CHECK(t.ScalarAt(2) == 30);
  auto gathered = t.GatherRows({2, 0});
  REQUIRE(gathered.ok());
  CHECK(gathered->shape() == Shape({2, 2}));
  CHECK(gathered->ToDoubleVector() == std::vector<double>{5, 6, 1, 2});
  auto stacked = Tensor::Stack({*t.Row(2), *t.Row(2)});
  REQUIRE(stacked.ok());
  CHECK(stacked->ToDoubleVector() == std::vector<double>{5, 6, 5, 6});
  auto none = t.GatherRows({});
  REQUIRE(none.ok());
  CHECK(none->shape() == Shape({0, 2}));
  CHECK(!t.Row(3).ok());
  CHECK(!t.Row(-1).ok());
  CHECK(!Tensor::Zeros({}).Row(0).ok());
  CHECK(!Tensor::Stack({}).ok());
  CHECK(!Tensor::Stack({Tensor::Zeros({2}), Tensor::Zeros({3})}).ok());
}

TEST_CASE("RNG is deterministic and streams are independent") {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 10; ++i) CHECK(a.NextU64() == b.NextU64());
  CHECK(Rng(42).NextU64() != c.NextU64());
  CHECK(Rng::Stream(1, 2, 3).NextU64() != Rng::Stream(1, 3, 2).NextU64());
  Rng n(7);
  double sum = 0, sq = 0;
  const int kN = 20000;
  for (int i = 0; i < kN; ++i) {
    double x = n.Normal();
    sum += x;
    sq += x * x;
  }
  CHECK(std::abs(sum / kN) < 0.03);
  CHECK(std::abs(sq / kN - 1.0) < 0.05);
}

TEST_CASE("ThreadPool covers the range exactly once") {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.ParallelFor(1000, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) CHECK(h.load() == 1);
  // Nested calls run inline instead of deadlocking.
  std::atomic<int> total{0};
  pool.ParallelFor(4, 1, [&](int64_t b, int64_t e) {
    pool.ParallelFor(10, 1, [&](int64_t b2, int64_t e2) { total += static_cast<int>((e - b) * (e2 - b2)); });
  });
  CHECK(total.load() == 40);
}

TEST_CASE("ThreadPool hands jobs to spinning and to sleeping workers alike") {
  // Back to back, the workers are still spinning when the next job comes;
  // after a pause longer than their spin, they are asleep. Each job's
  // writes must be visible when ParallelFor returns, in either case.
  ThreadPool pool(3);
  std::vector<int64_t> out(300);
  for (int job = 0; job < 400; ++job) {
    if (job % 100 == 99) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    pool.ParallelFor(300, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] = job * 1000 + i;
    });
    for (int64_t i = 0; i < 300; ++i) REQUIRE(out[static_cast<size_t>(i)] == job * 1000 + i);
  }
}

TEST_CASE("a thread count the system cannot start is an error, not an exception") {
  // Cap the address space 16 MiB above what the process maps now: no room
  // for 4095 thread stacks, so std::thread throws std::system_error.
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  REQUIRE(pages > 0);
  rlimit cap = old;
  cap.rlim_cur = std::min<rlim_t>(old.rlim_max, static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (16 << 20));
  REQUIRE(setrlimit(RLIMIT_AS, &cap) == 0);
  StatusOr<std::unique_ptr<ThreadPool>> pool = ThreadPool::Create(4096);
  ThreadPool::SetDefaultThreads(4096);
  const Status started = ThreadPool::StartDefault();
  REQUIRE(setrlimit(RLIMIT_AS, &old) == 0);

  REQUIRE_FALSE(pool.ok());
  CHECK(pool.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(pool.status().message(), Catch::StartsWith("cannot start 4096 threads (started "));
  CHECK_FALSE(started.ok());
  // The default is still usable at a size that fits.
  ThreadPool::SetDefaultThreads(2);
  CHECK(ThreadPool::StartDefault().ok());
  CHECK(ThreadPool::Default().num_threads() == 2);
  ThreadPool::SetDefaultThreads(0);
}

TEST_CASE("WaitForDevice returns at once on the CPU and names a device it cannot wait for") {
  CHECK(WaitForDevice(Device::Cpu()).ok());
  // The CPU build has no CUDA backend; a CUDA build without a GPU has no cuda:0.
  const Status s = WaitForDevice(Device::Cuda(0));
  if (!s.ok()) CHECK_THAT(s.message(), Catch::Contains("cuda:0"));
}

TEST_CASE("device lists: cpu:N, GPUs and streams on a GPU") {
  CHECK(ParseDevices("cpu:3").value() == std::vector<Device>(3, Device::Cpu()));
  CHECK(ParseDevices("cuda:0,1").value() == std::vector<Device>{Device::Cuda(0), Device::Cuda(1)});
  CHECK(ParseDevices("cuda:0x3").value() == std::vector<Device>(3, Device::Cuda(0)));
  CHECK(ParseDevices("cuda:0x2,1").value() ==
        std::vector<Device>{Device::Cuda(0), Device::Cuda(0), Device::Cuda(1)});
  CHECK(ParseDevices("cuda:1").value() == std::vector<Device>{Device::Cuda(1)});
  for (const char* bad : {"cpu:0", "cpu:65", "cpu:", "cpu:2x", "cuda:", "cuda:a", "cuda:0x0", "cuda:0,", "cuda:0x65",
                          "cuda:-1", "gpu:0", "2"}) {
    INFO(bad);
    const StatusOr<std::vector<Device>> parsed = ParseDevices(bad);
    REQUIRE_FALSE(parsed.ok());
    CHECK_THAT(parsed.status().message(), Catch::Contains("expected cpu:N or cuda:LIST"));
  }
}

}  // namespace loom

