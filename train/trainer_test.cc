// loom::Trainer, the embedding API's training run: step by step it trains
// exactly what a whole run trains, it reports its metrics, it checkpoints and
// restores, it stops on Cancel() from another thread, and it takes networks
// of the host's own. Synthetic data, so the test needs no dataset files.
#include "train/trainer.h"

#include <catch2/catch.hpp>
#include <atomic>
#include <filesystem>
#include <thread>

#include "tests/temp_files.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/run_dir.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// 96 examples of 4 x 4 "images", batches of 16: 6 steps per epoch.
std::string SmallConfig(const std::string& extra = "", int epochs = 2, const std::string& model = "mlp") {
  return R"(
model { name: ")" + model + R"(" args { key: "hidden" value: "8" } }
data {
  dataset: "synthetic"
  input_shape: [1, 4, 4]
  num_classes: 3
  num_examples: 96
  batch_size: 16
  eval_batch_size: 32
}
optimizer { type: "sgd" lr: 0.1 momentum: 0.9 }
epochs: )" + std::to_string(epochs) + R"(
threads: 1
log_every_steps: 2
tensorboard: false
)" + extra;
}

TrainerOptions InFolder(const std::string& dir) {
  TrainerOptions o;
  o.out_dir = dir;
  return o;
}

std::map<std::string, Tensor> Parameters(const std::string& checkpoint) {
  auto ckpt = LoadCheckpoint(checkpoint);
  REQUIRE(ckpt.ok());
  return ckpt->tensors;
}

void CheckSameTensors(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name));
    CHECK(t.ToDoubleVector() == b.at(name).ToDoubleVector());
  }
}

TEST_CASE("Trainer steps train exactly what a whole run trains") {
  const std::string tmp = testing::FreshTempDir(Catch::getResultCapture().getCurrentTestName()).string();
  auto whole = Trainer::FromConfigText(SmallConfig(), InFolder(tmp + "/whole"));
  REQUIRE(whole.ok());
  auto result = (*whole)->Run();
  REQUIRE(result.ok());
  CHECK(result->steps == 12);
  CHECK(!result->cancelled);

  std::vector<metrics::MetricsRecord> records;
  TrainerOptions o = InFolder(tmp + "/steps");
  o.on_metrics = [&](const metrics::MetricsRecord& r) { records.push_back(r); };
  auto stepped = Trainer::FromConfigText(SmallConfig(), o);
  REQUIRE(stepped.ok());
  Trainer& t = **stepped;
  auto first = t.Step();
  REQUIRE(first.ok());
  CHECK(first->step == 1);
  CHECK(!first->epoch_ended);
  auto epoch = t.RunEpoch();
  REQUIRE(epoch.ok());
  CHECK(epoch->step == 6);
  CHECK(epoch->epoch_ended);
  CHECK(t.epoch() == 1);
  while (!t.done()) REQUIRE(t.Step().ok());
  CHECK(t.step() == 12);
  auto after_end = t.Step();
  REQUIRE(!after_end.ok());
  CHECK(after_end.status().code() == StatusCode::kFailedPrecondition);

  // Train records every 2 steps and a test record per epoch, as metrics.jsonl has.
  int train_records = 0, test_records = 0;
  for (const auto& r : records) (r.split == metrics::Split::kTrain ? train_records : test_records)++;
  CHECK(train_records == 6);
  CHECK(test_records == 2);

  auto whole_ckpt = FindLatestCheckpoint(tmp + "/whole");
  auto steps_ckpt = FindLatestCheckpoint(tmp + "/steps");
  REQUIRE(whole_ckpt.ok());
  REQUIRE(steps_ckpt.ok());
  CheckSameTensors(Parameters(whole_ckpt->path), Parameters(steps_ckpt->path));

  auto eval = t.Evaluate();
  REQUIRE(eval.ok());
  CHECK(eval->accuracy == Approx(result->test_accuracy));
  CHECK(eval->loss == Approx(result->test_loss));
  REQUIRE(eval->replicas.size() == 1);
}

TEST_CASE("Trainer checkpoints and restores mid-run") {
  const std::string tmp = testing::FreshTempDir(Catch::getResultCapture().getCurrentTestName()).string();
  auto a = Trainer::FromConfigText(SmallConfig(), InFolder(tmp + "/a"));
  REQUIRE(a.ok());
  for (int i = 0; i < 4; ++i) REQUIRE((*a)->Step().ok());
  const std::string saved = tmp + "/step4.loom";
  REQUIRE((*a)->SaveCheckpoint(saved).ok());
  while (!(*a)->done()) REQUIRE((*a)->Step().ok());

  // A second trainer of the same config restores step 4 and ends where a ended.
  auto b = Trainer::FromConfigText(SmallConfig(), InFolder(tmp + "/b"));
  REQUIRE(b.ok());
  REQUIRE((*b)->Restore(saved).ok());
  CHECK((*b)->step() == 4);
  REQUIRE((*b)->Run().ok());
  CheckSameTensors(Parameters(FindLatestCheckpoint(tmp + "/a")->path),
                   Parameters(FindLatestCheckpoint(tmp + "/b")->path));

  // Another run's checkpoint is refused, naming the difference.
  auto other = Trainer::FromConfigText(SmallConfig("seed: 5\n"), InFolder(tmp + "/c"));
  REQUIRE(other.ok());
  Status refused = (*other)->Restore(saved);
  REQUIRE(!refused.ok());
  CHECK_THAT(refused.message(), Catch::Contains("seed"));
}

TEST_CASE("Trainer::Cancel from another thread stops the run with a checkpoint") {
  const std::string tmp = testing::FreshTempDir(Catch::getResultCapture().getCurrentTestName()).string();
  auto trainer = Trainer::FromConfigText(SmallConfig("", 1000), InFolder(tmp + "/run"));
  REQUIRE(trainer.ok());
  Trainer& t = **trainer;
  std::thread canceller([&] {
    while (t.step() < 3) std::this_thread::yield();
    t.Cancel();
  });
  auto result = t.Run();
  canceller.join();
  REQUIRE(result.ok());
  CHECK(result->cancelled);
  CHECK(result->steps >= 3);
  CHECK(result->steps < 6000);
  auto latest = FindLatestCheckpoint(tmp + "/run");
  REQUIRE(latest.ok());
  CHECK(latest->step == result->steps);
  auto step = t.Step();
  REQUIRE(!step.ok());
  CHECK(step.status().code() == StatusCode::kCancelled);
  CHECK(t.Evaluate().ok());  // still usable for evaluation

  // The run resumes from the cancel's checkpoint.
  TrainerOptions resume = InFolder(tmp + "/run");
  resume.resume = true;
  auto resumed = Trainer::FromConfigText(SmallConfig("", 1000), resume);
  REQUIRE(resumed.ok());
  CHECK((*resumed)->step() == result->steps);
}

TEST_CASE("Trainer trains a network of the host's own") {
  const std::string tmp = testing::FreshTempDir(Catch::getResultCapture().getCurrentTestName()).string();
  TrainerOptions o = InFolder(tmp + "/custom");
  o.network = [](Model& m, const models::ModelInputs& in) -> StatusOr<Sym> {
    Sym h = m.relu(m.linear(m.flatten(in.input), 5, {}, "hidden"));
    return m.linear(h, in.num_classes, {}, "out");
  };
  // model.name only names the run: it need not be a zoo model.
  auto trainer = Trainer::FromConfigText(SmallConfig("", 2, "host_net"), o);
  REQUIRE(trainer.ok());
  REQUIRE((*trainer)->Run().ok());
  auto latest = FindLatestCheckpoint(tmp + "/custom");
  REQUIRE(latest.ok());
  CHECK(Parameters(latest->path).count("hidden/weight") == 1);

  // Logits of the wrong shape are an error naming both shapes.
  o.out_dir = tmp + "/wrong";
  o.network = [](Model& m, const models::ModelInputs& in) -> StatusOr<Sym> {
    return m.linear(m.flatten(in.input), in.num_classes + 1, {}, "out");
  };
  auto wrong = Trainer::FromConfigText(SmallConfig(), o);
  REQUIRE(!wrong.ok());
  CHECK_THAT(wrong.status().message(), Catch::Contains("gives logits [16, 4]"));
  CHECK(!fs::exists(tmp + "/wrong"));
}

TEST_CASE("Trainer errors are statuses with loom train's messages, and write nothing") {
  const std::string tmp = testing::FreshTempDir(Catch::getResultCapture().getCurrentTestName()).string();
  auto bad_text = Trainer::FromConfigText(SmallConfig("", -1), InFolder(tmp + "/x"));
  REQUIRE(!bad_text.ok());
  CHECK_THAT(bad_text.status().message(), Catch::Contains("<config text>:12: field epochs"));
  CHECK_THAT(bad_text.status().message(), Catch::Contains("epochs"));
  auto no_model = Trainer::FromConfigText(SmallConfig("", 2, "no_such_model"), InFolder(tmp + "/y"));
  REQUIRE(!no_model.ok());
  CHECK_THAT(no_model.status().message(), Catch::Contains("no_such_model"));
  auto missing = Trainer::FromConfigFile(tmp + "/missing.pbtxt");
  REQUIRE(!missing.ok());
  CHECK_THAT(missing.status().message(), Catch::Contains("missing.pbtxt"));
  CHECK(!fs::exists(tmp + "/x"));
  CHECK(!fs::exists(tmp + "/y"));

  // A used folder is not overwritten.
  REQUIRE(Trainer::FromConfigText(SmallConfig(), InFolder(tmp + "/used")).ok());
  auto again = Trainer::FromConfigText(SmallConfig(), InFolder(tmp + "/used"));
  REQUIRE(!again.ok());
  CHECK_THAT(again.status().message(), Catch::Contains("is not empty"));
}

}  // namespace
}  // namespace loom
