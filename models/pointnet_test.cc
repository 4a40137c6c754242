// PointNetCls and PointNetDenseCls as fxia22/pointnet.pytorch builds them:
// the parameter counts (built, not run), a forward pass through the executor
// at [2, 3, 32]; the zoo's pointnet_cls and pointnet_seg add the
// feature-transform regularizer to the loss, and one SGD step lowers
// pointnet_seg's per-point loss.
#include "models/pointnet.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "core/rng.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "models/model_test_util.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::LossAcrossOneStep;
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

TEST_CASE("pointnet_seg has fxia22's PointNetDenseCls parameter count and names") {
  // bench/reference_models.py pointnet_seg: PointNetDenseCls(k, feature_transform=True)
  // rebuilt from pointnet/model.py; sum(p.numel()) is 3527629 at k = 4 and
  // 3533563 at k = 50, over 70 tensors.
  for (auto [parts, count] : {std::pair<int64_t, int64_t>{4, 3527629}, {50, 3533563}}) {
    INFO("parts " << parts);
    Model m;
    PointNetSegOptions o;
    o.num_parts = parts;
    PointNetResult r = PointNetDenseCls(m, m.input("input", {2, 3, 1024}), o);
    INFO(m.status().ToString());
    REQUIRE(m.status().ok());
    CHECK(m.shape(r.logits) == Shape({2, 1024, parts}));
    CHECK(m.shape(r.regularizer) == Shape({}));
    CHECK(ParameterCount(m.graph()) == count);
    const auto names = ParameterNames(m.graph());
    CHECK(names.size() == 70);
    for (const char* n : {"feat/stn/conv1/weight", "feat/fstn/fc3/bias", "feat/conv3/weight", "feat/bn3/bias",
                          "conv1/weight", "bn1/weight", "conv3/bias", "bn3/bias", "conv4/weight", "conv4/bias"})
      CHECK(names.count(n) == 1);
    for (NodeId id : m.graph().NodesWithOp(kParameterOp)) {
      const Node& n = m.graph().node(id);
      if (n.name == "conv1/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({512, 1088, 1}));
      if (n.name == "conv4/weight") CHECK(m.graph().type(n.outputs[0]).shape == Shape({parts, 128, 1}));
    }
  }
}

TEST_CASE("pointnet_seg's per-point features are the global features beside the point features") {
  // Eval mode: every example's logits at point n depend on that point and
  // the cloud's max-pooled features; permuting the points permutes the rows.
  Model m(DType::kF64);
  m.set_training(false);
  PointNetSegOptions o;
  o.num_parts = 3;
  PointNetResult r = PointNetDenseCls(m, m.input("input", {2, 3, 8}), o);
  m.set_output("logits", r.logits);
  REQUIRE(m.status().ok());
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  Tensor x = RandomInput({2, 3, 8}, DType::kF64, 3);
  Tensor reversed = Tensor::Zeros({2, 3, 8}, DType::kF64);  // x with the points in reverse order
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t n = 0; n < 8; ++n)
        reversed.data<double>()[(b * 3 + c) * 8 + n] = x.data<double>()[(b * 3 + c) * 8 + (7 - n)];
  auto out = (*exec)->Run({{"input", x}});
  auto out_reversed = (*exec)->Run({{"input", reversed}});
  REQUIRE(out.ok());
  REQUIRE(out_reversed.ok());
  const Tensor& logits = out->at("logits");
  CHECK(logits.shape() == Shape({2, 8, 3}));
  const std::vector<double> a = logits.ToDoubleVector(), b = out_reversed->at("logits").ToDoubleVector();
  bool differ_between_points = false;
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t n = 0; n < 8; ++n)
      for (int64_t k = 0; k < 3; ++k) {
        const double v = a[(e * 8 + n) * 3 + k];
        CHECK(v == Approx(b[(e * 8 + (7 - n)) * 3 + k]).epsilon(1e-9));
        differ_between_points = differ_between_points || v != a[(e * 8) * 3 + k];
      }
  CHECK(differ_between_points);
}

TEST_CASE("one training step lowers pointnet_seg's per-point loss on a fixed batch") {
  constexpr int64_t kPoints = 32, kParts = 4, kBatch = 2;
  Model m;
  const DataSpec data{Shape{3, kPoints}, DType::kF32, Shape{kPoints}, kParts};
  {
    const Status built = BuildSupervised(m, "pointnet_seg", {}, data, kBatch);
    INFO(built.ToString());
    REQUIRE(built.ok());
  }
  CHECK(m.shape(Sym{m.graph().outputs().at("logits")}) == Shape({kBatch, kPoints, kParts}));
  CHECK(m.graph().outputs().count(kAuxLossOutput) == 1);
  Tensor target = Tensor::Zeros({kBatch, kPoints}, DType::kI64);
  for (int64_t i = 0; i < target.numel(); ++i) target.data<int64_t>()[i] = (i * 7) % kParts;
  auto change = LossAcrossOneStep(
      m.graph(), {{"input", RandomInput({kBatch, 3, kPoints}, DType::kF32, 4)}, {"target", target}}, 0.01);
  if (!change.ok()) FAIL(change.status().ToString());
  INFO("loss " << change->before << " -> " << change->after);
  CHECK(std::isfinite(change->before));
  CHECK(change->after < change->before);
}

TEST_CASE("the zoo's pointnet_seg wants point clouds and a part label per point") {
  Model one_class;
  const Status s = BuildClassifier(one_class, "pointnet_seg", {}, Shape({3, 16}), 2, 4);
  CHECK(!s.ok());
  INFO(s.ToString());
  CHECK(s.ToString().find("pointnet_seg") != std::string::npos);
  CHECK(s.ToString().find("targets") != std::string::npos);
  Model image;
  CHECK(!BuildSupervised(image, "pointnet_seg", {}, DataSpec{Shape{3, 4, 4}, DType::kF32, Shape{4}, 4}, 2).ok());
  Model bad_arg;
  CHECK(!BuildSupervised(bad_arg, "pointnet_seg", {{"feature_transform", "2"}},
                         DataSpec{Shape{3, 16}, DType::kF32, Shape{16}, 4}, 2).ok());
}

}  // namespace
}  // namespace loom::models
