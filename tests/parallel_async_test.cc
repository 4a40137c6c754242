// The task runtime with every device's work done later, on a thread of its
// own with random pauses (tests/async_work_queue.h), as a GPU's streams do
// it: the small zoo under dp, OWT, model and random strategies, and fused
// arrays split by replicas, against one device (f64, the tolerances of
// parallel_zoo_test), and devices in processes against the in-process
// runtime. A missing marker wait, a piece's bytes reused before
// queued work read them, or a tensor freed under queued work fails here
// (or under ASan) on the CPU.
#include <catch2/catch.hpp>

#include <random>

#include "tests/async_work_queue.h"
#include "tests/parallel_check.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

using testing::StepCase;

TaskRuntimeOptions AsyncQueues(uint64_t seed) {
  TaskRuntimeOptions o;
  o.make_queue = testing::AsyncQueueMaker(seed);
  return o;
}

void CheckAsync(const StepCase& c, const testing::StepResults& want, const std::string& strategy, uint64_t seed) {
  INFO(strategy);
  auto got = testing::RunOnDevices(c, strategy, testing::ZooSteps(c), 5, {}, AsyncQueues(seed));
  if (!got.ok()) FAIL(got.status().ToString());
  CHECK(testing::FirstMismatch(want, *got, testing::ZooTolerance(c)) == "");
}

TEST_CASE("zoo models on asynchronous queues train under dp, owt, model and random strategies as on one device") {
  std::mt19937_64 rng(31);
  testing::ForEachZooRuntimeCase(rng, [&](const StepCase& c, const testing::StepResults& want,
                                          const std::vector<std::string>& strategies) {
    for (const std::string& strategy : strategies) CheckAsync(c, want, strategy, rng());
  });
}

TEST_CASE("fused arrays on asynchronous queues split their replicas as on one device") {
  testing::ForEachReplicaSplitCase([](const StepCase& c, const testing::StepResults& want, const std::string& strategy) {
    CheckAsync(c, want, strategy, 3);
  });
}

// Processes on asynchronous queues (GPUs in processes; ranks played by
// threads joined by local communicators): a message must wait for the
// queued work that makes what it sends, and a received piece must be
// written in its queue's order, after earlier work there read those bytes
// (the memory plan reuses them). Each rank's results are the in-process
// runtime's, bit for bit.
TEST_CASE("devices in processes on asynchronous queues match the in-process runtime bit for bit") {
  uint64_t seed = 7;
  testing::ForEachProcessSplitCase([&](const StepCase& c, const std::string& strategy, int ranks) {
    auto in_process = testing::RunOnDevices(c, strategy, 3, 5);
    REQUIRE(in_process.status().ToString() == "OK");
    for (int round = 0; round < 3; ++round) {
      auto got = testing::RunAsProcesses(c, strategy, 3, 5, ranks, {}, AsyncQueues(seed++));
      REQUIRE(got.status().ToString() == "OK");
      for (size_t r = 0; r < got->size(); ++r) {
        INFO("rank " << r);
        CHECK(testing::FirstMismatch(*in_process, (*got)[r], 0.0) == "");
      }
    }
  });
}

// The queue itself: a wait holds back later work until the other queue's
// marker is done, however long that queue's earlier work takes.
TEST_CASE("an asynchronous queue's work waits for another queue's marker") {
  testing::AsyncWorkQueue a(1, 1), b(0, 2);
  std::atomic<int> written{0};
  int seen = -1;
  REQUIRE(a.Run([&] {
               std::this_thread::sleep_for(std::chrono::milliseconds(20));
               written = 42;
               return Status::Ok();
             }).ok());
  REQUIRE(a.Mark(0).ok());
  REQUIRE(b.WaitFor(a, 0).ok());
  REQUIRE(b.Run([&] {
               seen = written;
               return Status::Ok();
             }).ok());
  REQUIRE(b.Synchronize().ok());
  CHECK(seen == 42);
  // An error surfaces at Synchronize, and later work is skipped.
  REQUIRE(a.Run([] { return Internal("boom"); }).ok());
  bool ran = false;
  REQUIRE(a.Run([&] {
               ran = true;
               return Status::Ok();
             }).ok());
  CHECK(a.Synchronize().message().find("boom") != std::string::npos);
  CHECK_FALSE(ran);
}

}  // namespace
}  // namespace loom
