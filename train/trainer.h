// loom::Trainer: one training run, driven step by step from a host program
// (a service, a sweep, a notebook) or run to its end as `loom train` does.
//
//   auto trainer = loom::Trainer::FromConfigFile("models/configs/fashion_mnist_mlp.pbtxt");
//   if (!trainer.ok()) return Fail(trainer.status());   // the message `loom train` prints
//   while (!(*trainer)->done()) {
//     auto step = (*trainer)->Step();                  // one optimizer update
//     if (!step.ok()) return Fail(step.status());
//   }
//   auto eval = (*trainer)->Evaluate();                // test loss and accuracy
//
// A run is exactly what `loom train --config` runs: the same data, graphs,
// schedule, metrics.jsonl, TensorBoard events and checkpoints in its run
// folder, and the same numbers. Threads: one thread drives a Trainer;
// Cancel() alone may be called from any other thread. Nothing here aborts
// the process on bad input, and nothing touches process-wide state other
// than the CPU thread pool that the config's `threads` sizes.
#pragma once

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "graph/model.h"
#include "models/zoo.h"
#include "train/config/train_config.h"
#include "train/metrics/metrics_jsonl.h"

namespace loom {

namespace train {
class TrainingLoop;
}

// A network of the host's own, in place of the config's zoo model: given the
// graph inputs, returns the logits [B, target..., classes]. The trainer adds
// the loss exactly as for zoo models (models::BuildSupervised); the config's
// model.name then only names the run.
using NetworkBuilder = models::NetworkFn;

struct TrainerOptions {
  // The run folder; empty: the config's out_dir, else runs/<name>-<time>.
  std::string out_dir;
  // Continue the run in out_dir from its newest checkpoint.
  bool resume = false;
  // Start the parameters from this single-model checkpoint.
  std::string init_from;
  // Progress lines and the end-of-run summary; null: silent.
  FILE* console = nullptr;
  // Called on the driving thread for every metrics record the run writes
  // (train windows and evaluations, one per replica of a fused run).
  std::function<void(const metrics::MetricsRecord&)> on_metrics;
  NetworkBuilder network;  // optional
};

// One replica of a fused run (config order), or the only one.
struct ReplicaReport {
  std::string label;               // "lr=0.1" for fused runs; "0" otherwise
  std::string status = "running";  // running | diverged ... | stopped ...
  double train_loss = 0, test_loss = 0, test_accuracy = 0;
};

struct StepReport {
  int64_t step = 0;      // updates done, this one included
  double loss = 0;       // the step's loss (fused: mean over the replicas it updated)
  bool epoch_ended = false;  // the step finished an epoch (evaluated and checkpointed as configured)
  bool done = false;         // the run has reached its length
};

struct Evaluation {
  double loss = 0, accuracy = 0;         // the best replica's
  std::vector<ReplicaReport> replicas;   // every replica still training, config order
};

struct TrainerResult {
  std::string out_dir;
  int64_t steps = 0;
  double final_train_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;  // fused runs: the best replica's
  double seconds = 0;
  std::vector<ReplicaReport> replicas;  // fused runs, config order
  bool cancelled = false;               // Cancel() (or SIGINT/SIGTERM under `loom train`) stopped it
  int stop_signal = 0;                  // `loom train` only: the signal that stopped it
};

class Trainer {
 public:
  // From a config file, its text, or a parsed config (errors name the file
  // and line, as `loom train` does).
  static StatusOr<std::unique_ptr<Trainer>> FromConfigFile(const std::string& path, TrainerOptions options = {});
  static StatusOr<std::unique_ptr<Trainer>> FromConfigText(const std::string& text, TrainerOptions options = {});
  static StatusOr<std::unique_ptr<Trainer>> FromConfig(const proto::TrainConfig& config, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer update on the next batch; an epoch's last step also
  // evaluates and checkpoints when the config says so. An error once done().
  StatusOr<StepReport> Step();
  // Steps to the end of the current epoch (or of the run).
  StatusOr<StepReport> RunEpoch();
  // Steps to the end of the run, then prints the summary (console) and
  // returns it. After Cancel(): saves a checkpoint and returns cancelled.
  StatusOr<TrainerResult> Run();
  // Test loss and accuracy of the parameters now; records nothing.
  StatusOr<Evaluation> Evaluate();
  // Saves ckpt-<step>.loom in the run folder (pruned to keep_checkpoints),
  // or to `path`: a file that `Restore` and `loom train --resume` read.
  Status SaveCheckpoint();
  Status SaveCheckpoint(const std::string& path);
  // Restores parameters, optimizer state and position from a checkpoint of
  // this run's config.
  Status Restore(const std::string& path);
  // From any thread: the step in progress finishes, then Run returns (after
  // saving a checkpoint) with `cancelled`, and Step and RunEpoch return a
  // Cancelled status, now and on every later call. Evaluate and
  // SaveCheckpoint still work; a new Trainer with resume continues the run.
  void Cancel();
  bool cancelled() const;

  bool done() const;
  int64_t step() const;
  int64_t epoch() const;  // the epoch in progress, 0-based
  const std::string& out_dir() const;
  const proto::TrainConfig& config() const;

 private:
  explicit Trainer(std::unique_ptr<train::TrainingLoop> loop);
  std::unique_ptr<train::TrainingLoop> loop_;
};

}  // namespace loom
