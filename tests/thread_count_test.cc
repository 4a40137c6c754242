// Results never depend on the thread count (docs/reliability.md: a resume
// may change `threads`; the harness checks the same for single ops, but at
// sizes too small for most kernels to split). Zoo models at sizes where the
// kernels do split (row tiles and batches of convolutions, blocked GEMMs,
// parallel reductions and norms, the optimizer's chunks) take two training
// steps from one initial state on pools of 1 to 4 threads; the losses and
// every state tensor afterwards must be the same bits, for single models and
// fused arrays of replicas.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "graph/fusion.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

using testing::Features;
using testing::Tokens;
using testing::ZooBatch;

struct Case {
  std::string model;
  std::map<std::string, std::string> args;
  models::DataSpec data;
  int64_t batch;
  int replicas = 1;  // more: the model fused as that many replicas (graph/fusion.h)
};

std::vector<Case> Cases() {
  return {
      {"mlp", {{"hidden", "256"}}, Features({1, 28, 28}), 64},
      // A 32x32 stage in row tiles, 16x16 and smaller planes in batches of images.
      {"resnet18", {{"stem", "cifar"}, {"width", "16"}}, Features({3, 32, 32}), 3},
      // Depthwise and 1x1 convolutions, squeeze-excitation, hard activations.
      {"mobilenet_v3_large", {{"width_mult", "0.5"}, {"dropout", "0"}}, Features({3, 32, 32}), 4},
      {"transformer_lm",
       {{"width", "64"}, {"heads", "4"}, {"layers", "2"}, {"feedforward", "128"}, {"dropout", "0"}, {"max_len", "64"}},
       Tokens(48), 4},
      {"rnnlm", {{"embed", "32"}, {"hidden", "64"}, {"dropout", "0"}}, Tokens(24), 8},
      {"pointnet_cls", {{"dropout", "0"}}, Features({3, 256}), 4},
      // Batches smaller than some of the thread counts: kernels that split
      // images over threads split other work instead.
      {"vgg16", {{"width_mult", "0.25"}, {"hidden", "64"}, {"dropout", "0"}}, Features({3, 32, 32}), 1},
      {"alexnet", {{"width_mult", "0.25"}, {"hidden", "64"}, {"dropout", "0"}}, Features({3, 63, 63}), 2},
      {"mobilenet_v2", {{"width_mult", "0.5"}, {"dropout", "0"}}, Features({3, 32, 32}), 2},
      {"inception_v3", {{"width_mult", "0.0625"}, {"dropout", "0"}}, Features({3, 299, 299}), 2},
      {"bert_medium",
       {{"layers", "2"}, {"hidden", "64"}, {"heads", "4"}, {"intermediate", "128"}, {"max_positions", "64"},
        {"dropout", "0"}},
       Tokens(32), 3},
      {"nmt", {{"embed", "32"}, {"hidden", "64"}, {"dropout", "0"}}, Tokens(16), 3},
      // Fused arrays: grouped convolutions, batched GEMMs, per-replica
      // norms, losses and updates, the divergence check.
      {"resnet18", {{"stem", "cifar"}, {"width", "8"}}, Features({3, 32, 32}), 2, 3},
      {"mobilenet_v3_large", {{"width_mult", "0.25"}, {"dropout", "0"}}, Features({3, 32, 32}), 3, 3},
      {"mlp", {{"hidden", "128"}}, Features({1, 28, 28}), 32, 3},
      {"transformer_lm",
       {{"width", "32"}, {"heads", "2"}, {"layers", "1"}, {"feedforward", "64"}, {"dropout", "0"}, {"max_len", "32"}},
       Tokens(24), 2, 3},
  };
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, Tensor> state;
};

// The model's training step, or that of `replicas` fused replicas.
StatusOr<Graph> TrainingStep(const Graph& model, const StepOptimizer& opt, int replicas) {
  if (replicas == 1) return BuildTrainingGraph(model, "loss", opt);
  std::vector<uint64_t> seeds;
  for (int r = 0; r < replicas; ++r) seeds.push_back(11 + r);
  LOOM_ASSIGN_OR_RETURN(Graph fused, FuseReplicas(model, FusionOptions{replicas, seeds, {}, {}}));
  return BuildFusedTrainingGraph(fused, "loss", std::vector<StepOptimizer>(replicas, opt), true);
}

Trained TrainTwoSteps(const Graph& train, const std::map<std::string, Tensor>& batch, int replicas, int threads) {
  auto pool = ThreadPool::Create(threads);
  REQUIRE(pool.ok());
  ExecutorOptions options;
  options.pool = pool->get();
  options.seed = 7;
  auto e = Executor::Create(train, options);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  REQUIRE((*e)->InitializeState(1).ok());
  std::map<std::string, Tensor> feeds = batch;
  const DType dtype = train.type(train.node(*train.FindNode(kLearningRateInput)).outputs[0]).dtype;
  if (replicas == 1) {
    feeds[kLearningRateInput] = *Tensor::FromVector<double>({}, {0.05}).Cast(dtype);
  } else {  // a learning rate per replica
    std::vector<double> lrs;
    for (int r = 0; r < replicas; ++r) lrs.push_back(0.02 * (r + 1));
    feeds[kLearningRateInput] = *Tensor::FromVector<double>({replicas}, lrs).Cast(dtype);
    feeds["replica_mask"] = *Tensor::FromVector<double>({replicas}, std::vector<double>(replicas, 1.0)).Cast(dtype);
  }
  Trained t;
  for (int step = 1; step <= 2; ++step) {
    feeds[kStepInput] = *Tensor::FromVector<double>({}, {double(step)}).Cast(dtype);
    auto out = (*e)->Run(feeds);
    INFO(out.status().ToString());
    REQUIRE(out.ok());
    const std::vector<double> losses = out->at("loss").ToDoubleVector();
    t.losses.insert(t.losses.end(), losses.begin(), losses.end());
  }
  t.state = (*e)->state();
  return t;
}

TEST_CASE("zoo models train to the same bits on 1, 2, 3 and 4 threads") {
  for (const Case& c : Cases()) {
    DYNAMIC_SECTION(c.model << " x " << c.replicas) {
      Model m;
      const Status built = models::BuildSupervised(m, c.model, c.args, c.data, c.batch);
      INFO(built.ToString());
      REQUIRE(built.ok());
      StepOptimizer opt;
      opt.config.set_type("sgd");
      opt.config.set_momentum(0.9);
      const StatusOr<Graph> train = TrainingStep(m.graph(), opt, c.replicas);
      INFO(train.status().ToString());
      REQUIRE(train.ok());
      const std::map<std::string, Tensor> batch = ZooBatch(c.data, DType::kF32, c.batch);
      const Trained one = TrainTwoSteps(*train, batch, c.replicas, 1);
      for (int threads : {2, 3, 4}) {
        const Trained other = TrainTwoSteps(*train, batch, c.replicas, threads);
        INFO(c.model << " on " << threads << " threads against 1");
        CHECK(other.losses == one.losses);
        for (const auto& [name, value] : one.state)
          testing::CheckBitwiseEqual("state " + name, value, other.state.at(name));
      }
    }
  }
}

}  // namespace
}  // namespace loom
