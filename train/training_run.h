// One `loom train` run from a config: data, model, training graph, schedule,
// metrics, checkpoints, evaluation, and resume. The run folder holds
//   config.pbtxt    the resolved config (repeats the run exactly)
//   metrics.jsonl   one JSON object per report (train and test)
//   events.out.tfevents.*  TensorBoard scalars
//   ckpt-<step>.loom        the newest checkpoints (atomic, checksummed)
// A resumed run continues from the newest checkpoint so that its final
// parameters equal an uninterrupted run's bit for bit on the CPU.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "graph/training.h"
#include "train/config/train_config.h"

namespace loom::train {

struct RunOptions {
  proto::TrainConfig config;  // resolved (defaults filled, flags applied)
  std::string config_name;    // names the run folder when out_dir is empty
  bool resume = false;        // continue the run in config.out_dir()
  // A single-model checkpoint whose parameters and buffers (not optimizer
  // state) the model starts from; every fused replica starts from it.
  std::string init_from;
  FILE* console = stdout;     // progress and summaries
};

// A fused run's replica at the end of the run.
struct ReplicaResult {
  std::string label;
  std::string status;  // running | diverged ... | stopped ...
  double train_loss = 0, test_loss = 0, test_accuracy = 0;
};

struct RunResult {
  std::string out_dir;
  int64_t steps = 0;
  double final_train_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;  // fused runs: the best replica's
  double seconds = 0;
  std::vector<ReplicaResult> replicas;  // fused runs, in config order
  // SIGINT or SIGTERM stopped the run (after a checkpoint); 0 when it ran to its end.
  int stop_signal = 0;
};

StatusOr<RunResult> RunTraining(const RunOptions& options);

// Applies `loom train` flags to a config and re-checks it.
struct Overrides {
  std::optional<int64_t> epochs, max_steps, threads;
  std::optional<uint64_t> seed;
  std::optional<std::string> out_dir;
};
Status ApplyOverrides(const Overrides& o, proto::TrainConfig* config);

// The graph layer's optimizer settings for a config's optimizer block.
OptimizerConfig ToOptimizerConfig(const proto::OptimizerConfig& p);

}  // namespace loom::train
