#include "tests/parallel_check.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <tuple>

#include <catch2/catch.hpp>

#include "graph/compile.h"
#include "graph/model.h"
#include "graph/strategy.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/executor.h"
#include "runtime/task_runtime.h"
#include "search/baselines.h"

namespace loom::testing {

StatusOr<StepCase> MakeStepCase(const Graph& model, const std::optional<FusionOptions>& fusion,
                                std::map<std::string, Tensor> feeds, double lr, const std::string& trainable_scope) {
  StepOptimizer opt;
  opt.config.set_type("sgd");
  opt.config.set_lr(lr);
  opt.config.set_momentum(0.9);
  opt.trainable_scope = trainable_scope;
  const CompileOptions o = StepOptions(opt, fusion);
  StepCase c;
  LOOM_ASSIGN_OR_RETURN(c.forward, Compile(model, Program::kForward, o));
  LOOM_ASSIGN_OR_RETURN(c.step, Compile(model, Program::kTrainingStep, o));
  for (const Node& n : c.step.nodes()) {
    if (n.op != kInputOp || feeds.count(n.name)) continue;
    const TensorType& t = c.step.type(n.outputs[0]);
    Tensor x = Tensor::Zeros(t.shape, t.dtype);
    x.Fill(n.name == kLearningRateInput ? lr : 1.0);  // lr, step 1, every replica active
    feeds[n.name] = x;
  }
  c.feeds = std::move(feeds);
  return c;
}

namespace {

StatusOr<StepResults> RunSteps(StepRunner& runner, const StepCase& c, int steps) {
  StepResults r;
  for (int s = 0; s < steps; ++s) {
    LOOM_ASSIGN_OR_RETURN(auto out, runner.Run(c.feeds));
    r.outputs.push_back(std::move(out));
  }
  for (const std::string& name : runner.StateNames()) {
    LOOM_ASSIGN_OR_RETURN(r.state[name], runner.GetState(name));
  }
  return r;
}

double MaxRelativeError(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return INFINITY;
  const std::vector<double> x = a.ToDoubleVector(), y = b.ToDoubleVector();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double scale = std::max(1e-6, std::max(std::abs(x[i]), std::abs(y[i])));
    const double e = std::abs(x[i] - y[i]) / scale;
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
  return worst;
}

}  // namespace

StatusOr<StepResults> RunOneDevice(const StepCase& c, int steps, uint64_t seed) {
  LOOM_ASSIGN_OR_RETURN(auto e, Executor::Create(c.step));
  LOOM_RETURN_IF_ERROR(e->InitializeState(seed));
  return RunSteps(*e, c, steps);
}

StatusOr<TaskGraph> LowerStrategy(const StepCase& c, const std::string& strategy_text,
                                  const LoweringOptions& lowering) {
  LOOM_ASSIGN_OR_RETURN(Strategy s, Strategy::Parse(strategy_text, "strategy.pbtxt"));
  return LowerToTaskGraph(c.step, s, c.forward, lowering);
}

StatusOr<StepResults> RunOnDevices(const StepCase& c, const std::string& strategy_text, int steps, uint64_t seed,
                                   const LoweringOptions& lowering, const TaskRuntimeOptions& options) {
  LOOM_ASSIGN_OR_RETURN(TaskGraph tasks, LowerStrategy(c, strategy_text, lowering));
  LOOM_ASSIGN_OR_RETURN(auto runtime, TaskRuntime::Create(std::move(tasks), options));
  LOOM_RETURN_IF_ERROR(runtime->InitializeState(seed));
  return RunSteps(*runtime, c, steps);
}

StatusOr<std::vector<StepResults>> RunAsProcesses(const StepCase& c, const std::string& strategy_text, int steps,
                                                  uint64_t seed, int ranks, const LoweringOptions& lowering,
                                                  const TaskRuntimeOptions& options) {
  LOOM_ASSIGN_OR_RETURN(TaskGraph tasks, LowerStrategy(c, strategy_text, lowering));
  if (ranks == 0) ranks = static_cast<int>(tasks.devices);
  std::vector<std::unique_ptr<Communicator>> comms = MakeLocalCommunicators(ranks);
  std::vector<StatusOr<StepResults>> results(static_cast<size_t>(ranks), Internal("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      // Each process lowers the strategy itself, as `mpirun ... loom train` does.
      results[static_cast<size_t>(r)] = [&]() -> StatusOr<StepResults> {
        LOOM_ASSIGN_OR_RETURN(TaskGraph own, LowerStrategy(c, strategy_text, lowering));
        TaskRuntimeOptions o = options;
        o.communicator = comms[static_cast<size_t>(r)].get();
        LOOM_ASSIGN_OR_RETURN(auto runtime, TaskRuntime::Create(std::move(own), o));
        LOOM_RETURN_IF_ERROR(runtime->InitializeState(seed));
        return RunSteps(*runtime, c, steps);
      }();
    });
  for (std::thread& t : threads) t.join();
  std::vector<StepResults> out;
  for (int r = 0; r < ranks; ++r) {
    if (!results[static_cast<size_t>(r)].ok()) return results[static_cast<size_t>(r)].status().WithContext(StrCat("rank ", r));
    out.push_back(std::move(*results[static_cast<size_t>(r)]));
  }
  return out;
}

std::string FirstMismatch(const StepResults& want, const StepResults& got, double tolerance) {
  if (want.outputs.size() != got.outputs.size()) return "a different number of steps";
  for (size_t s = 0; s < want.outputs.size(); ++s)
    for (const auto& [name, t] : want.outputs[s]) {
      auto it = got.outputs[s].find(name);
      const double e = it == got.outputs[s].end() ? INFINITY : MaxRelativeError(t, it->second);
      if (!(e <= tolerance)) return StrCat("step ", s, " output ", name, ": ", e);
    }
  for (const auto& [name, t] : want.state) {
    auto it = got.state.find(name);
    const double e = it == got.state.end() ? INFINITY : MaxRelativeError(t, it->second);
    if (!(e <= tolerance)) return StrCat("state ", name, ": ", e);
  }
  return "";
}

StepCase ClassifierCase(const std::string& model, const std::map<std::string, std::string>& args, const Shape& input,
                        int replicas) {
  constexpr int64_t kBatch = 8;
  Model m(DType::kF64);
  REQUIRE(models::BuildClassifier(m, model, args, input, kBatch, 4).ok());
  std::optional<FusionOptions> fusion;
  if (replicas > 0) {
    fusion = FusionOptions{};
    fusion->replicas = replicas;
    for (int r = 0; r < replicas; ++r) fusion->seeds.push_back(100 + static_cast<uint64_t>(r));
  }
  std::mt19937_64 rng(7);
  std::vector<int64_t> dims = input.dims();
  dims.insert(dims.begin(), kBatch);
  Tensor x = Tensor::Zeros(Shape(dims), DType::kF64), y = Tensor::Zeros({kBatch}, DType::kI64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = MakeStepCase(m.graph(), fusion, {{"input", x}, {"target", y}});
  if (!c.ok()) FAIL(c.status().ToString());
  return *c;
}

void ForEachZooStepCase(const std::function<void(const std::string& name, const StepCase& c)>& visit) {
  for (const SmallModel& s : SmallModels()) {
    if (IsGan(s)) continue;
    for (int replicas : {0, 2}) {
      std::optional<FusionOptions> fusion;
      if (replicas > 0) fusion = FusionOptions{replicas, {7, 8}, {}, {}};
      visit(StrCat(s.name, replicas ? ".fused" : ""), ZooStepCase(s, fusion));
    }
  }
}

StepCase ZooStepCase(const SmallModel& s, const std::optional<FusionOptions>& fusion) {
  const int64_t batch = s.name.rfind("pointnet", 0) == 0 || s.name == "resnet101" ? 8 : kZooBatch;
  Model m(DType::kF64);
  const Status built = models::BuildSupervised(m, s.name, s.args, s.data, batch);
  INFO(built.ToString());
  REQUIRE(built.ok());
  auto c = MakeStepCase(m.graph(), fusion, ZooBatch(s.data, DType::kF64, batch), s.step_lr);
  if (!c.ok()) FAIL(c.status().ToString());
  return *c;
}

StepCase GanStepCase(const SmallModel& s, models::GanStep step, const std::optional<FusionOptions>& fusion) {
  const bool discriminator = step == models::GanStep::kDiscriminator;
  Model m(DType::kF64);
  const Status built = models::BuildGanStep(m, s.name, s.args, s.data.input, kZooBatch, step);
  INFO(built.ToString());
  REQUIRE(built.ok());
  const int64_t nz = m.shape(Sym{m.graph().node(*m.graph().FindNode("noise")).outputs[0]})[1];
  Rng rng(5);
  Tensor noise = Tensor::Zeros({kZooBatch, nz}, DType::kF64);
  for (int64_t i = 0; i < noise.numel(); ++i) noise.data<double>()[i] = rng.Normal();
  std::map<std::string, Tensor> feeds = {{"noise", noise}};
  if (discriminator) {
    Tensor real = Tensor::Zeros(Batched(s.data.input), DType::kF64);
    for (int64_t i = 0; i < real.numel(); ++i) real.data<double>()[i] = rng.Uniform(-1, 1);
    feeds["real"] = real;
  }
  auto c = MakeStepCase(m.graph(), fusion, std::move(feeds), s.step_lr,
                        discriminator ? models::kDiscriminatorScope : models::kGeneratorScope);
  if (!c.ok()) FAIL(c.status().ToString());
  return *c;
}

int ZooSteps(const StepCase& c) { return c.step.NodesWithOp("BatchNorm").empty() ? 3 : 1; }

double ZooTolerance(const StepCase& c) { return c.step.NodesWithOp("BatchNorm").empty() ? 1e-9 : 1e-4; }

void ForEachZooRuntimeCase(std::mt19937_64& rng, const std::function<void(const StepCase& c, const StepResults& want,
                                                                          const std::vector<std::string>& strategies)>& check) {
  for (const SmallModel& s : SmallModels()) {
    if (IsGan(s)) continue;
    INFO(s.name);
    const StepCase c = ZooStepCase(s, std::nullopt);
    auto want = RunOneDevice(c, ZooSteps(c), 5);
    if (!want.ok()) FAIL(want.status().ToString());
    std::vector<std::string> strategies;
    for (StandardStrategy kind :
         {StandardStrategy::kDataParallel, StandardStrategy::kOneWeirdTrick, StandardStrategy::kModelParallel}) {
      auto standard = MakeStandardStrategy(c.forward, kind, 2);
      if (!standard.ok()) FAIL(standard.status().ToString());
      strategies.push_back(StrategyToText(*standard));
    }
    for (int attempt = 0; attempt < 100; ++attempt) {
      std::string random = RandomStrategy(c.forward, 3, rng);
      if (!LowerStrategy(c, random).ok()) continue;
      strategies.push_back(std::move(random));
      break;
    }
    check(c, *want, strategies);
  }
}

void ForEachProcessSplitCase(const std::function<void(const StepCase& c, const std::string& strategy, int ranks)>& check) {
  const StepCase cnn = ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8});
  const StepCase fused = ClassifierCase("mlp", {{"hidden", "16"}}, {64}, 4);
  const std::vector<std::tuple<const StepCase*, std::string, int>> cases = {
      {&cnn, "devices: 2\ndefault_split { sample: 2 }\n", 2},
      {&cnn, "devices: 2\nlayer { layer: \"stage1/*\" devices: 1 }\n", 2},
      {&cnn, "devices: 2\nlayer { layer: \"*conv\" attribute: 2 }\n", 2},
      {&cnn, "devices: 4\ndefault_split { sample: 2 parameter: 2 }\n", 2},
      {&cnn, "devices: 6\ndefault_split { sample: 2 devices: 1 devices: 4 }\nlayer { layer: \"*conv\" sample: 2 "
             "attribute: 2 devices: 0 devices: 2 devices: 3 devices: 5 }\n", 3},
      {&fused, "devices: 4\ndefault_split { sample: 2 replica: 2 }\n", 2},
  };
  for (const auto& [c, strategy, ranks] : cases) {
    INFO(strategy << "over " << ranks << " ranks");
    check(*c, strategy, ranks);
  }
}

void ForEachReplicaSplitCase(
    const std::function<void(const StepCase& c, const StepResults& want, const std::string& strategy)>& check) {
  for (const SmallModel& s : SmallModels()) {
    if (s.name != "mlp" && s.name != "cnn" && s.name != "transformer_lm") continue;
    INFO(s.name);
    const StepCase c = ZooStepCase(s, FusionOptions{2, {7, 8}, {}, {}});
    auto split = MakeStandardStrategy(c.forward, StandardStrategy::kReplicaParallel, 2);
    if (!split.ok()) FAIL(split.status().ToString());
    auto want = RunOneDevice(c, ZooSteps(c), 5);
    if (!want.ok()) FAIL(want.status().ToString());
    check(c, *want, StrategyToText(*split));
  }
}

std::string RandomStrategy(const Graph& forward, int64_t devices, std::mt19937_64& rng) {
  std::string text = StrCat("devices: ", devices, "\n");
  for (const Node& n : forward.nodes()) {
    if (IsSourceOp(n.op)) continue;
    std::vector<TensorType> in, out;
    for (ValueId v : n.inputs) in.push_back(forward.type(v));
    for (ValueId v : n.outputs) out.push_back(forward.type(v));
    const SplitRules rules = OpRegistry::Global().FindOp(n.op)->Splits(n.attrs, in, out);
    // The parameter rule: the op's default or, as often, one of its variants.
    std::string variant;
    if (!rules.parameter_variants.empty()) {
      const size_t pick = rng() % (rules.parameter_variants.size() + 1);
      if (pick > 0) variant = rules.parameter_variants[pick - 1].first;
    }
    const std::optional<DimSplit> parameter = rules.Parameter(variant);
    std::string why;
    const bool can[kSplitDims] = {rules.sample.has_value(), forward.fused() && ReplicaSplit(forward, n, rules, &why),
                                  rules.attribute.has_value(), parameter.has_value()};
    // Halves of every tensor the rule divides (a window input follows its output).
    auto halves = [&](const std::optional<DimSplit>& rule) {
      if (!rule) return true;
      for (size_t i = 0; i < rule->outputs.size(); ++i)
        if (rule->outputs[i].axis >= 0 && out[i].shape[rule->outputs[i].axis] % 2 != 0) return false;
      for (size_t i = 0; i < rule->inputs.size(); ++i)
        if (rule->inputs[i].axis >= 0 && rule->inputs[i].span == 1 && rule->inputs[i].stride == 1 &&
            in[i].shape[rule->inputs[i].axis] % 2 != 0)
          return false;
      return true;
    };
    const bool fits[kSplitDims] = {halves(rules.sample), forward.replicas() % 2 == 0, halves(rules.attribute),
                                   halves(parameter)};
    int64_t degree[kSplitDims] = {1, 1, 1, 1};
    int64_t parts = 1;
    for (int d = 0; d < kSplitDims; ++d)
      if (can[d] && fits[d] && rng() % 3 == 0 && parts * 2 <= devices) degree[d] = 2, parts *= 2;
    std::vector<int64_t> order(static_cast<size_t>(devices));
    for (int64_t d = 0; d < devices; ++d) order[static_cast<size_t>(d)] = d;
    std::shuffle(order.begin(), order.end(), rng);
    text += StrCat("layer { layer: \"", n.name, "\"");
    for (int d = 0; d < kSplitDims; ++d)
      if (degree[d] > 1) text += StrCat(" ", SplitDimName(kAllSplitDims[d]), ": ", degree[d]);
    if (degree[static_cast<int>(SplitDim::kParameter)] > 1 && !variant.empty())
      text += StrCat(" parameter_split: \"", variant, "\"");
    for (int64_t p = 0; p < parts; ++p) text += StrCat(" devices: ", order[static_cast<size_t>(p)]);
    text += " }\n";
  }
  return text;
}

}  // namespace loom::testing
