// End to end through the public API: small models train on real
// Fashion-MNIST data and their loss falls by a stated factor.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

#include "graph/model.h"
#include "models/mlp.h"
#include "runtime/trainer.h"

namespace loom {
namespace {

// The first n samples of a split (the files are not sorted by class).
ImageDataset Head(const ImageDataset& d, int64_t n) {
  ImageDataset out;
  const int64_t per = d.images.numel() / d.size();
  out.images = Tensor::Zeros({n, d.images.shape()[1], d.images.shape()[2], d.images.shape()[3]});
  out.labels = Tensor::Zeros({n}, DType::kI64);
  std::memcpy(out.images.raw_data(), d.images.raw_data(), n * per * sizeof(float));
  std::memcpy(out.labels.raw_data(), d.labels.raw_data(), n * sizeof(int64_t));
  return out;
}

bool HaveData() {
  if (std::filesystem::exists(kFashionMnistDir)) return true;
  WARN("dataset-fashion-mnist is not installed (tools/setup.sh installs it); skipped");
  return false;
}

struct Result {
  double first_loss, last_epoch_loss;
  EvalReport eval;
};

Result Train(Model& m, int64_t train_samples, int epochs, double lr) {
  auto train = LoadFashionMnist(kFashionMnistDir, "train");
  auto test = LoadFashionMnist(kFashionMnistDir, "test");
  REQUIRE(train.ok());
  REQUIRE(test.ok());
  ImageDataset small = Head(*train, train_samples);
  TrainerOptions opts;
  opts.optimizer.momentum = 0.9;
  opts.learning_rate = lr;
  auto trainer = ClassifierTrainer::Create(m.graph(), opts);
  REQUIRE(trainer.status().ToString() == "OK");
  Result r{0, 0, {}};
  bool first = true;
  for (int e = 0; e < epochs; ++e) {
    auto loss = (*trainer)->TrainEpoch(small, 1, [&](const StepReport& s) {
      if (first) r.first_loss = s.loss;
      first = false;
    });
    REQUIRE(loss.ok());
    r.last_epoch_loss = *loss;
  }
  auto eval = (*trainer)->Evaluate(Head(*test, 2000));
  REQUIRE(eval.ok());
  r.eval = *eval;
  return r;
}

TEST_CASE("an MLP trains on Fashion-MNIST: loss falls 3x, accuracy > 0.75") {
  if (!HaveData()) return;
  Model m;
  Sym image = m.input("image", {64, 1, 28, 28});
  Sym label = m.input("label", {64}, DType::kI64);
  Sym logits = models::Mlp(m, image, {{128}, 10, 0.0});
  m.set_output("logits", logits);
  m.set_output("loss", m.cross_entropy(logits, label));
  REQUIRE(m.status().ok());
  Result r = Train(m, 4096, 2, 0.05);
  INFO("first step loss " << r.first_loss << ", last epoch mean " << r.last_epoch_loss << ", test accuracy "
                          << r.eval.accuracy);
  CHECK(r.first_loss > 2.0);  // ~ln(10) at initialisation
  CHECK(r.last_epoch_loss < r.first_loss / 3);
  CHECK(r.eval.accuracy > 0.75);
}

TEST_CASE("a small CNN (conv, batch norm, pooling, dropout) trains on Fashion-MNIST") {
  if (!HaveData()) return;
  Model m;
  Sym image = m.input("image", {32, 1, 28, 28});
  Sym label = m.input("label", {32}, DType::kI64);
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
  Result r = Train(m, 2048, 1, 0.02);
  INFO("first step loss " << r.first_loss << ", epoch mean " << r.last_epoch_loss << ", test accuracy "
                          << r.eval.accuracy);
  CHECK(r.last_epoch_loss < r.first_loss / 2);
  CHECK(r.eval.accuracy > 0.65);
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
