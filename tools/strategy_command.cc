// `loom strategy --config C --devices N --kind dp|replica|model|owt [--out FILE]`
// writes a standard strategy (search/baselines.h) for the model of a train
// config, and `loom inspect --config C --strategy S` shows a strategy's split
// of every layer (graph/strategy.h). docs/parallel.md.
#include <cstdio>
#include <string>

#include "core/file_util.h"
#include "graph/fusion.h"
#include "graph/model.h"
#include "graph/compile.h"
#include "graph/strategy.h"
#include "graph/task_graph.h"
#include "runtime/task_memory_plan.h"
#include "search/baselines.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/config/replicas.h"
#include "train/config/train_config.h"
#include "train/run_parts.h"

namespace loom::tools {
namespace {

constexpr const char* kUsage =
    "usage: loom strategy --config FILE --devices N --kind dp|replica|model|owt [--out FILE]\n";

}  // namespace

// Fused as loom train fuses (the names a strategy uses are the same); the
// step trains every replica with the config's optimizer: per-replica
// hyper-parameters change attributes, not tasks.

StatusOr<ConfigPrograms> BuildConfigPrograms(const proto::TrainConfig& config) {
  LOOM_ASSIGN_OR_RETURN(const train::Datasets data, train::LoadDatasets(config.data()));
  Model m;
  LOOM_RETURN_IF_ERROR(train::BuildConfigModel(m, config, train::DataSpecOf(*data.train), config.data().batch_size()));
  std::optional<FusionOptions> fusion;
  if (IsFused(config)) {
    LOOM_ASSIGN_OR_RETURN(const std::vector<ReplicaSpec> replicas, ExpandReplicas(config));
    fusion = FusionOptions{};
    fusion->replicas = static_cast<int>(replicas.size());
    fusion->unfused_layers.assign(config.fusion().unfused_layers().begin(), config.fusion().unfused_layers().end());
    for (const ReplicaSpec& r : replicas) fusion->seeds.push_back(r.config.seed());
  }
  CompileOptions o = StepOptions(StepOptimizer{config.optimizer()}, fusion);
  o.precision = RunPrecision(config);
  o.loss_scaling = RunLossScaling(config);
  ConfigPrograms p;
  LOOM_ASSIGN_OR_RETURN(p.forward, Compile(m.graph(), Program::kForward, o));
  LOOM_ASSIGN_OR_RETURN(p.step, Compile(m.graph(), Program::kTrainingStep, o));
  return p;
}

namespace {

Status WriteStrategy(const Flags& flags) {
  if (!flags.Has("config")) return InvalidArgument("loom strategy needs --config FILE");
  if (!flags.Has("kind")) return InvalidArgument("loom strategy needs --kind dp|replica|model|owt");
  LOOM_ASSIGN_OR_RETURN(const int64_t devices, flags.Int("devices", 0));
  if (devices < 1) return InvalidArgument("loom strategy needs --devices N (N >= 1)");
  LOOM_ASSIGN_OR_RETURN(const StandardStrategy kind, ParseStandardStrategy(flags.Str("kind", "")));
  const std::string config_path = flags.Str("config", "");
  LOOM_ASSIGN_OR_RETURN(const proto::TrainConfig config, LoadTrainConfig(config_path));
  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  const Graph& graph = programs.forward;
  LOOM_ASSIGN_OR_RETURN(const proto::Strategy strategy, MakeStandardStrategy(graph, kind, devices));
  const std::string text = StrCat("# loom strategy --config ", config_path, " --devices ", devices, " --kind ",
                                  flags.Str("kind", ""), "\n", StrategyToText(strategy));
  if (!flags.Has("out")) {
    std::fputs(text.c_str(), stdout);
    return Status::Ok();
  }
  const std::string out = flags.Str("out", "");
  LOOM_RETURN_IF_ERROR(WriteFileAtomically(out, text));
  std::printf("wrote %s\n", out.c_str());
  return Status::Ok();
}

}  // namespace

Status InspectStrategy(const std::string& config_path, const std::string& strategy_path, bool taskgraph,
                       const std::string& json_path) {
  LOOM_ASSIGN_OR_RETURN(const proto::TrainConfig config, LoadTrainConfig(config_path));
  LOOM_ASSIGN_OR_RETURN(const Strategy strategy, Strategy::Load(strategy_path));
  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  const Graph& graph = programs.forward;
  LOOM_ASSIGN_OR_RETURN(const auto splits, strategy.Resolve(graph));
  size_t wn = 5, wo = 2, ws = 12;
  for (const auto& [id, split] : splits) {
    const Node& n = graph.node(id);
    wn = std::max(wn, n.name.size());
    wo = std::max(wo, n.op.size());
    if (!n.outputs.empty()) ws = std::max(ws, graph.type(n.outputs[0]).shape.ToString().size());
  }
  std::printf("strategy %s on %lld devices for %s (%zu layers)\n\n", strategy_path.c_str(),
              static_cast<long long>(strategy.devices()), config_path.c_str(), splits.size());
  std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(wn), "layer", static_cast<int>(wo), "op",
              static_cast<int>(ws), "output shape", "split");
  for (const auto& [id, split] : splits) {
    const Node& n = graph.node(id);
    const std::string shape = n.outputs.empty() ? "-" : graph.type(n.outputs[0]).shape.ToString();
    std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(wn), n.name.c_str(), static_cast<int>(wo), n.op.c_str(),
                static_cast<int>(ws), shape.c_str(), split.ToString().c_str());
  }
  if (!taskgraph) return Status::Ok();
  LOOM_ASSIGN_OR_RETURN(const TaskGraph tasks, LowerToTaskGraph(programs.step, strategy, graph));
  std::map<TaskKind, int64_t> count;
  std::vector<double> flops(static_cast<size_t>(tasks.devices), 0.0);
  for (const Task& t : tasks.tasks) {
    ++count[t.kind];
    if (t.kind == TaskKind::kCompute) flops[static_cast<size_t>(t.device)] += t.flops;
  }
  std::printf("\ntask graph of the training step: %zu tasks (%lld compute, %lld transfer, %lld all-reduce), "
              "%.0f bytes moved\n",
              tasks.tasks.size(), static_cast<long long>(count[TaskKind::kCompute]),
              static_cast<long long>(count[TaskKind::kTransfer]), static_cast<long long>(count[TaskKind::kAllReduce]),
              tasks.TransferBytes());
  // The task runtime's memory plan in one process (a queue per device).
  std::vector<int64_t> queue_of;
  for (const Task& t : tasks.tasks) queue_of.push_back(t.device);
  const TaskMemoryPlan plan = PlanTaskMemory(tasks, queue_of, std::vector<bool>(flops.size(), true));
  for (size_t d = 0; d < flops.size(); ++d)
    std::printf("  device %zu: %.4g FLOPs, a %zu-byte arena for %zu bytes of the step's pieces\n", d, flops[d],
                plan.arena_bytes[d], plan.planned_bytes[d]);
  std::printf("\n%s", tasks.ToString().c_str());
  if (!json_path.empty()) {
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(json_path, tasks.ToJson()));
    std::printf("task graph written to %s\n", json_path.c_str());
  }
  return Status::Ok();
}

Status StrategyCommand(const std::vector<std::string>& args) {
  Flags flags({{"config", "the training config whose model the strategy splits"},
               {"devices", "how many devices the strategy places layers on"},
               {"kind", "dp (data parallel), replica (a fused array's replicas over the devices), model (layers "
                        "over the devices by FLOPs) or owt (data parallel, Linear layers parameter parallel)"},
               {"out", "write the strategy to this file (default: print it)"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("%s%s", kUsage, flags.Help().c_str());
    return Status::Ok();
  }
  return WriteStrategy(flags);
}

}  // namespace loom::tools
