// End to end through the public API: small models train on real
// Fashion-MNIST data and their loss falls by a stated factor.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "graph/model.h"
#include "models/mlp.h"
#include "graph/training.h"
#include "train/data/idx.h"
#include "train/data/loader.h"
#include "runtime/executor.h"

namespace loom {
namespace {

bool HaveData() {
  if (std::filesystem::exists(kFashionMnistDir)) return true;
  WARN("dataset-fashion-mnist is not installed (tools/setup.sh installs it); skipped");
  return false;
}

struct Result {
  double first_loss = 0, last_loss = 0;  // the first step's, and the mean of the last 20
  double accuracy = 0;                   // on the first 2000 test images
};

// `steps` SGD steps through the public API: DataLoader batches into the
// training-step graph, then the eval graph over test batches.
Result Train(const Model& m, int64_t steps, double lr) {
  const int64_t batch = m.shape(Sym{m.graph().node(*m.graph().FindNode("input")).outputs[0]})[0];
  auto train_data = LoadMnist(kFashionMnistDir, "train");
  auto test_data = LoadMnist(kFashionMnistDir, "test");
  REQUIRE(train_data.ok());
  REQUIRE(test_data.ok());
  DataLoaderOptions lo;
  lo.batch_size = batch;
  lo.mean = {kFashionMnistMean};
  lo.std = {kFashionMnistStd};
  auto train_loader = DataLoader::Create(*train_data, lo);
  lo.shuffle = false;
  lo.drop_last = false;
  auto test_loader = DataLoader::Create(*test_data, lo);
  REQUIRE(train_loader.status().ToString() == "OK");
  REQUIRE(test_loader.status().ToString() == "OK");

  StepOptimizer sgd;
  sgd.config.set_momentum(0.9);
  auto train_graph = BuildTrainingGraph(m.graph(), "loss", sgd);
  auto eval_graph = BuildEvalGraph(m.graph());
  REQUIRE(train_graph.status().ToString() == "OK");
  REQUIRE(eval_graph.ok());
  auto train = Executor::Create(*train_graph);
  auto eval = Executor::Create(*eval_graph);
  REQUIRE(train.ok());
  REQUIRE(eval.ok());
  REQUIRE((*train)->InitializeState(0).ok());

  Result r;
  std::vector<double> losses;
  Tensor lr_t = Tensor::FromVector<float>({}, {static_cast<float>(lr)});
  REQUIRE((*train_loader)->Start(0).ok());
  Batch b;
  for (int64_t step = 1; step <= steps; ++step) {
    REQUIRE(*(*train_loader)->Next(&b));
    Tensor step_t = Tensor::FromVector<float>({}, {static_cast<float>(step)});
    auto out = (*train)->Run({{"input", b.input}, {"target", b.target}, {"lr", lr_t}, {"step", step_t}});
    REQUIRE(out.status().ToString() == "OK");
    losses.push_back(out->at("loss").ScalarAt(0));
  }
  r.first_loss = losses.front();
  for (size_t i = losses.size() - 20; i < losses.size(); ++i) r.last_loss += losses[i] / 20;

  for (const auto& [name, t] : (*eval)->state()) REQUIRE((*eval)->SetState(name, (*train)->state().at(name)).ok());
  REQUIRE((*test_loader)->Start(0).ok());
  int64_t seen = 0, correct = 0;
  while (seen < 2000 && *(*test_loader)->Next(&b)) {
    auto out = (*eval)->Run({{"input", b.input}, {"target", b.target}});
    REQUIRE(out.ok());
    const Tensor& logits = out->at("logits");
    for (int64_t i = 0; i < b.valid; ++i) {
      const float* row = logits.data<float>() + i * 10;
      correct += (std::max_element(row, row + 10) - row) == b.target.data<int64_t>()[i];
    }
    seen += b.valid;
  }
  r.accuracy = static_cast<double>(correct) / static_cast<double>(seen);
  return r;
}

TEST_CASE("an MLP trains on Fashion-MNIST: loss falls 3x, accuracy > 0.75") {
  if (!HaveData()) return;
  Model m;
  Sym image = m.input("input", {64, 1, 28, 28});
  Sym label = m.input("target", {64}, DType::kI64);
  Sym logits = models::Mlp(m, image, {{128}, 10, 0.0});
  m.set_output("logits", logits);
  m.set_output("loss", m.cross_entropy(logits, label));
  REQUIRE(m.status().ok());
  Result r = Train(m, /*steps=*/128, /*lr=*/0.05);
  INFO("first step loss " << r.first_loss << ", mean of the last 20 " << r.last_loss << ", test accuracy "
                          << r.accuracy);
  CHECK(r.first_loss > 2.0);  // ~ln(10) at initialisation
  CHECK(r.last_loss < r.first_loss / 3);
  CHECK(r.accuracy > 0.75);
}

TEST_CASE("a small CNN (conv, batch norm, pooling, dropout) trains on Fashion-MNIST") {
  if (!HaveData()) return;
  Model m;
  Sym image = m.input("input", {32, 1, 28, 28});
  Sym label = m.input("target", {32}, DType::kI64);
  Sym h = image;
  {
    auto block = m.scope("block1");
    Conv2dOptions c;
    c.padding = {1, 1};
    h = m.max_pool2d(m.relu(m.batch_norm(m.conv2d(h, 8, {3, 3}, c, "conv"), {}, "bn")), {2, 2});
  }
  h = m.dropout(m.flatten(h), 0.1);
  Sym logits = m.linear(h, 10, {}, "classifier");
  m.set_output("logits", logits);
  m.set_output("loss", m.cross_entropy(logits, label));
  REQUIRE(m.status().ToString() == "OK");
  REQUIRE(m.graph().FindNode("block1/conv/weight"));
  REQUIRE(m.graph().FindNode("block1/bn/running_mean"));
  Result r = Train(m, /*steps=*/64, /*lr=*/0.02);
  INFO("first step loss " << r.first_loss << ", mean of the last 20 " << r.last_loss << ", test accuracy "
                          << r.accuracy);
  CHECK(r.last_loss < r.first_loss / 2);
  CHECK(r.accuracy > 0.65);
}

TEST_CASE("model API errors name the layer and the shapes") {
  Model m;
  Sym x = m.input("x", {4, 3, 8, 8});
  Sym y = m.linear(x, 5, {}, "head");  // in-features come from the last dim (8)
  CHECK(y.valid());
  Sym bad = m.add(y, m.input("z", {4, 7}));
  CHECK_FALSE(bad.valid());
  REQUIRE_FALSE(m.status().ok());
  CHECK(m.status().message().find("[4, 3, 8, 5] and [4, 7] cannot be broadcast") != std::string::npos);
  CHECK(m.status().message().find("node 'add'") != std::string::npos);
  // Sticky: later calls do nothing and keep the first error.
  CHECK_FALSE(m.relu(y).valid());
  CHECK(m.status().message().find("cannot be broadcast") != std::string::npos);
}

}  // namespace
}  // namespace loom
