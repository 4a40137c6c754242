// Mixed precision through Compile and dynamic loss scaling in the training
// step (graph/training.h, docs/mixed_precision.md):
//  - a loss-scaled step with a power-of-two scale trains bit for bit as an
//    unscaled one (scaling and unscaling are exact), and the scale grows
//    every growth_interval good steps;
//  - fp16, fused: a replica whose scaled gradients overflow skips its own
//    step (parameters and optimizer state unchanged, bit for bit) and backs
//    its scale off alone, while the other replicas train exactly as they
//    would without it, and it trains again once its scale fits (issue 12's
//    acceptance test: HFTA's one shared scaler would skip every replica);
//  - fp16, unfused: an overflowing step is skipped the same way;
//  - `loom train` with precision fp16 and bf16 (the Trainer): the loop
//    counts skipped steps without calling them divergence, the scaler is
//    checkpointed, and a restored run ends where an uninterrupted one does.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "graph/compile.h"
#include "graph/model.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "tests/temp_files.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/run_dir.h"
#include "train/trainer.h"

namespace loom {
namespace {

constexpr int kR = 3;
const std::vector<uint64_t> kSeeds = {11, 22, 33};

Tensor Filled(const Shape& s, DType dtype, double v) {
  Tensor t = Tensor::Zeros(s, dtype);
  t.Fill(v);
  return t;
}

// Batch `step` of 6 examples of 1 x 5 x 5 and 4 classes.
std::map<std::string, Tensor> Batch(int step, DType dtype) {
  Rng rng = Rng::Stream(5, static_cast<uint64_t>(step));
  Tensor x = Tensor::Zeros({6, 1, 5, 5}, DType::kF64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = rng.Uniform(-1, 1);
  Tensor y = Tensor::Zeros({6}, DType::kI64);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = rng.UniformInt(4);
  return {{"input", *x.Cast(dtype)}, {"target", y}};
}

void BuildNet(Model& m, const std::string& model) {
  const std::map<std::string, std::string> args =
      model == "mlp" ? std::map<std::string, std::string>{{"hidden", "12,8"}}
                     : std::map<std::string, std::string>{{"channels", "3,4"}, {"hidden", "8"}};
  REQUIRE(models::BuildClassifier(m, model, args, {1, 5, 5}, 6, 4).ok());
}

StepOptimizer Sgd() {
  StepOptimizer o;
  o.config.set_type("sgd");
  o.config.set_momentum(0.9);
  return o;
}

struct Run {
  std::unique_ptr<Executor> exec;
  DType dtype;
  bool fused;

  std::map<std::string, Tensor> Step(int step, double lr = 0.05) {
    auto feeds = Batch(step, dtype);
    const Shape per_replica = fused ? Shape({kR}) : Shape{};
    feeds[kLearningRateInput] = Filled(per_replica, dtype, lr);
    feeds[kStepInput] = Filled({}, dtype, step + 1);
    if (fused) feeds[kReplicaMaskInput] = Filled({kR}, dtype, 1);
    auto out = exec->Run(feeds);
    if (!out.ok()) FAIL(out.status().ToString());
    return *out;
  }
};

Run Start(const Graph& step, DType dtype, bool fused) {
  auto e = Executor::Create(step, ExecutorOptions{Device::Cpu(), nullptr, 7, false});
  if (!e.ok()) FAIL(e.status().ToString());
  REQUIRE((*e)->InitializeState(7).ok());
  return Run{std::move(*e), dtype, fused};
}

std::vector<double> Chunk(const std::vector<double>& all, int r) {
  const size_t n = all.size() / kR;
  return std::vector<double>(all.begin() + r * n, all.begin() + (r + 1) * n);
}
std::vector<double> Chunk(const Tensor& t, int r) { return Chunk(t.ToDoubleVector(), r); }

// What a skipped step leaves alone: parameters, optimizer state and the
// scaler of other replicas; not BatchNorm's running statistics, which the
// forward pass updates (as in PyTorch, where GradScaler skips only
// optimizer.step()).
bool KeptBySkippedStep(const std::string& name) {
  return name.rfind("loss_scale/", 0) != 0 && name.find("/running_") == std::string::npos;
}

// A copy of the state's values (the executor updates its tensors in place).
std::map<std::string, std::vector<double>> Snapshot(const Executor& e) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : e.state()) out[name] = t.ToDoubleVector();
  return out;
}

TEST_CASE("a loss-scaled step with a power-of-two scale trains bit for bit as an unscaled one") {
  LossScaling scaling;
  scaling.init_scale = 1024;
  scaling.growth_interval = 2;
  for (const std::string model : {"mlp", "cnn"}) {
    for (bool fused : {false, true}) {
      INFO(model << (fused ? ", fused" : ", single"));
      Model m(DType::kF64);
      BuildNet(m, model);
      std::vector<StepOptimizer> opts(fused ? kR : 1, Sgd());
      opts[0].output_grad_norm = true;
      std::optional<Graph> plain, scaled;
      if (fused) {
        auto f = FuseReplicas(m.graph(), FusionOptions{kR, kSeeds, {}, {}});
        REQUIRE(f.ok());
        plain = BuildFusedTrainingGraph(*f, "loss", opts, true).value();
        scaled = BuildFusedTrainingGraph(*f, "loss", opts, true, scaling).value();
      } else {
        plain = BuildTrainingGraph(m.graph(), "loss", opts[0]).value();
        scaled = BuildTrainingGraph(m.graph(), "loss", opts[0], scaling).value();
      }
      Run a = Start(*plain, DType::kF64, fused), b = Start(*scaled, DType::kF64, fused);
      const double want_scale[] = {1024, 2048, 2048, 4096, 4096};
      for (int s = 0; s < 5; ++s) {
        auto oa = a.Step(s), ob = b.Step(s);
        CHECK(oa.at("loss").ToDoubleVector() == ob.at("loss").ToDoubleVector());
        CHECK(oa.at(kGradNormOutput).ToDoubleVector() == ob.at(kGradNormOutput).ToDoubleVector());
        for (double v : ob.at(kGradsFiniteOutput).ToDoubleVector()) CHECK(v == 1);
        for (double v : ob.at(kLossScaleOutput).ToDoubleVector()) CHECK(v == want_scale[s]);
      }
      for (const auto& [name, t] : a.exec->state()) {
        INFO(name);
        CHECK(t.ToDoubleVector() == b.exec->state().at(name).ToDoubleVector());
      }
    }
  }
}

TEST_CASE("fp16: a fused replica whose gradients overflow skips its own step and backs off alone") {
  for (const std::string model : {"mlp", "cnn"}) {
    INFO(model);
    Model m;
    BuildNet(m, model);
    CompileOptions o = StepOptions(Sgd(), FusionOptions{kR, kSeeds, {}, {}});
    o.precision = DType::kF16;
    o.loss_scaling.init_scale = 1024;
    auto step = Compile(m.graph(), Program::kTrainingStep, o);
    if (!step.ok()) FAIL(step.status().ToString());
    // The GEMMs (and convolutions) run in f16 behind casts.
    int f16_ops = 0;
    for (const Node& n : step->nodes())
      if ((n.op == "BatchMatMul" || n.op == "MatMul" || n.op == "Linear" || n.op == "Conv2d") &&
          step->type(n.outputs[0]).dtype == DType::kF16)
        ++f16_ops;
    CHECK(f16_ops >= 2);

    Run ref = Start(*step, DType::kF32, true), run = Start(*step, DType::kF32, true);
    // Replica 1's scale makes its f16 gradients overflow (the loss stays
    // finite: the scaled loss is f32); it backs off by halves until its
    // gradients fit.
    Tensor scales = Filled({kR}, DType::kF32, 1024);
    scales.data<float>()[1] = 0x1p40f;
    REQUIRE(run.exec->SetState(kLossScaleState, scales).ok());
    const auto start = Snapshot(*run.exec);
    int first_update = -1;
    for (int s = 0; s < 60 && first_update < 0; ++s) {
      INFO("step " << s + 1);
      auto want = ref.Step(s), got = run.Step(s);
      const auto finite = got.at(kGradsFiniteOutput).ToDoubleVector();
      const auto active = got.at(kActiveOutput).ToDoubleVector();
      const auto scale = got.at(kLossScaleOutput).ToDoubleVector();
      CHECK(std::isfinite(got.at("loss").ToDoubleVector()[1]));
      for (int r : {0, 2}) {
        CHECK(finite[r] == 1);
        CHECK(active[r] == 1);
        CHECK(scale[r] == 1024);
        CHECK(got.at("loss").ToDoubleVector()[r] == want.at("loss").ToDoubleVector()[r]);
      }
      if (finite[1] == 1) {
        first_update = s;
        CHECK(active[1] == 1);
        CHECK(scale[1] == std::ldexp(1.0, 40 - s));  // no growth yet: the count restarted
        break;
      }
      CHECK(active[1] == 0);
      CHECK(scale[1] == std::ldexp(1.0, 39 - s));
      // Replica 1 has not moved: its parameters and momentum are its start.
      for (const auto& [name, t] : run.exec->state()) {
        if (!KeptBySkippedStep(name)) continue;
        INFO(name);
        CHECK(Chunk(t, 1) == Chunk(start.at(name), 1));
      }
      // The others are exactly where they would be without replica 1's overflow.
      for (const auto& [name, t] : run.exec->state()) {
        INFO(name);
        for (int r : {0, 2}) CHECK(Chunk(t, r) == Chunk(ref.exec->state().at(name), r));
      }
    }
    // 2^40 / 6 examples needs about 25 halvings before it fits f16.
    CHECK(first_update > 10);
    CHECK(first_update < 40);
    bool moved = false;
    for (const auto& [name, t] : run.exec->state())
      if (KeptBySkippedStep(name) && Chunk(t, 1) != Chunk(start.at(name), 1)) moved = true;
    CHECK(moved);
  }
}

TEST_CASE("fp16: an unfused step whose gradients overflow leaves parameters and optimizer state as they were") {
  Model m;
  BuildNet(m, "cnn");
  CompileOptions o = StepOptions(Sgd());
  o.precision = DType::kF16;
  auto step = Compile(m.graph(), Program::kTrainingStep, o);
  if (!step.ok()) FAIL(step.status().ToString());
  Run run = Start(*step, DType::kF32, false);
  CHECK(run.exec->GetState(kLossScaleState)->ScalarAt(0) == 65536);  // GradScaler's init_scale
  REQUIRE(run.exec->SetState(kLossScaleState, Filled({}, DType::kF32, 0x1p60f)).ok());
  const auto before = Snapshot(*run.exec);
  auto out = run.Step(0);
  CHECK(out.at(kGradsFiniteOutput).ScalarAt(0) == 0);
  CHECK(out.at(kLossScaleOutput).ScalarAt(0) == 0x1p59);
  CHECK(std::isfinite(out.at("loss").ScalarAt(0)));
  for (const auto& [name, t] : run.exec->state()) {
    if (!KeptBySkippedStep(name)) continue;
    INFO(name);
    CHECK(t.ToDoubleVector() == before.at(name));
  }
  // A scale that fits: the step updates.
  REQUIRE(run.exec->SetState(kLossScaleState, Filled({}, DType::kF32, 256)).ok());
  out = run.Step(1);
  CHECK(out.at(kGradsFiniteOutput).ScalarAt(0) == 1);
  CHECK(run.exec->state().at("fc/weight").ToDoubleVector() != before.at("fc/weight"));
}

TEST_CASE("Compile: bf16 casts without a loss scaler, fp16 adds one, and bad scaler settings are refused") {
  Model m;
  BuildNet(m, "cnn");
  CompileOptions o = StepOptions(Sgd());
  o.precision = DType::kBF16;
  auto bf16 = Compile(m.graph(), Program::kTrainingStep, o);
  if (!bf16.ok()) FAIL(bf16.status().ToString());
  CHECK(!bf16->NodesWithOp("Cast").empty());
  CHECK(bf16->NodesWithOp("LossScaleUpdate").empty());
  CHECK(bf16->outputs().count(kLossScaleOutput) == 0);
  o.precision = DType::kF16;
  auto f16 = Compile(m.graph(), Program::kTrainingStep, o);
  REQUIRE(f16.ok());
  CHECK(f16->NodesWithOp("LossScaleUpdate").size() == 1);
  // Evaluation graphs take the same casts, no scaler.
  auto eval = Compile(m.graph(), Program::kForward, o);
  REQUIRE(eval.ok());
  CHECK(!eval->NodesWithOp("Cast").empty());
  CHECK(eval->NodesWithOp("LossScaleUpdate").empty());

  o.loss_scaling.backoff_factor = 1.5;
  auto bad = Compile(m.graph(), Program::kTrainingStep, o);
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("loss_scale.backoff_factor must be in (0, 1), got 1.5"));
  CHECK_THAT(bad.status().message(), Catch::Contains("training-step"));
}

// ---- loom train (the Trainer) ----

// 96 synthetic 4 x 4 images, batches of 16: 6 steps per epoch.
std::string Config(const std::string& extra) {
  return R"(
model { name: "cnn" args { key: "channels" value: "4" } args { key: "hidden" value: "8" } }
data {
  dataset: "synthetic"
  input_shape: [1, 4, 4]
  num_classes: 3
  num_examples: 96
  batch_size: 16
  eval_batch_size: 32
}
optimizer { type: "sgd" lr: 0.1 momentum: 0.9 }
epochs: 3
threads: 1
log_every_steps: 3
tensorboard: false
)" + extra;
}

TrainerOptions InFolder(const std::string& dir, std::vector<metrics::MetricsRecord>* records = nullptr) {
  TrainerOptions o;
  o.out_dir = dir;
  if (records) o.on_metrics = [records](const metrics::MetricsRecord& r) { records->push_back(r); };
  return o;
}

double Extra(const metrics::MetricsRecord& r, const std::string& key) {
  for (const auto& [k, v] : r.extra)
    if (k == key) return v;
  FAIL("no " << key << " in the record");
  return 0;
}

TEST_CASE("loom train with precision fp16: overflowed steps are skipped, not divergence, and resume exactly") {
  const std::string tmp = testing::FreshTempDir(Catch::getResultCapture().getCurrentTestName()).string();
  // A scale of 2^30 overflows f16 gradients at first: about a dozen steps
  // are skipped while it backs off, then the run trains.
  const std::string config = Config(R"(
precision: "fp16"
loss_scale { init_scale: 1073741824 growth_interval: 4 }
replicas { optimizer { lr: 0.1 } }
replicas { optimizer { lr: 0.05 } }
)");
  std::vector<metrics::MetricsRecord> records;
  auto whole = Trainer::FromConfigText(config, InFolder(tmp + "/whole", &records));
  if (!whole.ok()) FAIL(whole.status().ToString());
  auto result = (*whole)->Run();
  if (!result.ok()) FAIL(result.status().ToString());
  CHECK(result->steps == 18);
  double skipped[2] = {0, 0}, last_scale[2] = {0, 0};
  for (const auto& r : records) {
    if (r.split != metrics::Split::kTrain) continue;
    REQUIRE(r.replica >= 0);
    skipped[r.replica] += Extra(r, "skipped_steps");
    last_scale[r.replica] = Extra(r, "loss_scale");
    CHECK(std::isfinite(r.loss));
  }
  for (int r = 0; r < 2; ++r) {
    INFO("replica " << r);
    CHECK(skipped[r] >= 5);
    CHECK(skipped[r] < 18);
    CHECK(last_scale[r] < 1073741824.0);
  }
  REQUIRE(result->replicas.size() == 2);
  for (const auto& rep : result->replicas) CHECK(rep.status == "running");

  // The scaler is checkpointed; a restored run ends where the whole one did.
  auto b = Trainer::FromConfigText(config, InFolder(tmp + "/b"));
  REQUIRE(b.ok());
  for (int i = 0; i < 7; ++i) REQUIRE((*b)->Step().ok());
  const std::string saved = tmp + "/step7.loom";
  REQUIRE((*b)->SaveCheckpoint(saved).ok());
  auto ckpt = LoadCheckpoint(saved);
  REQUIRE(ckpt.ok());
  CHECK(ckpt->tensors.count(kLossScaleState) + ckpt->tensors.count(std::string("replica_0/") + kLossScaleState) >= 1);
  auto c = Trainer::FromConfigText(config, InFolder(tmp + "/c"));
  REQUIRE(c.ok());
  REQUIRE((*c)->Restore(saved).ok());
  REQUIRE((*c)->Run().ok());
  auto a_last = FindLatestCheckpoint(tmp + "/whole");
  auto c_last = FindLatestCheckpoint(tmp + "/c");
  REQUIRE(a_last.ok());
  REQUIRE(c_last.ok());
  const auto ta = LoadCheckpoint(a_last->path)->tensors, tc = LoadCheckpoint(c_last->path)->tensors;
  REQUIRE(ta.size() == tc.size());
  for (const auto& [name, t] : ta) {
    INFO(name);
    CHECK(t.ToDoubleVector() == tc.at(name).ToDoubleVector());
  }
}

TEST_CASE("loom train with precision bf16 trains a single model and reports no scaler") {
  const std::string tmp = testing::FreshTempDir(Catch::getResultCapture().getCurrentTestName()).string();
  std::vector<metrics::MetricsRecord> records;
  auto t = Trainer::FromConfigText(Config("precision: \"bf16\"\n"), InFolder(tmp + "/run", &records));
  if (!t.ok()) FAIL(t.status().ToString());
  auto result = (*t)->Run();
  if (!result.ok()) FAIL(result.status().ToString());
  CHECK(result->steps == 18);
  CHECK(std::isfinite(result->test_loss));
  for (const auto& r : records)
    for (const auto& [k, v] : r.extra) CHECK(k != "loss_scale");
}

}  // namespace
}  // namespace loom
