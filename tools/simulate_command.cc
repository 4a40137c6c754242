// `loom simulate --config C --machine M [--strategy S] [--devices N]
// [--trace F] [--json F]`: the predicted training step of a config's model
// on a machine (simulator/simulator.h, docs/simulator.md) under a standard
// strategy or a strategy file.
#include <cstdio>
#include <sstream>
#include <string>

#include "core/file_util.h"
#include "core/parse.h"
#include "graph/strategy.h"
#include "graph/task_graph.h"
#include "search/baselines.h"
#include "simulator/simulator.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/config/train_config.h"

namespace loom::tools {

Status SimulateCommand(const std::vector<std::string>& args) {
  Flags flags({{"config", "the training config whose step to predict"},
               {"machine", "a machine file (simulator/machines/*.pbtxt)"},
               {"strategy", "dp (default), replica, model, owt, or a strategy file"},
               {"devices", "the devices the strategy uses (default: the machine's; a strategy file says its own)"},
               {"trace", "write the predicted step as Chrome trace JSON (the task runtime's --trace layout)"},
               {"json", "write the prediction as JSON"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom simulate --config FILE --machine FILE [flags]\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  if (!flags.Has("config")) return InvalidArgument("loom simulate needs --config FILE");
  if (!flags.Has("machine")) return InvalidArgument("loom simulate needs --machine FILE (e.g. simulator/machines/h200_8_nvswitch.pbtxt)");
  LOOM_ASSIGN_OR_RETURN(const Machine machine, Machine::Load(flags.Str("machine", "")));
  LOOM_ASSIGN_OR_RETURN(const proto::TrainConfig config, LoadTrainConfig(flags.Str("config", "")));
  LOOM_ASSIGN_OR_RETURN(const int64_t devices, flags.Int("devices", machine.devices()));
  if (devices < 1 || devices > machine.devices())
    return InvalidArgument("--devices ", devices, ": machine ", machine.name(), " has ", machine.devices(), " devices");
  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  const std::string name = flags.Str("strategy", "dp");
  LOOM_ASSIGN_OR_RETURN(const Strategy strategy, LoadOrMakeStrategy(name, programs.forward, devices, "--strategy"));
  LOOM_ASSIGN_OR_RETURN(auto layers, ResolveLayers(strategy, programs.forward));
  LOOM_ASSIGN_OR_RETURN(const TaskGraph tasks, BuildTaskGraph(programs.step, layers, strategy.devices()));
  const AnalyticalCostModel cost(machine);
  LOOM_ASSIGN_OR_RETURN(const SimulationResult r, Simulate(tasks, machine, cost));

  std::printf("%s on %s (%s x %lld), strategy %s: %zu tasks, analytical cost model\n",
              flags.Str("config", "").c_str(), machine.name().c_str(), machine.device().kind().c_str(),
              static_cast<long long>(strategy.devices()), name.c_str(), tasks.tasks.size());
  std::printf("iteration: %.6g ms%s\n", r.iteration_seconds * 1e3,
              r.fits ? "" : "  (does NOT fit: a device's peak memory exceeds its memory)");
  std::printf("%8s %12s %8s %14s\n", "device", "busy ms", "busy", "peak MiB");
  for (int64_t d = 0; d < tasks.devices; ++d) {
    const double busy = r.device_busy_seconds[static_cast<size_t>(d)];
    std::printf("%8lld %12.4f %7.1f%% %14.2f\n", static_cast<long long>(d), busy * 1e3,
                r.iteration_seconds > 0 ? 100 * busy / r.iteration_seconds : 0.0,
                r.peak_memory_bytes[static_cast<size_t>(d)] / (1 << 20));
  }
  double moved = 0;
  for (size_t q = 0; q < r.resource_bytes.size(); ++q) {
    if (r.resource_bytes[q] == 0) continue;
    moved += r.resource_bytes[q];
    std::printf("link %-14s %14.0f bytes\n", machine.ResourceName(static_cast<int64_t>(q)).c_str(),
                r.resource_bytes[q]);
  }
  std::printf("bytes on links: %.0f (task graph: %.0f moved)\n", moved, tasks.TransferBytes());

  if (flags.Has("trace")) {
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(flags.Str("trace", ""), SimulationTraceJson(tasks, machine, r)));
    std::printf("trace: %s\n", flags.Str("trace", "").c_str());
  }
  if (flags.Has("json")) {
    std::ostringstream json;
    json.precision(17);  // seconds and bytes as computed
    json << "{\"machine\": " << JsonQuoted(machine.name()) << ", \"strategy\": " << JsonQuoted(name)
         << ", \"devices\": " << tasks.devices << ", \"iteration_s\": " << r.iteration_seconds
         << ", \"fits\": " << (r.fits ? "true" : "false") << ", \"device_busy_s\": [";
    for (int64_t d = 0; d < tasks.devices; ++d) json << (d ? ", " : "") << r.device_busy_seconds[static_cast<size_t>(d)];
    json << "], \"peak_memory_bytes\": [";
    for (int64_t d = 0; d < tasks.devices; ++d) json << (d ? ", " : "") << r.peak_memory_bytes[static_cast<size_t>(d)];
    json << "], \"link_bytes\": {";
    bool first = true;
    for (size_t q = 0; q < r.resource_bytes.size(); ++q) {
      if (r.resource_bytes[q] == 0) continue;
      json << (first ? "" : ", ") << JsonQuoted(machine.ResourceName(static_cast<int64_t>(q))) << ": "
           << r.resource_bytes[q];
      first = false;
    }
    json << "}}\n";
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(flags.Str("json", ""), json.str()));
    std::printf("json: %s\n", flags.Str("json", "").c_str());
  }
  return Status::Ok();
}

}  // namespace loom::tools
