// Every zoo model, at a reduced size: one training step lowers the loss on a
// fixed batch, and the fused graph of 2 replicas (graph/fusion.h) computes
// the logits of 2 separate models started from the replicas' seeds (f64,
// 1e-9 relative: only the summation order inside products differs).
#include <catch2/catch.hpp>
#include <cmath>

#include "core/rng.h"
#include "graph/fusion.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "runtime/executor.h"

namespace loom {
namespace {

struct SmallModel {
  std::string name;
  std::map<std::string, std::string> args;
  Shape example;  // per-example input shape
  bool fused_check = true;
};

// Dropout off (where the model has it), so the loss is a function of the
// parameters and the batch only.
std::vector<SmallModel> SmallModels() {
  return {
      {"mlp", {{"hidden", "12"}}, {1, 6, 6}},
      {"cnn", {{"channels", "3,4"}, {"hidden", "8"}, {"dropout", "0"}}, {1, 8, 8}},
      {"resnet18", {{"stem", "cifar"}, {"width", "4"}}, {3, 8, 8}},
      {"resnet101", {{"stem", "cifar"}, {"width", "2"}}, {3, 8, 8}},
      {"alexnet", {{"dropout", "0"}}, {3, 63, 63}},
      // 134M parameters whatever the input: the fused f64 copy would take
      // gigabytes, so VGG-16 gets the training-step check only.
      {"vgg16", {{"dropout", "0"}}, {3, 32, 32}, false},
      {"mobilenet_v2", {{"width_mult", "0.25"}, {"dropout", "0"}}, {3, 16, 16}},
      {"mobilenet_v3_small", {{"width_mult", "0.25"}, {"dropout", "0"}}, {3, 16, 16}},
      {"mobilenet_v3_large", {{"width_mult", "0.25"}, {"dropout", "0"}}, {3, 16, 16}},
      {"pointnet_cls", {{"dropout", "0"}}, {3, 32}},
  };
}

constexpr int64_t kBatch = 2, kClasses = 5;

std::map<std::string, Tensor> FixedBatch(const Shape& example, DType dtype) {
  std::vector<int64_t> dims = example.dims();
  dims.insert(dims.begin(), kBatch);
  Rng rng(3);
  Tensor image = Tensor::Zeros(Shape(dims), DType::kF64);
  for (int64_t i = 0; i < image.numel(); ++i) image.data<double>()[i] = rng.Uniform(-1, 1);
  Tensor label = Tensor::Zeros({kBatch}, DType::kI64);
  for (int64_t i = 0; i < kBatch; ++i) label.data<int64_t>()[i] = i % kClasses;
  return {{"image", *image.Cast(dtype)}, {"label", label}};
}

TEST_CASE("the zoo covers every model of this test") {
  for (const SmallModel& s : SmallModels()) CHECK(models::FindModel(s.name).ok());
  CHECK(models::Zoo().size() == SmallModels().size());  // a new zoo model needs a row here
}

TEST_CASE("one training step lowers each zoo model's loss on a fixed batch") {
  for (const SmallModel& s : SmallModels()) {
    INFO(s.name);
    Model m;
    REQUIRE(models::BuildClassifier(m, s.name, s.args, s.example, kBatch, kClasses).ok());
    OptimizerConfig opt;  // plain SGD
    auto g = BuildTrainingGraph(m.graph(), "loss", opt);
    REQUIRE(g.ok());
    auto e = Executor::Create(*g);
    REQUIRE(e.ok());
    REQUIRE((*e)->InitializeState(1).ok());
    auto feeds = FixedBatch(s.example, DType::kF32);
    feeds["lr"] = Tensor::FromVector<float>({}, {0.01f});
    feeds["step"] = Tensor::FromVector<float>({}, {1});
    auto first = (*e)->Run(feeds);
    REQUIRE(first.ok());
    auto second = (*e)->Run(feeds);  // reports the loss after the first update
    REQUIRE(second.ok());
    const double before = first->at("loss").ScalarAt(0), after = second->at("loss").ScalarAt(0);
    INFO("loss " << before << " -> " << after);
    CHECK(std::isfinite(before));
    CHECK(after < before);
  }
}

TEST_CASE("each zoo model fused as 2 replicas computes 2 separate models' logits") {
  const std::vector<uint64_t> seeds = {7, 8};
  for (const SmallModel& s : SmallModels()) {
    if (!s.fused_check) continue;
    INFO(s.name);
    Model m(DType::kF64);
    REQUIRE(models::BuildClassifier(m, s.name, s.args, s.example, kBatch, kClasses).ok());
    auto fused = FuseReplicas(m.graph(), FusionOptions{2, seeds, {}, {}});
    if (!fused.ok()) FAIL(fused.status().ToString());
    auto fe = Executor::Create(*fused);
    REQUIRE(fe.ok());
    REQUIRE((*fe)->InitializeState(0).ok());
    const auto feeds = FixedBatch(s.example, DType::kF64);
    auto fused_out = (*fe)->Run(feeds);
    REQUIRE(fused_out.ok());
    const std::vector<double> fused_logits = fused_out->at("logits").ToDoubleVector();  // [2, B, C]
    for (int r = 0; r < 2; ++r) {
      auto se = Executor::Create(m.graph(), ExecutorOptions{Device::Cpu(), nullptr, seeds[r], false});
      REQUIRE(se.ok());
      REQUIRE((*se)->InitializeState(seeds[r]).ok());
      auto out = (*se)->Run(feeds);
      REQUIRE(out.ok());
      const std::vector<double> logits = out->at("logits").ToDoubleVector();
      REQUIRE(fused_logits.size() == 2 * logits.size());
      for (size_t i = 0; i < logits.size(); ++i) {
        INFO("replica " << r << " logit " << i);
        CHECK(std::abs(fused_logits[r * logits.size() + i] - logits[i]) <= 1e-9 * std::max(1.0, std::abs(logits[i])));
      }
    }
  }
}

}  // namespace
}  // namespace loom
