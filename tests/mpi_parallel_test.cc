// The task runtime across MPI processes (run by tests/mpirun.sh NP): one
// device per rank; every rank's losses, outputs and parameters after 3 SGD
// steps must be the in-process runtime's bit for bit, and one Executor's
// to 1e-9 (f64), for data, model, parameter and attribute parallelism and
// fused replicas split over the ranks; and every zoo model at a reduced
// size (a GAN: each of its two steps) under data parallelism and OWT, bit
// for bit; and the same with every device's work done later on a thread of
// its own (tests/async_work_queue.h), as on GPUs.
#include <catch2/catch.hpp>

#include <optional>


#include "graph/model.h"
#include "graph/strategy.h"
#include "models/zoo.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/task_runtime.h"
#include "search/baselines.h"
#include "tests/async_work_queue.h"
#include "tests/mpi_catch_main.h"
#include "tests/parallel_check.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

using testing::World;
constexpr int kSteps = 3;
constexpr uint64_t kSeed = 3;


// This rank's results under `strategy` (its devices: the world's size), on
// asynchronous queues when `async_seed` is set.
testing::StepResults OnThisRank(const testing::StepCase& c, const std::string& strategy, int steps = kSteps,
                                std::optional<uint64_t> async_seed = std::nullopt) {
  auto tasks = testing::LowerStrategy(c, strategy);
  REQUIRE(tasks.status().ToString() == "OK");
  TaskRuntimeOptions o;
  o.communicator = &World();
  if (async_seed) o.make_queue = testing::AsyncQueueMaker(*async_seed + static_cast<uint64_t>(World().rank()));
  auto runtime = TaskRuntime::Create(std::move(*tasks), o);
  REQUIRE(runtime.status().ToString() == "OK");
  REQUIRE((*runtime)->InitializeState(kSeed).ok());
  testing::StepResults r;
  for (int s = 0; s < steps; ++s) {
    auto out = (*runtime)->Run(c.feeds);
    REQUIRE(out.status().ToString() == "OK");
    r.outputs.push_back(*out);
  }
  for (const std::string& name : (*runtime)->StateNames()) {
    auto t = (*runtime)->GetState(name);
    REQUIRE(t.ok());
    r.state[name] = *t;
  }
  return r;
}

void ExpectSame(const testing::StepCase& c, const std::string& strategy) {
  INFO("rank " << World().rank() << " of " << World().size() << ", strategy:\n" << strategy);
  const testing::StepResults mine = OnThisRank(c, strategy);
  auto in_process = testing::RunOnDevices(c, strategy, kSteps, kSeed);
  REQUIRE(in_process.status().ToString() == "OK");
  CHECK(testing::FirstMismatch(*in_process, mine, 0.0) == "");
  auto one = testing::RunOneDevice(c, kSteps, kSeed);
  REQUIRE(one.ok());
  CHECK(testing::FirstMismatch(*one, mine, 1e-9) == "");
}

std::string Devices() { return "devices: " + std::to_string(World().size()) + "\n"; }

TEST_CASE("processes: data parallel") {
  ExpectSame(testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64}),
             Devices() + "default_split { sample: " + std::to_string(World().size()) + " }\n");
  ExpectSame(testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8}),
             Devices() + "default_split { sample: 2 }\n");
}

TEST_CASE("processes: model, parameter and attribute parallel") {
  const testing::StepCase cnn = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  ExpectSame(cnn, Devices() + "layer { layer: \"stage1/*\" devices: 1 }\n");
  ExpectSame(cnn, Devices() + "default_split { parameter: 2 }\n");
  ExpectSame(cnn, Devices() + "layer { layer: \"*conv\" attribute: 2 }\n");
}

TEST_CASE("processes: two devices per process") {
  const std::string devices = "devices: " + std::to_string(2 * World().size()) + "\n";
  const testing::StepCase cnn = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8});
  ExpectSame(cnn, devices + "default_split { sample: 2 parameter: 2 }\n");
  ExpectSame(cnn, devices + "default_split { sample: " + std::to_string(2 * World().size()) + " }\n");
}

TEST_CASE("processes: fused replicas split over the ranks") {
  ExpectSame(testing::ClassifierCase("mlp", {{"hidden", "16"}}, {64}, 4), Devices() + "default_split { replica: 2 }\n");
}

// GPU streams across processes, checked on the CPU: every device's work is
// done later, on a thread of its own. A message sent before the queued work
// that makes it, or received into bytes that queued work still reads,
// gives other bits than the in-process runtime's.
TEST_CASE("processes: devices on asynchronous queues") {
  const std::string one = Devices(), two = "devices: " + std::to_string(2 * World().size()) + "\n";
  const testing::StepCase mlp = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const testing::StepCase cnn =
      testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8});
  const std::vector<std::pair<const testing::StepCase*, std::string>> cases = {
      {&mlp, one + "default_split { sample: " + std::to_string(World().size()) + " }\n"},
      {&cnn, one + "layer { layer: \"stage1/*\" devices: 1 }\n"},
      {&cnn, one + "default_split { parameter: 2 }\n"},
      {&cnn, one + "layer { layer: \"*conv\" attribute: 2 }\n"},
      {&cnn, two + "default_split { sample: 2 parameter: 2 }\n"},
      {&cnn, two + "default_split { sample: " + std::to_string(2 * World().size()) + " }\n"},
  };
  uint64_t seed = 11;
  for (const auto& [c, strategy] : cases) {
    INFO("rank " << World().rank() << " of " << World().size() << ", strategy:\n" << strategy);
    auto in_process = testing::RunOnDevices(*c, strategy, kSteps, kSeed);
    REQUIRE(in_process.status().ToString() == "OK");
    for (int round = 0; round < 3; ++round) {
      const testing::StepResults mine = OnThisRank(*c, strategy, kSteps, seed++);
      CHECK(testing::FirstMismatch(*in_process, mine, 0.0) == "");
    }
  }
}

TEST_CASE("processes: every zoo model under data parallelism and OWT, bit for bit", "[zoo]") {
  auto check = [](const std::string& name, const testing::StepCase& c) {
    for (StandardStrategy kind : {StandardStrategy::kDataParallel, StandardStrategy::kOneWeirdTrick}) {
      auto strategy = MakeStandardStrategy(c.forward, kind, World().size());
      REQUIRE(strategy.ok());
      const std::string text = StrategyToText(*strategy);
      INFO(name << " rank " << World().rank() << ":\n" << text);
      const testing::StepResults mine = OnThisRank(c, text, testing::ZooSteps(c));
      auto in_process = testing::RunOnDevices(c, text, testing::ZooSteps(c), kSeed);
      REQUIRE(in_process.status().ToString() == "OK");
      CHECK(testing::FirstMismatch(*in_process, mine, 0.0) == "");
    }
  };
  for (const testing::SmallModel& s : testing::SmallModels()) {
    if (!testing::IsGan(s)) {
      check(s.name, testing::ZooStepCase(s, std::nullopt));
      continue;
    }
    check(s.name + " discriminator step", testing::GanStepCase(s, models::GanStep::kDiscriminator, std::nullopt));
    check(s.name + " generator step", testing::GanStepCase(s, models::GanStep::kGenerator, std::nullopt));
  }
}

}  // namespace
}  // namespace loom
