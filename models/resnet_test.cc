// ResNet-18/101 as torchvision builds them: parameter counts and names, a
// forward pass and training steps through the executor, and horizontal
// fusion (R = 2) against separate models.
#include "models/resnet.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "core/rng.h"
#include "graph/fusion.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "models/model_test_util.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::ParameterCount;
using testing::FusedMismatch;
using testing::ParameterNames;
using testing::RunFusedAndSeparate;
using testing::RandomInput;

Tensor Scalar(double v) {
  Tensor t = Tensor::Zeros({}, DType::kF32);
  t.Fill(v);
  return t;
}

// image [batch, 3, size, size] -> "logits", and with "target" [batch] "loss".
void BuildClassifier(Model& m, const ResNetOptions& o, int64_t batch, int64_t size) {
  Sym image = m.input("input", {batch, 3, size, size});
  Sym label = m.input("target", {batch}, DType::kI64);
  Sym logits = ResNet(m, image, o);
  m.set_output("logits", logits);
  m.set_output("loss", m.cross_entropy(logits, label));
  REQUIRE(m.status().ok());
}

TEST_CASE("resnet18 and resnet101 have torchvision's parameter counts and names") {
  {
    Model m;
    BuildClassifier(m, ResNet18Options(1000), 1, 224);
    CHECK(ParameterCount(m.graph()) == 11689512);  // torchvision resnet18
    CHECK(m.graph().type(m.graph().outputs().at("logits")).shape == Shape({1, 1000}));
    const auto names = ParameterNames(m.graph());
    for (const char* n : {"conv1/weight", "bn1/weight", "bn1/bias", "layer1/0/conv1/weight", "layer1/1/bn2/bias",
                          "layer2/0/downsample/0/weight", "layer2/0/downsample/1/weight", "layer4/1/conv2/weight",
                          "fc/weight", "fc/bias"})
      CHECK(names.count(n) == 1);
    CHECK(names.count("layer1/0/downsample/0/weight") == 0);  // BasicBlock: no shape change in layer1
    CHECK(names.count("conv1/bias") == 0);
    CHECK(names.size() == 62);  // torchvision: len(list(resnet18().parameters())) == 62
  }
  {
    Model m;
    BuildClassifier(m, ResNet101Options(1000), 1, 224);
    CHECK(ParameterCount(m.graph()) == 44549160);  // torchvision resnet101
    const auto names = ParameterNames(m.graph());
    for (const char* n : {"layer1/0/downsample/0/weight", "layer1/0/conv3/weight", "layer3/22/bn3/weight",
                          "layer4/2/conv3/weight", "fc/weight"})
      CHECK(names.count(n) == 1);
    CHECK(names.size() == 314);  // torchvision: len(list(resnet101().parameters())) == 314
    // v1.5: the stride sits on the 3x3 conv; 224 -> 112 (conv1) -> 56 (maxpool) -> 28 -> 14 -> 7.
    const Graph& g = m.graph();
    for (NodeId id : g.NodesWithOp("Conv2d")) {
      const Node& n = g.node(id);
      if (n.name == "layer2/0/conv1") CHECK(g.type(n.outputs[0]).shape == Shape({1, 128, 56, 56}));
      if (n.name == "layer2/0/conv2") CHECK(g.type(n.outputs[0]).shape == Shape({1, 128, 28, 28}));
      if (n.name == "layer4/2/conv3") CHECK(g.type(n.outputs[0]).shape == Shape({1, 2048, 7, 7}));
    }
  }
  {
    // The C++ builder with the CIFAR stem: 3x3 conv1 instead of 7x7, otherwise the same.
    Model m;
    Sym x = m.input("input", {1, 3, 32, 32});
    ResNetOptions o = ResNet18Options(10);
    o.stem = ResNetStem::kCifar;
    Sym logits = ResNet(m, x, o);
    REQUIRE(m.status().ok());
    CHECK(m.shape(logits) == Shape({1, 10}));
    CHECK(ParameterCount(m.graph()) == 11689512 - 3 * 64 * (49 - 9) - 513 * 990);  // 7x7 -> 3x3 conv1, fc 1000 -> 10
  }
}

TEST_CASE("resnet stems parse by name") {
  CHECK(*ParseResNetStem("imagenet") == ResNetStem::kImageNet);
  CHECK(*ParseResNetStem("cifar") == ResNetStem::kCifar);
  auto bad = ParseResNetStem("imagnet");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "argument stem: 'imagnet' is not a ResNet stem (imagenet, cifar)");
}

TEST_CASE("the zoo's resnet18 and resnet101 check their arguments") {
  {
    Model m;
    REQUIRE(models::BuildClassifier(m, "resnet18", {}, {3, 224, 224}, 1, 1000).ok());
    CHECK(ParameterCount(m.graph()) == 11689512);
  }
  {
    Model m;
    REQUIRE(models::BuildClassifier(m, "resnet101", {{"stem", "imagenet"}}, {3, 224, 224}, 1, 1000).ok());
    CHECK(ParameterCount(m.graph()) == 44549160);
  }
  {
    // Fashion-MNIST-sized: 1 channel, 28x28, the CIFAR stem at width 16.
    Model m;
    REQUIRE(models::BuildClassifier(m, "resnet18", {{"stem", "cifar"}, {"width", "16"}}, {1, 28, 28}, 2, 10).ok());
    CHECK(m.graph().type(m.graph().outputs().at("logits")).shape == Shape({2, 10}));
  }
  Model m1;
  Status stem = models::BuildClassifier(m1, "resnet18", {{"stem", "imagnet"}}, {3, 32, 32}, 2, 10);
  CHECK(stem.message() == "argument stem: 'imagnet' is not a ResNet stem (imagenet, cifar)");
  Model m2;
  Status typo = models::BuildClassifier(m2, "resnet101", {{"widht", "8"}}, {3, 32, 32}, 2, 10);
  CHECK(typo.message() == "model resnet101 has no argument 'widht' (its arguments: stem, width)");
  Model m3;
  Status width = models::BuildClassifier(m3, "resnet18", {{"width", "0"}}, {3, 32, 32}, 2, 10);
  CHECK(width.message() == "argument width: must be >= 1, got 0");
  Model m4;
  Status number = models::BuildClassifier(m4, "resnet18", {{"stem", "3"}}, {3, 32, 32}, 2, 10);
  CHECK(number.message() == "argument stem: '3' is not a ResNet stem (imagenet, cifar)");
}

TEST_CASE("resnet18 (cifar stem) runs forward and trains on a fixed batch") {
  Model m;
  ResNetOptions o = ResNet18Options(10);
  o.stem = ResNetStem::kCifar;
  BuildClassifier(m, o, 2, 32);
  const Tensor images = RandomInput({2, 3, 32, 32}, DType::kF32, 1);
  Tensor labels = Tensor::Zeros({2}, DType::kI64);
  labels.data<int64_t>()[0] = 3;
  labels.data<int64_t>()[1] = 7;

  auto fwd = Executor::Create(m.graph());
  REQUIRE(fwd.ok());
  REQUIRE((*fwd)->InitializeState(0).ok());
  auto out = (*fwd)->Run({{"input", images}, {"target", labels}});
  if (!out.ok()) FAIL(out.status().ToString());
  CHECK(out->at("logits").shape() == Shape({2, 10}));
  for (double v : out->at("logits").ToDoubleVector()) CHECK(std::isfinite(v));

  StepOptimizer sgd;
  sgd.config.set_momentum(0.9);
  auto train = BuildTrainingGraph(m.graph(), "loss", sgd);
  if (!train.ok()) FAIL(train.status().ToString());
  auto exec = Executor::Create(*train);
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  std::vector<double> losses;
  for (int step = 1; step <= 4; ++step) {
    auto r = (*exec)->Run({{"input", images}, {"target", labels}, {"lr", Scalar(0.01)}, {"step", Scalar(step)}});
    if (!r.ok()) FAIL(r.status().ToString());
    losses.push_back(r->at("loss").ScalarAt(0));
  }
  INFO("losses " << losses[0] << " " << losses[1] << " " << losses[2] << " " << losses[3]);
  for (double l : losses) CHECK(std::isfinite(l));
  CHECK(losses[0] == Approx(out->at("loss").ScalarAt(0)).epsilon(1e-5));  // the same forward, same seed
  CHECK(losses.back() < losses.front());
}

TEST_CASE("fused resnet (R = 2) computes what two separate resnets compute (f64)") {
  const std::vector<uint64_t> seeds = {5, 9};
  Model m(DType::kF64);
  Sym x = m.input("input", {2, 3, 16, 16});
  ResNetOptions o = ResNet18Options(10);
  o.width = 8;
  o.stem = ResNetStem::kCifar;
  m.set_output("logits", ResNet(m, x, o));
  REQUIRE(m.status().ok());
  const Tensor images = RandomInput({2, 3, 16, 16}, DType::kF64, 2);

  // Replica r starts as a single model with seeds[r].
  auto run = RunFusedAndSeparate(m.graph(), seeds, {{"input", images}}, {{"input", images}}, "logits");
  if (!run.ok()) FAIL(run.status().ToString());
  REQUIRE(run->fused.size() == 2 * 2 * 10);
  CHECK(FusedMismatch(*run) == "");
  const auto& separate = run->separate;
  CHECK(separate[0] != separate[1]);  // the replicas really have different parameters
}

}  // namespace
}  // namespace loom::models
