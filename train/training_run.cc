#include "train/training_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/file_util.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "graph/fusion.h"
#include "graph/model.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/executor_state.h"
#include "train/checkpoint/run_dir.h"
#include "train/config/replicas.h"
#include "train/data/loader.h"
#include "runtime/executor.h"
#include "train/metrics/progress.h"
#include "train/metrics/run_logger.h"
#include "train/metrics/summary_table.h"
#include "train/optim/schedule.h"
#include "train/gan_run.h"
#include "train/run_parts.h"
#include "train/stop_signals.h"

#include <google/protobuf/util/message_differencer.h>

namespace loom::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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
  if (o.seed) c->set_seed(*o.seed);
  if (o.out_dir) c->set_out_dir(*o.out_dir);
  return Status::Ok();
}

OptimizerConfig ToOptimizerConfig(const proto::OptimizerConfig& p) {
  OptimizerConfig o;
  o.type = p.type();
  o.momentum = p.momentum();
  o.dampening = p.dampening();
  o.nesterov = p.nesterov();
  o.beta1 = p.beta1();
  o.beta2 = p.beta2();
  o.rho = p.rho();
  o.alpha = p.alpha();
  o.centered = p.centered();
  if (p.has_eps()) o.eps = p.eps();
  if (p.has_weight_decay()) o.weight_decay = p.weight_decay();
  o.max_grad_norm = p.clip_grad_norm();
  return o;
}

namespace {

// What a resume may change: the folder's path (a run can be moved or named
// by another path), the run's length (to extend it) and the thread count
// (results do not depend on it). Every other field defines the run.
const char* const kResumableFields[] = {"out_dir", "epochs", "max_steps", "threads"};

// The fields in which `run` and `given` define different runs, as
// "seed: 1 -> 2; optimizer.lr: ..."; empty when they define the same run.
std::string RunDifferences(const proto::TrainConfig& run, const proto::TrainConfig& given) {
  namespace pb = google::protobuf;
  pb::util::MessageDifferencer differ;
  for (const char* name : kResumableFields) differ.IgnoreField(proto::TrainConfig::descriptor()->FindFieldByName(name));
  std::string report;
  differ.set_report_ignores(false);
  differ.ReportDifferencesToString(&report);
  if (differ.Compare(run, given)) return "";
  std::string out;
  size_t start = 0;
  while (start < report.size()) {
    size_t end = report.find('\n', start);
    if (end == std::string::npos) end = report.size();
    std::string line = report.substr(start, end - start);
    start = end + 1;
    if (line.rfind("modified: ", 0) == 0) {
      line = line.substr(std::strlen("modified: "));
    } else if (line.rfind("added: ", 0) == 0) {  // "field: value", set only in `given`
      line = line.substr(std::strlen("added: "));
      if (size_t colon = line.find(": "); colon != std::string::npos) line.insert(colon + 2, "unset -> ");
    } else if (line.rfind("deleted: ", 0) == 0) {
      line = line.substr(std::strlen("deleted: ")) + " -> unset";
    }
    if (line.empty()) continue;
    if (!out.empty()) out += "; ";
    out += line;
  }
  return out;
}

// Per-replica bookkeeping of a fused run (graph/fusion.h). A replica leaves
// the fused array when it diverges (it is frozen at its last finite state)
// or when the early-stop rule stops it; the array is then re-fused without
// it, so it costs nothing from then on. Its final state is kept aside
// ("retired/<r>/<tensor>" in checkpoints) for `loom export`.
struct ReplicaState {
  std::string label;
  std::string status = "running";  // running | diverged | stopped
  int64_t since_step = 0;          // when it left the array
  double train_loss = NAN, test_loss = NAN, test_accuracy = NAN;
  double lr = 0, grad_norm = 0;
  double window_loss = 0;
};

constexpr char kRetiredPrefix[] = "retired/";

// The state of the training loop between steps.
class Trainer {
 public:
  Trainer(const RunOptions& options, std::string out_dir) : opt_(options), c_(options.config), out_dir_(std::move(out_dir)) {}

  Status Prepare();
  StatusOr<RunResult> Run();

 private:
  bool fused() const { return !specs_.empty(); }
  // Replicas in the array now (1 for an unfused run).
  int64_t array_size() const { return fused() ? static_cast<int64_t>(alive_.size()) : 1; }
  // (Re)builds the training and evaluation executors for alive_; state of
  // replicas still in the array moves over from the previous executors.
  Status BuildArray(bool initialize);
  // Takes the replicas at array positions `positions` out of the array.
  Status Retire(const std::vector<int64_t>& positions, const std::string& status, metrics::ProgressBar* progress);
  Status ApplyEarlyStop(metrics::ProgressBar* progress);
  // Parameters and buffers from a single-model checkpoint (--init-from).
  Status InitFrom(const std::string& path);
  Status Evaluate(std::vector<double>* loss, std::vector<double>* accuracy);
  // Token models scored per token: the test loss is also reported as
  // perplexity, exp(loss).
  bool scores_tokens() const {
    return data_.train->input_spec().dtype == DType::kI64 && data_.train->target_spec().shape.rank() > 0;
  }
  Status SaveCheckpoint();
  Status RestoreLatest();
  double Elapsed() const { return elapsed_before_ + std::chrono::duration<double>(Clock::now() - start_).count(); }

  const RunOptions& opt_;
  const proto::TrainConfig& c_;
  std::string out_dir_;
  Datasets data_;
  std::unique_ptr<DataLoader> train_loader_, test_loader_;
  // fusion.per_replica_data_order: one training loader per replica, each
  // shuffling with the replica's seed; the fused graph's image and label
  // inputs are then [R, batch, ...].
  std::vector<std::unique_ptr<DataLoader>> replica_loaders_;
  bool per_replica_data() const { return !replica_loaders_.empty(); }
  // The next training batch of the array: shared, or stacked per replica.
  StatusOr<bool> NextBatch(std::map<std::string, Tensor>* feeds);
  Graph train_forward_, eval_forward_;  // one model
  std::unique_ptr<Executor> train_, eval_;
  std::vector<std::unique_ptr<Schedule>> schedules_;  // per replica (one when unfused)
  std::string fingerprint_;
  std::string config_text_;
  DType dtype_ = DType::kF32;
  int64_t total_steps_ = 0;
  // Fused runs: the replicas' configs, their states, and which of them (by
  // index) form the array now, in array order.
  std::vector<ReplicaSpec> specs_;
  std::vector<ReplicaState> replicas_;
  std::vector<int64_t> alive_;
  std::map<std::string, Tensor> retired_;  // "retired/<r>/<name>"
  std::vector<int64_t> kept_rows_;         // Retire -> BuildArray: old array rows that stay
  // Position: the next batch to train on is batch_in_epoch_ of epoch_.
  int64_t step_ = 0, epoch_ = 0, batch_in_epoch_ = 0;
  // The training-loss window since the last train record (per replica in
  // ReplicaState::window_loss); checkpointed, so a resumed run's first record
  // averages the same steps as an uninterrupted run's.
  double window_loss_ = 0;
  int64_t window_steps_ = 0;
  double elapsed_before_ = 0;  // seconds of earlier processes of a resumed run
  Clock::time_point start_ = Clock::now();
};

Status Trainer::Prepare() {
  config_text_ = TrainConfigToText(c_);
  if (c_.threads() > 0) ThreadPool::SetDefaultThreads(static_cast<int>(c_.threads()));
  LOOM_RETURN_IF_ERROR(ThreadPool::StartDefault());
  if (IsFused(c_)) {
    LOOM_ASSIGN_OR_RETURN(specs_, ExpandReplicas(c_));
    for (size_t r = 0; r < specs_.size(); ++r) {
      replicas_.push_back(ReplicaState{specs_[r].label});
      alive_.push_back(static_cast<int64_t>(r));
    }
  }
  if (c_.data().augment().crop_size() > 0)
    return InvalidArgument("data.augment.crop_size is for GAN training (padding images to the generator's size); ",
                           "model ", c_.model().name(), " is evaluated on the images as they are");
  LOOM_ASSIGN_OR_RETURN(data_, LoadDatasets(c_.data()));
  LOOM_ASSIGN_OR_RETURN(train_loader_, DataLoader::Create(data_.train, LoaderOptions(c_, data_, true)));
  LOOM_ASSIGN_OR_RETURN(test_loader_, DataLoader::Create(data_.test, LoaderOptions(c_, data_, false)));
  if (fused() && c_.fusion().per_replica_data_order()) {
    for (const ReplicaSpec& spec : specs_) {
      LOOM_ASSIGN_OR_RETURN(auto loader, DataLoader::Create(data_.train, LoaderOptions(spec.config, data_, true)));
      replica_loaders_.push_back(std::move(loader));
    }
  }

  // The same model twice: a training graph at the training batch size and an
  // evaluation graph (BatchNorm and Dropout in eval mode) at the eval batch.
  const models::DataSpec spec = DataSpecOf(*data_.train);
  const std::map<std::string, std::string> model_args(c_.model().args().begin(), c_.model().args().end());
  Model train_model;
  LOOM_RETURN_IF_ERROR(models::BuildSupervised(train_model, c_.model().name(), model_args, spec, c_.data().batch_size()));
  Model eval_model;
  eval_model.set_training(false);
  LOOM_RETURN_IF_ERROR(
      models::BuildSupervised(eval_model, c_.model().name(), model_args, spec, c_.data().eval_batch_size()));
  train_forward_ = train_model.graph();
  eval_forward_ = eval_model.graph();
  LOOM_RETURN_IF_ERROR(BuildArray(/*initialize=*/true));

  const int64_t per_epoch = train_loader_->batches_per_epoch();
  total_steps_ = per_epoch * c_.epochs();
  if (c_.max_steps() > 0) total_steps_ = std::min(total_steps_, c_.max_steps());
  if (fused()) {
    for (size_t r = 0; r < specs_.size(); ++r) {
      auto schedule = BuildSchedule(specs_[r].config, per_epoch, total_steps_);
      if (!schedule.ok()) return schedule.status().WithContext("replica " + specs_[r].label);
      schedules_.push_back(std::move(*schedule));
    }
  } else {
    LOOM_ASSIGN_OR_RETURN(auto schedule, BuildSchedule(c_, per_epoch, total_steps_));
    schedules_.push_back(std::move(schedule));
  }
  if (!opt_.init_from.empty()) LOOM_RETURN_IF_ERROR(InitFrom(opt_.init_from));
  if (opt_.resume) LOOM_RETURN_IF_ERROR(RestoreLatest());
  return Status::Ok();
}

Status Trainer::InitFrom(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(path));
  for (const Node& n : train_forward_.nodes()) {
    if (!IsStateOp(n.op)) continue;
    auto it = ckpt.tensors.find(n.name);
    const TensorType& want = train_forward_.type(n.outputs[0]);
    if (it == ckpt.tensors.end())
      return InvalidArgument(path, ": no tensor '", n.name, "' (", want.ToString(), ") for the model's ", n.op);
    if (it->second.shape() != want.shape || it->second.dtype() != want.dtype)
      return InvalidArgument(path, ": tensor '", n.name, "' is ", it->second.shape().ToString(), " ",
                             DTypeName(it->second.dtype()), ", the model's ", n.op, " is ", want.ToString());
    Tensor value = it->second;
    if (fused()) {  // the same start for every replica
      const int64_t rows = array_size();
      std::vector<int64_t> dims = want.shape.dims();
      dims.insert(dims.begin(), rows);
      Tensor tiled = Tensor::Zeros(Shape(dims), want.dtype);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(static_cast<char*>(tiled.raw_data()) + r * value.nbytes(), value.raw_data(), value.nbytes());
      value = tiled;
    }
    LOOM_RETURN_IF_ERROR(train_->SetState(n.name, value));
  }
  return Status::Ok();
}

Status Trainer::BuildArray(bool initialize) {
  Graph train_graph, eval_graph;
  ExecutorOptions eo;
  eo.seed = c_.seed();
  if (!fused()) {
    OptimizerConfig opt = ToOptimizerConfig(c_.optimizer());
    opt.output_grad_norm = true;
    LOOM_ASSIGN_OR_RETURN(train_graph, BuildTrainingGraph(train_forward_, "loss", opt));
    eval_graph = eval_forward_;
  } else {
    FusionOptions fo;
    fo.replicas = static_cast<int>(alive_.size());
    fo.unfused_layers.assign(c_.fusion().unfused_layers().begin(), c_.fusion().unfused_layers().end());
    std::vector<OptimizerConfig> opts;
    for (int64_t r : alive_) {
      fo.seeds.push_back(specs_[r].config.seed());
      opts.push_back(ToOptimizerConfig(specs_[r].config.optimizer()));
      opts.back().output_grad_norm = true;
    }
    const bool isolate = !c_.fusion().has_isolate_divergence() || c_.fusion().isolate_divergence();
    LOOM_ASSIGN_OR_RETURN(eval_graph, FuseReplicas(eval_forward_, fo));  // evaluation data is shared
    if (per_replica_data()) fo.per_replica_inputs = {"input", "target"};
    LOOM_ASSIGN_OR_RETURN(Graph fused_train, FuseReplicas(train_forward_, fo));
    LOOM_ASSIGN_OR_RETURN(train_graph, BuildFusedTrainingGraph(fused_train, "loss", opts, isolate));
  }
  LOOM_ASSIGN_OR_RETURN(auto train, Executor::Create(train_graph, eo));
  LOOM_ASSIGN_OR_RETURN(eval_, Executor::Create(eval_graph, eo));
  if (initialize) {
    LOOM_RETURN_IF_ERROR(train->InitializeState(c_.seed()));
  } else {
    // Rows of the replicas that stay, in their new order.
    const std::vector<int64_t>& kept = kept_rows_;
    for (const auto& [name, t] : train->state()) {
      LOOM_ASSIGN_OR_RETURN(Tensor old, train_->GetState(name));
      const size_t row = old.nbytes() / static_cast<size_t>(old.shape()[0]);
      Tensor host = Tensor::Zeros(t.shape(), t.dtype());
      for (size_t i = 0; i < kept.size(); ++i)
        std::memcpy(static_cast<char*>(host.raw_data()) + i * row,
                    static_cast<const char*>(old.raw_data()) + static_cast<size_t>(kept[i]) * row, row);
      LOOM_RETURN_IF_ERROR(train->SetState(name, host));
    }
    train->SetStep(train_->step());
  }
  train_ = std::move(train);
  fingerprint_ = ModelFingerprint(train_graph);
  return Status::Ok();
}

StatusOr<bool> Trainer::NextBatch(std::map<std::string, Tensor>* feeds) {
  Batch b;
  if (!per_replica_data()) {
    LOOM_ASSIGN_OR_RETURN(bool more, train_loader_->Next(&b));
    (*feeds)["input"] = b.input;
    (*feeds)["target"] = b.target;
    return more;
  }
  std::vector<Batch> batches(alive_.size());
  for (size_t i = 0; i < alive_.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(bool more, replica_loaders_[alive_[i]]->Next(&batches[i]));
    if (!more) return false;  // the loaders have the same number of batches
  }
  for (const char* name : {"input", "target"}) {
    const bool input = std::string(name) == "input";
    const Tensor& first = input ? batches[0].input : batches[0].target;
    std::vector<int64_t> dims = first.shape().dims();
    dims.insert(dims.begin(), static_cast<int64_t>(batches.size()));
    Tensor stacked = Tensor::Zeros(Shape(dims), first.dtype());
    for (size_t i = 0; i < batches.size(); ++i) {
      const Tensor& t = input ? batches[i].input : batches[i].target;
      std::memcpy(static_cast<char*>(stacked.raw_data()) + i * t.nbytes(), t.raw_data(), t.nbytes());
    }
    (*feeds)[name] = stacked;
  }
  return true;
}

Status Trainer::Retire(const std::vector<int64_t>& positions, const std::string& status,
                       metrics::ProgressBar* progress) {
  if (positions.empty()) return Status::Ok();
  std::vector<int64_t> alive;
  kept_rows_.clear();
  for (size_t i = 0; i < alive_.size(); ++i) {
    const int64_t r = alive_[i];
    if (std::find(positions.begin(), positions.end(), static_cast<int64_t>(i)) == positions.end()) {
      alive.push_back(r);
      kept_rows_.push_back(static_cast<int64_t>(i));
      continue;
    }
    // Keep the replica's final state, as a single model's tensors.
    for (const auto& [name, t] : train_->state()) {
      const int64_t rows = t.shape()[0];
      LOOM_ASSIGN_OR_RETURN(Tensor row, t.Reshape(Shape({rows, t.numel() / rows})));
      Tensor host = Tensor::Zeros(Shape(std::vector<int64_t>(t.shape().dims().begin() + 1, t.shape().dims().end())),
                                  t.dtype());
      std::memcpy(host.raw_data(), static_cast<const char*>(row.raw_data()) + i * host.nbytes(), host.nbytes());
      retired_[kRetiredPrefix + std::to_string(r) + "/" + name] = host;
    }
    replicas_[r].status = status;
    replicas_[r].since_step = step_;
    progress->PrintLine(StrCat("replica ", replicas_[r].label, ": ", status, " at step ", step_, " (train loss ",
                               replicas_[r].train_loss, ")"));
  }
  alive_ = alive;
  if (alive_.empty()) return Status::Ok();
  return BuildArray(/*initialize=*/false);
}

// Ranks the running replicas by the rule's metric and stops the worst.
Status Trainer::ApplyEarlyStop(metrics::ProgressBar* progress) {
  if (!fused() || !c_.fusion().has_early_stop() || alive_.size() <= 1) return Status::Ok();
  const proto::EarlyStopConfig& e = c_.fusion().early_stop();
  const int64_t every = std::max<int64_t>(1, e.every_epochs());
  if (epoch_ < e.after_epochs() || (epoch_ - e.after_epochs()) % every != 0) return Status::Ok();
  const std::string metric = e.metric().empty() ? "test_accuracy" : e.metric();
  auto score = [&](int64_t r) {  // higher is better; NaN ranks last
    const ReplicaState& s = replicas_[r];
    const double v = metric == "test_accuracy" ? s.test_accuracy : metric == "test_loss" ? -s.test_loss : -s.train_loss;
    return std::isnan(v) ? -INFINITY : v;
  };
  std::vector<int64_t> order(alive_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return score(alive_[a]) > score(alive_[b]); });
  const double fraction = e.keep_fraction() > 0 ? e.keep_fraction() : 0.5;
  const size_t keep = std::max<size_t>(1, static_cast<size_t>(std::ceil(fraction * alive_.size())));
  std::vector<int64_t> stop(order.begin() + static_cast<std::ptrdiff_t>(std::min(keep, order.size())), order.end());
  return Retire(stop, StrCat("stopped by early stop (", metric, ", epoch ", epoch_, ")"), progress);
}

Status Trainer::RestoreLatest() {
  LOOM_ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpoints(out_dir_));
  // The newest checkpoint that reads back; a damaged one (a disk error, a
  // copy cut short) is moved aside with a warning and the one before it taken.
  Checkpoint ckpt;
  CheckpointFile latest;
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    StatusOr<Checkpoint> loaded = LoadCheckpoint(it->path);
    if (loaded.ok()) {
      ckpt = std::move(*loaded);
      latest = *it;
      break;
    }
    const std::string aside = it->path + ".corrupt";
    std::error_code ec;
    fs::rename(it->path, aside, ec);
    if (ec) return loaded.status().WithContext("and it cannot be moved aside (" + ec.message() + ")");
    std::fprintf(opt_.console, "warning: %s; moved to %s, trying the checkpoint before it\n",
                 loaded.status().message().c_str(), aside.c_str());
  }
  if (latest.path.empty()) {
    // The run stopped before its first checkpoint: it starts again from step 0.
    std::fprintf(opt_.console, "%s holds no checkpoint yet: starting the run from step 0\n", out_dir_.c_str());
    return Status::Ok();
  }
  LOOM_ASSIGN_OR_RETURN(proto::TrainConfig saved, ParseTrainConfig(ckpt.config_text, latest.path));
  if (std::string diff = RunDifferences(saved, c_); !diff.empty())
    return FailedPrecondition(latest.path, " was written by a run with another config (", diff,
                              "); resume with the run's own ", out_dir_, "/config.pbtxt");
  if (fused()) {
    // Rebuild the array the checkpoint holds: the replicas still running.
    alive_.clear();
    for (size_t r = 0; r < replicas_.size(); ++r) {
      const std::string key = "replica_" + std::to_string(r);
      if (auto it = ckpt.string_values.find(key + "/status"); it != ckpt.string_values.end())
        replicas_[r].status = it->second;
      if (auto it = ckpt.int_values.find(key + "/since_step"); it != ckpt.int_values.end())
        replicas_[r].since_step = it->second;
      if (replicas_[r].status == "running") alive_.push_back(static_cast<int64_t>(r));
    }
    for (auto it = ckpt.tensors.begin(); it != ckpt.tensors.end();) {
      if (it->first.rfind(kRetiredPrefix, 0) != 0) {
        ++it;
        continue;
      }
      retired_[it->first] = it->second;
      it = ckpt.tensors.erase(it);
    }
    if (alive_.size() != specs_.size()) LOOM_RETURN_IF_ERROR(BuildArray(/*initialize=*/true));
  }
  LOOM_RETURN_IF_ERROR(RestoreExecutorState(ckpt, train_.get()));
  step_ = ckpt.position.global_step;
  epoch_ = ckpt.position.epoch;
  batch_in_epoch_ = ckpt.position.batch_in_epoch;
  if (auto it = ckpt.float_values.find("elapsed_s"); it != ckpt.float_values.end()) elapsed_before_ = it->second;
  if (auto it = ckpt.float_values.find("window_loss"); it != ckpt.float_values.end()) window_loss_ = it->second;
  if (auto it = ckpt.int_values.find("window_steps"); it != ckpt.int_values.end()) window_steps_ = it->second;
  for (size_t r = 0; r < replicas_.size(); ++r)
    if (auto it = ckpt.float_values.find("replica_" + std::to_string(r) + "/window_loss"); it != ckpt.float_values.end())
      replicas_[r].window_loss = it->second;
  std::fprintf(opt_.console, "resuming %s from %s (step %lld, epoch %lld, batch %lld)\n", out_dir_.c_str(),
               latest.path.c_str(), static_cast<long long>(step_), static_cast<long long>(epoch_ + 1),
               static_cast<long long>(batch_in_epoch_));
  return Status::Ok();
}

Status Trainer::SaveCheckpoint() {
  Checkpoint ckpt;
  if (!alive_.empty() || !fused()) {
    LOOM_ASSIGN_OR_RETURN(ckpt, CaptureExecutorState(*train_));
  }
  ckpt.position.global_step = step_;
  ckpt.position.epoch = epoch_;
  ckpt.position.batch_in_epoch = batch_in_epoch_;
  ckpt.seeds["seed"] = c_.seed();
  ckpt.float_values["elapsed_s"] = Elapsed();
  ckpt.float_values["window_loss"] = window_loss_;
  ckpt.int_values["window_steps"] = window_steps_;
  ckpt.config_text = config_text_;
  for (size_t r = 0; r < replicas_.size(); ++r) {
    const std::string key = "replica_" + std::to_string(r);
    ckpt.string_values[key + "/status"] = replicas_[r].status;
    ckpt.int_values[key + "/since_step"] = replicas_[r].since_step;
    ckpt.float_values[key + "/window_loss"] = replicas_[r].window_loss;
  }
  for (const auto& [name, t] : retired_) ckpt.tensors[name] = t;
  return SaveCheckpointToRunDir(out_dir_, ckpt, static_cast<int>(c_.keep_checkpoints())).status();
}

// Per replica in the array: the test loss and accuracy over the scored target
// entries (one per example for classifiers, one per token for token models).
Status Trainer::Evaluate(std::vector<double>* loss, std::vector<double>* accuracy) {
  for (const auto& [name, t] : eval_->state()) LOOM_RETURN_IF_ERROR(eval_->SetState(name, train_->state().at(name)));
  LOOM_RETURN_IF_ERROR(test_loader_->Start(0));
  const int64_t n = array_size();
  Batch batch;
  std::vector<double> loss_sum(n, 0.0);
  std::vector<int64_t> correct(n, 0);
  int64_t scored = 0;  // target entries that count (not padding, not unmasked tokens)
  for (;;) {
    LOOM_ASSIGN_OR_RETURN(bool more, test_loader_->Next(&batch));
    if (!more) break;
    LOOM_ASSIGN_OR_RETURN(auto out, eval_->Run({{"input", batch.input}, {"target", batch.target}}));
    const Tensor& logits = out["logits"];  // [B, target..., C], fused [R, B, target..., C]
    const int64_t classes = logits.shape().dim(-1);
    const int64_t rows = logits.numel() / classes / n;  // = batch.target.numel()
    const int64_t* targets = batch.target.data<int64_t>();
    const int64_t valid_rows = batch.valid * (rows / batch.target.shape()[0]);
    int64_t batch_scored = 0;
    for (int64_t i = 0; i < valid_rows; ++i) batch_scored += targets[i] != models::kIgnoreTarget;
    const std::vector<double> losses = out["loss"].ToDoubleVector();
    for (int64_t r = 0; r < n; ++r) {
      const float* pl = logits.data<float>() + r * rows * classes;
      for (int64_t i = 0; i < valid_rows; ++i) {
        if (targets[i] == models::kIgnoreTarget) continue;
        const float* row = pl + i * classes;
        correct[r] += (std::max_element(row, row + classes) - row) == targets[i];
      }
      // The loss is the mean over the scored entries (padding rows have
      // ignored targets), so weigh it by their number.
      loss_sum[r] += losses[r] * static_cast<double>(batch_scored);
    }
    scored += batch_scored;
  }
  loss->assign(n, 0.0);
  accuracy->assign(n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    (*loss)[r] = loss_sum[r] / std::max<int64_t>(1, scored);
    (*accuracy)[r] = static_cast<double>(correct[r]) / std::max<int64_t>(1, scored);
  }
  return Status::Ok();
}

StatusOr<RunResult> Trainer::Run() {
  metrics::RunLoggerOptions lo;
  if (opt_.resume) lo.resume_step = step_;
  lo.tensorboard = c_.tensorboard();
  lo.replicas = fused() ? static_cast<int64_t>(specs_.size()) : 1;
  LOOM_ASSIGN_OR_RETURN(metrics::RunLogger logger, metrics::RunLogger::Create(out_dir_, lo));
  if (!logger.resume_note().empty()) std::fprintf(opt_.console, "%s\n", logger.resume_note().c_str());
  if (opt_.resume) LOOM_RETURN_IF_ERROR(PruneCheckpoints(out_dir_, static_cast<int>(c_.keep_checkpoints())));
  const StopSignals stop_signals;
  metrics::ProgressOptions po;
  po.total_steps = total_steps_;
  po.first_step = step_;
  po.line_every_steps = c_.log_every_steps();
  metrics::ProgressBar progress(opt_.console, po);
  progress.PrintLine(StrCat("run ", out_dir_, ": model ", c_.model().name(),
                            fused() ? StrCat(", ", specs_.size(), " fused replicas") : std::string(), ", ",
                            data_.train->size(), " training and ", data_.test->size(), " test examples, ",
                            total_steps_, " steps, ", ThreadPool::Default().num_threads(), " threads"));
  for (const ReplicaState& r : replicas_) progress.PrintLine(StrCat("  replica ", r.label));

  const int64_t batch = c_.data().batch_size();
  Tensor step_t = Tensor::Zeros({}, dtype_);
  RunResult result;
  result.out_dir = out_dir_;
  double last_loss = 0;
  int64_t timed_steps = 0;  // steps since window_start, for the throughput
  auto window_start = Clock::now();
  bool evaluated_at_end = false;
  auto done = [&] { return step_ >= total_steps_ || (fused() && alive_.empty()); };

  while (!done() && epoch_ < c_.epochs()) {
    if (per_replica_data()) {
      for (int64_t r : alive_) LOOM_RETURN_IF_ERROR(replica_loaders_[r]->Start(epoch_, batch_in_epoch_));
    } else {
      LOOM_RETURN_IF_ERROR(train_loader_->Start(epoch_, batch_in_epoch_));
    }
    for (;;) {
      if (done()) break;
      std::map<std::string, Tensor> feeds;
      LOOM_ASSIGN_OR_RETURN(bool more, NextBatch(&feeds));
      if (!more) break;
      const int64_t n = array_size();
      Tensor lr = Tensor::Zeros(fused() ? Shape({n}) : Shape{}, dtype_);
      for (int64_t i = 0; i < n; ++i) {
        const double rate = schedules_[fused() ? alive_[i] : 0]->LearningRate(step_);
        lr.data<float>()[i] = static_cast<float>(rate);
        if (fused()) replicas_[alive_[i]].lr = rate;
      }
      step_t.Fill(static_cast<double>(step_ + 1));
      feeds["lr"] = lr;
      feeds["step"] = step_t;
      if (fused()) {
        Tensor mask = Tensor::Zeros({n}, dtype_);
        mask.Fill(1);
        feeds[kReplicaMaskInput] = mask;
      }
      LOOM_ASSIGN_OR_RETURN(auto out, train_->Run(feeds));
      ++step_;
      ++batch_in_epoch_;
      const std::vector<double> losses = out["loss"].ToDoubleVector();
      if (!fused()) {
        last_loss = losses[0];
        if (!std::isfinite(last_loss))
          return FailedPrecondition("the loss became ", last_loss, " at step ", step_, " (epoch ", epoch_ + 1,
                                    "); lower optimizer.lr or set optimizer.clip_grad_norm");
      } else {
        // Replicas the step did not update diverged: they leave the array.
        const std::vector<double> active = out[kActiveOutput].ToDoubleVector();
        const std::vector<double> norms = out[kGradNormOutput].ToDoubleVector();
        std::vector<int64_t> diverged;
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) {
          ReplicaState& s = replicas_[alive_[i]];
          s.train_loss = losses[i];
          s.grad_norm = norms[i];
          if (active[i] == 0) {
            diverged.push_back(i);
            continue;
          }
          s.window_loss += losses[i];
          sum += losses[i];
        }
        LOOM_RETURN_IF_ERROR(Retire(diverged, "diverged (loss or gradient not finite)", &progress));
        if (alive_.empty())
          return FailedPrecondition("every replica diverged by step ", step_, " (epoch ", epoch_ + 1,
                                    "); lower the learning rates or set optimizer.clip_grad_norm");
        last_loss = sum / static_cast<double>(n - static_cast<int64_t>(diverged.size()));
      }
      window_loss_ += last_loss;
      ++window_steps_;
      ++timed_steps;
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      const double samples_per_s = secs > 0 ? timed_steps * batch * n / secs : 0;
      progress.Update(step_, last_loss, samples_per_s);
      if (step_ % c_.log_every_steps() == 0) {
        metrics::MetricsRecord r;
        r.epoch = epoch_ + 1;
        r.step = step_;
        r.samples_per_s = samples_per_s;
        r.time_s = Elapsed();
        if (!fused()) {
          r.loss = window_loss_ / window_steps_;
          r.extra = {{"lr", schedules_[0]->LearningRate(step_ - 1)}, {"grad_norm", out[kGradNormOutput].ScalarAt(0)}};
          LOOM_RETURN_IF_ERROR(logger.Log(r));
        } else {
          r.samples_per_s = samples_per_s / static_cast<double>(alive_.size());
          for (int64_t rep : alive_) {
            ReplicaState& s = replicas_[rep];
            r.replica = rep;
            r.loss = s.window_loss / window_steps_;
            r.extra = {{"lr", s.lr}, {"grad_norm", s.grad_norm}};
            LOOM_RETURN_IF_ERROR(logger.Log(r));
          }
        }
        for (ReplicaState& s : replicas_) s.window_loss = 0;
        window_loss_ = 0;
        window_steps_ = 0;
        timed_steps = 0;
        window_start = Clock::now();
      }
      // A step that ends an epoch or the run is saved once, below, after
      // its evaluation: a checkpoint at step S follows every record of S.
      const bool ends_epoch_or_run = batch_in_epoch_ >= train_loader_->batches_per_epoch() || done();
      const bool periodic = c_.checkpoint_every_steps() > 0 && step_ % c_.checkpoint_every_steps() == 0;
      if (const int sig = StopSignals::Received(); sig != 0) {
        LOOM_RETURN_IF_ERROR(SaveCheckpoint());
        progress.Finish();
        std::fprintf(opt_.console, "stopped by %s at step %lld; checkpoint saved: resume with loom train --resume %s\n",
                     StopSignals::Name(sig), static_cast<long long>(step_), out_dir_.c_str());
        result.steps = step_;
        result.final_train_loss = last_loss;
        result.seconds = Elapsed();
        result.stop_signal = sig;
        return result;
      }
      if (periodic && !ends_epoch_or_run) LOOM_RETURN_IF_ERROR(SaveCheckpoint());
    }
    const bool epoch_finished = batch_in_epoch_ >= train_loader_->batches_per_epoch();
    if (epoch_finished) {
      ++epoch_;
      batch_in_epoch_ = 0;
    }
    const bool last = done() || epoch_ >= c_.epochs();
    if ((epoch_finished && epoch_ % c_.eval_every_epochs() == 0) || last) {
      std::vector<double> loss, accuracy;
      LOOM_RETURN_IF_ERROR(Evaluate(&loss, &accuracy));
      metrics::MetricsRecord r;
      r.epoch = epoch_finished ? epoch_ : epoch_ + 1;
      r.step = step_;
      r.split = metrics::Split::kTest;
      r.time_s = Elapsed();
      for (int64_t i = 0; i < array_size(); ++i) {
        r.replica = fused() ? alive_[i] : 0;
        r.loss = loss[i];
        r.accuracy = accuracy[i];
        if (scores_tokens()) r.extra = {{"perplexity", std::exp(loss[i])}};
        LOOM_RETURN_IF_ERROR(logger.Log(r));
        if (fused()) {
          replicas_[alive_[i]].test_loss = loss[i];
          replicas_[alive_[i]].test_accuracy = accuracy[i];
        }
      }
      const size_t best = std::max_element(accuracy.begin(), accuracy.end()) - accuracy.begin();
      progress.PrintLine(StrCat("epoch ", r.epoch, " step ", step_, ": train loss ", last_loss,
                                fused() ? StrCat(" (mean of ", array_size(), ")") : std::string(), ", test loss ",
                                loss[best],
                                scores_tokens() ? StrCat(" (perplexity ", std::exp(loss[best]), ")") : std::string(),
                                ", test accuracy ", accuracy[best],
                                fused() ? StrCat(" (best: ", replicas_[alive_[best]].label, ")") : std::string(),
                                " (", metrics::FormatDuration(r.time_s), ")"));
      result.test_loss = loss[best];
      result.test_accuracy = accuracy[best];
      evaluated_at_end = last;
      if (epoch_finished && !last) LOOM_RETURN_IF_ERROR(ApplyEarlyStop(&progress));
    }
    if (epoch_finished || last) LOOM_RETURN_IF_ERROR(SaveCheckpoint());
  }
  if (!evaluated_at_end && !(fused() && alive_.empty())) {  // e.g. resumed after the last step: report once more
    std::vector<double> loss, accuracy;
    LOOM_RETURN_IF_ERROR(Evaluate(&loss, &accuracy));
    const size_t best = std::max_element(accuracy.begin(), accuracy.end()) - accuracy.begin();
    result.test_loss = loss[best];
    result.test_accuracy = accuracy[best];
    for (int64_t i = 0; fused() && i < array_size(); ++i) {
      replicas_[alive_[i]].test_loss = loss[i];
      replicas_[alive_[i]].test_accuracy = accuracy[i];
    }
  }
  progress.Finish();
  result.steps = step_;
  result.final_train_loss = last_loss;
  result.seconds = Elapsed();
  std::vector<metrics::SummaryRow> rows;
  metrics::SummaryOptions so;
  if (!fused()) {
    rows.push_back({"0", {{"steps", static_cast<double>(step_)},
                          {"train_loss", last_loss},
                          {"test_loss", result.test_loss},
                          {"test_accuracy", result.test_accuracy},
                          {"time_s", result.seconds}}});
    if (scores_tokens()) rows.back().values.push_back({"test_perplexity", std::exp(result.test_loss)});
  } else {
    so.rank_by = "test_accuracy";
    for (const ReplicaState& s : replicas_) {
      const double steps = s.status == "running" ? static_cast<double>(step_) : static_cast<double>(s.since_step);
      rows.push_back({s.label, {{"steps", steps},
                                {"train_loss", s.train_loss},
                                {"test_loss", s.test_loss},
                                {"test_accuracy", s.test_accuracy}}});
      if (scores_tokens()) rows.back().values.push_back({"test_perplexity", std::exp(s.test_loss)});
      result.replicas.push_back({s.label, s.status, s.train_loss, s.test_loss, s.test_accuracy});
    }
  }
  LOOM_ASSIGN_OR_RETURN(std::string table, metrics::FormatSummaryTable(rows, so));
  std::fprintf(opt_.console, "%s", table.c_str());
  for (const ReplicaState& s : replicas_)
    if (s.status != "running")
      std::fprintf(opt_.console, "replica %s: %s at step %lld\n", s.label.c_str(), s.status.c_str(),
                   static_cast<long long>(s.since_step));
  std::fprintf(opt_.console, "run folder: %s\n", out_dir_.c_str());
  return result;
}

}  // namespace

StatusOr<RunResult> RunTraining(const RunOptions& options) {
  std::string out_dir = options.config.out_dir().empty() ? DefaultOutDir(options.config_name) : options.config.out_dir();
  const std::string config_path = (fs::path(out_dir) / "config.pbtxt").string();
  RunOptions run_options = options;
  run_options.config.set_out_dir(out_dir);
  const std::string config_text = TrainConfigToText(run_options.config);
  bool rewrite_config = !options.resume;
  if (options.resume) {
    // The run's own config decides; only kResumableFields may change.
    if (!fs::exists(config_path)) return NotFound(out_dir, " holds no run to resume (no config.pbtxt)");
    LOOM_ASSIGN_OR_RETURN(proto::TrainConfig saved, LoadTrainConfig(config_path));
    if (std::string diff = RunDifferences(saved, run_options.config); !diff.empty())
      return FailedPrecondition("the config differs from the run's own ", config_path, " in ", diff,
                                " (a resume may change only epochs, max_steps and threads)");
    rewrite_config = TrainConfigToText(saved) != config_text;  // extended or moved
  } else {
    std::error_code ec;
    if (fs::exists(out_dir) && !fs::is_empty(out_dir, ec))
      return FailedPrecondition("the output folder ", out_dir, " is not empty: resume it with --resume ", out_dir,
                                " or choose another --out");
  }
  LOOM_ASSIGN_OR_RETURN(const models::ZooEntry* entry, models::FindModel(options.config.model().name()));
  if (entry->gan) return RunGanTraining(run_options, out_dir);
  // Everything that can fail on bad input (data files, model, checkpoint)
  // happens before the run folder is made, so a failed start leaves nothing.
  Trainer trainer(run_options, out_dir);
  LOOM_RETURN_IF_ERROR(trainer.Prepare());
  if (!options.resume) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) return Internal("cannot create ", out_dir, ": ", ec.message());
  }
  // A later plain --resume continues with the length and folder given now.
  if (rewrite_config) LOOM_RETURN_IF_ERROR(WriteFileAtomically(config_path, config_text));
  return trainer.Run();
}

}  // namespace loom::train
