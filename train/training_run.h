// One `loom train` run from a config: the supervised loop
// (train/training_loop.h) with SIGINT/SIGTERM stopping it cleanly, or the
// GAN loop (train/gan_run.h).
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/training.h"
#include "runtime/comm/communicator.h"
#include "simulator/machine.h"
#include "train/config/train_config.h"
#include "train/trainer.h"

namespace loom::train {

struct RunOptions {
  proto::TrainConfig config;  // resolved (defaults filled, flags applied)
  std::string config_name;    // names the run folder when out_dir is empty
  bool resume = false;        // continue the run in config.out_dir()
  // A single-model checkpoint whose parameters and buffers (not optimizer
  // state) the model starts from; every fused replica starts from it.
  std::string init_from;
  FILE* console = stdout;     // progress and summaries
  std::string dump_graphs_dir;  // --dump-graphs: each program's graph after each compile pass
  std::string trace_path;       // --trace: the last step's task trace (with devices)
  // `mpirun -np K loom train`: this process's rank of K, each running
  // devices / K devices (LoopOptions::processes); not owned.
  Communicator* processes = nullptr;
  // strategy "auto": LoopOptions::search_machine.
  std::function<StatusOr<Machine>(int64_t devices)> search_machine;
};

// What `loom train` reports; stop_signal is the SIGINT or SIGTERM that
// stopped the run (after a checkpoint), 0 when it ran to its end.
using RunResult = TrainerResult;

StatusOr<RunResult> RunTraining(const RunOptions& options);

// Applies `loom train` flags to a config and re-checks it.
struct Overrides {
  std::optional<int64_t> epochs, max_steps, threads;
  std::optional<std::string> device, devices, strategy;
  std::optional<uint64_t> seed;
  std::optional<std::string> out_dir;
};
Status ApplyOverrides(const Overrides& o, proto::TrainConfig* config);

}  // namespace loom::train
