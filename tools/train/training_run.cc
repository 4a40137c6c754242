#include "tools/train/training_run.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/file_util.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "graph/model.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/executor_state.h"
#include "runtime/checkpoint/run_dir.h"
#include "runtime/data/cifar.h"
#include "runtime/data/idx.h"
#include "runtime/data/loader.h"
#include "runtime/data/synthetic.h"
#include "runtime/executor.h"
#include "runtime/metrics/progress.h"
#include "runtime/metrics/run_logger.h"
#include "runtime/metrics/summary_table.h"
#include "runtime/optim/schedule.h"

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
    if (*o.threads < 0) return InvalidArgument("--threads must be >= 0, got ", *o.threads);
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

struct Datasets {
  std::shared_ptr<const Dataset> train, test;
  std::vector<float> mean, std;  // the dataset's published normalisation
};

StatusOr<Datasets> LoadDatasets(const proto::DataConfig& d) {
  Datasets out;
  const std::string& name = d.dataset();
  if (name == "fashion_mnist" || name == "mnist") {
    if (name == "mnist" && d.path().empty()) return InvalidArgument("data.path is required for mnist (the IDX folder)");
    std::string dir = d.path().empty() ? kFashionMnistDir : d.path();
    LOOM_ASSIGN_OR_RETURN(out.train, LoadMnist(dir, "train"));
    LOOM_ASSIGN_OR_RETURN(out.test, LoadMnist(dir, "test"));
    out.mean = {name == "mnist" ? kMnistMean : kFashionMnistMean};
    out.std = {name == "mnist" ? kMnistStd : kFashionMnistStd};
  } else if (name == "cifar10") {
    if (d.path().empty()) return InvalidArgument("data.path is required for cifar10 (the folder of data_batch_*.bin)");
    LOOM_ASSIGN_OR_RETURN(out.train, LoadCifar10(d.path(), "train"));
    LOOM_ASSIGN_OR_RETURN(out.test, LoadCifar10(d.path(), "test"));
    out.mean = kCifar10Mean;
    out.std = kCifar10Std;
  } else if (name == "synthetic") {
    SyntheticOptions o;
    o.input = {Shape(std::vector<int64_t>(d.input_shape().begin(), d.input_shape().end())), DType::kF32};
    o.num_classes = d.num_classes();
    o.size = d.num_examples();
    o.seed = 1;
    LOOM_ASSIGN_OR_RETURN(out.train, SyntheticDataset::Create(o));
    o.seed = 2;
    o.size = std::max<int64_t>(1, d.num_examples() / 5);
    LOOM_ASSIGN_OR_RETURN(out.test, SyntheticDataset::Create(o));
  } else {
    return Unimplemented("data.dataset '", name, "' needs a language model; the zoo has only classifiers so far");
  }
  if (d.train_limit() > 0 && d.train_limit() < out.train->size()) {
    LOOM_ASSIGN_OR_RETURN(out.train, SliceDataset(out.train, 0, d.train_limit()));
  }
  if (d.test_limit() > 0 && d.test_limit() < out.test->size()) {
    LOOM_ASSIGN_OR_RETURN(out.test, SliceDataset(out.test, 0, d.test_limit()));
  }
  return out;
}

DataLoaderOptions LoaderOptions(const proto::TrainConfig& c, const Datasets& data, bool training) {
  const proto::DataConfig& d = c.data();
  DataLoaderOptions o;
  o.batch_size = training ? d.batch_size() : d.eval_batch_size();
  o.shuffle = training && d.shuffle();
  o.seed = c.seed();
  o.drop_last = training && d.drop_last();
  o.prefetch = static_cast<int>(d.prefetch());
  if (d.normalize().mean_size() > 0) {
    o.mean.assign(d.normalize().mean().begin(), d.normalize().mean().end());
    o.std.assign(d.normalize().std().begin(), d.normalize().std().end());
  } else {
    o.mean = data.mean;
    o.std = data.std;
  }
  if (training) {
    o.crop_padding = d.augment().random_crop_padding();
    o.random_flip = d.augment().horizontal_flip();
  }
  return o;
}

StatusOr<std::unique_ptr<Schedule>> BuildSchedule(const proto::TrainConfig& c, int64_t steps_per_epoch,
                                                  int64_t total_steps) {
  const proto::ScheduleConfig& p = c.schedule();
  ScheduleConfig s;
  s.type = p.type();
  s.step_size = p.step_size();
  s.milestones.assign(p.milestones().begin(), p.milestones().end());
  s.gamma = p.gamma();
  s.eta_min = p.eta_min();
  s.warmup_steps = p.warmup_steps();
  s.warmup_start_factor = p.warmup_start_factor();
  const bool per_epoch = p.unit() == "epoch";
  // t_max 0: anneal over the whole run (after the warm-up).
  s.t_max = p.t_max() > 0 ? p.t_max()
                          : (per_epoch ? c.epochs() : std::max<int64_t>(1, total_steps - s.warmup_steps));
  auto made = per_epoch ? MakeEpochSchedule(s, c.optimizer().lr(), steps_per_epoch) : MakeSchedule(s, c.optimizer().lr());
  if (!made.ok()) return made.status().WithContext("schedule");
  return made;
}

std::string DefaultOutDir(const std::string& config_name) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
  return "runs/" + config_name + "-" + stamp;
}

// The state of the training loop between steps.
class Trainer {
 public:
  Trainer(const RunOptions& options, std::string out_dir) : opt_(options), c_(options.config), out_dir_(std::move(out_dir)) {}

  Status Prepare();
  StatusOr<RunResult> Run();

 private:
  Status Evaluate(double* loss, double* accuracy);
  Status SaveCheckpoint();
  Status RestoreLatest();
  double Elapsed() const { return elapsed_before_ + std::chrono::duration<double>(Clock::now() - start_).count(); }

  const RunOptions& opt_;
  const proto::TrainConfig& c_;
  std::string out_dir_;
  Datasets data_;
  std::unique_ptr<DataLoader> train_loader_, test_loader_;
  std::unique_ptr<Executor> train_, eval_;
  std::unique_ptr<Schedule> schedule_;
  std::string fingerprint_;
  std::string config_text_;
  DType dtype_ = DType::kF32;
  int64_t total_steps_ = 0;
  // Position: the next batch to train on is batch_in_epoch_ of epoch_.
  int64_t step_ = 0, epoch_ = 0, batch_in_epoch_ = 0;
  double elapsed_before_ = 0;  // seconds of earlier processes of a resumed run
  Clock::time_point start_ = Clock::now();
};

Status Trainer::Prepare() {
  config_text_ = TrainConfigToText(c_);
  if (c_.threads() > 0) ThreadPool::SetDefaultThreads(static_cast<int>(c_.threads()));
  LOOM_ASSIGN_OR_RETURN(data_, LoadDatasets(c_.data()));
  LOOM_ASSIGN_OR_RETURN(train_loader_, DataLoader::Create(data_.train, LoaderOptions(c_, data_, true)));
  LOOM_ASSIGN_OR_RETURN(test_loader_, DataLoader::Create(data_.test, LoaderOptions(c_, data_, false)));

  // The same model twice: a training graph at the training batch size and an
  // evaluation graph (BatchNorm and Dropout in eval mode) at the eval batch.
  const Shape& in_shape = train_loader_->input_shape();
  const Shape example(std::vector<int64_t>(in_shape.dims().begin() + 1, in_shape.dims().end()));
  const int64_t classes = data_.train->num_classes();
  Model train_model;
  LOOM_RETURN_IF_ERROR(models::BuildClassifier(train_model, c_.model().name(),
                                               {c_.model().args().begin(), c_.model().args().end()}, example,
                                               c_.data().batch_size(), classes));
  Model eval_model;
  eval_model.set_training(false);
  LOOM_RETURN_IF_ERROR(models::BuildClassifier(eval_model, c_.model().name(),
                                               {c_.model().args().begin(), c_.model().args().end()}, example,
                                               c_.data().eval_batch_size(), classes));
  OptimizerConfig opt = ToOptimizerConfig(c_.optimizer());
  opt.output_grad_norm = true;
  LOOM_ASSIGN_OR_RETURN(Graph train_graph, BuildTrainingGraph(train_model.graph(), "loss", opt));
  ExecutorOptions eo;
  eo.seed = c_.seed();
  LOOM_ASSIGN_OR_RETURN(train_, Executor::Create(train_graph, eo));
  LOOM_ASSIGN_OR_RETURN(eval_, Executor::Create(eval_model.graph(), eo));
  LOOM_RETURN_IF_ERROR(train_->InitializeState(c_.seed()));
  fingerprint_ = ModelFingerprint(train_graph);

  const int64_t per_epoch = train_loader_->batches_per_epoch();
  total_steps_ = per_epoch * c_.epochs();
  if (c_.max_steps() > 0) total_steps_ = std::min(total_steps_, c_.max_steps());
  LOOM_ASSIGN_OR_RETURN(schedule_, BuildSchedule(c_, per_epoch, total_steps_));
  if (opt_.resume) LOOM_RETURN_IF_ERROR(RestoreLatest());
  return Status::Ok();
}

Status Trainer::RestoreLatest() {
  LOOM_ASSIGN_OR_RETURN(CheckpointFile latest, FindLatestCheckpoint(out_dir_));
  LOOM_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(latest.path));
  if (ckpt.config_text != config_text_)
    return FailedPrecondition(latest.path, " was written by a run with another config; resume with the run's own ",
                              out_dir_, "/config.pbtxt");
  LOOM_RETURN_IF_ERROR(RestoreExecutorState(ckpt, train_.get()));
  step_ = ckpt.position.global_step;
  epoch_ = ckpt.position.epoch;
  batch_in_epoch_ = ckpt.position.batch_in_epoch;
  if (auto it = ckpt.float_values.find("elapsed_s"); it != ckpt.float_values.end()) elapsed_before_ = it->second;
  std::fprintf(opt_.console, "resuming %s from %s (step %lld, epoch %lld, batch %lld)\n", out_dir_.c_str(),
               latest.path.c_str(), static_cast<long long>(step_), static_cast<long long>(epoch_ + 1),
               static_cast<long long>(batch_in_epoch_));
  return Status::Ok();
}

Status Trainer::SaveCheckpoint() {
  LOOM_ASSIGN_OR_RETURN(Checkpoint ckpt, CaptureExecutorState(*train_));
  ckpt.position.global_step = step_;
  ckpt.position.epoch = epoch_;
  ckpt.position.batch_in_epoch = batch_in_epoch_;
  ckpt.seeds["seed"] = c_.seed();
  ckpt.float_values["elapsed_s"] = Elapsed();
  ckpt.config_text = config_text_;
  ckpt.model_fingerprint = fingerprint_;
  return SaveCheckpointToRunDir(out_dir_, ckpt, static_cast<int>(c_.keep_checkpoints())).status();
}

Status Trainer::Evaluate(double* loss, double* accuracy) {
  for (const auto& [name, t] : eval_->state()) LOOM_RETURN_IF_ERROR(eval_->SetState(name, train_->state().at(name)));
  LOOM_RETURN_IF_ERROR(test_loader_->Start(0));
  Batch batch;
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  for (;;) {
    LOOM_ASSIGN_OR_RETURN(bool more, test_loader_->Next(&batch));
    if (!more) break;
    LOOM_ASSIGN_OR_RETURN(auto out, eval_->Run({{"image", batch.input}, {"label", batch.target}}));
    const Tensor& logits = out["logits"];
    const int64_t classes = logits.shape()[1];
    const float* pl = logits.data<float>();
    for (int64_t i = 0; i < batch.valid; ++i) {
      const float* row = pl + i * classes;
      correct += (std::max_element(row, row + classes) - row) == batch.target.data<int64_t>()[i];
    }
    // The loss is the mean over the valid rows (padding has the ignored label).
    loss_sum += out["loss"].ScalarAt(0) * static_cast<double>(batch.valid);
    seen += batch.valid;
  }
  *loss = loss_sum / std::max<int64_t>(1, seen);
  *accuracy = static_cast<double>(correct) / std::max<int64_t>(1, seen);
  return Status::Ok();
}

StatusOr<RunResult> Trainer::Run() {
  metrics::RunLoggerOptions lo;
  lo.resume = opt_.resume;
  lo.tensorboard = c_.tensorboard();
  LOOM_ASSIGN_OR_RETURN(metrics::RunLogger logger, metrics::RunLogger::Create(out_dir_, lo));
  metrics::ProgressOptions po;
  po.total_steps = total_steps_;
  po.first_step = step_;
  po.line_every_steps = c_.log_every_steps();
  metrics::ProgressBar progress(opt_.console, po);
  progress.PrintLine(StrCat("run ", out_dir_, ": model ", c_.model().name(), ", ", data_.train->size(), " training and ",
                            data_.test->size(), " test examples, ", total_steps_, " steps, ",
                            ThreadPool::Default().num_threads(), " threads"));

  const int64_t batch = c_.data().batch_size();
  Tensor lr = Tensor::Zeros({}, dtype_), step_t = Tensor::Zeros({}, dtype_);
  RunResult result;
  result.out_dir = out_dir_;
  double window_loss = 0, last_loss = 0;
  int64_t window_steps = 0;
  auto window_start = Clock::now();
  bool evaluated_at_end = false;
  Batch b;
  auto done = [&] { return step_ >= total_steps_; };

  while (!done() && epoch_ < c_.epochs()) {
    LOOM_RETURN_IF_ERROR(train_loader_->Start(epoch_, batch_in_epoch_));
    for (;;) {
      if (done()) break;
      LOOM_ASSIGN_OR_RETURN(bool more, train_loader_->Next(&b));
      if (!more) break;
      const double rate = schedule_->LearningRate(step_);
      lr.Fill(rate);
      step_t.Fill(static_cast<double>(step_ + 1));
      LOOM_ASSIGN_OR_RETURN(auto out, train_->Run({{"image", b.input}, {"label", b.target}, {"lr", lr}, {"step", step_t}}));
      ++step_;
      ++batch_in_epoch_;
      last_loss = out["loss"].ScalarAt(0);
      if (!std::isfinite(last_loss))
        return FailedPrecondition("the loss became ", last_loss, " at step ", step_, " (epoch ", epoch_ + 1,
                                  "); lower optimizer.lr or set optimizer.clip_grad_norm");
      window_loss += last_loss;
      ++window_steps;
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      const double samples_per_s = secs > 0 ? window_steps * batch / secs : 0;
      progress.Update(step_, last_loss, samples_per_s);
      if (step_ % c_.log_every_steps() == 0) {
        metrics::MetricsRecord r;
        r.epoch = epoch_ + 1;
        r.step = step_;
        r.loss = window_loss / window_steps;
        r.samples_per_s = samples_per_s;
        r.time_s = Elapsed();
        r.extra = {{"lr", rate}, {"grad_norm", out[kGradNormOutput].ScalarAt(0)}};
        LOOM_RETURN_IF_ERROR(logger.Log(r));
        window_loss = 0;
        window_steps = 0;
        window_start = Clock::now();
      }
      if (c_.checkpoint_every_steps() > 0 && step_ % c_.checkpoint_every_steps() == 0)
        LOOM_RETURN_IF_ERROR(SaveCheckpoint());
    }
    const bool epoch_finished = batch_in_epoch_ >= train_loader_->batches_per_epoch();
    if (epoch_finished) {
      ++epoch_;
      batch_in_epoch_ = 0;
    }
    const bool last = done() || epoch_ >= c_.epochs();
    if (epoch_finished || last) LOOM_RETURN_IF_ERROR(SaveCheckpoint());
    if ((epoch_finished && epoch_ % c_.eval_every_epochs() == 0) || last) {
      double loss = 0, accuracy = 0;
      LOOM_RETURN_IF_ERROR(Evaluate(&loss, &accuracy));
      metrics::MetricsRecord r;
      r.epoch = epoch_finished ? epoch_ : epoch_ + 1;
      r.step = step_;
      r.split = metrics::Split::kTest;
      r.loss = loss;
      r.accuracy = accuracy;
      r.time_s = Elapsed();
      LOOM_RETURN_IF_ERROR(logger.Log(r));
      progress.PrintLine(StrCat("epoch ", r.epoch, " step ", step_, ": train loss ", last_loss, ", test loss ", loss,
                                ", test accuracy ", accuracy, " (", metrics::FormatDuration(r.time_s), ")"));
      result.test_loss = loss;
      result.test_accuracy = accuracy;
      evaluated_at_end = last;
    }
  }
  if (!evaluated_at_end) {  // e.g. resumed after the last step: report once more
    LOOM_RETURN_IF_ERROR(Evaluate(&result.test_loss, &result.test_accuracy));
  }
  progress.Finish();
  result.steps = step_;
  result.final_train_loss = last_loss;
  result.seconds = Elapsed();
  metrics::SummaryRow row{"0", {{"steps", static_cast<double>(step_)},
                                {"train_loss", last_loss},
                                {"test_loss", result.test_loss},
                                {"test_accuracy", result.test_accuracy},
                                {"time_s", result.seconds}}};
  LOOM_ASSIGN_OR_RETURN(std::string table, metrics::FormatSummaryTable({row}));
  std::fprintf(opt_.console, "%s", table.c_str());
  std::fprintf(opt_.console, "run folder: %s\n", out_dir_.c_str());
  return result;
}

}  // namespace

StatusOr<RunResult> RunTraining(const RunOptions& options) {
  std::string out_dir = options.config.out_dir().empty() ? DefaultOutDir(options.config_name) : options.config.out_dir();
  const std::string config_path = out_dir + "/config.pbtxt";
  RunOptions run_options = options;
  run_options.config.set_out_dir(out_dir);
  const std::string config_text = TrainConfigToText(run_options.config);
  if (options.resume) {
    // The run's own config decides; flags that would change it are refused.
    if (!fs::exists(config_path)) return NotFound(out_dir, " holds no run to resume (no config.pbtxt)");
    LOOM_ASSIGN_OR_RETURN(proto::TrainConfig saved, LoadTrainConfig(config_path));
    if (TrainConfigToText(saved) != config_text)
      return FailedPrecondition("the config differs from the run's own ", config_path,
                                " (resume without --config, or with the same config and flags)");
  } else {
    std::error_code ec;
    if (fs::exists(out_dir) && !fs::is_empty(out_dir, ec))
      return FailedPrecondition("the output folder ", out_dir, " is not empty: resume it with --resume ", out_dir,
                                " or choose another --out");
  }
  // Everything that can fail on bad input (data files, model, checkpoint)
  // happens before the run folder is made, so a failed start leaves nothing.
  Trainer trainer(run_options, out_dir);
  LOOM_RETURN_IF_ERROR(trainer.Prepare());
  if (!options.resume) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) return Internal("cannot create ", out_dir, ": ", ec.message());
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(config_path, config_text));
  }
  return trainer.Run();
}

}  // namespace loom::train
