// PointNetCls as fxia22/pointnet.pytorch builds it: the parameter count at 40
// classes and 1024 points (built, not run), and a forward pass through the
// executor at [2, 3, 32] with 10 classes; the zoo's pointnet_cls adds the
// feature-transform regularizer to the loss.
#include "models/pointnet.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "core/rng.h"
#include "models/zoo.h"
#include "models/model_test_util.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::ParameterCount;
using testing::ParameterNames;
using testing::RandomInput;

TEST_CASE("pointnet_cls has fxia22's parameter count and names") {
  Model m;
  PointNetResult r = PointNetCls(m, m.input("input", {2, 3, 1024}), {});  // training BatchNorm needs batch > 1
  INFO(m.status().ToString());
  REQUIRE(m.status().ok());
  CHECK(m.shape(r.logits) == Shape({2, 40}));
  CHECK(m.shape(r.regularizer) == Shape({}));
  // fxia22/pointnet.pytorch pointnet/model.py: PointNetCls(k=40,
  // feature_transform=True); sum(p.numel() for p in model.parameters()) ==
  // 3471473 over 66 tensors (torch 2.x, the modules rebuilt as in model.py).
  CHECK(ParameterCount(m.graph()) == 3471473);
  const auto names = ParameterNames(m.graph());
  CHECK(names.size() == 66);
  for (const char* n : {"feat/stn/conv1/weight", "feat/stn/bn5/bias", "feat/stn/fc3/weight", "feat/conv1/weight",
                        "feat/bn3/weight", "feat/fstn/conv3/bias", "feat/fstn/fc3/bias", "fc1/weight", "bn2/bias",
                        "fc3/weight"})
    CHECK(names.count(n) == 1);
  for (NodeId id : m.graph().NodesWithOp(kParameterOp)) {
    const Node& n = m.graph().node(id);
    if (n.name == "feat/fstn/fc3/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({64 * 64, 256}));
    if (n.name == "feat/stn/fc3/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({9, 256}));
    if (n.name == "feat/conv1/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({64, 3, 1}));
  }
}

TEST_CASE("pointnet_cls runs forward at [2, 3, 32] with 10 classes") {
  for (bool training : {false, true}) {
    INFO("training " << training);
    Model m;
    m.set_training(training);
    PointNetOptions o;
    o.num_classes = 10;
    PointNetResult r = PointNetCls(m, m.input("input", {2, 3, 32}), o);
    m.set_output("logits", r.logits);
    m.set_output("regularizer", r.regularizer);
    INFO(m.status().ToString());
    REQUIRE(m.status().ok());
    auto exec = Executor::Create(m.graph());
    REQUIRE(exec.ok());
    REQUIRE((*exec)->InitializeState(0).ok());
    auto out = (*exec)->Run({{"input", RandomInput({2, 3, 32}, DType::kF32, 1)}});
    if (!out.ok()) FAIL(out.status().ToString());
    const Tensor& logits = out->at("logits");
    CHECK(logits.shape() == Shape({2, 10}));
    bool nonzero = false;
    for (double v : logits.ToDoubleVector()) {
      CHECK(std::isfinite(v));
      nonzero = nonzero || v != 0.0;
    }
    CHECK(nonzero);
    const double reg = out->at("regularizer").ScalarAt(0);
    CHECK(std::isfinite(reg));
    CHECK(reg >= 0.0);
  }
}

TEST_CASE("with a zero fstn fc3 the feature transform is the identity and the regularizer 0") {
  // With fstn/fc3 zero the transform is the added identity constant alone, so
  // ||I - A A^T||_F^2 is 0: this checks the Fill/Concat/Slice identity.
  Model m(DType::kF64);
  PointNetOptions o;
  o.num_classes = 4;
  PointNetResult r = PointNetCls(m, m.input("input", {2, 3, 8}), o);
  m.set_output("regularizer", r.regularizer);
  REQUIRE(m.status().ok());
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  for (const char* p : {"feat/fstn/fc3/weight", "feat/fstn/fc3/bias"}) {
    auto t = (*exec)->GetState(p);
    REQUIRE(t.ok());
    REQUIRE((*exec)->SetState(p, Tensor::Zeros(t->shape(), DType::kF64)).ok());
  }
  auto out = (*exec)->Run({{"input", RandomInput({2, 3, 8}, DType::kF64, 2)}});
  if (!out.ok()) FAIL(out.status().ToString());
  CHECK(out->at("regularizer").ScalarAt(0) == Approx(0.0).margin(1e-12));
}

TEST_CASE("the zoo's pointnet_cls adds the regularizer to the loss") {
  Model m;
  REQUIRE(BuildClassifier(m, "pointnet_cls", {{"dropout", "0"}}, Shape({3, 32}), 2, 5).ok());
  CHECK(m.graph().outputs().count(kAuxLossOutput) == 1);
  CHECK(m.graph().outputs().count("loss") == 1);
  Model bad;
  CHECK(!BuildClassifier(bad, "pointnet_cls", {}, Shape({3, 8, 8}), 2, 5).ok());
}

}  // namespace
}  // namespace loom::models
