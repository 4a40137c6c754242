// Inception-v3 as torchvision builds it: parameter counts (with and without
// the auxiliary classifier), parameter names and shapes against
// torchvision's, output shapes, the auxiliary loss in training mode only,
// and argument and input-size errors.
#include "models/inception.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "graph/training.h"
#include "models/model_test_util.h"
#include "models/width.h"
#include "models/zoo.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::ParameterCount;
using testing::ParameterNames;
using testing::ParameterShapes;
using testing::RandomInput;

// torchvision 0.14: inception_v3(weights=None, aux_logits=True,
// init_weights=False): sum(p.numel() for p in m.parameters()) over 292
// tensors; aux_logits=False leaves 284.
constexpr int64_t kTorchvisionParams = 27161264;
constexpr int64_t kTorchvisionParamsNoAux = 23834568;

TEST_CASE("inception_v3 has torchvision's parameter count, names and shapes") {
  Model m;  // training mode: AuxLogits is built
  const Status built = BuildClassifier(m, "inception_v3", {}, {3, 299, 299}, 2, 1000);
  INFO(built.ToString());
  REQUIRE(built.ok());
  CHECK(ParameterCount(m.graph()) == kTorchvisionParams);
  const std::map<std::string, Shape> shapes = ParameterShapes(m.graph());
  CHECK(shapes.size() == 292);
  // From torchvision's named_parameters() ("." written "/").
  const std::vector<std::pair<std::string, Shape>> torchvision = {
      {"Conv2d_1a_3x3/conv/weight", {32, 3, 3, 3}},
      {"Conv2d_1a_3x3/bn/weight", {32}},
      {"Conv2d_1a_3x3/bn/bias", {32}},
      {"Conv2d_2a_3x3/conv/weight", {32, 32, 3, 3}},
      {"Conv2d_2b_3x3/conv/weight", {64, 32, 3, 3}},
      {"Conv2d_3b_1x1/conv/weight", {80, 64, 1, 1}},
      {"Conv2d_4a_3x3/conv/weight", {192, 80, 3, 3}},
      {"Mixed_5b/branch1x1/conv/weight", {64, 192, 1, 1}},
      {"Mixed_5b/branch5x5_1/conv/weight", {48, 192, 1, 1}},
      {"Mixed_5b/branch5x5_2/conv/weight", {64, 48, 5, 5}},
      {"Mixed_5b/branch3x3dbl_1/conv/weight", {64, 192, 1, 1}},
      {"Mixed_5b/branch3x3dbl_2/conv/weight", {96, 64, 3, 3}},
      {"Mixed_5b/branch3x3dbl_3/conv/weight", {96, 96, 3, 3}},
      {"Mixed_5b/branch_pool/conv/weight", {32, 192, 1, 1}},
      {"Mixed_5d/branch_pool/bn/weight", {64}},
      {"Mixed_6a/branch3x3/conv/weight", {384, 288, 3, 3}},
      {"Mixed_6a/branch3x3dbl_1/conv/weight", {64, 288, 1, 1}},
      {"Mixed_6a/branch3x3dbl_2/conv/weight", {96, 64, 3, 3}},
      {"Mixed_6a/branch3x3dbl_3/conv/weight", {96, 96, 3, 3}},
      {"Mixed_6b/branch7x7_2/conv/weight", {128, 128, 1, 7}},
      {"Mixed_6c/branch7x7dbl_3/conv/weight", {160, 160, 1, 7}},
      {"Mixed_6e/branch1x1/conv/weight", {192, 768, 1, 1}},
      {"Mixed_6e/branch7x7_1/conv/weight", {192, 768, 1, 1}},
      {"Mixed_6e/branch7x7_2/conv/weight", {192, 192, 1, 7}},
      {"Mixed_6e/branch7x7_3/conv/weight", {192, 192, 7, 1}},
      {"Mixed_6e/branch7x7dbl_1/conv/weight", {192, 768, 1, 1}},
      {"Mixed_6e/branch7x7dbl_2/conv/weight", {192, 192, 7, 1}},
      {"Mixed_6e/branch7x7dbl_3/conv/weight", {192, 192, 1, 7}},
      {"Mixed_6e/branch7x7dbl_4/conv/weight", {192, 192, 7, 1}},
      {"Mixed_6e/branch7x7dbl_5/conv/weight", {192, 192, 1, 7}},
      {"Mixed_6e/branch_pool/conv/weight", {192, 768, 1, 1}},
      {"AuxLogits/conv0/conv/weight", {128, 768, 1, 1}},
      {"AuxLogits/conv1/conv/weight", {768, 128, 5, 5}},
      {"AuxLogits/conv1/bn/bias", {768}},
      {"AuxLogits/fc/weight", {1000, 768}},
      {"AuxLogits/fc/bias", {1000}},
      {"Mixed_7a/branch3x3_1/conv/weight", {192, 768, 1, 1}},
      {"Mixed_7a/branch3x3_2/conv/weight", {320, 192, 3, 3}},
      {"Mixed_7a/branch7x7x3_1/conv/weight", {192, 768, 1, 1}},
      {"Mixed_7a/branch7x7x3_2/conv/weight", {192, 192, 1, 7}},
      {"Mixed_7a/branch7x7x3_3/conv/weight", {192, 192, 7, 1}},
      {"Mixed_7a/branch7x7x3_4/conv/weight", {192, 192, 3, 3}},
      {"Mixed_7b/branch3x3dbl_3b/conv/weight", {384, 384, 3, 1}},
      {"Mixed_7c/branch1x1/conv/weight", {320, 2048, 1, 1}},
      {"Mixed_7c/branch3x3_1/conv/weight", {384, 2048, 1, 1}},
      {"Mixed_7c/branch3x3_2a/conv/weight", {384, 384, 1, 3}},
      {"Mixed_7c/branch3x3_2b/conv/weight", {384, 384, 3, 1}},
      {"Mixed_7c/branch3x3dbl_1/conv/weight", {448, 2048, 1, 1}},
      {"Mixed_7c/branch3x3dbl_2/conv/weight", {384, 448, 3, 3}},
      {"Mixed_7c/branch3x3dbl_3a/conv/weight", {384, 384, 1, 3}},
      {"Mixed_7c/branch3x3dbl_3b/conv/weight", {384, 384, 3, 1}},
      {"Mixed_7c/branch_pool/conv/weight", {192, 2048, 1, 1}},
      {"Mixed_7c/branch_pool/bn/bias", {192}},
      {"fc/weight", {1000, 2048}},
      {"fc/bias", {1000}},
  };
  for (const auto& [name, shape] : torchvision) {
    INFO(name);
    REQUIRE(shapes.count(name) == 1);
    CHECK(shapes.at(name) == shape);
  }
  // BasicConv2d: no conv bias; BatchNorm running statistics are buffers.
  CHECK(shapes.count("Conv2d_1a_3x3/conv/bias") == 0);
  CHECK(shapes.count("Conv2d_1a_3x3/bn/running_mean") == 0);
  int64_t convs = 0, norms = 0;
  for (const auto& [name, shape] : shapes) {
    convs += name.size() > 12 && name.compare(name.size() - 12, 12, "/conv/weight") == 0;
    norms += name.size() > 8 && name.compare(name.size() - 8, 8, "/bn/bias") == 0;
  }
  CHECK(convs == 96);  // torchvision: 96 BasicConv2d modules (nn.Conv2d), AuxLogits' 2 included
  CHECK(norms == 96);
}

TEST_CASE("inception_v3 without the auxiliary classifier, or in evaluation mode, has torchvision's no-aux count") {
  {
    Model m;
    REQUIRE(BuildClassifier(m, "inception_v3", {{"aux_logits", "0"}}, {3, 299, 299}, 1, 1000).ok());
    CHECK(ParameterCount(m.graph()) == kTorchvisionParamsNoAux);
    CHECK(ParameterNames(m.graph()).size() == 284);
    CHECK(m.graph().outputs().count(kAuxLossOutput) == 0);
  }
  {
    // torchvision never runs AuxLogits in eval(); loom does not build it.
    Model m;
    m.set_training(false);
    REQUIRE(BuildClassifier(m, "inception_v3", {}, {3, 299, 299}, 2, 1000).ok());
    CHECK(ParameterCount(m.graph()) == kTorchvisionParamsNoAux);
    CHECK(m.graph().outputs().count(kAuxLossOutput) == 0);
  }
  {
    // 10 classes: both classifiers shrink (torchvision: 24,371,444).
    Model m;
    REQUIRE(BuildClassifier(m, "inception_v3", {}, {3, 299, 299}, 2, 10).ok());
    CHECK(ParameterCount(m.graph()) == 24371444);
  }
}

TEST_CASE("inception_v3's feature maps have torchvision's shapes at 299x299 (evaluation mode)") {
  Model m;
  m.set_training(false);
  auto r = InceptionV3(m, m.input("input", {1, 3, 299, 299}), {});
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(m.shape(r->logits) == Shape({1, 1000}));
  CHECK_FALSE(r->aux_logits.valid());
  // The shapes torchvision's Inception3._forward lists in its comments.
  const std::map<std::string, Shape> want = {
      {"Conv2d_1a_3x3/conv", {1, 32, 149, 149}}, {"Conv2d_2a_3x3/conv", {1, 32, 147, 147}},
      {"Conv2d_2b_3x3/conv", {1, 64, 147, 147}}, {"maxpool1", {1, 64, 73, 73}},
      {"Conv2d_3b_1x1/conv", {1, 80, 73, 73}},   {"Conv2d_4a_3x3/conv", {1, 192, 71, 71}},
      {"maxpool2", {1, 192, 35, 35}},            {"Mixed_7a/branch3x3_2/conv", {1, 320, 8, 8}},
      {"Mixed_7c/branch_pool/conv", {1, 192, 8, 8}}, {"avgpool", {1, 2048, 1, 1}},
  };
  std::set<std::string> seen;
  for (const Node& n : m.graph().nodes()) {
    auto it = want.find(n.name);
    if (it == want.end()) continue;
    INFO(n.name);
    CHECK(m.graph().type(n.outputs[0]).shape == it->second);
    seen.insert(n.name);
  }
  CHECK(seen.size() == want.size());
  // Each Mixed block's output: the concatenation of its branches.
  int64_t mixed = 0;
  const std::map<std::string, Shape> blocks = {{"Mixed_5b", {1, 256, 35, 35}}, {"Mixed_5d", {1, 288, 35, 35}},
                                               {"Mixed_6a", {1, 768, 17, 17}}, {"Mixed_6e", {1, 768, 17, 17}},
                                               {"Mixed_7a", {1, 1280, 8, 8}},  {"Mixed_7b", {1, 2048, 8, 8}},
                                               {"Mixed_7c", {1, 2048, 8, 8}}};
  for (NodeId id : m.graph().NodesWithOp("Concat")) {
    const Node& n = m.graph().node(id);
    const Shape& s = m.graph().type(n.outputs[0]).shape;
    for (const auto& [block, shape] : blocks) {
      // The block's last Concat takes 4 (A, C, E) or 3 (B, D) branches.
      if (n.name.rfind(block + "/", 0) == 0 && s == shape) ++mixed;
    }
  }
  CHECK(mixed == 7);
}

TEST_CASE("inception_v3 runs forward at 299x299 in evaluation mode") {
  Model m;
  m.set_training(false);
  REQUIRE(BuildClassifier(m, "inception_v3", {}, {3, 299, 299}, 1, 1000).ok());
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  Tensor target = Tensor::Zeros({1}, DType::kI64);
  // Well under a second on the CPU (the reason this test can run at 299).
  auto out = (*exec)->Run({{"input", RandomInput({1, 3, 299, 299}, DType::kF32, 1)}, {"target", target}});
  if (!out.ok()) FAIL(out.status().ToString());
  CHECK(out->at("logits").shape() == Shape({1, 1000}));
  for (double v : out->at("logits").ToDoubleVector()) CHECK(std::isfinite(v));
}


// A reduced Inception-v3 (width_mult 1/16) at 299x299, the smallest input with
// which the auxiliary head runs: float64, dropout off, so each run is a
// function of the seed and the batch.
std::map<std::string, Tensor> RunSmall(const std::map<std::string, std::string>& extra, bool training) {
  std::map<std::string, std::string> args = {{"width_mult", "0.0625"}, {"dropout", "0"}};
  args.insert(extra.begin(), extra.end());
  Model m(DType::kF64);
  m.set_training(training);
  const Status built = BuildClassifier(m, "inception_v3", args, {3, 299, 299}, 2, 5);
  INFO(built.ToString());
  REQUIRE(built.ok());
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(3).ok());
  auto out = (*exec)->Run({{"input", RandomInput({2, 3, 299, 299}, DType::kF64, 4)},
                           {"target", Tensor::FromVector<int64_t>({2}, {1, 4})}});
  if (!out.ok()) FAIL(out.status().ToString());
  return *out;
}

// Mean cross-entropy of logits [B, C] against targets, computed here.
double CrossEntropy(const Tensor& logits, const std::vector<int64_t>& targets) {
  const std::vector<double> v = logits.ToDoubleVector();
  const int64_t classes = logits.shape()[1];
  double total = 0;
  for (size_t b = 0; b < targets.size(); ++b) {
    double mx = -1e300, sum = 0;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, v[b * classes + c]);
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(v[b * classes + c] - mx);
    total += mx + std::log(sum) - v[b * classes + targets[b]];
  }
  return total / static_cast<double>(targets.size());
}

TEST_CASE("inception_v3's aux loss: training mode only, aux_weight x its cross-entropy, added to the loss") {
  const auto train = RunSmall({}, true);
  REQUIRE(train.count(kAuxLossOutput) == 1);
  const double aux = train.at(kAuxLossOutput).ScalarAt(0);
  CHECK(std::isfinite(aux));
  CHECK(aux > 0);
  // loss = CE(logits) + aux_loss (torchvision's recipe: loss1 + 0.4 * loss2).
  CHECK(train.at("loss").ScalarAt(0) == Approx(CrossEntropy(train.at("logits"), {1, 4}) + aux).epsilon(1e-12));
  // The same parameters with twice the weight: twice the aux loss.
  const auto doubled = RunSmall({{"aux_weight", "0.8"}}, true);
  CHECK(doubled.at(kAuxLossOutput).ScalarAt(0) == Approx(2 * aux).epsilon(1e-12));
  // Off: no aux loss, and the loss is the cross-entropy alone.
  const auto off = RunSmall({{"aux_logits", "0"}}, true);
  CHECK(off.count(kAuxLossOutput) == 0);
  CHECK(off.at("loss").ScalarAt(0) == Approx(CrossEntropy(off.at("logits"), {1, 4})).epsilon(1e-12));
  // Evaluation mode: no aux head at all.
  const auto eval = RunSmall({}, false);
  CHECK(eval.count(kAuxLossOutput) == 0);
  CHECK(eval.at("logits").shape() == Shape({2, 5}));
}

TEST_CASE("training inception_v3 with the aux head at batch 1 is an error naming the layer, as in torchvision") {
  // AuxLogits/conv1's BatchNorm would see one value per channel.
  Model one;
  const Status s = BuildClassifier(one, "inception_v3", {}, {3, 299, 299}, 1, 1000);
  CHECK_THAT(s.message(), Catch::Contains("AuxLogits/conv1"));
  CHECK_THAT(s.message(), Catch::Contains("more than one value per channel"));
  Model no_aux;
  CHECK(BuildClassifier(no_aux, "inception_v3", {{"aux_logits", "0"}}, {3, 299, 299}, 1, 1000).ok());
  Model two;
  REQUIRE(BuildClassifier(two, "inception_v3", {}, {3, 299, 299}, 2, 1000).ok());
  CHECK(ParameterCount(two.graph()) == kTorchvisionParams);
  CHECK(two.graph().outputs().count(kAuxLossOutput) == 1);
}

TEST_CASE("inception_v3 channels scale with width_mult, rounded, at least 1") {
  CHECK(ScaledChannels(192, 1.0) == 192);
  CHECK(ScaledChannels(192, 0.0625) == 12);
  CHECK(ScaledChannels(48, 0.0625) == 3);
  CHECK(ScaledChannels(80, 0.0625) == 5);
  CHECK(ScaledChannels(32, 0.01) == 1);
  Model m;
  m.set_training(false);
  REQUIRE(BuildClassifier(m, "inception_v3", {{"width_mult", "0.0625"}}, {3, 75, 75}, 1, 5).ok());
  // Mixed_7c: 320 + 2 * 384 + 2 * 384 + 192 = 2048 channels at full width;
  // at 1/16: 20 + 2 * 24 + 2 * 24 + 12 = 128 into fc.
  for (NodeId id : m.graph().NodesWithOp(kParameterOp)) {
    const Node& n = m.graph().node(id);
    if (n.name == "fc/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({5, 128}));
    if (n.name == "Conv2d_1a_3x3/conv/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({2, 3, 3, 3}));
  }
}

TEST_CASE("inception_v3 rejects bad arguments and too-small images, naming them") {
  struct Bad {
    std::map<std::string, std::string> args;
    Shape input;
    bool training;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{{"aux_logits", "2"}}, {3, 299, 299}, true, "argument aux_logits: must be 0 or 1, got 2"},
      {{{"aux_weight", "-0.1"}}, {3, 299, 299}, true, "argument aux_weight: must be >= 0"},
      {{{"dropout", "1"}}, {3, 299, 299}, true, "argument dropout: must be in [0, 1), got 1"},
      {{{"width_mult", "0"}}, {3, 299, 299}, true, "argument width_mult: must be > 0, got 0"},
      {{{"width_mult", "x"}}, {3, 299, 299}, true, "argument width_mult: 'x' is not a number"},
      {{{"aux", "1"}}, {3, 299, 299}, true, "has no argument 'aux'"},
      {{}, {3, 74, 75}, false, "at least 75x75 (torchvision's minimum), got 74x75"},
      {{{"aux_logits", "0"}}, {3, 299, 60}, true, "got 299x60"},
      {{}, {3, 298, 298}, true, "at least 299x299 (a 17x17 Mixed_6e output), got 298x298; set aux_logits=0"},
      {{}, {299, 299}, false, "needs [batch, channels, height, width] images"},
  };
  for (const Bad& b : bad) {
    INFO(b.message);
    Model m;
    m.set_training(b.training);
    const Status s = BuildClassifier(m, "inception_v3", b.args, b.input, 2, 10);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains(b.message));
  }
  // The limits themselves build: 75x75 in eval mode or without the aux head,
  // 299x299 with it.
  for (const auto& [args, size, training] :
       std::vector<std::tuple<std::map<std::string, std::string>, int64_t, bool>>{
           {{}, 75, false}, {{{"aux_logits", "0"}}, 75, true}, {{}, 299, true}}) {
    Model m;
    m.set_training(training);
    const Status s = BuildClassifier(m, "inception_v3", args, {3, size, size}, 2, 10);
    INFO(size << " training " << training << ": " << s.ToString());
    CHECK(s.ok());
  }
}


TEST_CASE("one SGD step at width 1/16 trains the aux head and lowers the loss") {
  Model m;
  REQUIRE(BuildClassifier(m, "inception_v3", {{"width_mult", "0.0625"}, {"dropout", "0"}}, {3, 299, 299}, 2, 5).ok());
  StepOptimizer opt;  // plain SGD
  auto g = BuildTrainingGraph(m.graph(), "loss", opt);
  REQUIRE(g.ok());
  auto e = Executor::Create(*g);
  REQUIRE(e.ok());
  REQUIRE((*e)->InitializeState(1).ok());
  auto aux_fc = [&] { return (*e)->GetState("AuxLogits/fc/weight")->ToDoubleVector(); };
  const std::vector<double> aux_before = aux_fc();
  const std::map<std::string, Tensor> feeds = {{"input", RandomInput({2, 3, 299, 299}, DType::kF32, 5)},
                                               {"target", Tensor::FromVector<int64_t>({2}, {0, 3})},
                                               {"lr", Tensor::FromVector<float>({}, {0.01f})},
                                               {"step", Tensor::FromVector<float>({}, {1})}};
  auto first = (*e)->Run(feeds);
  REQUIRE(first.ok());
  auto second = (*e)->Run(feeds);  // reports the loss after the first update
  REQUIRE(second.ok());
  CHECK(aux_fc() != aux_before);  // the aux loss reaches AuxLogits
  const double before = first->at("loss").ScalarAt(0), after = second->at("loss").ScalarAt(0);
  INFO("loss " << before << " -> " << after);
  CHECK(std::isfinite(before));
  CHECK(after < before);
}

}  // namespace
}  // namespace loom::models
