// The task runtime across MPI processes (run by tests/mpirun.sh NP): one
// device per rank; every rank's losses, outputs and parameters after 3 SGD
// steps must be the in-process runtime's bit for bit, and one Executor's
// to 1e-9 (f64), for data, model, parameter and attribute parallelism and
// fused replicas split over the ranks; and every zoo model at a reduced
// size under data parallelism and OWT, bit for bit.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <random>

#include "graph/model.h"
#include "graph/strategy.h"
#include "models/zoo.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/task_runtime.h"
#include "search/baselines.h"
#include "tests/parallel_check.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

MpiCommunicator* world = nullptr;  // made in main
constexpr int kSteps = 3;
constexpr int64_t kBatch = 8;
constexpr uint64_t kSeed = 3;

testing::StepCase Classifier(const std::string& model, const std::map<std::string, std::string>& args,
                             const Shape& input, int replicas = 0) {
  Model m(DType::kF64);
  REQUIRE(models::BuildClassifier(m, model, args, input, kBatch, 4).ok());
  std::optional<FusionOptions> fusion;
  if (replicas > 0) {
    fusion = FusionOptions{};
    fusion->replicas = replicas;
    for (int r = 0; r < replicas; ++r) fusion->seeds.push_back(100 + static_cast<uint64_t>(r));
  }
  std::mt19937_64 rng(7);  // the same data on every rank
  std::vector<int64_t> dims = input.dims();
  dims.insert(dims.begin(), kBatch);
  Tensor x = Tensor::Zeros(Shape(dims), DType::kF64), y = Tensor::Zeros({kBatch}, DType::kI64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = testing::MakeStepCase(m.graph(), fusion, {{"input", x}, {"target", y}});
  REQUIRE(c.status().ToString() == "OK");
  return *c;
}

// This rank's results under `strategy` (its devices: the world's size).
testing::StepResults OnThisRank(const testing::StepCase& c, const std::string& strategy, int steps = kSteps) {
  auto tasks = testing::LowerStrategy(c, strategy);
  REQUIRE(tasks.status().ToString() == "OK");
  TaskRuntimeOptions o;
  o.communicator = world;
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
  INFO("rank " << world->rank() << " of " << world->size() << ", strategy:\n" << strategy);
  const testing::StepResults mine = OnThisRank(c, strategy);
  auto in_process = testing::RunOnDevices(c, strategy, kSteps, kSeed);
  REQUIRE(in_process.status().ToString() == "OK");
  CHECK(testing::FirstMismatch(*in_process, mine, 0.0) == "");
  auto one = testing::RunOneDevice(c, kSteps, kSeed);
  REQUIRE(one.ok());
  CHECK(testing::FirstMismatch(*one, mine, 1e-9) == "");
}

std::string Devices() { return "devices: " + std::to_string(world->size()) + "\n"; }

TEST_CASE("processes: data parallel") {
  ExpectSame(Classifier("mlp", {{"hidden", "16,8"}}, {64}),
             Devices() + "default_split { sample: " + std::to_string(world->size()) + " }\n");
  ExpectSame(Classifier("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8}),
             Devices() + "default_split { sample: 2 }\n");
}

TEST_CASE("processes: model, parameter and attribute parallel") {
  const testing::StepCase cnn = Classifier("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  ExpectSame(cnn, Devices() + "layer { layer: \"stage1/*\" devices: 1 }\n");
  ExpectSame(cnn, Devices() + "default_split { parameter: 2 }\n");
  ExpectSame(cnn, Devices() + "layer { layer: \"*conv\" attribute: 2 }\n");
}

TEST_CASE("processes: two devices per process") {
  const std::string devices = "devices: " + std::to_string(2 * world->size()) + "\n";
  const testing::StepCase cnn = Classifier("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8});
  ExpectSame(cnn, devices + "default_split { sample: 2 parameter: 2 }\n");
  ExpectSame(cnn, devices + "default_split { sample: " + std::to_string(2 * world->size()) + " }\n");
}

TEST_CASE("processes: fused replicas split over the ranks") {
  ExpectSame(Classifier("mlp", {{"hidden", "16"}}, {64}, 4), Devices() + "default_split { replica: 2 }\n");
}

TEST_CASE("processes: every zoo model under data parallelism and OWT, bit for bit", "[zoo]") {
  for (const testing::SmallModel& s : testing::SmallModels()) {
    if (testing::IsGan(s) || !s.fused_check) continue;  // GANs: two steps; VGG-16: gigabytes in f64
    const testing::StepCase c = testing::ZooStepCase(s, std::nullopt);
    if (testing::ParameterCount(c.step) > 1e7) continue;  // AlexNet: f64 copies per device
    for (StandardStrategy kind : {StandardStrategy::kDataParallel, StandardStrategy::kOneWeirdTrick}) {
      auto strategy = MakeStandardStrategy(c.forward, kind, world->size());
      REQUIRE(strategy.ok());
      const std::string text = StrategyToText(*strategy);
      INFO(s.name << " rank " << world->rank() << ":\n" << text);
      const testing::StepResults mine = OnThisRank(c, text, testing::ZooSteps(c));
      auto in_process = testing::RunOnDevices(c, text, testing::ZooSteps(c), kSeed);
      REQUIRE(in_process.status().ToString() == "OK");
      CHECK(testing::FirstMismatch(*in_process, mine, 0.0) == "");
    }
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  auto communicator = loom::MpiCommunicator::World();
  if (!communicator.ok()) {
    std::fprintf(stderr, "%s\n", communicator.status().ToString().c_str());
    return 1;
  }
  loom::world = communicator->get();
  const int failed = Catch::Session().run(argc, argv);
  communicator->reset();
  loom::FinalizeMpi();
  return failed == 0 ? 0 : 1;
}
