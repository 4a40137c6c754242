#include "train/training_loop.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <optional>

#include "core/file_util.h"
#include "core/thread_pool.h"
#include "graph/compile.h"
#include "graph/model.h"
#include "models/zoo.h"
#include "graph/strategy.h"
#include "graph/task_graph.h"
#include "runtime/task_runtime.h"
#include "search/baselines.h"
#include "search/search.h"
#include "simulator/cost_model.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/data_spec.h"
#include "train/checkpoint/executor_state.h"
#include "train/checkpoint/run_dir.h"
#include "train/metrics/summary_table.h"
#include "train/stop_signals.h"

namespace loom::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kRetiredPrefix[] = "retired/";

std::string ReplicaKey(size_t r) { return "replica_" + std::to_string(r); }

}  // namespace

StatusOr<bool> CheckRunFolder(const proto::TrainConfig& config, bool resume) {
  const std::string& out_dir = config.out_dir();
  const std::string config_path = (fs::path(out_dir) / "config.pbtxt").string();
  if (resume) {
    if (!fs::exists(config_path)) return NotFound(out_dir, " holds no run to resume (no config.pbtxt)");
    LOOM_ASSIGN_OR_RETURN(proto::TrainConfig saved, LoadTrainConfig(config_path));
    if (std::string diff = RunDifferences(saved, config); !diff.empty())
      return FailedPrecondition("the config differs from the run's own ", config_path, " in ", diff,
                                " (a resume may change only epochs, max_steps, threads, device, devices and strategy)");
    return TrainConfigToText(saved) != TrainConfigToText(config);  // extended or moved
  }
  std::error_code ec;
  if (fs::exists(out_dir) && !fs::is_empty(out_dir, ec))
    return FailedPrecondition("the output folder ", out_dir, " is not empty: resume it with --resume ", out_dir,
                              " or choose another --out");
  return true;
}

TrainingLoop::TrainingLoop(LoopOptions options) : opt_(std::move(options)), c_(opt_.config) {
  console_ = opt_.console;
  if (console_ == nullptr) console_ = null_console_ = std::fopen("/dev/null", "w");
}

TrainingLoop::~TrainingLoop() {
  progress_.reset();
  if (null_console_ != nullptr) std::fclose(null_console_);
}

StatusOr<std::unique_ptr<TrainingLoop>> TrainingLoop::Open(LoopOptions options) {
  if (options.config.out_dir().empty()) return InvalidArgument("the run needs an output folder (out_dir)");
  if (!options.network) {  // with a host network, model.name only names the run
    LOOM_ASSIGN_OR_RETURN(const models::ZooEntry* entry, models::FindModel(options.config.model().name()));
    if (entry->gan)
      return Unimplemented("model ", entry->name, " is a GAN: it trains with `loom train` (train::RunTraining); ",
                           "the step-by-step Trainer drives supervised models");
  }
  // Under processes rank 0 checks and writes the folder; the others only
  // read it (a resume), and may find it already made by rank 0.
  const bool writer = options.processes == nullptr || options.processes->rank() == 0;
  bool rewrite_config = false;
  if (writer || options.resume) {
    LOOM_ASSIGN_OR_RETURN(rewrite_config, CheckRunFolder(options.config, options.resume));
  }
  std::unique_ptr<TrainingLoop> loop(new TrainingLoop(std::move(options)));
  if (loop->console_ == nullptr) return Internal("cannot open /dev/null for a silent run");
  LOOM_RETURN_IF_ERROR(loop->Prepare());
  LOOM_RETURN_IF_ERROR(loop->OpenRecords(rewrite_config));
  return loop;
}

Status TrainingLoop::Prepare() {
  config_text_ = TrainConfigToText(c_);
  if (c_.threads() > 0) ThreadPool::SetDefaultThreads(static_cast<int>(c_.threads()));
  LOOM_RETURN_IF_ERROR(ThreadPool::StartDefault());
  fused_ = IsFused(c_);
  if (fused_) {
    LOOM_ASSIGN_OR_RETURN(std::vector<ReplicaSpec> specs, ExpandReplicas(c_));
    for (ReplicaSpec& spec : specs) replicas_.push_back(Replica{std::move(spec)});
  } else {
    replicas_.push_back(Replica{ReplicaSpec{c_, "0"}});
  }
  for (size_t r = 0; r < replicas_.size(); ++r) alive_.push_back(static_cast<int64_t>(r));
  if (c_.data().augment().crop_size() > 0)
    return InvalidArgument("data.augment.crop_size is for GAN training (padding images to the generator's size); ",
                           "model ", c_.model().name(), " is evaluated on the images as they are");
  LOOM_ASSIGN_OR_RETURN(data_, LoadDatasets(c_.data()));
  LOOM_ASSIGN_OR_RETURN(train_loader_, DataLoader::Create(data_.train, LoaderOptions(c_, data_, true)));
  LOOM_ASSIGN_OR_RETURN(test_loader_, DataLoader::Create(data_.test, LoaderOptions(c_, data_, false)));
  if (per_replica_data()) {
    for (Replica& r : replicas_) {
      LOOM_ASSIGN_OR_RETURN(r.loader, DataLoader::Create(data_.train, LoaderOptions(r.spec.config, data_, true)));
    }
  }

  // The same model twice: a training graph at the training batch size and an
  // evaluation graph (BatchNorm and Dropout in eval mode) at the eval batch.
  data_spec_ = DataSpecOf(*data_.train);
  Model train_model;
  LOOM_RETURN_IF_ERROR(BuildConfigModel(train_model, c_, data_spec_, c_.data().batch_size(), opt_.network));
  Model eval_model;
  eval_model.set_training(false);
  LOOM_RETURN_IF_ERROR(BuildConfigModel(eval_model, c_, data_spec_, c_.data().eval_batch_size(), opt_.network));
  train_forward_ = train_model.graph();
  eval_forward_ = eval_model.graph();
  LOOM_RETURN_IF_ERROR(BuildArray(/*initialize=*/true));

  const int64_t per_epoch = train_loader_->batches_per_epoch();
  total_steps_ = per_epoch * c_.epochs();
  if (c_.max_steps() > 0) total_steps_ = std::min(total_steps_, c_.max_steps());
  for (Replica& r : replicas_) {
    auto schedule = BuildSchedule(r.spec.config, per_epoch, total_steps_);
    if (!schedule.ok()) return fused() ? schedule.status().WithContext("replica " + r.spec.label) : schedule.status();
    r.schedule = std::move(*schedule);
  }
  if (!opt_.init_from.empty()) LOOM_RETURN_IF_ERROR(InitFrom(opt_.init_from));
  if (opt_.resume) LOOM_RETURN_IF_ERROR(RestoreLatest());
  return Status::Ok();
}

Status TrainingLoop::OpenRecords(bool rewrite_config) {
  const std::string& out_dir = c_.out_dir();
  if (!writes_records()) {  // a rank > 0: rank 0 keeps the records
    progress_ = std::make_unique<metrics::ProgressBar>(console_, metrics::ProgressOptions{});
    window_start_ = Clock::now();
    return Status::Ok();
  }
  if (!opt_.resume) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) return Internal("cannot create ", out_dir, ": ", ec.message());
  }
  // A later plain --resume continues with the length and folder given now.
  if (rewrite_config)
    LOOM_RETURN_IF_ERROR(WriteFileAtomically((fs::path(out_dir) / "config.pbtxt").string(), config_text_));
  if (!strategy_text_.empty())
    LOOM_RETURN_IF_ERROR(WriteFileAtomically((fs::path(out_dir) / "strategy.pbtxt").string(), strategy_text_));
  metrics::RunLoggerOptions lo;
  if (opt_.resume) lo.resume_step = step_;
  lo.tensorboard = c_.tensorboard();
  lo.replicas = static_cast<int64_t>(replicas_.size());
  LOOM_ASSIGN_OR_RETURN(metrics::RunLogger logger, metrics::RunLogger::Create(out_dir, lo));
  logger_ = std::make_unique<metrics::RunLogger>(std::move(logger));
  if (!logger_->resume_note().empty()) std::fprintf(console_, "%s\n", logger_->resume_note().c_str());
  if (opt_.resume) LOOM_RETURN_IF_ERROR(PruneCheckpoints(out_dir, static_cast<int>(c_.keep_checkpoints())));
  metrics::ProgressOptions po;
  po.total_steps = total_steps_;
  po.first_step = step_;
  po.line_every_steps = c_.log_every_steps();
  progress_ = std::make_unique<metrics::ProgressBar>(console_, po);
  progress_->PrintLine(StrCat("run ", out_dir, ": model ", c_.model().name(),
                              fused() ? StrCat(", ", replicas_.size(), " fused replicas") : std::string(), ", ",
                              data_.train->size(), " training and ", data_.test->size(), " test examples, ",
                              total_steps_, " steps, ", ThreadPool::Default().num_threads(), " threads"));
  if (fused())
    for (const Replica& r : replicas_) progress_->PrintLine(StrCat("  replica ", r.spec.label));
  window_start_ = Clock::now();
  return Status::Ok();
}

double TrainingLoop::Elapsed() const {
  return elapsed_before_ + std::chrono::duration<double>(Clock::now() - start_).count();
}

bool TrainingLoop::done() const { return step_ >= total_steps_ || alive_.empty() || epoch_ >= c_.epochs(); }

Status TrainingLoop::InitFrom(const std::string& path) {
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
      LOOM_ASSIGN_OR_RETURN(value, Tensor::Stack(std::vector<Tensor>(alive_.size(), value)));
    }
    LOOM_RETURN_IF_ERROR(train_->SetState(n.name, value));
  }
  return Status::Ok();
}

StatusOr<Strategy> TrainingLoop::AutoStrategy(const Graph& step, const Graph& forward, int64_t devices) {
  const std::string saved = (fs::path(c_.out_dir()) / "strategy.pbtxt").string();
  // The run's own strategy as long as it applies (a resumed run trains as
  // it did; an array re-fused with fewer replicas may need another).
  std::string own = strategy_text_;
  if (own.empty() && opt_.resume && fs::exists(saved)) {
    std::ifstream in(saved);
    own.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  LOOM_ASSIGN_OR_RETURN(std::string text, AutoStrategyText(step, forward, devices, own, saved, opt_, c_.seed(), ""));
  LOOM_ASSIGN_OR_RETURN(Strategy strategy, Strategy::Parse(text, saved));
  const bool changed = text != strategy_text_;
  strategy_text_ = std::move(text);
  // A search after the run folder exists (the array re-fused) replaces the file.
  if (changed && logger_ && writes_records()) LOOM_RETURN_IF_ERROR(WriteFileAtomically(saved, strategy_text_));
  return strategy;
}

StatusOr<std::string> AutoStrategyText(const Graph& step, const Graph& forward, int64_t devices,
                                       const std::string& kept, const std::string& kept_name, const LoopOptions& opt,
                                       uint64_t seed, const std::string& label) {
  const std::string what = label.empty() ? std::string("strategy auto") : StrCat("strategy auto (", label, ")");
  auto decide = [&]() -> StatusOr<std::string> {
    if (!kept.empty()) {
      StatusOr<Strategy> own = Strategy::Parse(kept, kept_name);
      if (own.ok() && own->devices() == devices && LowerToTaskGraph(step, *own, forward).ok()) return kept;
    }
    if (!opt.search_machine)
      return FailedPrecondition("strategy \"auto\" needs a machine model to search on (LoopOptions::search_machine; "
                                "loom train probes this machine or reads --machine)");
    LOOM_ASSIGN_OR_RETURN(const Machine machine, opt.search_machine(devices));
    const AnalyticalCostModel cost(machine);
    SearchOptions so;
    so.proposals = opt.search_proposals;
    so.seed = seed;
    LOOM_ASSIGN_OR_RETURN(const SearchResult found, SearchStrategy(forward, step, machine, cost, devices, {}, so));
    double dp = 0;
    for (const Candidate& start : found.initial)
      if (start.name == "dp") dp = start.cost.seconds;
    if (opt.console) {
      std::fprintf(opt.console,
                   "%s: %lld proposals in %.1f s on %s: predicted step %.4g ms, data parallel %.4g ms (%.2fx)\n",
                   what.c_str(), static_cast<long long>(found.proposals), found.seconds, machine.name().c_str(),
                   found.best.cost.seconds * 1e3, dp * 1e3, dp / found.best.cost.seconds);
      if (!found.kept.empty()) std::fprintf(opt.console, "%s: kept %s\n", what.c_str(), found.kept.c_str());
    }
    return StrCat("# ", what, ": found by the search on ", machine.name(), ", predicted step ",
                  found.best.cost.seconds * 1e3, " ms (data parallel ", dp * 1e3, " ms).\n",
                  StrategyToText(found.best.strategy));
  };
  // Rank 0 decides; every rank trains with its answer.
  std::string text;
  if (!opt.processes || opt.processes->rank() == 0) {
    LOOM_ASSIGN_OR_RETURN(text, decide());
  }
  if (opt.processes) {
    Tensor size = Tensor::Zeros({1}, DType::kI64);
    size.data<int64_t>()[0] = static_cast<int64_t>(text.size());
    LOOM_RETURN_IF_ERROR(opt.processes->Broadcast(size, 0));
    Tensor chars = Tensor::Zeros({size.data<int64_t>()[0]}, DType::kI64);
    for (size_t i = 0; i < text.size(); ++i) chars.data<int64_t>()[i] = static_cast<unsigned char>(text[i]);
    LOOM_RETURN_IF_ERROR(opt.processes->Broadcast(chars, 0));
    text.resize(static_cast<size_t>(chars.numel()));
    for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(chars.data<int64_t>()[i]);
  }
  return text;
}

// The step on `devices` CPU devices under the config's strategy (a file, a
// standard kind named, or auto; dp when unset), resolved on the step's
// forward graph; the run's threads are shared out among the devices.
StatusOr<std::unique_ptr<StepRunner>> TrainingLoop::CreateTaskRuntime(const Graph& step, const Graph& forward,
                                                                      const std::vector<Device>& devices) {
  const int64_t count = static_cast<int64_t>(devices.size());
  LOOM_RETURN_IF_ERROR(CheckDevicesPerProcess(count, opt_.processes));
  const std::string& name = c_.strategy().empty() ? std::string("dp") : c_.strategy();
  StatusOr<Strategy> chosen = name == "auto" ? AutoStrategy(step, forward, count)
                                             : LoadOrMakeStrategy(name, forward, count, "field strategy");
  LOOM_ASSIGN_OR_RETURN(const Strategy strategy, std::move(chosen));
  return CreateStepTaskRuntime(step, forward, strategy, devices, opt_.processes, c_.seed(), !opt_.trace_path.empty());
}

Status CheckDevicesPerProcess(int64_t devices, const Communicator* processes) {
  if (processes && devices % processes->size() != 0)
    return InvalidArgument("devices: cpu:", devices, " under ", processes->size(),
                           " MPI processes: each process runs as many devices (a multiple of ", processes->size(), ")");
  return Status::Ok();
}

StatusOr<std::unique_ptr<StepRunner>> CreateStepTaskRuntime(const Graph& step, const Graph& forward,
                                                            const Strategy& strategy, const std::vector<Device>& devices,
                                                            Communicator* processes, uint64_t seed, bool trace) {
  // The devices run the step as an executor of their kind runs it (with
  // ReLUs folded into BatchNorms: runtime/fold_activations.h).
  ExecutorOptions kind;
  kind.device = devices.front();
  LOOM_ASSIGN_OR_RETURN(TaskGraph tasks, LowerToTaskGraph(ExecutedGraph(step, kind), strategy, forward));
  TaskRuntimeOptions o;
  o.devices = devices;
  o.communicator = processes;
  o.seed = seed;
  o.trace = trace;
  // Processes share the machine's cores among themselves.
  const int count = static_cast<int>(devices.size());
  const int local_devices = processes ? count / processes->size() : count;
  o.threads_per_device = std::max<int>(1, ThreadPool::Default().num_threads() / local_devices);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<TaskRuntime> runtime, TaskRuntime::Create(std::move(tasks), o));
  return std::unique_ptr<StepRunner>(std::move(runtime));
}

Status TrainingLoop::BuildArray(bool initialize) {
  CompileOptions step_options;
  step_options.name = "train";
  step_options.dump_dir = opt_.dump_graphs_dir;
  step_options.isolate_divergence = !c_.fusion().has_isolate_divergence() || c_.fusion().isolate_divergence();
  step_options.precision = RunPrecision(c_);
  step_options.loss_scaling = RunLossScaling(c_);
  for (int64_t r : alive_) {
    step_options.optimizers.push_back(StepOptimizer{replicas_[r].spec.config.optimizer()});
    step_options.optimizers.back().output_grad_norm = true;
  }
  CompileOptions eval_options;
  eval_options.name = "eval";
  eval_options.dump_dir = opt_.dump_graphs_dir;
  eval_options.precision = step_options.precision;  // evaluated as trained
  if (fused()) {
    FusionOptions fo;
    fo.replicas = static_cast<int>(alive_.size());
    fo.unfused_layers.assign(c_.fusion().unfused_layers().begin(), c_.fusion().unfused_layers().end());
    for (int64_t r : alive_) fo.seeds.push_back(replicas_[r].spec.config.seed());
    eval_options.fusion = fo;  // evaluation data is shared
    if (per_replica_data()) fo.per_replica_inputs = {"input", "target"};
    step_options.fusion = fo;
  }
  LOOM_ASSIGN_OR_RETURN(Graph train_graph, Compile(train_forward_, Program::kTrainingStep, step_options));
  LOOM_ASSIGN_OR_RETURN(Graph eval_graph, Compile(eval_forward_, Program::kForward, eval_options));
  ExecutorOptions eo;
  eo.seed = c_.seed();
  LOOM_ASSIGN_OR_RETURN(eo.device, RunDevice(c_));
  std::unique_ptr<StepRunner> train;
  LOOM_ASSIGN_OR_RETURN(const std::vector<Device> devices, RunDevices(c_));
  if (!devices.empty()) {
    LOOM_ASSIGN_OR_RETURN(Graph forward, Compile(train_forward_, Program::kForward, step_options));
    LOOM_ASSIGN_OR_RETURN(train, CreateTaskRuntime(train_graph, forward, devices));
  } else {
    LOOM_ASSIGN_OR_RETURN(train, Executor::Create(train_graph, eo));
  }
  LOOM_ASSIGN_OR_RETURN(eval_, Executor::Create(eval_graph, eo));
  if (initialize) {
    LOOM_RETURN_IF_ERROR(train->InitializeState(c_.seed()));
  } else {
    // Rows of the replicas that stay, in their new order.
    for (const std::string& name : train->StateNames()) {
      LOOM_ASSIGN_OR_RETURN(Tensor old, train_->GetState(name));
      LOOM_ASSIGN_OR_RETURN(Tensor kept, old.GatherRows(kept_rows_));
      LOOM_RETURN_IF_ERROR(train->SetState(name, kept));
    }
    train->SetStep(train_->step());
  }
  train_ = std::move(train);
  fingerprint_ = ModelFingerprint(train_graph);
  return Status::Ok();
}

StatusOr<bool> TrainingLoop::NextBatch(std::map<std::string, Tensor>* feeds) {
  if (!loaders_started_) {
    if (per_replica_data()) {
      for (int64_t r : alive_) LOOM_RETURN_IF_ERROR(replicas_[r].loader->Start(epoch_, batch_in_epoch_));
    } else {
      LOOM_RETURN_IF_ERROR(train_loader_->Start(epoch_, batch_in_epoch_));
    }
    loaders_started_ = true;
  }
  Batch b;
  if (!per_replica_data()) {
    LOOM_ASSIGN_OR_RETURN(bool more, train_loader_->Next(&b));
    (*feeds)["input"] = b.input;
    (*feeds)["target"] = b.target;
    return more;
  }
  std::vector<Tensor> inputs, targets;
  for (int64_t r : alive_) {
    LOOM_ASSIGN_OR_RETURN(bool more, replicas_[r].loader->Next(&b));
    if (!more) return false;  // the loaders have the same number of batches
    inputs.push_back(b.input);
    targets.push_back(b.target);
  }
  LOOM_ASSIGN_OR_RETURN((*feeds)["input"], Tensor::Stack(inputs));
  LOOM_ASSIGN_OR_RETURN((*feeds)["target"], Tensor::Stack(targets));
  return true;
}

Status TrainingLoop::Log(const metrics::MetricsRecord& record) {
  if (logger_) LOOM_RETURN_IF_ERROR(logger_->Log(record));
  if (opt_.on_metrics) opt_.on_metrics(record);
  return Status::Ok();
}

StatusOr<bool> TrainingLoop::TrainBatch() {
  std::map<std::string, Tensor> feeds;
  LOOM_ASSIGN_OR_RETURN(bool more, NextBatch(&feeds));
  if (!more) return false;
  const int64_t n = array_size();
  Tensor lr = Tensor::Zeros(fused() ? Shape({n}) : Shape{}, dtype_);
  for (int64_t i = 0; i < n; ++i) {
    Replica& r = replicas_[alive_[i]];
    r.lr = r.schedule->LearningRate(step_);
    lr.data<float>()[i] = static_cast<float>(r.lr);
  }
  Tensor step_t = Tensor::Zeros({}, dtype_);
  step_t.Fill(static_cast<double>(step_ + 1));
  feeds[kLearningRateInput] = lr;
  feeds[kStepInput] = step_t;
  if (fused()) {
    Tensor mask = Tensor::Zeros({n}, dtype_);
    mask.Fill(1);
    feeds[kReplicaMaskInput] = mask;
  }
  LOOM_ASSIGN_OR_RETURN(auto out, train_->Run(feeds));
  ++step_;
  ++batch_in_epoch_;
  const std::vector<double> losses = out["loss"].ToDoubleVector();
  const std::vector<double> norms = out[kGradNormOutput].ToDoubleVector();
  // fp16: a step whose scaled gradients overflowed was skipped (its
  // replica's scale backed off); that is no divergence unless the loss
  // itself is not finite or the scale has collapsed.
  const bool loss_scaled = out.count(kGradsFiniteOutput) > 0;
  std::vector<double> grads_finite(static_cast<size_t>(n), 1), scales(static_cast<size_t>(n), 0);
  if (loss_scaled) {
    grads_finite = out[kGradsFiniteOutput].ToDoubleVector();
    scales = out[kLossScaleOutput].ToDoubleVector();
  }
  for (int64_t i = 0; i < n; ++i) {
    Replica& r = replicas_[alive_[i]];
    r.loss_scale = scales[i];
    if (grads_finite[i] == 0) ++r.window_skipped;
  }
  if (!fused()) {
    last_loss_ = losses[0];
    replicas_[0].train_loss = last_loss_;
    replicas_[0].grad_norm = norms[0];
    if (!std::isfinite(last_loss_))
      return FailedPrecondition("the loss became ", last_loss_, " at step ", step_, " (epoch ", epoch_ + 1,
                                "); lower optimizer.lr or set optimizer.clip_grad_norm");
    if (loss_scaled && scales[0] < kMinLossScale)
      return FailedPrecondition("the fp16 gradients overflowed at every step until the loss scale fell to ", scales[0],
                                " at step ", step_, " (epoch ", epoch_ + 1,
                                "); lower optimizer.lr, set optimizer.clip_grad_norm or use precision: bf16");
  } else {
    // Replicas the step did not update diverged, unless they only skipped
    // an overflowed fp16 step: the diverged leave the array.
    const std::vector<double> active = out[kActiveOutput].ToDoubleVector();
    std::vector<int64_t> diverged;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      Replica& r = replicas_[alive_[i]];
      r.train_loss = losses[i];
      r.grad_norm = norms[i];
      const bool overflow_skip = grads_finite[i] == 0 && std::isfinite(losses[i]) && r.loss_scale >= kMinLossScale;
      if (active[i] == 0 && !overflow_skip) {
        diverged.push_back(i);
        continue;
      }
      r.window_loss += losses[i];
      sum += losses[i];
    }
    LOOM_RETURN_IF_ERROR(Retire(diverged, "diverged (loss or gradient not finite)"));
    if (alive_.empty())
      return FailedPrecondition("every replica diverged by step ", step_, " (epoch ", epoch_ + 1,
                                "); lower the learning rates or set optimizer.clip_grad_norm");
    last_loss_ = sum / static_cast<double>(n - static_cast<int64_t>(diverged.size()));
  }
  window_loss_ += last_loss_;
  ++window_steps_;
  ++timed_steps_;
  const double secs = std::chrono::duration<double>(Clock::now() - window_start_).count();
  const double samples_per_s = secs > 0 ? timed_steps_ * c_.data().batch_size() * n / secs : 0;
  progress_->Update(step_, last_loss_, samples_per_s);
  if (step_ % c_.log_every_steps() == 0) {
    metrics::MetricsRecord r;
    r.epoch = epoch_ + 1;
    r.step = step_;
    r.samples_per_s = samples_per_s;
    r.time_s = Elapsed();
    // fp16: the scale the next step uses, and the steps of this window
    // that overflowed and were skipped.
    auto add_loss_scale = [&](const Replica& s) {
      if (!loss_scaled) return;
      r.extra.push_back({"loss_scale", s.loss_scale});
      r.extra.push_back({"skipped_steps", static_cast<double>(s.window_skipped)});
    };
    if (!fused()) {
      r.loss = window_loss_ / window_steps_;
      r.extra = {{"lr", replicas_[0].schedule->LearningRate(step_ - 1)}, {"grad_norm", replicas_[0].grad_norm}};
      add_loss_scale(replicas_[0]);
      LOOM_RETURN_IF_ERROR(Log(r));
    } else {
      r.samples_per_s = samples_per_s / static_cast<double>(alive_.size());
      for (int64_t rep : alive_) {
        const Replica& s = replicas_[rep];
        r.replica = rep;
        r.loss = s.window_loss / window_steps_;
        r.extra = {{"lr", s.lr}, {"grad_norm", s.grad_norm}};
        add_loss_scale(s);
        LOOM_RETURN_IF_ERROR(Log(r));
      }
    }
    for (Replica& s : replicas_) {
      s.window_loss = 0;
      s.window_skipped = 0;
    }
    window_loss_ = 0;
    window_steps_ = 0;
    timed_steps_ = 0;
    window_start_ = Clock::now();
  }
  return true;
}

Status TrainingLoop::FinishBatch() {
  // A step that ends an epoch or the run is saved once, in EndEpoch, after
  // its evaluation: a checkpoint at step S follows every record of S.
  const bool ends_epoch_or_run = batch_in_epoch_ >= train_loader_->batches_per_epoch() || done();
  if (ends_epoch_or_run) return EndEpoch();
  const bool periodic = c_.checkpoint_every_steps() > 0 && step_ % c_.checkpoint_every_steps() == 0;
  if (periodic) LOOM_RETURN_IF_ERROR(SaveCheckpoint());
  return Status::Ok();
}

Status TrainingLoop::EndEpoch() {
  loaders_started_ = false;
  const bool epoch_finished = batch_in_epoch_ >= train_loader_->batches_per_epoch();
  if (epoch_finished) {
    ++epoch_;
    batch_in_epoch_ = 0;
  }
  const bool last = done();
  if ((epoch_finished && epoch_ % c_.eval_every_epochs() == 0) || last) {
    std::vector<double> loss, accuracy;
    LOOM_RETURN_IF_ERROR(EvaluateArray(&loss, &accuracy));
    metrics::MetricsRecord r;
    r.epoch = epoch_finished ? epoch_ : epoch_ + 1;
    r.step = step_;
    r.split = metrics::Split::kTest;
    r.time_s = Elapsed();
    for (int64_t i = 0; i < array_size(); ++i) {
      r.replica = alive_[i];
      r.loss = loss[i];
      r.accuracy = accuracy[i];
      if (scores_tokens()) r.extra = {{"perplexity", std::exp(loss[i])}};
      LOOM_RETURN_IF_ERROR(Log(r));
      replicas_[alive_[i]].test_loss = loss[i];
      replicas_[alive_[i]].test_accuracy = accuracy[i];
    }
    const size_t best = std::max_element(accuracy.begin(), accuracy.end()) - accuracy.begin();
    progress_->PrintLine(StrCat("epoch ", r.epoch, " step ", step_, ": train loss ", last_loss_,
                                fused() ? StrCat(" (mean of ", array_size(), ")") : std::string(), ", test loss ",
                                loss[best],
                                scores_tokens() ? StrCat(" (perplexity ", std::exp(loss[best]), ")") : std::string(),
                                ", test accuracy ", accuracy[best],
                                fused() ? StrCat(" (best: ", replicas_[alive_[best]].spec.label, ")") : std::string(),
                                " (", metrics::FormatDuration(r.time_s), ")"));
    test_loss_ = loss[best];
    test_accuracy_ = accuracy[best];
    evaluated_at_end_ = last;
    if (epoch_finished && !last) LOOM_RETURN_IF_ERROR(ApplyEarlyStop());
  }
  if (epoch_finished || last) LOOM_RETURN_IF_ERROR(SaveCheckpoint());
  return Status::Ok();
}

StepReport TrainingLoop::Report(bool epoch_ended) const {
  StepReport report;
  report.step = step_;
  report.loss = last_loss_;
  report.epoch_ended = epoch_ended;
  report.done = done();
  return report;
}

StatusOr<StepReport> TrainingLoop::Step() {
  if (cancelled()) return Cancelled("the run was cancelled at step ", step_);
  if (done()) return FailedPrecondition("the run is done: ", step_, " of ", total_steps_, " steps");
  const int64_t epoch_before = epoch_;
  for (;;) {
    LOOM_ASSIGN_OR_RETURN(bool trained, TrainBatch());
    if (trained) break;
    // A run resumed at an epoch's end: finish that epoch, then train on.
    LOOM_RETURN_IF_ERROR(EndEpoch());
    if (done()) return Report(true);
  }
  LOOM_RETURN_IF_ERROR(FinishBatch());
  return Report(epoch_ != epoch_before);
}

StatusOr<StepReport> TrainingLoop::RunEpoch() {
  for (;;) {
    LOOM_ASSIGN_OR_RETURN(StepReport report, Step());
    if (report.epoch_ended || report.done) return report;
  }
}

StatusOr<int> TrainingLoop::StopRequest() {
  int sig = opt_.stop_on_signals ? StopSignals::Received() : 0;
  if (opt_.processes == nullptr) return sig;
  // The largest over the ranks: a stop signal's number (SIGINT 2, SIGTERM
  // 15) over kCancel (a cancel request) over 0 (go on).
  constexpr int32_t kCancel = 1;
  Tensor flag = Tensor::Zeros({}, DType::kI32);
  flag.data<int32_t>()[0] = sig != 0 ? sig : (cancelled() ? kCancel : 0);
  LOOM_RETURN_IF_ERROR(opt_.processes->AllReduce(flag, ReduceOp::kMax));
  sig = flag.data<int32_t>()[0];
  if (sig == kCancel) {
    cancel_requested_.store(true);
    return 0;
  }
  return sig;
}

StatusOr<TrainerResult> TrainingLoop::Run() {
  std::optional<StopSignals> stop_signals;
  if (opt_.stop_on_signals) stop_signals.emplace();
  while (!done()) {
    LOOM_ASSIGN_OR_RETURN(bool trained, TrainBatch());
    if (!trained) {
      LOOM_RETURN_IF_ERROR(EndEpoch());
      continue;
    }
    LOOM_ASSIGN_OR_RETURN(const int sig, StopRequest());
    if (sig != 0 || cancelled()) {
      LOOM_RETURN_IF_ERROR(SaveCheckpoint());
      progress_->Finish();
      std::fprintf(console_, "stopped by %s at step %lld; checkpoint saved: resume with loom train --resume %s\n",
                   sig != 0 ? StopSignals::Name(sig) : "a cancel request", static_cast<long long>(step_),
                   out_dir().c_str());
      TrainerResult result = Result();
      result.cancelled = true;
      result.stop_signal = sig;
      return result;
    }
    LOOM_RETURN_IF_ERROR(FinishBatch());
  }
  if (!evaluated_at_end_ && !alive_.empty()) {  // e.g. resumed after the last step: report once more
    std::vector<double> loss, accuracy;
    LOOM_RETURN_IF_ERROR(EvaluateArray(&loss, &accuracy));
    const size_t best = std::max_element(accuracy.begin(), accuracy.end()) - accuracy.begin();
    test_loss_ = loss[best];
    test_accuracy_ = accuracy[best];
    for (int64_t i = 0; i < array_size(); ++i) {
      replicas_[alive_[i]].test_loss = loss[i];
      replicas_[alive_[i]].test_accuracy = accuracy[i];
    }
  }
  progress_->Finish();
  if (!opt_.trace_path.empty() && writes_records()) {
    const auto* runtime = dynamic_cast<const TaskRuntime*>(train_.get());
    if (!runtime) return InvalidArgument("--trace FILE needs devices (--devices cpu:N): it traces the task runtime");
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(opt_.trace_path, runtime->TraceJson()));
    std::fprintf(console_, "trace of step %lld: %s\n", static_cast<long long>(runtime->step()),
                 opt_.trace_path.c_str());
  }
  TrainerResult result = Result();
  std::vector<metrics::SummaryRow> rows;
  metrics::SummaryOptions so;
  if (!fused()) {
    rows.push_back({"0", {{"steps", static_cast<double>(step_)},
                          {"train_loss", last_loss_},
                          {"test_loss", result.test_loss},
                          {"test_accuracy", result.test_accuracy},
                          {"time_s", result.seconds}}});
    if (scores_tokens()) rows.back().values.push_back({"test_perplexity", std::exp(result.test_loss)});
  } else {
    so.rank_by = "test_accuracy";
    for (const Replica& s : replicas_) {
      const double steps = s.status == "running" ? static_cast<double>(step_) : static_cast<double>(s.since_step);
      rows.push_back({s.spec.label, {{"steps", steps},
                                     {"train_loss", s.train_loss},
                                     {"test_loss", s.test_loss},
                                     {"test_accuracy", s.test_accuracy}}});
      if (scores_tokens()) rows.back().values.push_back({"test_perplexity", std::exp(s.test_loss)});
    }
  }
  LOOM_ASSIGN_OR_RETURN(std::string table, metrics::FormatSummaryTable(rows, so));
  std::fprintf(console_, "%s", table.c_str());
  for (const Replica& s : replicas_)
    if (s.status != "running")
      std::fprintf(console_, "replica %s: %s at step %lld\n", s.spec.label.c_str(), s.status.c_str(),
                   static_cast<long long>(s.since_step));
  std::fprintf(console_, "run folder: %s\n", out_dir().c_str());
  return result;
}

TrainerResult TrainingLoop::Result() const {
  TrainerResult result;
  result.out_dir = out_dir();
  result.steps = step_;
  result.final_train_loss = last_loss_;
  result.test_loss = test_loss_;
  result.test_accuracy = test_accuracy_;
  result.seconds = Elapsed();
  if (fused())
    for (const Replica& s : replicas_)
      result.replicas.push_back({s.spec.label, s.status, s.train_loss, s.test_loss, s.test_accuracy});
  return result;
}

StatusOr<Evaluation> TrainingLoop::Evaluate() {
  if (alive_.empty()) return FailedPrecondition("no replica is training any more: nothing to evaluate");
  std::vector<double> loss, accuracy;
  LOOM_RETURN_IF_ERROR(EvaluateArray(&loss, &accuracy));
  Evaluation e;
  const size_t best = std::max_element(accuracy.begin(), accuracy.end()) - accuracy.begin();
  e.loss = loss[best];
  e.accuracy = accuracy[best];
  for (int64_t i = 0; i < array_size(); ++i) {
    const Replica& r = replicas_[alive_[i]];
    e.replicas.push_back({r.spec.label, r.status, r.train_loss, loss[i], accuracy[i]});
  }
  return e;
}

Status TrainingLoop::Retire(const std::vector<int64_t>& positions, const std::string& status) {
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
    for (const std::string& name : train_->StateNames()) {
      LOOM_ASSIGN_OR_RETURN(Tensor t, train_->GetState(name));
      LOOM_ASSIGN_OR_RETURN(Tensor row, t.Row(static_cast<int64_t>(i)));
      LOOM_ASSIGN_OR_RETURN(retired_[kRetiredPrefix + std::to_string(r) + "/" + name], row.To(Device::Cpu()));
    }
    replicas_[r].status = status;
    replicas_[r].since_step = step_;
    progress_->PrintLine(StrCat("replica ", replicas_[r].spec.label, ": ", status, " at step ", step_,
                                " (train loss ", replicas_[r].train_loss, ")"));
  }
  alive_ = alive;
  if (alive_.empty()) return Status::Ok();
  return BuildArray(/*initialize=*/false);
}

Status TrainingLoop::StopReplicas(const std::vector<int64_t>& replica_indices, const std::string& status) {
  if (!fused()) return FailedPrecondition("only a fused run's replicas can be stopped one by one");
  std::vector<int64_t> positions;
  for (int64_t r : replica_indices) {
    if (r < 0 || r >= static_cast<int64_t>(replicas_.size()))
      return InvalidArgument("replica ", r, " is not in the run (", replicas_.size(), " replicas)");
    auto it = std::find(alive_.begin(), alive_.end(), r);
    if (it != alive_.end()) positions.push_back(it - alive_.begin());
  }
  if (positions.empty()) return Status::Ok();
  LOOM_RETURN_IF_ERROR(Retire(positions, status));
  return SaveCheckpoint();
}

// Ranks the running replicas by the rule's metric and stops the worst.
Status TrainingLoop::ApplyEarlyStop() {
  if (!fused() || !c_.fusion().has_early_stop() || alive_.size() <= 1) return Status::Ok();
  const proto::EarlyStopConfig& e = c_.fusion().early_stop();
  const int64_t every = std::max<int64_t>(1, e.every_epochs());
  if (epoch_ < e.after_epochs() || (epoch_ - e.after_epochs()) % every != 0) return Status::Ok();
  const std::string metric = e.metric().empty() ? "test_accuracy" : e.metric();
  auto score = [&](int64_t r) {  // higher is better; NaN ranks last
    const Replica& s = replicas_[r];
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
  return Retire(stop, StrCat("stopped by early stop (", metric, ", epoch ", epoch_, ")"));
}

Status TrainingLoop::RestoreLatest() {
  LOOM_ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpoints(out_dir()));
  // The newest checkpoint that reads back; a damaged one (a disk error, a
  // copy cut short) is moved aside with a warning and the one before it taken.
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    StatusOr<Checkpoint> loaded = LoadCheckpoint(it->path);
    if (loaded.ok()) return RestoreFrom(std::move(*loaded), it->path);
    const std::string aside = it->path + ".corrupt";
    std::error_code ec;
    fs::rename(it->path, aside, ec);
    if (ec) return loaded.status().WithContext("and it cannot be moved aside (" + ec.message() + ")");
    std::fprintf(console_, "warning: %s; moved to %s, trying the checkpoint before it\n",
                 loaded.status().message().c_str(), aside.c_str());
  }
  // The run stopped before its first checkpoint: it starts again from step 0.
  std::fprintf(console_, "%s holds no checkpoint yet: starting the run from step 0\n", out_dir().c_str());
  return Status::Ok();
}

Status TrainingLoop::Restore(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(path));
  loaders_started_ = false;
  evaluated_at_end_ = false;
  return RestoreFrom(std::move(ckpt), path);
}

Status TrainingLoop::RestoreFrom(Checkpoint ckpt, const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(proto::TrainConfig saved, ParseTrainConfig(ckpt.config_text, path));
  if (std::string diff = RunDifferences(saved, c_); !diff.empty())
    return FailedPrecondition(path, " was written by a run with another config (", diff,
                              "); resume with the run's own ", out_dir(), "/config.pbtxt");
  if (fused()) {
    // Rebuild the array the checkpoint holds: the replicas still running.
    const std::vector<int64_t> alive_before = alive_;
    alive_.clear();
    retired_.clear();
    for (size_t r = 0; r < replicas_.size(); ++r) {
      const std::string key = ReplicaKey(r);
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
    if (alive_ != alive_before) LOOM_RETURN_IF_ERROR(BuildArray(/*initialize=*/true));
  }
  LOOM_RETURN_IF_ERROR(RestoreExecutorState(ckpt, train_.get()));
  step_ = ckpt.position.global_step;
  epoch_ = ckpt.position.epoch;
  batch_in_epoch_ = ckpt.position.batch_in_epoch;
  if (auto it = ckpt.float_values.find("elapsed_s"); it != ckpt.float_values.end()) {
    elapsed_before_ = it->second;
    start_ = Clock::now();
  }
  if (auto it = ckpt.float_values.find("window_loss"); it != ckpt.float_values.end()) window_loss_ = it->second;
  if (auto it = ckpt.int_values.find("window_steps"); it != ckpt.int_values.end()) window_steps_ = it->second;
  for (size_t r = 0; r < replicas_.size(); ++r)
    if (auto it = ckpt.float_values.find(ReplicaKey(r) + "/window_loss"); it != ckpt.float_values.end())
      replicas_[r].window_loss = it->second;
  std::fprintf(console_, "resuming %s from %s (step %lld, epoch %lld, batch %lld)\n", out_dir().c_str(), path.c_str(),
               static_cast<long long>(step_), static_cast<long long>(epoch_ + 1),
               static_cast<long long>(batch_in_epoch_));
  return Status::Ok();
}

StatusOr<Checkpoint> TrainingLoop::CaptureCheckpoint() const {
  Checkpoint ckpt;
  if (!alive_.empty()) {
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
  if (fused()) {
    for (size_t r = 0; r < replicas_.size(); ++r) {
      const std::string key = ReplicaKey(r);
      ckpt.string_values[key + "/status"] = replicas_[r].status;
      ckpt.int_values[key + "/since_step"] = replicas_[r].since_step;
      ckpt.float_values[key + "/window_loss"] = replicas_[r].window_loss;
    }
  }
  for (const auto& [name, t] : retired_) ckpt.tensors[name] = t;
  // What the model reads, so that the checkpoint alone serves it (loom::Predictor).
  const DataLoaderOptions eval_loading = LoaderOptions(c_, data_, /*training=*/false);
  RecordDataSpec({data_spec_, eval_loading.mean, eval_loading.std}, &ckpt);
  return ckpt;
}

Status TrainingLoop::SaveCheckpoint() {
  LOOM_ASSIGN_OR_RETURN(Checkpoint ckpt, CaptureCheckpoint());  // every rank: the state is gathered
  if (!writes_records()) return Status::Ok();
  return SaveCheckpointToRunDir(out_dir(), ckpt, static_cast<int>(c_.keep_checkpoints())).status();
}

Status TrainingLoop::SaveCheckpointTo(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(Checkpoint ckpt, CaptureCheckpoint());
  return loom::SaveCheckpoint(path, ckpt);
}

// Per replica in the array: the test loss and accuracy over the scored target
// entries (one per example for classifiers, one per token for token models).
Status TrainingLoop::EvaluateArray(std::vector<double>* loss, std::vector<double>* accuracy) {
  for (const auto& [name, t] : eval_->state()) {
    LOOM_ASSIGN_OR_RETURN(Tensor trained, train_->GetState(name));
    LOOM_RETURN_IF_ERROR(eval_->SetState(name, trained));
  }
  LOOM_RETURN_IF_ERROR(test_loader_->Start(0));
  const int64_t n = array_size();
  Batch batch;
  std::vector<double> loss_sum(n, 0.0);
  std::vector<int64_t> correct(n, 0);
  int64_t scored = 0;  // target entries that count (not padding, not unmasked tokens)
  // Processes share the batches out: rank r evaluates batches r, r + K, ...
  const int64_t ranks = opt_.processes ? opt_.processes->size() : 1;
  const int64_t rank = opt_.processes ? opt_.processes->rank() : 0;
  for (int64_t index = 0;; ++index) {
    LOOM_ASSIGN_OR_RETURN(bool more, test_loader_->Next(&batch));
    if (!more) break;
    if (index % ranks != rank) continue;
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
  if (opt_.processes) {
    // Every rank's sums, gathered and added in rank order: the same bits on
    // every rank (what each decides from them, early stops included, agrees).
    Tensor mine = Tensor::Zeros({2 * n + 1}, DType::kF64);
    double* m = mine.data<double>();
    for (int64_t r = 0; r < n; ++r) m[r] = loss_sum[r], m[n + r] = static_cast<double>(correct[r]);
    m[2 * n] = static_cast<double>(scored);
    Tensor all = Tensor::Zeros({ranks * (2 * n + 1)}, DType::kF64);
    LOOM_RETURN_IF_ERROR(opt_.processes->AllGather(mine, all));
    const double* a = all.data<double>();
    std::fill(loss_sum.begin(), loss_sum.end(), 0.0);
    std::fill(correct.begin(), correct.end(), 0);
    scored = 0;
    for (int64_t k = 0; k < ranks; ++k, a += 2 * n + 1) {
      for (int64_t r = 0; r < n; ++r) loss_sum[r] += a[r], correct[r] += static_cast<int64_t>(a[n + r]);
      scored += static_cast<int64_t>(a[2 * n]);
    }
  }
  loss->assign(n, 0.0);
  accuracy->assign(n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    (*loss)[r] = loss_sum[r] / std::max<int64_t>(1, scored);
    (*accuracy)[r] = static_cast<double>(correct[r]) / std::max<int64_t>(1, scored);
  }
  return Status::Ok();
}

}  // namespace loom::train
