// AlexNet and VGG-16 as torchvision builds them: parameter counts, names and
// initialisers at 224x224 (graphs only, never run at that size), the zoo's
// arguments, and forward passes through the executor at small sizes.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>

#include "core/rng.h"
#include "models/alexnet.h"
#include "models/vgg.h"
#include "models/zoo.h"
#include "models/model_test_util.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::ParameterCount;
using testing::ParameterNames;
using testing::RandomInput;

// The output shape of every node, by name.
std::map<std::string, Shape> NodeShapes(const Graph& g) {
  std::map<std::string, Shape> shapes;
  for (const Node& n : g.nodes())
    if (!n.outputs.empty()) shapes[n.name] = g.type(n.outputs[0]).shape;
  return shapes;
}

const Node* FindNamed(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes())
    if (n.name == name) return &n;
  return nullptr;
}

TEST_CASE("alexnet has torchvision's parameter count, names and shapes") {
  Model m;
  REQUIRE(models::BuildClassifier(m, "alexnet", {}, {3, 224, 224}, 1, 1000).ok());
  const Graph& g = m.graph();
  CHECK(ParameterCount(g) == 61100840);  // torchvision alexnet; derivation in models/alexnet.cc
  CHECK(g.type(g.outputs().at("logits")).shape == Shape({1, 1000}));
  const auto names = ParameterNames(g);
  for (const char* layer : {"features/0", "features/3", "features/6", "features/8", "features/10", "classifier/1",
                            "classifier/4", "classifier/6"}) {
    CHECK(names.count(std::string(layer) + "/weight") == 1);
    CHECK(names.count(std::string(layer) + "/bias") == 1);
  }
  CHECK(names.size() == 16);  // torchvision: len(list(alexnet().parameters())) == 16
  const auto shapes = NodeShapes(g);
  CHECK(shapes.at("features/0/weight") == Shape({64, 3, 11, 11}));
  CHECK(shapes.at("features/0") == Shape({1, 64, 55, 55}));
  CHECK(shapes.at("features/1") == Shape({1, 64, 55, 55}));  // ReLU under its torchvision index
  CHECK(shapes.at("features/2") == Shape({1, 64, 27, 27}));
  CHECK(shapes.at("features/3") == Shape({1, 192, 27, 27}));
  CHECK(shapes.at("features/5") == Shape({1, 192, 13, 13}));
  CHECK(shapes.at("features/10") == Shape({1, 256, 13, 13}));
  CHECK(shapes.at("features/12") == Shape({1, 256, 6, 6}));
  CHECK(shapes.at("avgpool") == Shape({1, 256, 6, 6}));
  CHECK(shapes.at("classifier/1/weight") == Shape({4096, 9216}));
  CHECK(shapes.at("classifier/6/weight") == Shape({1000, 4096}));
  const Node* d0 = FindNamed(g, "classifier/0");
  const Node* d3 = FindNamed(g, "classifier/3");
  REQUIRE(d0 != nullptr);
  REQUIRE(d3 != nullptr);
  CHECK(d0->op == "Dropout");
  CHECK(d3->op == "Dropout");
  CHECK(d0->attrs.Float("p") == 0.5);
  // PyTorch's default init (torchvision's AlexNet keeps it): U(+-1/sqrt(fan_in)).
  const Node* w = FindNamed(g, "features/0/weight");
  REQUIRE(w != nullptr);
  CHECK(w->attrs.Str("init") == "uniform");
  CHECK(w->attrs.Float("high") == Approx(1.0 / std::sqrt(3.0 * 121)));
}

TEST_CASE("vgg16 has torchvision's parameter count, names and shapes") {
  Model m;
  REQUIRE(models::BuildClassifier(m, "vgg16", {}, {3, 224, 224}, 1, 1000).ok());
  const Graph& g = m.graph();
  CHECK(ParameterCount(g) == 138357544);  // torchvision vgg16; derivation in models/vgg.cc
  CHECK(g.type(g.outputs().at("logits")).shape == Shape({1, 1000}));
  const auto names = ParameterNames(g);
  for (int i : {0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28}) {
    CHECK(names.count("features/" + std::to_string(i) + "/weight") == 1);
    CHECK(names.count("features/" + std::to_string(i) + "/bias") == 1);
  }
  for (const char* layer : {"classifier/0", "classifier/3", "classifier/6"})
    CHECK(names.count(std::string(layer) + "/weight") == 1);
  CHECK(names.size() == 32);  // torchvision: len(list(vgg16().parameters())) == 32
  const auto shapes = NodeShapes(g);
  CHECK(shapes.at("features/0") == Shape({1, 64, 224, 224}));
  CHECK(shapes.at("features/4") == Shape({1, 64, 112, 112}));
  CHECK(shapes.at("features/28/weight") == Shape({512, 512, 3, 3}));
  CHECK(shapes.at("features/30") == Shape({1, 512, 7, 7}));
  CHECK(shapes.at("classifier/0/weight") == Shape({4096, 25088}));
  CHECK(shapes.at("classifier/6/weight") == Shape({1000, 4096}));
  for (const char* n : {"features/4", "features/9", "features/16", "features/23", "features/30"}) {
    const Node* pool = FindNamed(g, n);
    REQUIRE(pool != nullptr);
    CHECK(pool->op == "MaxPool2d");
  }
  CHECK(FindNamed(g, "classifier/2")->op == "Dropout");
  CHECK(FindNamed(g, "classifier/5")->op == "Dropout");
  // torchvision's VGG init: convs kaiming_normal_(fan_out), Linear N(0, 0.01), zero biases.
  CHECK(FindNamed(g, "features/0/weight")->attrs.Str("init") == "normal");
  CHECK(FindNamed(g, "features/0/weight")->attrs.Float("std") == Approx(std::sqrt(2.0 / (64 * 9))));
  CHECK(FindNamed(g, "features/0/bias")->attrs.Str("init") == "zeros");
  CHECK(FindNamed(g, "classifier/3/weight")->attrs.Float("std") == Approx(0.01));
  CHECK(FindNamed(g, "classifier/3/bias")->attrs.Str("init") == "zeros");
}

TEST_CASE("the zoo's alexnet and vgg16 check their arguments") {
  {
    Model m;
    REQUIRE(models::BuildClassifier(m, "alexnet", {{"dropout", "0.25"}}, {3, 224, 224}, 1, 10).ok());
    CHECK(FindNamed(m.graph(), "classifier/3")->attrs.Float("p") == 0.25);
    CHECK(ParameterCount(m.graph()) == 61100840 - 4097 * 990);  // classifier/6: 1000 -> 10 classes
  }
  {
    Model m;
    REQUIRE(models::BuildClassifier(m, "vgg16", {{"dropout", "0"}}, {3, 224, 224}, 1, 1000).ok());
    CHECK(FindNamed(m.graph(), "classifier/5")->attrs.Float("p") == 0.0);
  }
  Model m1;
  Status typo = models::BuildClassifier(m1, "alexnet", {{"dropot", "0.1"}}, {3, 64, 64}, 1, 10);
  CHECK(typo.message() == "model alexnet has no argument 'dropot' (its arguments: dropout, hidden, width_mult)");
  Model m2;
  Status range = models::BuildClassifier(m2, "vgg16", {{"dropout", "1"}}, {3, 32, 32}, 1, 10);
  CHECK(range.message() == "argument dropout: must be in [0, 1), got 1");
  Model m3;
  Status number = models::BuildClassifier(m3, "vgg16", {{"dropout", "half"}}, {3, 32, 32}, 1, 10);
  CHECK(number.message() == "argument dropout: 'half' is not a number");
  Model m4;
  Status rank = models::BuildClassifier(m4, "alexnet", {}, {784}, 1, 10);
  CHECK(rank.message() == "alexnet needs [batch, channels, height, width] images, got [1, 784]");
  Model m5;
  CHECK_FALSE(models::BuildClassifier(m5, "alexnet", {}, {3, 32, 32}, 1, 10).ok());  // too small for 3 max-pools
}

// The reduced sizes the zoo-wide tests train: the same layers and names,
// counts by hand.
TEST_CASE("alexnet and vgg16 shrink with width_mult and hidden") {
  {
    // Channels 16, 48, 96, 64, 64: convs 5,824 + 19,248 + 41,568 + 55,360 +
    // 36,928; classifier 64*36*32+32 + 32*32+32 + 32*10+10.
    Model m;
    REQUIRE(models::BuildClassifier(m, "alexnet", {{"width_mult", "0.25"}, {"hidden", "32"}}, {3, 63, 63}, 1, 10).ok());
    CHECK(ParameterCount(m.graph()) == 158928 + 73760 + 1056 + 330);
    CHECK(ParameterNames(m.graph()).size() == 16);
    CHECK(NodeShapes(m.graph()).at("features/0/weight") == Shape({16, 3, 11, 11}));
  }
  {
    // Channels 8, 8, 16, 16, 32 x 3, 64 x 6: convs 230,568; classifier
    // 64*49*16+16 + 16*16+16 + 16*10+10.
    Model m;
    REQUIRE(models::BuildClassifier(m, "vgg16", {{"width_mult", "0.125"}, {"hidden", "16"}}, {3, 32, 32}, 1, 10).ok());
    CHECK(ParameterCount(m.graph()) == 230568 + 50192 + 272 + 170);
    CHECK(ParameterNames(m.graph()).size() == 32);
  }
  for (const char* model : {"alexnet", "vgg16"}) {
    INFO(model);
    Model m1;
    CHECK(models::BuildClassifier(m1, model, {{"width_mult", "0"}}, {3, 64, 64}, 1, 10).message() ==
          "argument width_mult: must be > 0, got 0");
    Model m2;
    CHECK(models::BuildClassifier(m2, model, {{"hidden", "0"}}, {3, 64, 64}, 1, 10).message() ==
          "argument hidden: must be >= 1, got 0");
  }
}

TEST_CASE("alexnet runs forward at 63x63 (the smallest valid size)") {
  Model m;
  m.set_training(false);
  REQUIRE(models::BuildClassifier(m, "alexnet", {}, {3, 63, 63}, 1, 10).ok());
  CHECK(NodeShapes(m.graph()).at("features/12") == Shape({1, 256, 1, 1}));
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  Tensor labels = Tensor::Zeros({1}, DType::kI64);
  labels.data<int64_t>()[0] = 3;
  auto out = (*exec)->Run({{"input", RandomInput({1, 3, 63, 63}, DType::kF32, 1)}, {"target", labels}});
  if (!out.ok()) FAIL(out.status().ToString());
  CHECK(out->at("logits").shape() == Shape({1, 10}));
  for (double v : out->at("logits").ToDoubleVector()) CHECK(std::isfinite(v));
  CHECK(std::isfinite(out->at("loss").ScalarAt(0)));
}

TEST_CASE("vgg16 runs forward at 32x32 (adaptive pool repeats 1x1 to 7x7)") {
  Model m;
  m.set_training(false);
  Sym x = m.input("input", {1, 3, 32, 32});
  Sym logits = Vgg(m, x, Vgg16Options(10));
  m.set_output("logits", logits);
  REQUIRE(m.status().ok());
  CHECK(m.shape(logits) == Shape({1, 10}));
  CHECK(NodeShapes(m.graph()).at("features/30") == Shape({1, 512, 1, 1}));
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  auto out = (*exec)->Run({{"input", RandomInput({1, 3, 32, 32}, DType::kF32, 2)}});
  if (!out.ok()) FAIL(out.status().ToString());
  CHECK(out->at("logits").shape() == Shape({1, 10}));
  for (double v : out->at("logits").ToDoubleVector()) CHECK(std::isfinite(v));
}

}  // namespace
}  // namespace loom::models
