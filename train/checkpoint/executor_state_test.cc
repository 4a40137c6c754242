// Executor state through checkpoints: capture and restore, refusal of
// another model's checkpoint, and a resumed run that continues bit for bit.
#include "train/checkpoint/executor_state.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "core/rng.h"
#include "graph/model.h"
#include "graph/training.h"
#include "runtime/executor.h"
#include "train/checkpoint/run_dir.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / ("executor_state_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct TinyModel {
  int64_t hidden = 16;
  DType dtype = DType::kF32;
  bool extra_layer = false;
  StepOptimizer optimizer = [] {
    StepOptimizer o;
    o.config.set_momentum(0.9);
    return o;
  }();
};

constexpr int64_t kBatch = 8, kFeatures = 6, kClasses = 3;
constexpr uint64_t kSeed = 1234;

// linear -> batch norm -> relu -> dropout -> linear -> cross entropy: weights,
// momentum slots, BatchNorm running statistics and a random op.
Graph TrainingGraph(const TinyModel& spec) {
  Model m(spec.dtype);
  Sym x = m.input("x", {kBatch, kFeatures});
  Sym y = m.input("y", {kBatch}, DType::kI64);
  Sym h = m.relu(m.batch_norm(m.linear(x, spec.hidden, {}, "fc1"), {}, "bn"));
  h = m.dropout(h, 0.5, "drop");
  if (spec.extra_layer) h = m.relu(m.linear(h, spec.hidden, {}, "fc1b"));
  m.set_output("loss", m.cross_entropy(m.linear(h, kClasses, {}, "fc2"), y));
  REQUIRE(m.status().ToString() == "OK");
  StatusOr<Graph> train = BuildTrainingGraph(m.graph(), "loss", spec.optimizer);
  REQUIRE(train.status().ToString() == "OK");
  return *train;
}

std::unique_ptr<Executor> NewExecutor(const Graph& graph, bool initialize) {
  ExecutorOptions options;
  options.seed = kSeed;
  StatusOr<std::unique_ptr<Executor>> e = Executor::Create(graph, options);
  REQUIRE(e.status().ToString() == "OK");
  if (initialize) REQUIRE((*e)->InitializeState(kSeed).ok());
  return std::move(*e);
}

// The feeds of 1-based step `step`: the same data whenever it is asked for.
std::map<std::string, Tensor> Feeds(int64_t step) {
  Rng rng = Rng::Stream(99, static_cast<uint64_t>(step));
  std::vector<float> x(kBatch * kFeatures);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  std::vector<int64_t> y(kBatch);
  for (int64_t i = 0; i < kBatch; ++i) y[i] = (i + step) % kClasses;
  return {{"x", Tensor::FromVector<float>({kBatch, kFeatures}, x)},
          {"y", Tensor::FromVector<int64_t>({kBatch}, y)},
          {kLearningRateInput, Tensor::FromVector<float>({}, {0.1f})},
          {kStepInput, Tensor::FromVector<float>({}, {static_cast<float>(step)})}};
}

void RunSteps(Executor* e, int64_t first, int64_t last) {
  for (int64_t s = first; s <= last; ++s) {
    auto out = e->Run(Feeds(s));
    REQUIRE(out.status().ToString() == "OK");
  }
}

std::string Bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.raw_data()), t.nbytes()); }

std::map<std::string, std::string> StateBytes(const Executor& e) {
  std::map<std::string, std::string> bytes;
  for (const auto& [name, t] : e.state()) bytes[name] = Bytes(t);
  return bytes;
}

TEST_CASE("The model fingerprint lists every parameter and buffer with its type, by name") {
  TinyModel spec;
  spec.hidden = 4;
  const Graph graph = TrainingGraph(spec);
  const std::string fp = ModelFingerprint(graph);
  // The executor's state is the same set of tensors (optimizer slots
  // included, whatever graph/training.cc names them), in the same order.
  std::unique_ptr<Executor> e = NewExecutor(graph, /*initialize=*/false);
  std::string want;
  for (const auto& [name, t] : e->state())
    want += name + "\t" + DTypeName(t.dtype()) + " " + t.shape().ToString() + "\n";
  CHECK(fp == want);
  CHECK_THAT(fp, StartsWith("bn/bias\tf32 [4]\n") && Contains("\nbn/running_var\tf32 [4]\n") &&
                     Contains("\nfc1/weight\tf32 [4, 6]\n") && Contains("\nfc2/weight\tf32 [3, 4]\n"));
  CHECK(std::count(fp.begin(), fp.end(), '\n') == 14);  // 6 parameters, 6 momentum slots, 2 BatchNorm statistics
}

TEST_CASE("Captured state is a copy that goes through a file and restores bit for bit into a new executor") {
  const Graph graph = TrainingGraph({});
  std::unique_ptr<Executor> a = NewExecutor(graph, /*initialize=*/true);
  RunSteps(a.get(), 1, 2);
  StatusOr<Checkpoint> c = CaptureExecutorState(*a);
  REQUIRE(c.status().ToString() == "OK");
  CHECK(c->position.executor_step == 2);
  CHECK(c->model_fingerprint == ModelFingerprint(graph));
  const auto captured = StateBytes(*a);
  RunSteps(a.get(), 3, 3);  // the executor moves on; the capture must not
  for (const auto& [name, t] : c->tensors) CHECK(Bytes(t) == captured.at(name));

  // Through a file and into a fresh executor.
  const std::string path = (TempDir("capture") / "c.loom").string();
  REQUIRE(SaveCheckpoint(path, *c).ok());
  StatusOr<Checkpoint> loaded = LoadCheckpoint(path);
  REQUIRE(loaded.status().ToString() == "OK");
  std::unique_ptr<Executor> b = NewExecutor(graph, /*initialize=*/false);
  REQUIRE(RestoreExecutorState(*loaded, b.get()).ToString() == "OK");
  CHECK(StateBytes(*b) == captured);
  CHECK(b->step() == 2);
}

// Continues the run of a checkpoint saved after 3 steps in a fresh
// executor: all state restored, then 3 more steps.
std::map<std::string, std::string> Resumed(const std::string& path, bool keep_step) {
  const Graph graph = TrainingGraph({});
  StatusOr<Checkpoint> c = LoadCheckpoint(path);
  REQUIRE(c.status().ToString() == "OK");
  std::unique_ptr<Executor> e = NewExecutor(graph, /*initialize=*/false);
  REQUIRE(RestoreExecutorState(*c, e.get()).ToString() == "OK");
  if (!keep_step) e->SetStep(0);
  RunSteps(e.get(), c->position.global_step + 1, c->position.global_step + 3);
  return StateBytes(*e);
}

TEST_CASE("A run resumed from a checkpoint continues bit for bit") {
  const Graph graph = TrainingGraph({});
  std::unique_ptr<Executor> straight = NewExecutor(graph, /*initialize=*/true);
  RunSteps(straight.get(), 1, 6);
  const auto want = StateBytes(*straight);

  const std::string dir = (TempDir("resume") / "run").string();
  std::unique_ptr<Executor> first = NewExecutor(graph, /*initialize=*/true);
  RunSteps(first.get(), 1, 3);
  StatusOr<Checkpoint> c = CaptureExecutorState(*first);
  REQUIRE(c.ok());
  c->position.global_step = 3;
  c->seeds["executor"] = kSeed;
  REQUIRE(SaveCheckpointToRunDir(dir, *c, /*keep_last=*/2).ok());
  first.reset();  // nothing survives but the file

  StatusOr<CheckpointFile> latest = FindLatestCheckpoint(dir);
  REQUIRE(latest.ok());
  const auto got = Resumed(latest->path, /*keep_step=*/true);
  REQUIRE(got.size() == want.size());
  for (const auto& [name, bytes] : want) {
    INFO("state " << name);
    CHECK(got.at(name) == bytes);
  }
  // The step counter is what keeps the dropout masks of the resumed steps
  // the same: without it, the run diverges.
  CHECK(Resumed(latest->path, /*keep_step=*/false).at("fc1/weight") != want.at("fc1/weight"));
}

// Restores a checkpoint of model `saved` into model `loaded`; returns the error.
Status Mismatch(const TinyModel& saved, const TinyModel& loaded) {
  std::unique_ptr<Executor> a = NewExecutor(TrainingGraph(saved), /*initialize=*/true);
  StatusOr<Checkpoint> c = CaptureExecutorState(*a);
  REQUIRE(c.ok());
  c->source = "runs/x/ckpt-3.loom";
  std::unique_ptr<Executor> b = NewExecutor(TrainingGraph(loaded), /*initialize=*/true);
  b->SetStep(5);
  const auto before = StateBytes(*b);
  Status s = RestoreExecutorState(*c, b.get());
  CHECK(StateBytes(*b) == before);  // a refused checkpoint changes nothing
  CHECK(b->step() == 5);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Contains("checkpoint 'runs/x/ckpt-3.loom' does not fit this model"));
  return s;
}

TEST_CASE("A checkpoint of another model is refused, naming the first differing tensor") {
  TinyModel base, wider, deeper, f64, adam;
  wider.hidden = 8;
  deeper.extra_layer = true;
  f64.dtype = DType::kF64;
  adam.optimizer.config.set_type("adam");
  CHECK_THAT(Mismatch(base, wider).message(),
             Contains("tensor 'bn/bias' is f32 [16] in the checkpoint but f32 [8] in the model"));
  CHECK_THAT(Mismatch(base, deeper).message(),
             Contains("tensor 'fc1b/bias' (f32 [16]) of the model is missing from the checkpoint"));
  CHECK_THAT(Mismatch(deeper, base).message(),
             Contains("tensor 'fc1b/bias' (f32 [16]) is in the checkpoint but not in the model"));
  CHECK_THAT(Mismatch(base, f64).message(),
             Contains("tensor 'bn/bias' is f32 [16] in the checkpoint but f64 [16] in the model"));
  // Other optimizer slots: the first in name order is bn/bias's.
  CHECK_THAT(Mismatch(base, adam).message(), Contains("does not fit this model: tensor 'bn/bias/"));
}

TEST_CASE("The tensors are checked even when the fingerprint agrees or is absent") {
  const Graph graph = TrainingGraph({});
  std::unique_ptr<Executor> e = NewExecutor(graph, /*initialize=*/true);
  StatusOr<Checkpoint> c = CaptureExecutorState(*e);
  REQUIRE(c.ok());

  Checkpoint missing = *c;  // fingerprint says fc2/bias, tensors lack it
  missing.tensors.erase("fc2/bias");
  Status s = RestoreExecutorState(missing, e.get());
  CHECK_THAT(s.message(),
             Contains("the checkpoint does not fit this model: tensor 'fc2/bias' (f32 [3]) of the model is missing"));

  Checkpoint reshaped = *c;
  reshaped.model_fingerprint.clear();
  reshaped.tensors["fc2/bias"] = Tensor::Zeros({1, 3});
  s = RestoreExecutorState(reshaped, e.get());
  CHECK_THAT(s.message(), Contains("tensor 'fc2/bias' is f32 [1, 3] in the checkpoint but f32 [3] in the model"));

  Checkpoint foreign = *c;
  foreign.model_fingerprint = "resnet-18 v2";
  s = RestoreExecutorState(foreign, e.get());
  CHECK_THAT(s.message(), Contains("its model fingerprint differs from this model's"));
}

}  // namespace
}  // namespace loom
