// The task runtime against one device: every strategy, on CPU devices of
// this process, must give the losses and parameters that one Executor
// gives after the same steps (f64: 1e-9 relative).
#include "runtime/task_runtime.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "graph/compile.h"
#include "graph/model.h"
#include "graph/strategy.h"
#include "graph/task_graph.h"
#include "models/zoo.h"
#include "runtime/executor.h"

namespace loom {
namespace {

constexpr int kSteps = 3;
constexpr int64_t kBatch = 8;

struct Case {
  Graph forward;  // what strategies name layers of
  Graph step;     // the training step
  std::map<std::string, Tensor> feeds;
};

// A zoo classifier in f64 on [1, 8, 8] images (or [64] features), 4 classes.
Case Classifier(const std::string& model, const std::map<std::string, std::string>& args, const Shape& input,
                int replicas = 0) {
  Model m(DType::kF64);
  REQUIRE(models::BuildClassifier(m, model, args, input, kBatch, 4).ok());
  StepOptimizer opt;
  opt.config.set_type("sgd");
  opt.config.set_lr(0.1);
  opt.config.set_momentum(0.9);
  std::optional<FusionOptions> fusion;
  if (replicas > 0) {
    fusion = FusionOptions{};
    fusion->replicas = replicas;
    for (int r = 0; r < replicas; ++r) fusion->seeds.push_back(100 + static_cast<uint64_t>(r));
  }
  CompileOptions o = StepOptions(opt, fusion);
  Case c;
  auto fwd = Compile(m.graph(), Program::kForward, o);
  REQUIRE(fwd.ok());
  c.forward = *fwd;
  auto step = Compile(m.graph(), Program::kTrainingStep, o);
  if (!step.ok()) FAIL(step.status().ToString());
  c.step = *step;
  std::mt19937_64 rng(7);
  for (const Node& n : c.step.nodes()) {
    if (n.op != kInputOp) continue;
    const TensorType& t = c.step.type(n.outputs[0]);
    Tensor x = Tensor::Zeros(t.shape, t.dtype);
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (t.dtype == DType::kI64) x.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
      else if (n.name == "replica_mask") x.data<double>()[i] = 1;
      else if (n.name == "lr") x.data<double>()[i] = 0.1;
      else if (n.name == "step") x.data<double>()[i] = 1;
      else x.data<double>()[i] = static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
    }
    c.feeds[n.name] = x;
  }
  return c;
}

struct Result {
  std::vector<std::map<std::string, Tensor>> outputs;  // per step
  std::map<std::string, Tensor> state;
};

Result OneDevice(const Case& c) {
  auto e = Executor::Create(c.step);
  REQUIRE(e.ok());
  REQUIRE((*e)->InitializeState(3).ok());
  Result r;
  for (int s = 0; s < kSteps; ++s) {
    auto out = (*e)->Run(c.feeds);
    if (!out.ok()) FAIL(out.status().ToString());
    r.outputs.push_back(*out);
  }
  r.state = (*e)->state();
  return r;
}

StatusOr<TaskGraph> Lower(const Case& c, const std::string& strategy) {
  LOOM_ASSIGN_OR_RETURN(Strategy s, Strategy::Parse(strategy, "s.pbtxt"));
  LOOM_ASSIGN_OR_RETURN(auto layers, ResolveLayers(s, c.forward));
  return BuildTaskGraph(c.step, layers, s.devices());
}

Result OnDevices(const Case& c, const std::string& strategy) {
  auto tg = Lower(c, strategy);
  if (!tg.ok()) FAIL(tg.status().ToString());
  auto rt = TaskRuntime::Create(c.step, *tg);
  if (!rt.ok()) FAIL(rt.status().ToString());
  // The one-device run's initial state.
  auto e = Executor::Create(c.step);
  REQUIRE(e.ok());
  REQUIRE((*e)->InitializeState(3).ok());
  for (const auto& [name, t] : (*e)->state()) REQUIRE((*rt)->SetState(name, t).ok());
  Result r;
  for (int s = 0; s < kSteps; ++s) {
    auto out = (*rt)->Run(c.feeds);
    if (!out.ok()) FAIL(out.status().ToString());
    r.outputs.push_back(*out);
  }
  for (const std::string& name : (*rt)->StateNames()) {
    auto t = (*rt)->GetState(name);
    REQUIRE(t.ok());
    r.state[name] = *t;
  }
  return r;
}

double MaxRelativeError(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> x = a.ToDoubleVector(), y = b.ToDoubleVector();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(x[i] - y[i]) / std::max(1e-6, std::max(std::abs(x[i]), std::abs(y[i]))));
  return worst;
}

void ExpectSame(const Result& want, const Result& got, const std::string& what) {
  INFO(what);
  for (int s = 0; s < kSteps; ++s)
    for (const auto& [name, t] : want.outputs[static_cast<size_t>(s)]) {
      INFO("step " << s << " output " << name);
      CHECK(MaxRelativeError(t, got.outputs[static_cast<size_t>(s)].at(name)) < 1e-9);
    }
  for (const auto& [name, t] : want.state) {
    INFO("state " << name);
    REQUIRE(got.state.count(name));
    CHECK(MaxRelativeError(t, got.state.at(name)) < 1e-9);
  }
}

TEST_CASE("mlp: data, model and parameter parallel match one device") {
  const Case c = Classifier("mlp", {{"hidden", "16,8"}}, {64});
  const Result want = OneDevice(c);
  for (const std::string& s : {
           std::string("devices: 1\n"),
           std::string("devices: 2\ndefault_split { sample: 2 }\n"),
           std::string("devices: 4\ndefault_split { sample: 4 }\n"),
           std::string("devices: 2\nlayer { layer: \"*fc1*\" devices: 1 }\n"),
           std::string("devices: 2\ndefault_split { parameter: 2 }\n"),
           std::string("devices: 4\ndefault_split { sample: 2 parameter: 2 }\n"),
       }) {
    ExpectSame(want, OnDevices(c, s), s);
  }
}

TEST_CASE("cnn: data, model, parameter and attribute parallel match one device") {
  const Case c = Classifier("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  const Result want = OneDevice(c);
  for (const std::string& s : {
           std::string("devices: 2\ndefault_split { sample: 2 }\n"),
           std::string("devices: 3\ndefault_split { sample: 2 devices: 1 devices: 2 }\n"),
           std::string("devices: 2\ndefault_split { parameter: 2 }\n"),
           std::string("devices: 2\nlayer { layer: \"*conv\" attribute: 2 }\n"),
           std::string("devices: 4\ndefault_split { sample: 2 }\nlayer { layer: \"*conv\" sample: 2 attribute: 2 }\n"),
           std::string("devices: 2\nlayer { layer: \"stage1/*\" devices: 1 }\n"),
       }) {
    ExpectSame(want, OnDevices(c, s), s);
  }
}

TEST_CASE("fused mlp: 4 replicas over 2 devices match one device") {
  const Case c = Classifier("mlp", {{"hidden", "16"}}, {64}, 4);
  const Result want = OneDevice(c);
  for (const std::string& s : {
           std::string("devices: 2\ndefault_split { replica: 2 }\n"),
           std::string("devices: 2\ndefault_split { sample: 2 }\n"),
           std::string("devices: 4\ndefault_split { sample: 2 replica: 2 }\n"),
       }) {
    ExpectSame(want, OnDevices(c, s), s);
  }
}

TEST_CASE("fused cnn: replicas of grouped convolutions over 2 devices match one device") {
  const Case c = Classifier("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8}, 4);
  const Result want = OneDevice(c);
  for (const std::string& s : {
           std::string("devices: 2\ndefault_split { replica: 2 }\n"),
           std::string("devices: 2\ndefault_split { sample: 2 }\n"),
       }) {
    ExpectSame(want, OnDevices(c, s), s);
  }
}

// Random per-layer splits (sample, parameter and attribute degrees of 1 or
// 2 where the layer allows them, parts on random distinct devices of 4).
TEST_CASE("random valid strategies match one device") {
  const Case mlp = Classifier("mlp", {{"hidden", "16,8"}}, {64});
  const Case cnn = Classifier("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  std::mt19937_64 rng(11);
  for (const Case* c : {&mlp, &cnn}) {
    const Result want = OneDevice(*c);
    int found = 0;
    for (int attempt = 0; found < 10 && attempt < 200; ++attempt) {
      std::string text = "devices: 4\n";
      for (const Node& n : c->forward.nodes()) {
        if (IsSourceOp(n.op)) continue;
        std::vector<TensorType> in, out;
        for (ValueId v : n.inputs) in.push_back(c->forward.type(v));
        for (ValueId v : n.outputs) out.push_back(c->forward.type(v));
        const SplitRules rules = OpRegistry::Global().FindOp(n.op)->Splits(n.attrs, in, out);
        const bool can[3] = {rules.sample.has_value(), rules.attribute.has_value(), rules.parameter.has_value()};
        int64_t degrees[3] = {1, 1, 1};  // sample, attribute, parameter
        for (int i = 0; i < 3; ++i) degrees[i] = can[i] && rng() % 3 == 0 ? 2 : 1;
        if (degrees[0] * degrees[1] * degrees[2] > 4) degrees[1] = 1;
        std::vector<int64_t> devices = {0, 1, 2, 3};
        std::shuffle(devices.begin(), devices.end(), rng);
        text += StrCat("layer { layer: \"", n.name, "\" sample: ", degrees[0], " attribute: ", degrees[1],
                       " parameter: ", degrees[2]);
        for (int64_t p = 0; p < degrees[0] * degrees[1] * degrees[2]; ++p) text += StrCat(" devices: ", devices[p]);
        text += " }\n";
      }
      if (!Lower(*c, text).ok()) continue;  // a split some layer cannot take
      ++found;
      ExpectSame(want, OnDevices(*c, text), text);
    }
    CHECK(found == 10);
  }
}

TEST_CASE("data parallel all-reduces each weight gradient once and moves no activations") {
  const Case c = Classifier("mlp", {{"hidden", "16,8"}}, {64});
  auto tg = Lower(c, "devices: 2\ndefault_split { sample: 2 }\n");
  REQUIRE(tg.ok());
  int all_reduces = 0;
  for (const Task& t : tg->tasks)
    if (t.kind == TaskKind::kAllReduce) ++all_reduces;
  int params = 0;
  for (const Node& n : c.step.nodes()) params += n.op == kParameterOp;
  INFO(tg->ToString());
  CHECK(all_reduces >= params);
}

TEST_CASE("a split no rule realises is an error naming the layer") {
  const Case c = Classifier("mlp", {{"hidden", "16,8"}}, {64});
  auto tg = Lower(c, "devices: 2\nlayer { layer: \"fc1\" replica: 2 }\n");
  REQUIRE(!tg.ok());
  CHECK_THAT(tg.status().message(), Catch::Contains("s.pbtxt:2") && Catch::Contains("fc1"));
}

}  // namespace
}  // namespace loom
