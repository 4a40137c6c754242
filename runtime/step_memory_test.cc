// EstimateStepMemory against what the Executor really allocates: the CPU
// allocator's peak over Executor::Create + InitializeState + Run, for
// training graphs of the zoo's MLP and CNN (single, fused R = 1 and R = 3)
// and of a transformer block and an LSTM (whose backward kernels allocate
// scratch), fused R = 2. Equal to the byte.
#include "runtime/step_memory.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>

#include "core/rng.h"
#include "graph/fusion.h"
#include "graph/model.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "tests/small_nets.h"

namespace loom {
namespace {

// Every Input of `graph`: floats in [-1, 1), integers in [0, 4) (valid
// labels and token ids of the models below), lr 0.01, step 1, mask 1.
std::map<std::string, Tensor> Feeds(const Graph& graph) {
  std::map<std::string, Tensor> feeds;
  Rng rng(3);
  for (const Node& n : graph.nodes()) {
    if (n.op != kInputOp) continue;
    const TensorType& t = graph.type(n.outputs[0]);
    Tensor x = Tensor::Zeros(t.shape, t.dtype);
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (t.dtype == DType::kF32) x.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
      if (t.dtype == DType::kI64) x.data<int64_t>()[i] = rng.UniformInt(4);
    }
    feeds[n.name] = x;
  }
  if (feeds.count(kLearningRateInput)) feeds[kLearningRateInput].Fill(0.01);
  if (feeds.count(kStepInput)) feeds[kStepInput].Fill(1);
  if (feeds.count(kReplicaMaskInput)) feeds[kReplicaMaskInput].Fill(1);
  return feeds;
}

struct Measured {
  int64_t peak = 0;   // allocator peak above what was allocated before
  size_t step_bytes = 0;  // Executor::PeakStepBytes()
};

// The CPU allocator's peak over Create, the feeds, InitializeState and one
// Run (feeds made before InitializeState when feeds_first, after otherwise),
// then a second Run.
Measured Measure(const Graph& graph, bool feeds_first) {
  Allocator* cpu = GetAllocator(Device::Cpu()).value();
  const int64_t before = cpu->stats().current_bytes;
  cpu->ResetPeak();
  Measured m;
  {
    auto exec = Executor::Create(graph);
    REQUIRE(exec.ok());
    std::map<std::string, Tensor> feeds;
    if (feeds_first) feeds = Feeds(graph);
    REQUIRE((*exec)->InitializeState(1).ok());
    if (!feeds_first) feeds = Feeds(graph);
    for (int step = 0; step < 2; ++step) {
      auto out = (*exec)->Run(feeds);
      INFO(out.status().message());
      REQUIRE(out.ok());
    }
    m.step_bytes = (*exec)->PeakStepBytes();
  }
  m.peak = cpu->stats().peak_bytes - before;
  CHECK(cpu->stats().current_bytes == before);
  return m;
}

void CheckGraph(const std::string& label, const Graph& graph) {
  INFO(label);
  auto est = EstimateStepMemory(graph);
  REQUIRE(est.ok());
  const Measured feeds_first = Measure(graph, true);
  std::printf("%-40s estimate %10zu bytes (state %zu + arena %zu + inputs %zu + transient %zu), measured peak %lld\n",
              label.c_str(), est->total(), est->state_bytes, est->arena_bytes, est->input_bytes, est->transient_bytes,
              static_cast<long long>(feeds_first.peak));
  // Feeds alive from the start: the estimate is the peak, to the byte.
  CHECK(est->total() == static_cast<size_t>(feeds_first.peak));
  CHECK(est->arena_bytes + est->state_bytes == feeds_first.step_bytes);
  CHECK(est->state_bytes > 0);
  CHECK(est->arena_bytes > 0);
  CHECK(est->input_bytes > 0);
  // Feeds made after InitializeState (as loom train does): at most that.
  const Measured feeds_later = Measure(graph, false);
  CHECK(static_cast<size_t>(feeds_later.peak) <= est->total());
  CHECK(static_cast<size_t>(feeds_later.peak) >= est->state_bytes + est->arena_bytes + est->input_bytes);
}

Graph Fused(const Graph& forward, int replicas, const StepOptimizer& opt) {
  FusionOptions fo;
  fo.replicas = replicas;
  for (int r = 0; r < replicas; ++r) fo.seeds.push_back(static_cast<uint64_t>(r + 1));
  auto fused = FuseReplicas(forward, fo);
  REQUIRE(fused.ok());
  auto train = BuildFusedTrainingGraph(*fused, "loss", std::vector<StepOptimizer>(replicas, opt), true);
  INFO(train.status().message());
  REQUIRE(train.ok());
  return *train;
}

Graph Classifier(const std::string& name, const std::map<std::string, std::string>& args, const Shape& image,
                 int64_t batch) {
  Model m;
  Status s = models::BuildClassifier(m, name, args, image, batch, 10);
  INFO(s.message());
  REQUIRE(s.ok());
  return m.graph();
}

TEST_CASE("the estimate is the allocator's peak: MLP") {
  const Graph forward = Classifier("mlp", {{"hidden", "32,16"}, {"dropout", "0.1"}}, {1, 8, 8}, 8);
  StepOptimizer sgd;
  sgd.config.set_momentum(0.9);
  auto single = BuildTrainingGraph(forward, "loss", sgd);
  REQUIRE(single.ok());
  CheckGraph("mlp, single", *single);
  CheckGraph("mlp, fused R=1", Fused(forward, 1, sgd));
  CheckGraph("mlp, fused R=3", Fused(forward, 3, sgd));
}

TEST_CASE("the estimate is the allocator's peak: CNN") {
  const Graph forward = Classifier("cnn", {{"channels", "4,8"}, {"hidden", "16"}, {"dropout", "0.25"}}, {1, 8, 8}, 4);
  StepOptimizer adam;
  adam.config.set_type("adam");
  adam.config.set_clip_grad_norm(1.0);
  auto single = BuildTrainingGraph(forward, "loss", adam);
  REQUIRE(single.ok());
  CheckGraph("cnn, single", *single);
  CheckGraph("cnn, fused R=1", Fused(forward, 1, adam));
  CheckGraph("cnn, fused R=3", Fused(forward, 3, adam));
}

TEST_CASE("the estimate is the allocator's peak at the shipped configs' sizes") {
  // models/configs/fashion_mnist_{mlp,cnn}.pbtxt: batch 128, 28x28 images.
  StepOptimizer sgd;
  sgd.config.set_momentum(0.9);
  CheckGraph("fashion_mnist_mlp, fused R=4", Fused(Classifier("mlp", {{"hidden", "256,128"}}, {1, 28, 28}, 128), 4, sgd));
  StepOptimizer nesterov = sgd;
  nesterov.config.set_nesterov(true);
  nesterov.config.set_weight_decay(5e-4);
  CheckGraph("fashion_mnist_cnn, fused R=2",
             Fused(Classifier("cnn", {{"channels", "32,64"}, {"hidden", "128"}, {"dropout", "0.25"}}, {1, 28, 28}, 128), 2,
                   nesterov));
}

TEST_CASE("the estimate counts the scratch of the LSTM and attention backward kernels") {
  Model t;
  testing::TransformerBlock(t);
  REQUIRE(t.status().ok());
  Model l;
  testing::LstmClassifier(l);
  REQUIRE(l.status().ok());
  StepOptimizer sgd;
  sgd.config.set_momentum(0.9);
  CheckGraph("transformer block, fused R=2", Fused(t.graph(), 2, sgd));
  CheckGraph("lstm, fused R=2", Fused(l.graph(), 2, sgd));
}

TEST_CASE("on CUDA the host copies do not count and a feed's next copy does") {
  const Graph forward = Classifier("mlp", {{"hidden", "32"}}, {1, 8, 8}, 8);
  const Graph g = Fused(forward, 3, StepOptimizer{});
  auto cpu = EstimateStepMemory(g, Device::Cpu());
  auto cuda = EstimateStepMemory(g, Device::Cuda(0));
  REQUIRE(cpu.ok());
  REQUIRE(cuda.ok());
  CHECK(cuda->state_bytes == cpu->state_bytes);
  CHECK(cuda->arena_bytes == cpu->arena_bytes);
  CHECK(cuda->input_bytes == cpu->input_bytes);
  CHECK(cuda->transient_bytes == 8 * 64 * 4);                // the image batch [8, 1, 8, 8] f32
  CHECK(cpu->transient_bytes == 3 * 32 * 64 * 4);            // fc1/weight [3, 32, 64] f32
}

}  // namespace
}  // namespace loom
