#include "train/config/replicas.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "train/config/train_config.h"

namespace loom {
namespace {

// Three lines; what a test appends starts at line 4.
const char kBase[] =
    "model { name: \"mlp\" }\n"
    "data { dataset: \"fashion_mnist\" }\n"
    "optimizer { type: \"sgd\" lr: 0.1 momentum: 0.9 }\n";

std::vector<ReplicaSpec> Expand(const std::string& text) {
  auto c = ParseTrainConfig(text, "cfg.pbtxt");
  REQUIRE(c.status().ToString() == "OK");
  auto r = ExpandReplicas(*c);
  REQUIRE(r.status().ToString() == "OK");
  return *r;
}

// The loader's error for a config (it expands fused configs to check them).
std::string Error(const std::string& text) {
  auto c = ParseTrainConfig(text, "cfg.pbtxt");
  REQUIRE_FALSE(c.ok());
  return c.status().message();
}

TEST_CASE("explicit replicas override the base's fields, zeros included") {
  auto r = Expand(std::string(kBase) +
                  "schedule { type: \"multistep\" milestones: [3, 6] }\n"
                  "seed: 10\n"
                  "replicas { }\n"
                  "replicas { name: \"slow\" optimizer { lr: 0.01 momentum: 0 } seed: 99 }\n"
                  "replicas { schedule { milestones: [5] } }\n");
  REQUIRE(r.size() == 3);
  CHECK(r[0].config.optimizer().lr() == 0.1);
  CHECK(r[0].config.optimizer().momentum() == 0.9);
  CHECK(r[1].config.optimizer().lr() == 0.01);
  CHECK(r[1].config.optimizer().has_momentum());
  CHECK(r[1].config.optimizer().momentum() == 0);  // 0 set over the base's 0.9
  CHECK(r[2].config.optimizer().momentum() == 0.9);
  // A list replaces the base's list.
  CHECK(std::vector<int64_t>(r[0].config.schedule().milestones().begin(), r[0].config.schedule().milestones().end()) ==
        std::vector<int64_t>{3, 6});
  CHECK(std::vector<int64_t>(r[2].config.schedule().milestones().begin(), r[2].config.schedule().milestones().end()) ==
        std::vector<int64_t>{5});
  // Seeds: the base seed + index unless given.
  CHECK(r[0].config.seed() == 10);
  CHECK(r[1].config.seed() == 99);
  CHECK(r[2].config.seed() == 12);
  // Complete single-model configs: no replicas or sweep, defaults filled,
  // the fusion block kept (with its defaults).
  for (const auto& s : r) {
    CHECK(s.config.replicas_size() == 0);
    CHECK_FALSE(s.config.has_sweep());
    CHECK_FALSE(IsFused(s.config));
    CHECK(s.config.data().batch_size() == 128);
    CHECK(s.config.schedule().gamma() == 0.1);
    CHECK(s.config.fusion().isolate_divergence());
  }
  // Labels: the name and the fields that differ between the replicas.
  CHECK(r[0].label == "r0 lr=0.1 momentum=0.9 milestones=3,6 seed=10");
  CHECK(r[1].label == "slow lr=0.01 momentum=0 milestones=3,6 seed=99");
  CHECK(r[2].label == "r2 lr=0.1 momentum=0.9 milestones=5 seed=12");
}

TEST_CASE("labels show only what differs; a fused config loads with its blocks") {
  auto c = ParseTrainConfig(std::string(kBase) +
                                "replicas { optimizer { lr: 0.1 momentum: 0.9 } }\n"
                                "replicas { optimizer { lr: 0.2 momentum: 0.9 } }\n"
                                "fusion { unfused_layers: \"fc1\" isolate_divergence: false\n"
                                "  early_stop { after_epochs: 2 } }\n",
                            "cfg.pbtxt");
  REQUIRE(c.ok());
  CHECK(IsFused(*c));
  CHECK(c->replicas_size() == 2);  // the loaded config keeps its replicas
  CHECK(c->fusion().early_stop().every_epochs() == 1);
  CHECK(c->fusion().early_stop().keep_fraction() == 0.5);
  CHECK(c->fusion().early_stop().metric() == "test_accuracy");
  auto r = ExpandReplicas(*c);
  REQUIRE(r.ok());
  CHECK((*r)[0].label == "r0 lr=0.1");
  CHECK((*r)[1].label == "r1 lr=0.2");
  CHECK((*r)[1].config.seed() == 1);
  CHECK_FALSE((*r)[1].config.fusion().isolate_divergence());
  CHECK((*r)[1].config.fusion().unfused_layers(0) == "fc1");
  CHECK((*r)[1].config.fusion().early_stop().after_epochs() == 2);
  // The resolved text (what a run folder keeps) loads back to the same.
  auto again = ParseTrainConfig(TrainConfigToText(*c), "resolved");
  REQUIRE(again.ok());
  CHECK(TrainConfigToText(*again) == TrainConfigToText(*c));
}

TEST_CASE("the example of docs/train_config.md expands as documented") {
  auto r = Expand(
      "model { name: \"mlp\" }\ndata { dataset: \"fashion_mnist\" }\n"
      "optimizer { type: \"sgd\" lr: 0.05 momentum: 0.9 }\n"
      "replicas { }\n"
      "replicas { name: \"plain\" optimizer { momentum: 0 } }\n"
      "replicas { optimizer { lr: 0.1 } schedule { warmup_steps: 500 } seed: 42 }\n"
      "fusion {\n  unfused_layers: \"fc1\"\n  isolate_divergence: true\n"
      "  early_stop { after_epochs: 2 every_epochs: 1 keep_fraction: 0.5 metric: \"test_accuracy\" }\n}\n");
  REQUIRE(r.size() == 3);
  CHECK(r[0].label == "r0 lr=0.05 momentum=0.9 warmup_steps=0 seed=0");
  CHECK(r[1].label == "plain lr=0.05 momentum=0 warmup_steps=0 seed=1");
  CHECK(r[2].label == "r2 lr=0.1 momentum=0.9 warmup_steps=500 seed=42");
  auto g = Expand(std::string(kBase) +
                  "sweep {\n  method: \"grid\"\n"
                  "  param { field: \"optimizer.lr\" values: [0.01, 0.03, 0.1] }\n"
                  "  param { field: \"optimizer.momentum\" values: [0, 0.9] }\n}\n");
  REQUIRE(g.size() == 6);
  CHECK(g[3].label == "r3 lr=0.03 momentum=0.9");
}

TEST_CASE("a single model is one replica and its resolved config is unchanged") {
  auto c = ParseTrainConfig(std::string(kBase) + "seed: 4\n", "cfg.pbtxt");
  REQUIRE(c.ok());
  CHECK_FALSE(IsFused(*c));
  CHECK_FALSE(c->has_fusion());
  CHECK(TrainConfigToText(*c).find("fusion") == std::string::npos);
  auto r = ExpandReplicas(*c);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  CHECK(TrainConfigToText((*r)[0].config) == TrainConfigToText(*c));
  CHECK((*r)[0].label == "r0");
}

TEST_CASE("a grid sweep is the product of the values, the first param varying slowest") {
  auto r = Expand(std::string(kBase) +
                  "seed: 5\n"
                  "sweep {\n"
                  "  method: \"grid\"\n"
                  "  param { field: \"optimizer.lr\" values: [0.1, 0.01] }\n"
                  "  param { field: \"optimizer.momentum\" values: [0, 0.5, 0.9] }\n"
                  "  param { field: \"schedule.warmup_steps\" values: [10.4] }\n"
                  "}\n");
  REQUIRE(r.size() == 6);
  const double lr[] = {0.1, 0.1, 0.1, 0.01, 0.01, 0.01}, momentum[] = {0, 0.5, 0.9, 0, 0.5, 0.9};
  for (int k = 0; k < 6; ++k) {
    CHECK(r[k].config.optimizer().lr() == lr[k]);
    CHECK(r[k].config.optimizer().momentum() == momentum[k]);
    CHECK(r[k].config.schedule().warmup_steps() == 10);  // an integer field gets the rounded value
    CHECK(r[k].config.seed() == 5u + k);
  }
  CHECK(r[0].label == "r0 lr=0.1 momentum=0");
  CHECK(r[4].label == "r4 lr=0.01 momentum=0.5");
}

TEST_CASE("a grid can sweep seeds") {
  auto r = Expand(std::string(kBase) + "sweep { method: \"grid\" param { field: \"seed\" values: [7, 7.6, 100] } }\n");
  REQUIRE(r.size() == 3);
  CHECK(r[0].config.seed() == 7);
  CHECK(r[1].config.seed() == 8);
  CHECK(r[2].config.seed() == 100);
  CHECK(r[2].label == "r2 seed=100");
}

TEST_CASE("a random sweep is deterministic in its seed and stays in range") {
  const std::string params =
      "  param { field: \"optimizer.lr\" distribution: \"log_uniform\" min: 1e-4 max: 0.1 }\n"
      "  param { field: \"optimizer.weight_decay\" values: [0, 1e-4] }\n"
      "  param { field: \"schedule.warmup_steps\" min: 0 max: 100 }\n";
  auto sweep = [&](int seed, const std::string& extra = "") {
    return Expand(std::string(kBase) + "sweep {\n  method: \"random\"\n  count: 200\n  seed: " + std::to_string(seed) +
                  "\n" + params + extra + "}\n");
  };
  auto a = sweep(7), b = sweep(7), c = sweep(8);
  REQUIRE(a.size() == 200);
  int low = 0, high = 0, wd0 = 0, differ = 0;
  std::set<double> lrs;
  for (size_t k = 0; k < a.size(); ++k) {
    const auto& o = a[k].config.optimizer();
    CHECK(TrainConfigToText(a[k].config) == TrainConfigToText(b[k].config));
    CHECK(a[k].label == b[k].label);
    if (o.lr() != c[k].config.optimizer().lr()) ++differ;
    CHECK(o.lr() >= 1e-4);
    CHECK(o.lr() <= 0.1);
    lrs.insert(o.lr());
    if (o.lr() < 1e-3) ++low;
    if (o.lr() > 1e-2) ++high;
    CHECK((o.weight_decay() == 0 || o.weight_decay() == 1e-4));
    if (o.weight_decay() == 0) ++wd0;
    const int64_t w = a[k].config.schedule().warmup_steps();
    CHECK(w >= 0);
    CHECK(w <= 100);
    CHECK(a[k].config.seed() == k);
  }
  CHECK(differ == 200);  // another seed, other draws
  CHECK(lrs.size() == 200);
  // Log-uniform: about a third of the draws in each decade.
  CHECK(low > 40);
  CHECK(high > 40);
  CHECK(wd0 > 60);
  CHECK(wd0 < 140);
  // A draw depends only on (seed, replica, param): adding a param changes no other.
  auto d = sweep(7, "  param { field: \"optimizer.momentum\" min: 0 max: 0.99 }\n");
  for (size_t k = 0; k < a.size(); ++k) {
    CHECK(d[k].config.optimizer().lr() == a[k].config.optimizer().lr());
    CHECK(d[k].config.optimizer().momentum() < 0.99);
  }
}

TEST_CASE("replica errors name the place and the line") {
  const std::string b = kBase;
  CHECK(Error(b + "replicas { }\nsweep { method: \"grid\" param { field: \"seed\" values: [1] } }\n") ==
        "cfg.pbtxt:5: field sweep: cannot be combined with replicas (list the replicas or sweep, not both)");
  CHECK(Error(b + "replicas { }\nreplicas {\n  optimizer { type: \"adam\" }\n}\n") ==
        "cfg.pbtxt:6: field replicas[1].optimizer.type: must be the base optimizer's 'sgd' (the replicas share one "
        "fused optimizer), got 'adam'");
  CHECK(Error(b + "replicas { optimizer { nesterov: true } }\n") ==
        "cfg.pbtxt:4: field replicas[0].optimizer.nesterov: must be the same for every replica (the replicas share "
        "one fused optimizer): the base has false");
  CHECK(Error("model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\noptimizer { type: \"rmsprop\" centered: true }\n"
              "replicas { }\nreplicas { optimizer { centered: false } }\n") ==
        "cfg.pbtxt:5: field replicas[1].optimizer.centered: must be the same for every replica (the replicas share "
        "one fused optimizer): the base has true");
  CHECK(Error(b + "replicas { name: \"a\" }\nreplicas { name: \"a\" }\n") ==
        "cfg.pbtxt:5: field replicas[1].name: 'a' is also the name of replicas[0]");
  CHECK(Error(b + "replicas { }\nreplicas { }\nreplicas {\n  optimizer {\n    lr: -1\n  }\n}\n") ==
        "cfg.pbtxt:8: field replicas[2].optimizer.lr: must be > 0, got -1");
  CHECK(Error(b + "replicas { }\nreplicas { optimizer { lr: 0 } }\n") ==
        "cfg.pbtxt:5: field replicas[1].optimizer.lr: must be > 0, got 0");
  CHECK(Error(b + "replicas { schedule { type: \"step\" } }\n") ==
        "cfg.pbtxt: field schedule.step_size (replica 0): must be >= 1, got 0");
  // A combination of a base field and a replica's: the base field's line.
  CHECK(Error("model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\n"
              "optimizer { type: \"sgd\" momentum: 0.9\n  nesterov: true }\n"
              "replicas { }\nreplicas { name: \"plain\" optimizer { momentum: 0 } }\n") ==
        "cfg.pbtxt:4: field optimizer.nesterov (replica 1 'plain'): needs momentum > 0 and dampening 0");
}

TEST_CASE("sweep errors name the param") {
  const std::string b = kBase;
  auto sweep = [&](const std::string& body) { return Error(b + "sweep {\n" + body + "}\n"); };
  const std::string allowed =
      "(allowed: optimizer.lr, optimizer.momentum, optimizer.dampening, optimizer.weight_decay, optimizer.beta1, "
      "optimizer.beta2, optimizer.eps, optimizer.rho, optimizer.alpha, optimizer.clip_grad_norm, "
      "schedule.step_size, schedule.gamma, schedule.t_max, schedule.eta_min, schedule.warmup_steps, "
      "schedule.warmup_start_factor, seed)";
  CHECK(sweep("method: \"grid\"\nparam { field: \"seed\" values: [1] }\nparam {\n  field: \"optimizer.lrate\"\n"
              "  values: [1] }\n") ==
        "cfg.pbtxt:8: field sweep.param[1].field: 'optimizer.lrate' is not a per-replica field " + allowed);
  CHECK(sweep("method: \"grid\"\nparam { field: \"data.batch_size\" values: [32] }\n") ==
        "cfg.pbtxt:6: field sweep.param[0].field: 'data.batch_size' is not a per-replica field " + allowed);
  CHECK(sweep("method: \"grid\"\nparam { field: \"optimizer.nesterov\" values: [1] }\n")
            .find("field sweep.param[0].field: 'optimizer.nesterov' is not a per-replica field") != std::string::npos);
  CHECK(sweep("method: \"grid\"\nparam { values: [1] }\n") ==
        "cfg.pbtxt:6: field sweep.param[0].field: is required (one of: " + allowed.substr(10));
  CHECK(sweep("method: \"grid\"\nparam { field: \"seed\" values: [1] }\nparam { field: \"seed\" values: [2] }\n") ==
        "cfg.pbtxt:7: field sweep.param[1].field: 'seed' is already swept by sweep.param[0]");
  CHECK(sweep("param { field: \"seed\" values: [1] }\n") ==
        "cfg.pbtxt:4: field sweep.method: is required: grid or random");
  CHECK(sweep("method: \"bayes\"\nparam { field: \"seed\" values: [1] }\n") ==
        "cfg.pbtxt:5: field sweep.method: unknown value 'bayes' (expected one of: grid, random)");
  CHECK(sweep("method: \"grid\"\n") ==
        "cfg.pbtxt:4: field sweep.param: needs at least one param (a field and its "
        "values or range)");
  CHECK(sweep("method: \"grid\"\nparam { field: \"optimizer.lr\" }\n") ==
        "cfg.pbtxt:6: field sweep.param[0].values: is required: a grid param needs values");
  CHECK(sweep("method: \"grid\"\nparam { field: \"optimizer.lr\" values: [1] min: 0 }\n") ==
        "cfg.pbtxt:6: field sweep.param[0].min: is for random sweeps (a grid param takes values)");
  CHECK(sweep("method: \"grid\"\ncount: 3\nparam { field: \"optimizer.lr\" values: [1] }\n") ==
        "cfg.pbtxt:6: field sweep.count: is for random sweeps (a grid has one replica per combination of the params' "
        "values)");
  std::string forty;
  for (int i = 1; i <= 40; ++i) forty += (i > 1 ? ", " : "") + std::to_string(i);
  CHECK(sweep("method: \"grid\"\nparam { field: \"seed\" values: [" + forty +
              "] }\nparam { field: "
              "\"schedule.warmup_steps\" values: [" +
              forty + "] }\n") ==
        "cfg.pbtxt:4: field sweep: gives 1600 replicas (the product of the params' value counts), more than the "
        "limit of 1024");
  CHECK(sweep("method: \"random\"\nparam { field: \"seed\" values: [1] }\n") ==
        "cfg.pbtxt:4: field sweep.count: must be >= 1 for a random sweep, got 0");
  CHECK(sweep("method: \"random\"\ncount: 2000\nparam { field: \"seed\" values: [1] }\n") ==
        "cfg.pbtxt:6: field sweep.count: must be <= 1024 (the replica limit), got 2000");
  const std::string random = "method: \"random\"\ncount: 2\n";
  CHECK(sweep(random + "param { field: \"optimizer.lr\" min: 0.1 }\n") ==
        "cfg.pbtxt:7: field sweep.param[0].max: is required for uniform (the range [min, max))");
  CHECK(sweep(random + "param { field: \"optimizer.lr\"\n  min: 0.1\n  max: 0.1 }\n") ==
        "cfg.pbtxt:9: field sweep.param[0].max: must be > min (0.1), got 0.1");
  CHECK(sweep(random + "param { field: \"optimizer.lr\" distribution: \"log_uniform\"\n  min: 0\n  max: 1 }\n") ==
        "cfg.pbtxt:8: field sweep.param[0].min: must be > 0 for log_uniform, got 0");
  CHECK(sweep(random + "param { field: \"optimizer.lr\" distribution: \"choice\" }\n") ==
        "cfg.pbtxt:7: field sweep.param[0].values: is required: a choice param needs values");
  CHECK(sweep(random + "param { field: \"optimizer.lr\" distribution: \"uniform\" values: [1] }\n") ==
        "cfg.pbtxt:7: field sweep.param[0].values: are for choice (uniform takes min and max)");
  CHECK(sweep(random + "param { field: \"optimizer.lr\" distribution: \"normal\" }\n") ==
        "cfg.pbtxt:7: field sweep.param[0].distribution: unknown value 'normal' (expected one of: choice, "
        "log_uniform, uniform)");
  CHECK(sweep("method: \"grid\"\nparam { field: \"seed\" values: [-1] }\n") ==
        "cfg.pbtxt:6: field sweep.param[0].values: must be >= 0 for seed, got -1");
  CHECK(sweep("method: \"grid\"\nparam { field: \"schedule.t_max\" values: [1e30] }\n") ==
        "cfg.pbtxt:6: field sweep.param[0].values: must be within +-2^53 for the integer field t_max, got 1e+30");
  // A swept value that a single config would refuse names the param and the replica.
  CHECK(sweep("method: \"grid\"\nparam {\n  field: \"optimizer.momentum\"\n  values: [0.5, 1.5]\n}\n") ==
        "cfg.pbtxt:6: field sweep.param[0] (optimizer.momentum of replica 1): must be in [0, 1), got 1.5");
  CHECK(sweep("method: \"grid\"\nparam { field: \"optimizer.lr\" values: [0.1, -0.1] }\n") ==
        "cfg.pbtxt:6: field sweep.param[0] (optimizer.lr of replica 1): must be > 0, got -0.1");
}

TEST_CASE("fusion errors name the field") {
  const std::string b = kBase;
  CHECK(
      Error(b + "fusion { unfused_layers: [\"fc1\", \"\"] }\n") ==
      "cfg.pbtxt:4: field fusion.unfused_layers[1]: must name a layer (a node-name prefix such as \"fc1\"), got \"\"");
  CHECK(Error(b + "fusion {\n  unfused_layers: \"fc1\"\n  unfused_layers: \"fc1\"\n}\n") ==
        "cfg.pbtxt:6: field fusion.unfused_layers[1]: 'fc1' is already listed as fusion.unfused_layers[0]");
  auto stop = [&](const std::string& body) { return Error(b + "fusion { early_stop {\n" + body + "} }\n"); };
  CHECK(stop("") == "cfg.pbtxt:4: field fusion.early_stop.after_epochs: must be >= 1, got 0");
  CHECK(stop("after_epochs: 1\nevery_epochs: -1\n") ==
        "cfg.pbtxt:6: field fusion.early_stop.every_epochs: must be >= 1, got -1");
  CHECK(stop("after_epochs: 1\nkeep_fraction: 1.5\n") ==
        "cfg.pbtxt:6: field fusion.early_stop.keep_fraction: must be in (0, 1), got 1.5");
  CHECK(stop("after_epochs: 1\nkeep_fraction: 0\n") ==
        "cfg.pbtxt:6: field fusion.early_stop.keep_fraction: must be in (0, 1), got 0");
  CHECK(stop("after_epochs: 1\nmetric: \"accuracy\"\n") ==
        "cfg.pbtxt:6: field fusion.early_stop.metric: unknown value 'accuracy' (expected one of: test_accuracy, "
        "test_loss, train_loss)");
  CHECK(Error(b + "eval_every_epochs: 2\nfusion { early_stop {\n  after_epochs: 3 } }\n") ==
        "cfg.pbtxt:6: field fusion.early_stop.after_epochs: must be a multiple of eval_every_epochs (2) for the metric "
        "test_accuracy, got 3");
  // Training loss is known every epoch.
  CHECK(ParseTrainConfig(b + "eval_every_epochs: 2\nfusion { early_stop { after_epochs: 3 metric: \"train_loss\" } }\n",
                         "cfg.pbtxt")
            .ok());
}

TEST_CASE("ExpandReplicas checks configs built in code") {
  proto::TrainConfig c;
  c.mutable_model()->set_name("mlp");
  c.mutable_data()->set_dataset("fashion_mnist");
  c.add_replicas();
  c.add_replicas()->mutable_optimizer()->set_lr(-1);
  auto r = ExpandReplicas(c);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "config: field replicas[1].optimizer.lr: must be > 0, got -1");
  c.mutable_replicas(1)->mutable_optimizer()->set_lr(0.5);
  r = ExpandReplicas(c);
  REQUIRE(r.ok());
  CHECK((*r)[0].config.optimizer().lr() == 1e-3);  // torch's SGD default, from the base
  CHECK((*r)[1].config.optimizer().lr() == 0.5);
  for (int i = 0; i < 1024; ++i) c.add_replicas();
  r = ExpandReplicas(c);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "config: field replicas: lists 1026 replicas, more than the limit of 1024");
}

// A shipped config (models/configs/NAME), a data dependency of the test.
std::string Shipped(const std::string& name) { return "models/configs/" + name; }

std::vector<double> Lrs(const std::vector<ReplicaSpec>& r) {
  std::vector<double> out;
  for (const auto& s : r) out.push_back(s.config.optimizer().lr());
  return out;
}

TEST_CASE("the shipped sweep configs load and expand") {
  auto mlp = LoadTrainConfig(Shipped("fashion_mnist_mlp_sweep.pbtxt"));
  REQUIRE(mlp.status().ToString() == "OK");
  auto base = LoadTrainConfig(Shipped("fashion_mnist_mlp.pbtxt"));
  REQUIRE(base.ok());
  auto r = ExpandReplicas(*mlp);
  REQUIRE(r.status().ToString() == "OK");
  REQUIRE(r->size() == 8);
  const auto lrs = Lrs(*r);
  CHECK(std::is_sorted(lrs.begin(), lrs.end()));
  CHECK(lrs.front() == Approx(0.001));
  CHECK(lrs.back() == Approx(0.1));
  CHECK(lrs.back() / lrs.front() == Approx(100));  // two decades
  CHECK((*r)[0].label == "r0 lr=0.001");
  CHECK((*r)[7].label == "r7 lr=0.1");
  for (auto& s : *r) {
    CHECK(s.config.optimizer().momentum() == 0.9);
    // Everything but the lr and seed is the single-model config's.
    s.config.mutable_optimizer()->set_lr(base->optimizer().lr());
    s.config.set_seed(base->seed());
    s.config.clear_fusion();
    CHECK(TrainConfigToText(s.config) == TrainConfigToText(*base));
  }

  auto cnn = LoadTrainConfig(Shipped("fashion_mnist_cnn_sweep.pbtxt"));
  REQUIRE(cnn.status().ToString() == "OK");
  auto cnn_base = LoadTrainConfig(Shipped("fashion_mnist_cnn.pbtxt"));
  REQUIRE(cnn_base.ok());
  auto c = ExpandReplicas(*cnn);
  REQUIRE(c.status().ToString() == "OK");
  REQUIRE(c->size() == 4);
  std::set<double> distinct;
  for (auto& s : *c) {
    const auto& o = s.config.optimizer();
    CHECK(o.lr() >= 0.01);
    CHECK(o.lr() < 0.2);
    distinct.insert(o.lr());
    CHECK((o.weight_decay() == 0 || o.weight_decay() == 0.0005 || o.weight_decay() == 0.001));
    CHECK(o.nesterov());
    s.config.mutable_optimizer()->set_lr(cnn_base->optimizer().lr());
    s.config.mutable_optimizer()->set_weight_decay(cnn_base->optimizer().weight_decay());
    s.config.set_seed(cnn_base->seed());
    s.config.clear_fusion();
    CHECK(TrainConfigToText(s.config) == TrainConfigToText(*cnn_base));
  }
  CHECK(distinct.size() == 4);
  CHECK((*c)[0].label == "r0 lr=0.0721 weight_decay=0");  // as the file's comment says
  CHECK((*c)[3].label == "r3 lr=0.0296 weight_decay=0.0005");
}

}  // namespace
}  // namespace loom
