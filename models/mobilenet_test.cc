// MobileNetV2 and MobileNetV3-Small/Large as torchvision builds them:
// parameter counts and names at 224x224 (built, not run), and a forward pass
// of each through the executor at 32x32 with 10 classes.
#include "models/mobilenet.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <set>

#include "core/rng.h"
#include "models/model_test_util.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::ParameterCount;
using testing::ParameterNames;
using testing::RandomInput;

using Builder = std::function<Sym(Model&, Sym, const MobileNetOptions&)>;

Sym V2(Model& m, Sym x, const MobileNetOptions& o) { return MobileNetV2(m, x, o); }
Sym V3Small(Model& m, Sym x, const MobileNetOptions& o) { return MobileNetV3(m, x, MobileNetV3Size::kSmall, o); }
Sym V3Large(Model& m, Sym x, const MobileNetOptions& o) { return MobileNetV3(m, x, MobileNetV3Size::kLarge, o); }

TEST_CASE("MakeDivisible is torchvision's _make_divisible") {
  CHECK(MakeDivisible(32) == 32);
  CHECK(MakeDivisible(16 * 0.75) == 16);   // 12 rounds up to 16
  CHECK(MakeDivisible(960 / 4) == 240);
  CHECK(MakeDivisible(72 / 4) == 24);      // 18 -> 16 is more than 10% down: 24
  CHECK(MakeDivisible(88 / 4) == 24);
  CHECK(MakeDivisible(3) == 8);            // at least the divisor
  CHECK(MakeDivisible(1280 * 0.5) == 640);
}

TEST_CASE("mobilenet_v2 and mobilenet_v3 have torchvision's parameter counts and names") {
  {
    Model m;
    Sym logits = MobileNetV2(m, m.input("input", {1, 3, 224, 224}), {});
    REQUIRE(m.status().ok());
    CHECK(m.shape(logits) == Shape({1, 1000}));
    CHECK(ParameterCount(m.graph()) == 3504872);  // torchvision mobilenet_v2
    const auto names = ParameterNames(m.graph());
    for (const char* n : {"features/0/0/weight", "features/0/1/weight", "features/0/1/bias",
                          "features/1/conv/0/0/weight", "features/1/conv/1/weight", "features/1/conv/2/bias",
                          "features/2/conv/0/0/weight", "features/2/conv/1/0/weight", "features/2/conv/2/weight",
                          "features/2/conv/3/weight", "features/17/conv/3/bias", "features/18/0/weight",
                          "features/18/1/bias", "classifier/1/weight", "classifier/1/bias"})
      CHECK(names.count(n) == 1);
    CHECK(names.size() == 158);  // torchvision: len(list(mobilenet_v2().parameters())) == 158
    const Graph& g = m.graph();
    for (NodeId id : g.NodesWithOp("Conv2d")) {
      const Node& n = g.node(id);
      if (n.name == "features/2/conv/1/0") CHECK(g.type(n.outputs[0]).shape == Shape({1, 96, 56, 56}));
      if (n.name == "features/18/0") CHECK(g.type(n.outputs[0]).shape == Shape({1, 1280, 7, 7}));
    }
    for (NodeId id : g.NodesWithOp(kParameterOp)) {
      const Node& n = g.node(id);
      // depthwise: groups = channels
      if (n.name == "features/2/conv/1/0/weight") CHECK(g.type(n.outputs[0]).shape == Shape({96, 1, 3, 3}));
    }
  }
  {
    Model m;
    Sym logits = MobileNetV3(m, m.input("input", {1, 3, 224, 224}), MobileNetV3Size::kSmall, {});
    REQUIRE(m.status().ok());
    CHECK(m.shape(logits) == Shape({1, 1000}));
    CHECK(ParameterCount(m.graph()) == 2542856);  // torchvision mobilenet_v3_small
    const auto names = ParameterNames(m.graph());
    for (const char* n : {"features/0/0/weight", "features/1/block/0/0/weight", "features/1/block/1/fc1/weight",
                          "features/1/block/1/fc1/bias", "features/1/block/1/fc2/bias", "features/1/block/2/1/bias",
                          "features/2/block/0/0/weight", "features/2/block/2/1/weight",
                          "features/11/block/2/fc1/weight", "features/12/0/weight", "features/12/1/bias",
                          "classifier/0/weight", "classifier/3/bias"})
      CHECK(names.count(n) == 1);
    CHECK(names.count("features/2/block/1/fc1/weight") == 0);  // no SE in the second block
    CHECK(names.size() == 142);  // torchvision: len(list(mobilenet_v3_small().parameters())) == 142
  }
  {
    Model m;
    Sym logits = MobileNetV3(m, m.input("input", {1, 3, 224, 224}), MobileNetV3Size::kLarge, {});
    REQUIRE(m.status().ok());
    CHECK(m.shape(logits) == Shape({1, 1000}));
    CHECK(ParameterCount(m.graph()) == 5483032);  // torchvision mobilenet_v3_large
    const auto names = ParameterNames(m.graph());
    for (const char* n : {"features/1/block/0/0/weight", "features/1/block/1/1/weight", "features/4/block/2/fc1/weight",
                          "features/15/block/2/fc2/bias", "features/15/block/3/1/bias", "features/16/0/weight",
                          "classifier/0/bias", "classifier/3/weight"})
      CHECK(names.count(n) == 1);
    CHECK(names.size() == 174);  // torchvision: len(list(mobilenet_v3_large().parameters())) == 174
    const Graph& g = m.graph();
    for (NodeId id : g.NodesWithOp("Conv2d")) {
      const Node& n = g.node(id);
      if (n.name == "features/16/0") CHECK(g.type(n.outputs[0]).shape == Shape({1, 960, 7, 7}));
    }
  }
}

TEST_CASE("width_mult scales the channels as torchvision does") {
  MobileNetOptions o;
  o.width_mult = 0.5;
  o.num_classes = 10;
  {
    Model m;
    MobileNetV2(m, m.input("input", {1, 3, 224, 224}), o);
    REQUIRE(m.status().ok());
    for (NodeId id : m.graph().NodesWithOp(kParameterOp)) {
      const Node& n = m.graph().node(id);
      if (n.name == "features/0/0/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({16, 3, 3, 3}));
      if (n.name == "features/18/0/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({1280, 160, 1, 1}));
    }
  }
  {
    Model m;
    MobileNetV3(m, m.input("input", {1, 3, 224, 224}), MobileNetV3Size::kLarge, o);
    REQUIRE(m.status().ok());
    for (NodeId id : m.graph().NodesWithOp(kParameterOp)) {
      const Node& n = m.graph().node(id);
      if (n.name == "features/16/0/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({480, 80, 1, 1}));
      if (n.name == "classifier/0/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({640, 480}));
    }
  }
}

// Inference at batch 1 (BatchNorm uses its running statistics); training mode
// needs batch 2, since at 32x32 the last stages are 1x1 and BatchNorm, as in
// PyTorch, needs more than one value per channel.
TEST_CASE("mobilenets run forward at 32x32 with 10 classes") {
  const std::vector<std::pair<const char*, Builder>> models = {
      {"mobilenet_v2", V2}, {"mobilenet_v3_small", V3Small}, {"mobilenet_v3_large", V3Large}};
  for (const auto& [name, build] : models) {
    INFO(name);
    for (bool training : {false, true}) {
      INFO("training " << training);
      const int64_t batch = training ? 2 : 1;
      Model m;
      m.set_training(training);
      MobileNetOptions o;
      o.num_classes = 10;
      m.set_output("logits", build(m, m.input("input", {batch, 3, 32, 32}), o));
      INFO(m.status().ToString());
      REQUIRE(m.status().ok());
      auto exec = Executor::Create(m.graph());
      REQUIRE(exec.ok());
      REQUIRE((*exec)->InitializeState(0).ok());
      auto out = (*exec)->Run({{"input", RandomInput({batch, 3, 32, 32}, DType::kF32, 1)}});
      if (!out.ok()) FAIL(out.status().ToString());
      const Tensor& logits = out->at("logits");
      CHECK(logits.shape() == Shape({batch, 10}));
      bool nonzero = false;
      for (double v : logits.ToDoubleVector()) {
        CHECK(std::isfinite(v));
        nonzero = nonzero || v != 0.0;
      }
      CHECK(nonzero);
    }
  }
}

}  // namespace
}  // namespace loom::models
