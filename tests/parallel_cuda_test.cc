// The task runtime on CUDA devices: several devices as streams of one GPU
// (`--devices cuda:0x2`), each device's work queued on its stream and
// ordered by events, trained under the standard and random strategies
// against one CPU device (f64, the tolerances of parallel_zoo_test);
// devices in processes (ranks as threads) against the in-process runtime;
// and the CUDA allocator's per-stream free lists.
// Without a GPU everything skips; LOOM_REQUIRE_CUDA=1 (tools/gpu_check.sh)
// makes a missing GPU a failure.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>

#include "core/cuda/cuda_device.h"
#include "core/logging.h"
#include "core/work_queue.h"
#include "graph/strategy.h"
#include "search/baselines.h"
#include "tests/parallel_check.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

using testing::FirstMismatch;
using testing::StepCase;

bool RunGpuChecks() {
  static const Status usable = GetAllocator(Device::Cuda(0)).status();
  if (usable.ok()) return true;
  const char* required = std::getenv("LOOM_REQUIRE_CUDA");
  if (required && std::string(required) == "1") FAIL("LOOM_REQUIRE_CUDA=1 but cuda:0 is unusable: " << usable.ToString());
  LOOM_LOG_WARN("no GPU: task runtime CUDA tests skipped ({})", usable.ToString());
  return false;
}

void CheckOnStreams(const StepCase& c, const testing::StepResults& want, const std::string& strategy, int devices) {
  INFO(strategy << " on cuda:0x" << devices);
  TaskRuntimeOptions options;
  options.devices.assign(static_cast<size_t>(devices), Device::Cuda(0));
  auto got = testing::RunOnDevices(c, strategy, testing::ZooSteps(c), 5, {}, options);
  if (!got.ok()) FAIL(got.status().ToString());
  CHECK(FirstMismatch(want, *got, testing::ZooTolerance(c)) == "");
}

TEST_CASE("zoo models on streams of one GPU train under dp, owt, model and random strategies as on one device") {
  if (!RunGpuChecks()) return;
  std::mt19937_64 rng(29);
  testing::ForEachZooRuntimeCase(rng, [](const StepCase& c, const testing::StepResults& want,
                                         const std::vector<std::string>& strategies) {
    for (const std::string& strategy : strategies) {
      auto parsed = Strategy::Parse(strategy, "strategy.pbtxt");
      if (!parsed.ok()) FAIL(parsed.status().ToString());
      CheckOnStreams(c, want, strategy, static_cast<int>(parsed->devices()));
    }
    auto four = MakeStandardStrategy(c.forward, StandardStrategy::kDataParallel, 4);
    if (four.ok()) CheckOnStreams(c, want, StrategyToText(*four), 4);
  });
}

TEST_CASE("a fused array's replicas split over streams of one GPU as on one device") {
  if (!RunGpuChecks()) return;
  testing::ForEachReplicaSplitCase([](const StepCase& c, const testing::StepResults& want, const std::string& strategy) {
    CheckOnStreams(c, want, strategy, 2);
  });
}

// CUDA devices in processes (mpirun; here ranks played by threads joined by
// local communicators): messages go through the host after the streams'
// work. Each rank's results are the in-process runtime's on the same
// streams bit for bit, and one CPU device's within the zoo's tolerance.
TEST_CASE("devices in processes on streams of one GPU match the in-process runtime") {
  if (!RunGpuChecks()) return;
  testing::ForEachProcessSplitCase([](const StepCase& c, const std::string& strategy, int ranks) {
    TaskRuntimeOptions options;
    options.devices.assign(static_cast<size_t>(Strategy::Parse(strategy, "strategy.pbtxt")->devices()),
                           Device::Cuda(0));
    auto in_process = testing::RunOnDevices(c, strategy, 3, 5, {}, options);
    REQUIRE(in_process.status().ToString() == "OK");
    auto one = testing::RunOneDevice(c, 3, 5);
    REQUIRE(one.status().ToString() == "OK");
    CHECK(FirstMismatch(*one, *in_process, testing::ZooTolerance(c)) == "");
    auto got = testing::RunAsProcesses(c, strategy, 3, 5, ranks, {}, options);
    REQUIRE(got.status().ToString() == "OK");
    for (size_t r = 0; r < got->size(); ++r) {
      INFO("rank " << r);
      CHECK(FirstMismatch(*in_process, (*got)[r], 0.0) == "");
    }
  });
}

// A block freed by a thread bound to stream A goes back to A only: B gets
// another block of the same size until the device is idle (AllIdle).
TEST_CASE("the CUDA allocator hands a stream's freed blocks to that stream until the device is idle") {
  if (!RunGpuChecks()) return;
  auto a = CreateWorkQueue(Device::Cuda(0), 0);
  auto b = CreateWorkQueue(Device::Cuda(0), 0);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  // An empty cache, so that only this test's block can be handed out.
  static_cast<cuda::CudaAllocator*>(GetAllocator(Device::Cuda(0)).value())->ReleaseCached();
  const Shape shape({12345});
  REQUIRE((*a)->BindThread().ok());
  const void* freed_on_a = nullptr;
  {
    Tensor t = Tensor::Empty(shape, DType::kF32, Device::Cuda(0)).value();
    freed_on_a = t.raw_data();
  }
  REQUIRE((*b)->BindThread().ok());
  Tensor on_b = Tensor::Empty(shape, DType::kF32, Device::Cuda(0)).value();
  CHECK(on_b.raw_data() != freed_on_a);
  REQUIRE((*a)->BindThread().ok());
  {
    Tensor again = Tensor::Empty(shape, DType::kF32, Device::Cuda(0)).value();
    CHECK(again.raw_data() == freed_on_a);
  }  // back to A's list
  REQUIRE((*a)->AllIdle().ok());
  REQUIRE((*b)->BindThread().ok());
  Tensor after_idle = Tensor::Empty(shape, DType::kF32, Device::Cuda(0)).value();
  CHECK(after_idle.raw_data() == freed_on_a);
  (*b)->UnbindThread();
}

// Markers order two streams: B copies what A wrote only after A's marker.
TEST_CASE("a queue's work waits for another queue's marker") {
  if (!RunGpuChecks()) return;
  auto a = CreateWorkQueue(Device::Cuda(0), 1).value();
  auto b = CreateWorkQueue(Device::Cuda(0), 0).value();
  const int64_t n = 1 << 22;
  Tensor host = Tensor::Zeros({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) host.data<float>()[i] = static_cast<float>(i % 977);
  Tensor src = host.To(Device::Cuda(0)).value();
  Tensor mid = Tensor::Empty({n}, DType::kF32, Device::Cuda(0)).value();
  Tensor dst = Tensor::Empty({n}, DType::kF32, Device::Cuda(0)).value();
  const Region all = Region::Whole(src.shape());
  REQUIRE(a->Zero(mid.raw_data(), mid.nbytes()).ok());
  REQUIRE(CopyRegionOn(*a, src, all, &mid, all, all).ok());
  REQUIRE(a->Mark(0).ok());
  REQUIRE(b->WaitFor(*a, 0).ok());
  REQUIRE(CopyRegionOn(*b, mid, all, &dst, all, all).ok());
  REQUIRE(b->Synchronize().ok());
  CHECK(dst.To(Device::Cpu()).value().ToDoubleVector() == host.ToDoubleVector());
}

}  // namespace
}  // namespace loom
