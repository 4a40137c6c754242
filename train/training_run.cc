#include "train/training_run.h"

#include <filesystem>

#include "models/zoo.h"
#include "train/gan_run.h"
#include "train/training_loop.h"

namespace loom::train {

Status ApplyOverrides(const Overrides& o, proto::TrainConfig* c) {
  if (o.epochs) {
    if (*o.epochs < 1) return InvalidArgument("--epochs must be >= 1, got ", *o.epochs);
    c->set_epochs(*o.epochs);
  }
  if (o.max_steps) {
    if (*o.max_steps < 0) return InvalidArgument("--max-steps must be >= 0, got ", *o.max_steps);
    c->set_max_steps(*o.max_steps);
  }
  if (o.threads) {
    LOOM_RETURN_IF_ERROR(CheckThreadCount(*o.threads).WithContext("--threads"));
    c->set_threads(*o.threads);
  }
  if (o.device) {
    LOOM_RETURN_IF_ERROR(ParseDevice(*o.device).status().WithContext("--device"));
    c->set_device(*o.device);
  }
  if (o.devices) {
    proto::TrainConfig probe;
    probe.set_devices(*o.devices);
    LOOM_RETURN_IF_ERROR(RunDevices(probe).status().WithContext("--devices"));
    c->set_devices(*o.devices);
  }
  if (o.strategy) c->set_strategy(*o.strategy);
  if (!c->strategy().empty() && c->devices().empty())
    return InvalidArgument("--strategy needs --devices cpu:N (or devices in the config)");
  if (o.seed) c->set_seed(*o.seed);
  if (o.out_dir) c->set_out_dir(*o.out_dir);
  return Status::Ok();
}

StatusOr<RunResult> RunTraining(const RunOptions& options) {
  RunOptions run = options;
  if (run.config.out_dir().empty()) run.config.set_out_dir(DefaultOutDir(options.config_name));
  LOOM_ASSIGN_OR_RETURN(const models::ZooEntry* entry, models::FindModel(run.config.model().name()));
  if (!run.trace_path.empty() && run.config.devices().empty())
    return InvalidArgument("--trace FILE needs --devices cpu:N: it traces the task runtime's devices and links");
  if (entry->gan) {
    // GAN runs always write their config (they do not resume yet); under
    // processes rank 0 checks the folder and writes it.
    if (run.processes == nullptr || run.processes->rank() == 0) {
      LOOM_RETURN_IF_ERROR(CheckRunFolder(run.config, run.resume).status());
    }
    return RunGanTraining(run, run.config.out_dir());
  }
  LoopOptions lo;
  lo.config = run.config;
  lo.resume = run.resume;
  lo.init_from = run.init_from;
  lo.console = run.console;
  lo.stop_on_signals = true;
  lo.dump_graphs_dir = run.dump_graphs_dir;
  lo.trace_path = run.trace_path;
  lo.processes = run.processes;
  lo.search_machine = run.search_machine;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<TrainingLoop> loop, TrainingLoop::Open(std::move(lo)));
  return loop->Run();
}

}  // namespace loom::train
