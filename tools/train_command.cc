// `loom train`: trains a model of the zoo from a config file (text protobuf,
// docs/train_config.md), or resumes a stopped run.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/logging.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/stop_signals.h"
#include "train/training_run.h"

namespace loom::tools {

Status TrainCommand(const std::vector<std::string>& args) {
  Flags flags({{"config", "the run's config file (text protobuf); required unless --resume"},
               {"out", "the run folder (default: runs/<config name>-<date>-<time>)"},
               {"resume", "continue the run in this folder from its newest checkpoint"},
               {"epochs", "override the config's epochs"},
               {"max-steps", "stop after this many optimizer steps"},
               {"seed", "override the config's seed"},
               {"threads", "CPU threads (0 = all cores)"},
               {"device", "where the step runs: cpu (default) or cuda[:i] (overrides the config's device)"},
               {"devices", "cpu:N: each step on N CPU devices of this process (the task runtime, docs/parallel.md)"},
               {"strategy", "with --devices: dp (default), replica, model, owt, auto (searched, docs/search.md) or a "
                            "strategy file"},
               {"machine", "with --strategy auto: the machine file to search on (default: this machine, probed)"},
               {"trace", "with --devices: write the last step's tasks (a GAN's: its last iteration's two steps) per "
                         "device and link as Chrome trace JSON"},
               {"dump-graphs", "write each compiled program's graph after each pass to this folder "
                               "(train.NN.<pass>.txt, eval.NN.<pass>.txt)"},
               {"init-from", "start from the parameters and buffers of this single-model checkpoint "
                             "(e.g. one replica written by loom export); every fused replica starts from it"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom train --config FILE.pbtxt [flags]\n       loom train --resume DIR\n%s",
                flags.Help().c_str());
    return Status::Ok();
  }
  SetLogVerbosity(flags.verbosity());

  train::RunOptions run;
  std::string config_path = flags.Str("config", "");
  if (flags.Has("resume")) {
    const std::string dir = flags.Str("resume", "");
    if (flags.Has("out")) {
      std::error_code ec;
      if (!std::filesystem::equivalent(flags.Str("out", ""), dir, ec))
        return InvalidArgument("--out and --resume name different folders");
    }
    const std::string run_config = (std::filesystem::path(dir) / "config.pbtxt").string();
    if (config_path.empty()) config_path = run_config;
    if (!std::filesystem::exists(run_config))
      return NotFound(dir, " holds no run to resume (no config.pbtxt)");
    run.resume = true;
  } else if (config_path.empty()) {
    return InvalidArgument("--config FILE is required (e.g. models/configs/fashion_mnist_mlp.pbtxt), or --resume DIR");
  }
  LOOM_ASSIGN_OR_RETURN(run.config, LoadTrainConfig(config_path));
  train::Overrides o;
  auto optional_int = [&](const char* name, std::optional<int64_t>* out) -> Status {
    if (!flags.Has(name)) return Status::Ok();
    LOOM_ASSIGN_OR_RETURN(*out, flags.Int(name, 0));
    return Status::Ok();
  };
  LOOM_RETURN_IF_ERROR(optional_int("epochs", &o.epochs));
  LOOM_RETURN_IF_ERROR(optional_int("max-steps", &o.max_steps));
  LOOM_RETURN_IF_ERROR(optional_int("threads", &o.threads));
  if (flags.Has("seed")) {
    LOOM_ASSIGN_OR_RETURN(uint64_t seed, flags.Unsigned("seed", 0));
    o.seed = seed;
  }
  if (flags.Has("device")) o.device = flags.Str("device", "");
  if (flags.Has("devices")) o.devices = flags.Str("devices", "");
  Communicator* world = ProcessCommunicator();
  const bool processes = world != nullptr && world->size() > 1;
  // mpirun -np K: K devices, one per process, unless the run says otherwise.
  if (processes && !o.devices && run.config.devices().empty()) o.devices = StrCat("cpu:", world->size());
  if (flags.Has("strategy")) o.strategy = flags.Str("strategy", "");
  if (flags.Has("resume")) o.out_dir = flags.Str("resume", "");
  if (flags.Has("out")) o.out_dir = flags.Str("out", "");
  LOOM_RETURN_IF_ERROR(train::ApplyOverrides(o, &run.config));
  run.config_name = std::filesystem::path(config_path).stem().string();
  if (flags.Has("init-from")) {
    if (run.resume) return InvalidArgument("--init-from starts a new run; it cannot be combined with --resume");
    run.init_from = flags.Str("init-from", "");
  }
  run.dump_graphs_dir = flags.Str("dump-graphs", "");
  const std::string machine_path = flags.Str("machine", "");
  if (flags.Has("machine") && run.config.strategy() != "auto")
    return InvalidArgument("--machine is the machine --strategy auto searches on; the run's strategy is '",
                           run.config.strategy(), "'");
  LOOM_ASSIGN_OR_RETURN(const std::vector<Device> run_devices, RunDevices(run.config));
  if (run.config.strategy() == "auto" && machine_path.empty() && !run_devices.empty() && run_devices[0].is_cuda())
    return InvalidArgument("--strategy auto on CUDA devices needs --machine FILE (loom machine probe measures CPU ",
                           "devices; e.g. --machine simulator/machines/h200_8_nvswitch.pbtxt)");
  run.search_machine = [machine_path](int64_t devices) -> StatusOr<Machine> {
    if (machine_path.empty()) return ProbeCpuMachine(3, devices);
    LOOM_ASSIGN_OR_RETURN(Machine machine, Machine::Load(machine_path));
    if (machine.devices() < devices)
      return InvalidArgument("--machine ", machine_path, ": ", machine.devices(), " devices, the run has ", devices);
    return machine;
  };
  run.trace_path = flags.Str("trace", "");
  if (processes) {  // rank 0 speaks and writes
    LOOM_ASSIGN_OR_RETURN(const std::vector<Device> device_list, RunDevices(run.config));
    const int64_t devices = static_cast<int64_t>(device_list.size());
    if (devices % world->size() != 0)
      return InvalidArgument("devices ", run.config.devices(), " under mpirun -np ", world->size(),
                             ": each process runs as many devices (cpu:N, N a multiple of ", world->size(), ")");
    run.processes = world;
    if (world->rank() != 0) run.console = nullptr;
    if (run.config.strategy() == "auto" && machine_path.empty()) {
      // Rank 0 searches, on a machine of a node per process (their messages
      // hold a device of each): every rank takes part in probing the link,
      // before the run (whether rank 0 keeps a saved strategy instead is
      // known only inside it; the probe then costs a few seconds for nothing).
      LOOM_ASSIGN_OR_RETURN(const Machine probed, ProbeMachine(3, world, devices));
      run.search_machine = [probed](int64_t) -> StatusOr<Machine> { return probed; };
    }
  }
  LOOM_ASSIGN_OR_RETURN(train::RunResult result, train::RunTraining(run));
  if (result.stop_signal != 0) {
    // Stopped cleanly by SIGINT/SIGTERM (every rank at the same step under
    // mpirun): exit as the signal would have.
    LeaveProcesses();
    std::fflush(nullptr);
    std::exit(train::StopSignals::ExitStatus(result.stop_signal));
  }
  return Status::Ok();
}

}  // namespace loom::tools
