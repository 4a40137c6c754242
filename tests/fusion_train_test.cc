// Horizontal fusion, whole training: K steps of one fused run of R = 3
// replicas (different learning rates, optimizer hyper-parameters, clipping
// norms and seeds, so different initial parameters and dropout masks) must
// give the losses, parameters, buffers and optimizer state of 3 separate
// runs. Models: the zoo's MLP (with dropout) and CNN (with BatchNorm), a
// small transformer block and an LSTM classifier.
//
// Tolerance: f64 runs, 1e-9 relative. Fused and separate runs execute the
// same arithmetic per replica except for the summation order inside
// products (a batched GEMM or grouped convolution blocks differently from
// the single-replica one), which costs a few ulps per step; over 6 steps
// that stays many orders below 1e-9. An f32 MLP run is checked at 1e-4
// (f32 ulps, 2^-23 ~ 1.2e-7, amplified over the steps by the updates).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/rng.h"
#include "graph/fusion.h"
#include "graph/model.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "tests/small_nets.h"

namespace loom {
namespace {

constexpr int kR = 3;
constexpr int kSteps = 6;
const std::vector<uint64_t> kSeeds = {11, 22, 33};

struct Net {
  std::string label;
  std::function<void(Model&)> build;                      // inputs + outputs "loss"
  std::function<std::map<std::string, Tensor>(int step, DType dtype)> batch;  // shared data
};

Tensor RandomFloat(const Shape& s, DType dtype, uint64_t key) {
  Rng rng = Rng::Stream(5, key);
  Tensor t = Tensor::Zeros(s, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.Uniform(-1, 1);
  return *t.Cast(dtype);
}

Tensor RandomLabels(const Shape& s, int64_t classes, uint64_t key) {
  Rng rng = Rng::Stream(6, key);
  Tensor t = Tensor::Zeros(s, DType::kI64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = rng.UniformInt(classes);
  return t;
}

std::function<std::map<std::string, Tensor>(int, DType)> ImageBatches(Shape image, int64_t classes) {
  return [image, classes](int step, DType dtype) {
    return std::map<std::string, Tensor>{{"input", RandomFloat(image, dtype, step)},
                                         {"target", RandomLabels({image[0]}, classes, step)}};
  };
}

std::vector<Net> Nets() {
  std::vector<Net> nets;
  nets.push_back({"mlp with dropout",
                  [](Model& m) {
                    REQUIRE(models::BuildClassifier(m, "mlp", {{"hidden", "12,8"}, {"dropout", "0.2"}}, {1, 5, 5},
                                                    6, 4)
                                .ok());
                  },
                  ImageBatches({6, 1, 5, 5}, 4)});
  nets.push_back({"cnn with batchnorm",
                  [](Model& m) {
                    REQUIRE(models::BuildClassifier(m, "cnn", {{"channels", "3,4"}, {"hidden", "8"}}, {1, 8, 8}, 4, 3)
                                .ok());
                  },
                  ImageBatches({4, 1, 8, 8}, 3)});
  nets.push_back({"transformer block",
                  [](Model& m) {
                    testing::TransformerBlock(m);
                    REQUIRE(m.status().ok());
                  },
                  [](int step, DType) {
                    return std::map<std::string, Tensor>{{"tokens", RandomLabels({3, 5}, 11, 100 + step)},
                                                         {"target", RandomLabels({3}, 4, step)}};
                  }});
  nets.push_back({"lstm classifier",
                  [](Model& m) {
                    testing::LstmClassifier(m);
                    REQUIRE(m.status().ok());
                  },
                  [](int step, DType dtype) {
                    return std::map<std::string, Tensor>{{"seq", RandomFloat({4, 3, 5}, dtype, step)},
                                                         {"target", RandomLabels({3}, 4, step)}};
                  }});
  return nets;
}

// Per-replica optimizers: same type, everything else different.
std::vector<StepOptimizer> Optimizers(const std::string& type) {
  std::vector<StepOptimizer> opts(kR);
  for (int r = 0; r < kR; ++r) opts[r].config.set_type(type);
  if (type == "sgd") {
    opts[0].config.set_momentum(0.9);
    opts[1].config.set_momentum(0.0);  // no momentum in one replica, while the others keep a buffer
    opts[1].config.set_weight_decay(1e-2);
    opts[2].config.set_momentum(0.5);
    opts[2].config.set_dampening(0.1);
  } else {
    opts[0].config.set_beta1(0.8);
    opts[1].config.set_beta2(0.99);
    opts[1].config.set_weight_decay(0.05);
    opts[2].config.set_eps(1e-6);
  }
  opts[0].config.set_clip_grad_norm(0.5);  // clips
  opts[2].config.set_clip_grad_norm(1e3);  // does not
  return opts;
}
const double kLearningRates[kR] = {0.05, 0.1, 0.02};

Tensor Fill(const Shape& s, DType dtype, double v) {
  Tensor t = Tensor::Zeros(s, dtype);
  t.Fill(v);
  return t;
}

std::vector<double> Chunk(const Tensor& t, int r, int replicas) {
  const std::vector<double> all = t.ToDoubleVector();
  const size_t n = all.size() / replicas;
  return std::vector<double>(all.begin() + r * n, all.begin() + (r + 1) * n);
}

bool Close(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  return std::abs(got - want) <= tol * std::max(1.0, std::abs(want));
}

struct SeparateRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> state;
};

SeparateRun TrainSeparately(const Net& net, DType dtype, const StepOptimizer& opt, double lr, uint64_t seed) {
  Model m(dtype);
  net.build(m);
  auto g = BuildTrainingGraph(m.graph(), "loss", opt);
  REQUIRE(g.ok());
  auto e = Executor::Create(*g, ExecutorOptions{Device::Cpu(), nullptr, seed, false});
  REQUIRE(e.ok());
  REQUIRE((*e)->InitializeState(seed).ok());
  SeparateRun run;
  for (int s = 0; s < kSteps; ++s) {
    auto feeds = net.batch(s, dtype);
    feeds["lr"] = Fill({}, dtype, lr);
    feeds["step"] = Fill({}, dtype, s + 1);
    auto out = (*e)->Run(feeds);
    REQUIRE(out.ok());
    run.losses.push_back(out->at("loss").ScalarAt(0));
  }
  run.state = (*e)->state();
  return run;
}

struct FusedRun {
  std::vector<std::vector<double>> losses;  // [step][replica]
  std::vector<std::vector<double>> active;  // [step][replica]
  std::map<std::string, Tensor> state;
};

FusedRun TrainFused(const Net& net, DType dtype, const std::vector<StepOptimizer>& opts,
                    const std::vector<double>& lrs) {
  Model m(dtype);
  net.build(m);
  auto fused = FuseReplicas(m.graph(), FusionOptions{kR, kSeeds, {}, {}});
  if (!fused.ok()) FAIL(fused.status().ToString());
  auto g = BuildFusedTrainingGraph(*fused, "loss", opts, /*isolate_divergence=*/true);
  if (!g.ok()) FAIL(g.status().ToString());
  auto e = Executor::Create(*g, ExecutorOptions{Device::Cpu(), nullptr, 999, false});
  REQUIRE(e.ok());
  REQUIRE((*e)->InitializeState(999).ok());
  Tensor lr = Tensor::Zeros({kR}, DType::kF64);
  for (int r = 0; r < kR; ++r) lr.data<double>()[r] = lrs[r];
  FusedRun run;
  for (int s = 0; s < kSteps; ++s) {
    auto feeds = net.batch(s, dtype);
    feeds["lr"] = *lr.Cast(dtype);
    feeds["step"] = Fill({}, dtype, s + 1);
    feeds["replica_mask"] = Fill({kR}, dtype, 1);
    auto out = (*e)->Run(feeds);
    if (!out.ok()) FAIL(out.status().ToString());
    run.losses.push_back(out->at("loss").ToDoubleVector());
    run.active.push_back(out->at("active").ToDoubleVector());
  }
  run.state = (*e)->state();
  return run;
}

void CheckEquivalent(const Net& net, DType dtype, const std::vector<StepOptimizer>& opts,
                     const std::vector<double>& lrs, double tol) {
  INFO(net.label << ", " << opts[0].config.type() << ", " << DTypeName(dtype));
  const FusedRun fused = TrainFused(net, dtype, opts, lrs);
  for (int r = 0; r < kR; ++r) {
    INFO("replica " << r);
    const SeparateRun sep = TrainSeparately(net, dtype, opts[r], lrs[r], kSeeds[r]);
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s + 1 << ": fused loss " << fused.losses[s][r] << ", separate " << sep.losses[s]);
      CHECK(Close(fused.losses[s][r], sep.losses[s], tol));
      CHECK(fused.active[s][r] == 1);
    }
    REQUIRE(fused.state.size() >= sep.state.size());  // + buffers other replicas need
    for (const auto& [name, t] : sep.state) {
      INFO("state " << name);
      REQUIRE(fused.state.count(name) == 1);
      const auto got = Chunk(fused.state.at(name), r, kR);
      const auto want = t.ToDoubleVector();
      REQUIRE(got.size() == want.size());
      size_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += Close(got[i], want[i], tol) ? 0 : 1;
      CHECK(bad == 0);
    }
  }
  // The replicas really differ (different seeds and hyper-parameters).
  CHECK(fused.losses[kSteps - 1][0] != fused.losses[kSteps - 1][1]);
}

void CheckEquivalent(const Net& net, DType dtype, const std::string& optimizer, double tol) {
  CheckEquivalent(net, dtype, Optimizers(optimizer), std::vector<double>(kLearningRates, kLearningRates + kR), tol);
}

TEST_CASE("fused training of 3 replicas equals 3 separate runs (f64, SGD)") {
  for (const Net& net : Nets()) CheckEquivalent(net, DType::kF64, "sgd", 1e-9);
}

TEST_CASE("fused training of 3 replicas equals 3 separate runs (f64, AdamW)") {
  for (const Net& net : Nets()) CheckEquivalent(net, DType::kF64, "adamw", 1e-9);
}

TEST_CASE("fused training equals separate runs in f32 (MLP)") {
  CheckEquivalent(Nets()[0], DType::kF32, "sgd", 1e-4);
}

// The CNN sweep's trials at lr ~0.2 with momentum 0.95 ended ~1e-2 in f32
// loss from the same trials trained alone (docs/sweep.md). At such rates
// in f64 the fused CNN (BatchNorm, per-replica momentum buffers) still
// computes the separate runs' steps: the f32 gap is rounding that the
// rate amplifies over epochs, not a difference of the fused step.
TEST_CASE("fused CNN equals separate runs at high learning rates with momentum 0.95 (f64, SGD)") {
  std::vector<StepOptimizer> opts(kR);
  for (StepOptimizer& o : opts) {
    o.config.set_type("sgd");
    o.config.set_momentum(0.95);
  }
  CheckEquivalent(Nets()[1], DType::kF64, opts, {0.2, 0.3, 0.15}, 1e-9);
}

TEST_CASE("a diverging replica is frozen and the others train as if it never existed") {
  const std::vector<Net> nets = Nets();
  const Net& net = nets[0];
  const auto opts = Optimizers("sgd");
  std::vector<double> lrs(kLearningRates, kLearningRates + kR);
  lrs[1] = 1e200;  // replica 1 overflows within a couple of steps
  const FusedRun fused = TrainFused(net, DType::kF64, opts, lrs);
  int frozen_at = -1;
  for (int s = 0; s < kSteps; ++s) {
    CHECK(fused.active[s][0] == 1);
    CHECK(fused.active[s][2] == 1);
    if (frozen_at < 0 && fused.active[s][1] == 0) frozen_at = s;
    if (frozen_at >= 0) CHECK(fused.active[s][1] == 0);  // stays frozen: its state no longer changes
  }
  REQUIRE(frozen_at >= 0);
  // Frozen replica: finite parameters (the step that diverged was not applied).
  for (const auto& [name, t] : fused.state)
    for (double v : Chunk(t, 1, kR)) CHECK(std::isfinite(v));
  for (int r : {0, 2}) {
    INFO("replica " << r);
    const SeparateRun sep = TrainSeparately(net, DType::kF64, opts[r], lrs[r], kSeeds[r]);
    for (int s = 0; s < kSteps; ++s) CHECK(Close(fused.losses[s][r], sep.losses[s], 1e-9));
    for (const auto& [name, t] : sep.state) {
      INFO("state " << name);
      const auto got = Chunk(fused.state.at(name), r, kR);
      const auto want = t.ToDoubleVector();
      size_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += Close(got[i], want[i], 1e-9) ? 0 : 1;
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("fused parameters start as each replica's seed would start them") {
  Model m;
  Nets()[1].build(m);
  auto fused = FuseReplicas(m.graph(), FusionOptions{kR, kSeeds, {}, {}});
  REQUIRE(fused.ok());
  auto fe = Executor::Create(*fused);
  REQUIRE(fe.ok());
  REQUIRE((*fe)->InitializeState(0).ok());
  for (int r = 0; r < kR; ++r) {
    auto se = Executor::Create(m.graph());
    REQUIRE(se.ok());
    REQUIRE((*se)->InitializeState(kSeeds[r]).ok());
    for (const auto& [name, t] : (*se)->state()) {
      INFO(name << " replica " << r);
      CHECK(Chunk((*fe)->state().at(name), r, kR) == t.ToDoubleVector());
    }
  }
}

TEST_CASE("fusion errors name the problem") {
  Model m;
  Nets()[0].build(m);
  auto seeds = FuseReplicas(m.graph(), FusionOptions{2, {1}, {}, {}});
  REQUIRE_FALSE(seeds.ok());
  CHECK_THAT(seeds.status().message(), Catch::Contains("needs 2 seeds"));
  auto layer = FuseReplicas(m.graph(), FusionOptions{2, {1, 2}, {"no_such_layer"}, {}});
  REQUIRE_FALSE(layer.ok());
  CHECK_THAT(layer.status().message(), Catch::Contains("no_such_layer"));
  auto fused = FuseReplicas(m.graph(), FusionOptions{2, {1, 2}, {}, {}});
  REQUIRE(fused.ok());
  std::vector<StepOptimizer> mixed(2);
  mixed[1].config.set_type("adam");
  auto g = BuildFusedTrainingGraph(*fused, "loss", mixed, true);
  REQUIRE_FALSE(g.ok());
  CHECK_THAT(g.status().message(), Catch::Contains("share one optimizer type"));
}

}  // namespace
}  // namespace loom
