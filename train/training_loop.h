// The supervised training loop behind loom::Trainer (train/trainer.h) and
// `loom train` (train/training_run.h): data, model, compiled programs,
// schedules, metrics, checkpoints, evaluation, fused replica arrays and
// resume. The run folder holds
//   config.pbtxt    the resolved config (repeats the run exactly)
//   metrics.jsonl   one JSON object per report (train and test)
//   events.out.tfevents.*  TensorBoard scalars
//   ckpt-<step>.loom        the newest checkpoints (atomic, checksummed)
// A resumed run continues from the newest checkpoint so that its final
// parameters equal an uninterrupted run's bit for bit on the CPU.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/strategy.h"
#include "runtime/comm/communicator.h"
#include "runtime/executor.h"
#include "runtime/step_runner.h"
#include "simulator/machine.h"
#include "train/checkpoint/checkpoint.h"
#include "train/config/replicas.h"
#include "train/data/loader.h"
#include "train/metrics/progress.h"
#include "train/metrics/run_logger.h"
#include "train/optim/schedule.h"
#include "train/run_parts.h"
#include "train/trainer.h"

namespace loom::train {

struct LoopOptions {
  proto::TrainConfig config;  // resolved: defaults filled, flags applied, out_dir set
  bool resume = false;
  std::string init_from;
  FILE* console = nullptr;  // null: silent
  std::function<void(const metrics::MetricsRecord&)> on_metrics;
  NetworkBuilder network;
  // `loom train`: SIGINT and SIGTERM end Run() after the step in progress,
  // with a checkpoint (train/stop_signals.h). Never set for embedded runs.
  bool stop_on_signals = false;
  // When set, every compiled program's graph after each pass (graph/compile.h).
  std::string dump_graphs_dir;
  // With devices: the last step's task trace (Chrome trace JSON) goes here.
  std::string trace_path;
  // Not owned. `mpirun -np K loom train`: this process is rank r of K, each
  // running devices / K devices of the task runtime (runtime/task_runtime.h). Every
  // rank runs the whole loop (same data, same evaluation) and takes part in
  // every exchange; rank 0 alone writes the run folder and the console.
  Communicator* processes = nullptr;
  // `strategy: "auto"`: the machine model the search predicts steps on, for
  // the run's CPU devices (`loom train` probes this machine, or reads
  // --machine), and the chain's proposals (docs/search.md).
  std::function<StatusOr<Machine>(int64_t devices)> search_machine;
  int64_t search_proposals = 500;
};

// Checks a run's folder against its config before anything is written: a
// new run needs an empty or absent folder; a resumed one must hold a
// config.pbtxt that defines the same run (only out_dir, epochs, max_steps,
// threads and device may change). Returns whether config.pbtxt must be
// (re)written with the config given: a new run, or a resume that extends or
// moves it.
StatusOr<bool> CheckRunFolder(const proto::TrainConfig& config, bool resume);

// An error unless `devices` shares out evenly among the processes (when
// there are several).
Status CheckDevicesPerProcess(int64_t devices, const Communicator* processes);

// The training step `step` (its forward graph `forward`, which the strategy
// names layers of) on `devices` CPU devices under `strategy`: all of them
// in this process, or this rank's share under `processes`; the machine's
// threads shared out among the local devices. Random ops draw from `seed`'s
// streams; `trace` records every task. The devices run the step as an
// executor of their kind would (ExecutedGraph: on the CPU, ReLUs folded
// into BatchNorms), so that a step on N devices does one device's work.
StatusOr<std::unique_ptr<StepRunner>> CreateStepTaskRuntime(const Graph& step, const Graph& forward,
                                                            const Strategy& strategy, const std::vector<Device>& devices,
                                                            Communicator* processes, uint64_t seed, bool trace);

// `strategy: "auto"` for one step graph (its forward graph `forward`): the
// strategy text `kept` (named `kept_name` in errors; empty: none) when it
// still lowers on `devices`, else the best the search finds on
// opt.search_machine in opt.search_proposals proposals from `seed`,
// reported on opt.console ("strategy auto (label): ..."). Under
// opt.processes rank 0 decides and every rank gets its text.
StatusOr<std::string> AutoStrategyText(const Graph& step, const Graph& forward, int64_t devices,
                                       const std::string& kept, const std::string& kept_name, const LoopOptions& opt,
                                       uint64_t seed, const std::string& label);

// A replica of the run (the only one when unfused): its config, schedule,
// data order and record. A fused replica leaves the array when it diverges
// (frozen at its last finite state) or when the early-stop rule stops it;
// the array is then re-fused without it, so it costs nothing from then on.
// Its final state is kept aside ("retired/<r>/<tensor>" in checkpoints).
struct Replica {
  ReplicaSpec spec;
  std::unique_ptr<Schedule> schedule;
  std::unique_ptr<DataLoader> loader;  // fusion.per_replica_data_order only
  std::string status = "running";      // running | diverged ... | stopped ...
  int64_t since_step = 0;              // when it left the array
  double train_loss = NAN, test_loss = NAN, test_accuracy = NAN;
  double lr = 0, grad_norm = 0;
  double window_loss = 0;  // fused runs: the replica's loss window since the last train record
  // fp16 runs: the scale the next step uses, and the steps skipped (gradient
  // overflow) since the last train record.
  double loss_scale = 0;
  int64_t window_skipped = 0;
};

class TrainingLoop {
 public:
  // Loads data, builds and compiles the model, restores a resumed run; only
  // when all of that succeeded is the run folder made and written, so a
  // failed start leaves nothing behind. Supervised models only.
  static StatusOr<std::unique_ptr<TrainingLoop>> Open(LoopOptions options);

  StatusOr<StepReport> Step();
  StatusOr<StepReport> RunEpoch();
  StatusOr<TrainerResult> Run();
  StatusOr<Evaluation> Evaluate();
  Status SaveCheckpoint();
  Status SaveCheckpointTo(const std::string& path);
  Status Restore(const std::string& path);
  // Takes replicas (by index in the config's order) out of a fused array as
  // the early stop does, and saves a checkpoint so that the array's folder
  // records it: `loom sweep` stops a Hyperband rung's losers this way.
  // Replicas no longer running are skipped; the last running one may go
  // (the array is then done).
  Status StopReplicas(const std::vector<int64_t>& replica_indices, const std::string& status);
  const std::vector<Replica>& replicas() const { return replicas_; }
  void Cancel() { cancel_requested_.store(true); }
  bool cancelled() const { return cancel_requested_.load(); }

  bool done() const;
  int64_t step() const { return step_; }
  int64_t epoch() const { return epoch_; }
  const std::string& out_dir() const { return c_.out_dir(); }
  const proto::TrainConfig& config() const { return c_; }
  ~TrainingLoop();

 private:
  explicit TrainingLoop(LoopOptions options);
  Status Prepare();
  Status OpenRecords(bool rewrite_config);

  bool fused() const { return fused_; }
  // Whether this process writes the run's records (not a rank > 0).
  bool writes_records() const { return opt_.processes == nullptr || opt_.processes->rank() == 0; }
  // SIGINT/SIGTERM (or a cancel) received; under processes, by any rank,
  // so that every rank stops after the same step.
  StatusOr<int> StopRequest();
  int64_t array_size() const { return static_cast<int64_t>(alive_.size()); }
  // (Re)compiles the training and evaluation programs for alive_; state of
  // replicas still in the array moves over from the previous executors.
  Status BuildArray(bool initialize);
  StatusOr<std::unique_ptr<StepRunner>> CreateTaskRuntime(const Graph& step, const Graph& forward,
                                                          const std::vector<Device>& devices);
  // The strategy of `strategy: "auto"`: the run folder's strategy.pbtxt when
  // it applies to `forward` (a resumed run, or the array re-fused), else
  // one searched now on the search machine (by rank 0, sent to the others).
  StatusOr<Strategy> AutoStrategy(const Graph& step, const Graph& forward, int64_t devices);
  // Takes the replicas at array positions `positions` out of the array.
  Status Retire(const std::vector<int64_t>& positions, const std::string& status);
  Status ApplyEarlyStop();
  Status InitFrom(const std::string& path);
  Status RestoreFrom(Checkpoint ckpt, const std::string& path);
  Status RestoreLatest();
  StatusOr<Checkpoint> CaptureCheckpoint() const;
  // Per replica in the array: test loss and accuracy.
  Status EvaluateArray(std::vector<double>* loss, std::vector<double>* accuracy);
  // Token models are scored per token: the test loss is also reported as
  // perplexity, exp(loss).
  bool scores_tokens() const {
    return data_.train->input_spec().dtype == DType::kI64 && data_.train->target_spec().shape.rank() > 0;
  }
  bool per_replica_data() const { return fused() && c_.fusion().per_replica_data_order(); }
  // The next training batch of the array: shared, or stacked per replica.
  // False when the epoch has no batch left.
  StatusOr<bool> NextBatch(std::map<std::string, Tensor>* feeds);
  // One optimizer step on the next batch, with its train record; false when
  // the epoch has no batch left.
  StatusOr<bool> TrainBatch();
  // After TrainBatch: a periodic checkpoint, or the epoch's (or run's) end.
  Status FinishBatch();
  // The epoch's end (or the run's): evaluation, early stop, checkpoint.
  Status EndEpoch();
  Status Log(const metrics::MetricsRecord& record);
  StepReport Report(bool epoch_ended) const;
  TrainerResult Result() const;
  double Elapsed() const;

  LoopOptions opt_;
  const proto::TrainConfig& c_;
  FILE* console_;  // opt_.console, or /dev/null
  FILE* null_console_ = nullptr;
  bool fused_ = false;
  Datasets data_;
  models::DataSpec data_spec_;
  std::unique_ptr<DataLoader> train_loader_, test_loader_;
  bool loaders_started_ = false;
  Graph train_forward_, eval_forward_;  // one model
  std::unique_ptr<StepRunner> train_;  // an Executor, or a TaskRuntime with `devices`
  std::unique_ptr<Executor> eval_;
  std::string fingerprint_;
  std::string config_text_;
  std::string strategy_text_;  // strategy: "auto": what strategy.pbtxt in the run folder holds
  DType dtype_ = DType::kF32;
  int64_t total_steps_ = 0;
  // Every replica (one when unfused), and which of them (by index) form the
  // array now, in array order.
  std::vector<Replica> replicas_;
  std::vector<int64_t> alive_;
  std::map<std::string, Tensor> retired_;  // "retired/<r>/<name>"
  std::vector<int64_t> kept_rows_;         // Retire -> BuildArray: old array rows that stay
  // Position: the next batch to train on is batch_in_epoch_ of epoch_.
  int64_t step_ = 0, epoch_ = 0, batch_in_epoch_ = 0;
  // The training-loss window since the last train record (per replica in
  // Replica::window_loss); checkpointed, so a resumed run's first record
  // averages the same steps as an uninterrupted run's.
  double window_loss_ = 0;
  int64_t window_steps_ = 0;
  int64_t timed_steps_ = 0;  // steps since window_start_, for the throughput
  std::chrono::steady_clock::time_point window_start_;
  double last_loss_ = 0;
  double test_loss_ = 0, test_accuracy_ = 0;  // the newest evaluation's best replica
  bool evaluated_at_end_ = false;
  double elapsed_before_ = 0;  // seconds of earlier processes of a resumed run
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::unique_ptr<metrics::RunLogger> logger_;
  std::unique_ptr<metrics::ProgressBar> progress_;
  std::atomic<bool> cancel_requested_{false};
};

}  // namespace loom::train
