// Every zoo model at a reduced size (tests/small_zoo.h), trained under the
// standard strategies and random valid ones on CPU devices of this
// process: the same losses, parameters and optimizer state as one device
// (f64). Without BatchNorm: 3 steps, 1e-9 relative (only summation orders
// differ). With BatchNorm, statistics over the batch of 2 amplify those
// differences, more with every step: there 1 step, 1e-4; a wrong split is
// off by 1e-2 and more. ResNet-101 at a batch of 2 reached 1.003e-4 (its
// BatchNorm over 1x1 and 2x2 planes: two to eight values per channel) and
// so trains with a batch of 8, where it differs by 1e-9-3e-9. AlexNet and
// VGG-16 train at 1/8 of their width with 16 hidden units; the GAN's two
// steps each under the strategies.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "graph/model.h"
#include "graph/strategy.h"
#include "models/zoo.h"
#include "runtime/fold_activations.h"
#include "search/baselines.h"
#include "tests/parallel_check.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

using testing::FirstMismatch;
using testing::LowerStrategy;
using testing::RandomStrategy;
using testing::RunOnDevices;
using testing::RunOneDevice;
using testing::StepCase;
using testing::StepResults;

void CheckStrategy(const StepCase& c, const StepResults& want, const std::string& strategy) {
  INFO(strategy);
  auto got = RunOnDevices(c, strategy, testing::ZooSteps(c), 5);
  if (!got.ok()) FAIL(got.status().ToString());
  CHECK(FirstMismatch(want, *got, testing::ZooTolerance(c)) == "");
}

// `count` random strategies that fit the model's shapes.
void CheckRandomStrategies(const StepCase& c, const StepResults& want, int count, std::mt19937_64& rng) {
  int found = 0;
  for (int attempt = 0; found < count && attempt < 100; ++attempt) {
    const std::string s = RandomStrategy(c.forward, 3, rng);
    if (!LowerStrategy(c, s).ok()) continue;
    ++found;
    CheckStrategy(c, want, s);
  }
  CHECK(found == count);
}

// dp, owt and model over 2 devices, every layer that can split its
// parameters (or its rows) in 2, and 3 random strategies.
void CheckStandardAndRandom(const StepCase& c, std::mt19937_64& rng) {
  auto want = RunOneDevice(c, testing::ZooSteps(c), 5);
  if (!want.ok()) FAIL(want.status().ToString());
  for (StandardStrategy kind :
       {StandardStrategy::kDataParallel, StandardStrategy::kOneWeirdTrick, StandardStrategy::kModelParallel}) {
    auto strategy = MakeStandardStrategy(c.forward, kind, 2);
    if (!strategy.ok()) FAIL(strategy.status().ToString());
    CheckStrategy(c, *want, StrategyToText(*strategy));
  }
  for (const char* dim : {"parameter", "attribute"})
    CheckStrategy(c, *want, StrCat("devices: 2\ndefault_split { ", dim, ": 2 }\n"));
  CheckRandomStrategies(c, *want, 3, rng);
}

TEST_CASE("every zoo model trains under dp, owt, model, parameter, attribute and random strategies as on one device") {
  std::mt19937_64 rng(17);
  for (const testing::SmallModel& s : testing::SmallModels()) {
    if (testing::IsGan(s)) continue;  // GANs: two steps (below)
    INFO(s.name);
    CheckStandardAndRandom(testing::ZooStepCase(s, std::nullopt), rng);
  }
}

// A GAN's steps (discriminator and generator, each training its own
// network) are two graphs: each under the strategies above, and fused as 2
// replicas split over 2 devices.
TEST_CASE("each zoo GAN's two steps train under dp, owt, model, parameter, attribute, replica and random strategies "
          "as on one device") {
  std::mt19937_64 rng(23);
  for (const testing::SmallModel& s : testing::SmallModels()) {
    if (!testing::IsGan(s)) continue;
    for (models::GanStep step : {models::GanStep::kDiscriminator, models::GanStep::kGenerator}) {
      INFO(s.name << (step == models::GanStep::kDiscriminator ? " discriminator step" : " generator step"));
      CheckStandardAndRandom(testing::GanStepCase(s, step, std::nullopt), rng);

      const StepCase fused = testing::GanStepCase(s, step, FusionOptions{2, {7, 8}, {}, {}});
      auto fused_want = RunOneDevice(fused, testing::ZooSteps(fused), 5);
      if (!fused_want.ok()) FAIL(fused_want.status().ToString());
      auto strategy = MakeStandardStrategy(fused.forward, StandardStrategy::kReplicaParallel, 2);
      if (!strategy.ok()) FAIL(strategy.status().ToString());
      CheckStrategy(fused, *fused_want, StrategyToText(*strategy));
    }
  }
}

// A small convolutional step in f64 (batch 8): conv, BatchNorm (gamma 3,
// so that ReLU6 clamps at 6 too, and Hardswish passes -3 and 3),
// `activation` ("relu", "relu6", "hardswish") unless
// `epilogue` makes it the BatchNorm's own, then a classifier.
StepCase ConvBatchNormReluCase(bool epilogue, const std::string& activation = "relu") {
  Model m(DType::kF64);
  Sym x = m.input("input", {8, 2, 6, 6});
  BatchNormOptions bn;
  bn.weight_init = InitConstant(3);
  Sym h = m.batch_norm(m.conv2d(x, 4, {3, 3}, {}, "conv"), bn, "bn");
  if (!epilogue) h = activation == "relu" ? m.relu(h) : activation == "relu6" ? m.relu6(h) : m.hardswish(h);
  m.set_output("loss", m.cross_entropy(m.linear(m.flatten(h), 4, {}, "fc"), m.input("target", {8}, DType::kI64)));
  REQUIRE(m.status().ok());
  Graph model = m.graph();
  if (epilogue) model.mutable_node(*model.FindNode("bn")).attrs.Set("activation", activation.c_str());
  std::mt19937_64 rng(11);
  Tensor input = Tensor::Zeros({8, 2, 6, 6}, DType::kF64), target = Tensor::Zeros({8}, DType::kI64);
  for (int64_t i = 0; i < input.numel(); ++i)
    input.data<double>()[i] = static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
  for (int64_t i = 0; i < target.numel(); ++i) target.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = testing::MakeStepCase(model, std::nullopt, {{"input", input}, {"target", target}});
  REQUIRE(c.ok());
  return *c;
}

// Compute tasks of `op` with attr activation `activation` when `c` is
// lowered under data parallelism over 2.
int DataParallelTasksOf(const StepCase& c, const std::string& op, const std::string& activation = "none") {
  auto dp = MakeStandardStrategy(c.forward, StandardStrategy::kDataParallel, 2);
  REQUIRE(dp.ok());
  auto tg = LowerStrategy(c, StrategyToText(*dp));
  REQUIRE(tg.ok());
  int count = 0;
  for (const Task& t : tg->tasks) {
    if (t.kind != TaskKind::kCompute) continue;
    const Node& n = tg->graph.node(t.node);
    count += n.op == op && n.attrs.Str("activation", "none") == activation;
  }
  return count;
}

// A BatchNorm with its ReLU epilogue (what the CPU executor folds a
// following ReLU into; a user's graph may hold it too) splits as the two
// ops would; along the batch its expansion's BatchNormApply does the ReLU.
TEST_CASE("a BatchNorm with the ReLU epilogue trains under the strategies as on one device") {
  for (const std::string activation : {"relu", "relu6", "hardswish"}) {
    INFO(activation);
    const StepCase c = ConvBatchNormReluCase(true, activation);
    std::mt19937_64 rng(11);
    CheckStandardAndRandom(c, rng);
    CHECK(DataParallelTasksOf(c, "BatchNormApply", activation) == 2);
    CHECK(DataParallelTasksOf(c, "ReLU") == 0);
  }
}

// The executor's folded step (runtime/fold_activations.h: BatchNorm and
// BatchNormBackward doing the ReLU's work), as the task runtime on CPU
// devices runs it, lowered under the strategies: along the batch the
// expansions' parts do the ReLU's work too.
TEST_CASE("a step with its ReLUs folded into the BatchNorms trains under the strategies as on one device") {
  for (const std::string activation : {"relu", "relu6", "hardswish"}) {
    INFO(activation);
    StepCase c = ConvBatchNormReluCase(false, activation);
    REQUIRE(FoldActivationsIntoBatchNorm(&c.step) == 2);
    std::mt19937_64 rng(13);
    CheckStandardAndRandom(c, rng);
    CHECK(DataParallelTasksOf(c, "BatchNormApply", activation) == 2);
    CHECK(DataParallelTasksOf(c, "BatchNormBackwardStats", activation) == 2);
    CHECK(DataParallelTasksOf(c, "BatchNormBackwardApply", activation) == 2);
    CHECK(DataParallelTasksOf(c, "ReLU") == 0);
    CHECK(DataParallelTasksOf(c, "ReLUBackward") == 0);
    CHECK(DataParallelTasksOf(c, "ReLU6") == 0);
    CHECK(DataParallelTasksOf(c, "ReLU6Backward") == 0);
    CHECK(DataParallelTasksOf(c, "Hardswish") == 0);
    CHECK(DataParallelTasksOf(c, "HardswishBackward") == 0);
  }
}

// Operation parallelism: each branch of every Inception block on a device
// of its own (first match wins: the double-3x3 branch before the 3x3).
TEST_CASE("inception_v3 with its blocks' branches on different devices matches one device") {
  for (const testing::SmallModel& s : testing::SmallModels()) {
    if (s.name != "inception_v3") continue;
    const StepCase c = testing::ZooStepCase(s, std::nullopt);
    auto want = RunOneDevice(c, testing::ZooSteps(c), 5);
    if (!want.ok()) FAIL(want.status().ToString());
    const std::string strategy =
        "devices: 4\n"
        "layer { layer: \"*branch1x1*\" devices: 0 }\n"
        "layer { layer: \"*branch3x3dbl*\" devices: 2 }\n"
        "layer { layer: \"*branch7x7dbl*\" devices: 2 }\n"
        "layer { layer: \"*branch5x5*\" devices: 1 }\n"
        "layer { layer: \"*branch3x3*\" devices: 1 }\n"
        "layer { layer: \"*branch7x7*\" devices: 1 }\n"
        "layer { layer: \"*branch_pool*\" devices: 3 }\n";
    CheckStrategy(c, *want, strategy);
    auto tg = LowerStrategy(c, strategy);
    REQUIRE(tg.ok());
    std::set<int64_t> conv_devices;
    for (const Task& t : tg->tasks)
      if (t.kind == TaskKind::kCompute && tg->graph.node(t.node).op == "Conv2d") conv_devices.insert(t.device);
    CHECK(conv_devices == std::set<int64_t>{0, 1, 2, 3});
    return;
  }
  FAIL("inception_v3 is not in the small zoo");
}

TEST_CASE("every zoo model fused as 2 replicas splits them over 2 devices as on one device") {
  std::mt19937_64 rng(19);
  for (const testing::SmallModel& s : testing::SmallModels()) {
    if (testing::IsGan(s)) continue;
    INFO(s.name);
    FusionOptions fusion;
    fusion.replicas = 2;
    fusion.seeds = {7, 8};
    const StepCase c = testing::ZooStepCase(s, fusion);
    auto want = RunOneDevice(c, testing::ZooSteps(c), 5);
    if (!want.ok()) FAIL(want.status().ToString());
    auto strategy = MakeStandardStrategy(c.forward, StandardStrategy::kReplicaParallel, 2);
    if (!strategy.ok()) FAIL(strategy.status().ToString());
    CheckStrategy(c, *want, StrategyToText(*strategy));
    CheckRandomStrategies(c, *want, 1, rng);
  }
}

}  // namespace
}  // namespace loom
