#include "train/gan_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>

#include "core/chrome_trace.h"
#include "core/file_util.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "graph/compile.h"
#include "graph/model.h"
#include "graph/training.h"
#include "models/zoo.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/run_dir.h"
#include "train/config/replicas.h"
#include "runtime/executor.h"
#include "runtime/task_runtime.h"
#include "search/baselines.h"
#include "train/metrics/progress.h"
#include "train/metrics/run_logger.h"
#include "train/metrics/summary_table.h"
#include "train/run_parts.h"
#include "train/stop_signals.h"
#include "train/training_loop.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kSampleGrid = 8;  // samples/*.pgm: 8 x 8 images

// A config whose optimizer is the discriminator's: `optimizer` with the
// fields that `discriminator_optimizer` sets.
proto::TrainConfig DiscriminatorConfig(const proto::TrainConfig& c, const proto::OptimizerConfig& overrides) {
  proto::TrainConfig d = c;
  d.mutable_optimizer()->MergeFrom(overrides);
  return d;
}

// One GAN, or one fused array of them; its per-replica configs.
struct Member {
  std::string label;
  proto::TrainConfig generator, discriminator;  // the same but for the optimizer
};

class GanTrainer {
 public:
  GanTrainer(const RunOptions& o, std::string out_dir) : opt_(o), c_(o.config), out_dir_(std::move(out_dir)) {
    console_ = opt_.console;
    if (console_ == nullptr) console_ = null_console_ = std::fopen("/dev/null", "w");
  }
  ~GanTrainer() {
    if (null_console_) std::fclose(null_console_);
  }
  GanTrainer(const GanTrainer&) = delete;
  GanTrainer& operator=(const GanTrainer&) = delete;
  Status Prepare();
  StatusOr<RunResult> Run();
  // Whether this process writes the run's records (not a rank > 0).
  bool writer() const { return opt_.processes == nullptr || opt_.processes->rank() == 0; }
  // strategy "auto": each step's strategy, by its file name in the run folder.
  const std::map<std::string, std::string>& strategy_files() const { return strategy_files_; }

 private:
  bool fused() const { return fused_; }
  int64_t replicas() const { return static_cast<int64_t>(members_.size()); }
  // The training step of one network, fused when the run is: an Executor,
  // or a TaskRuntime on the config's devices under its strategy.
  StatusOr<std::unique_ptr<StepRunner>> CreateStep(models::GanStep step);
  FusionOptions Fusion() const;
  Tensor LearningRates(bool discriminator) const;
  Tensor Noise(int64_t rows, uint64_t key) const;
  Status WriteSamples(int64_t epoch);
  Status SaveCheckpoint();
  // --trace: the last iteration's two steps, one after the other.
  Status WriteTrace() const;
  // fp16: a step's loss scale that has backed off to kMinLossScale means its
  // network's gradients overflow at any scale: the run diverged.
  Status CheckLossScales(const std::map<std::string, Tensor>& out, const char* network) const;
  // SIGINT/SIGTERM received; under processes, by any rank, so that every
  // rank stops after the same iteration.
  StatusOr<int> StopRequest() const;

  RunOptions opt_;
  proto::TrainConfig c_;
  std::string out_dir_;
  FILE* console_ = nullptr;       // opt_.console, or /dev/null (a silent run, a rank > 0)
  FILE* null_console_ = nullptr;  // owned
  bool fused_ = false;
  std::vector<Member> members_;
  Datasets data_;
  std::unique_ptr<DataLoader> loader_;
  Shape image_;  // [C, H, W] as the loader gives it (after padding)
  int64_t nz_ = 0;
  std::unique_ptr<StepRunner> d_step_, g_step_;
  std::map<std::string, std::string> strategy_files_;
  std::unique_ptr<Executor> sampler_;
  std::vector<std::string> shared_state_;  // what both steps hold: the networks' parameters and statistics
  std::vector<std::unique_ptr<Schedule>> g_schedules_, d_schedules_;
  int64_t total_steps_ = 0, step_ = 0, epoch_ = 0;
  Clock::time_point start_ = Clock::now();
};

// A step's own fp16 loss scaler, named alike in both steps' graphs.
bool IsLossScalerState(const std::string& name) { return name == kLossScaleState || name == kLossScaleGoodSteps; }

// The state both runners hold (the networks' parameters and BatchNorm
// statistics; optimizer slots and loss scalers belong to one step), sorted.
std::vector<std::string> SharedState(const StepRunner& a, const StepRunner& b) {
  const std::vector<std::string> x = a.StateNames(), y = b.StateNames();
  std::vector<std::string> both, shared;
  std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(both));
  std::copy_if(both.begin(), both.end(), std::back_inserter(shared),
               [](const std::string& name) { return !IsLossScalerState(name); });
  return shared;
}

Status CopyState(const StepRunner& from, StepRunner* to, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    LOOM_ASSIGN_OR_RETURN(Tensor t, from.GetState(name));
    LOOM_RETURN_IF_ERROR(to->SetState(name, t));
  }
  return Status::Ok();
}

// One replica per member, with its seed; the config's unfused layers.
FusionOptions GanTrainer::Fusion() const {
  FusionOptions fo;
  fo.replicas = static_cast<int>(replicas());
  for (const Member& mem : members_) fo.seeds.push_back(mem.generator.seed());
  fo.unfused_layers.assign(c_.fusion().unfused_layers().begin(), c_.fusion().unfused_layers().end());
  return fo;
}

StatusOr<std::unique_ptr<StepRunner>> GanTrainer::CreateStep(models::GanStep step) {
  const bool discriminator = step == models::GanStep::kDiscriminator;
  Model m;
  LOOM_RETURN_IF_ERROR(models::BuildGanStep(m, c_.model().name(), {c_.model().args().begin(), c_.model().args().end()},
                                            image_, c_.data().batch_size(), step));
  CompileOptions co;
  co.name = discriminator ? "d_step" : "g_step";
  co.dump_dir = opt_.dump_graphs_dir;
  co.isolate_divergence = false;
  // bf16 / fp16: each step has its own loss scaler (fp16), so an overflow in
  // one network's gradients skips that network's update only.
  co.precision = RunPrecision(c_);
  co.loss_scaling = RunLossScaling(c_);
  if (fused()) co.fusion = Fusion();
  for (const Member& mem : members_) {
    co.optimizers.push_back(StepOptimizer{(discriminator ? mem.discriminator : mem.generator).optimizer()});
    co.optimizers.back().trainable_scope = discriminator ? models::kDiscriminatorScope : models::kGeneratorScope;
  }
  LOOM_ASSIGN_OR_RETURN(Graph graph, Compile(m.graph(), Program::kTrainingStep, co));
  LOOM_ASSIGN_OR_RETURN(const std::vector<Device> device_list, RunDevices(c_));
  const int64_t devices = static_cast<int64_t>(device_list.size());
  if (devices == 0) {
    ExecutorOptions eo;
    eo.seed = c_.seed();
    LOOM_ASSIGN_OR_RETURN(eo.device, RunDevice(c_));
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Executor> executor, Executor::Create(graph, eo));
    return std::unique_ptr<StepRunner>(std::move(executor));
  }
  // Each step's strategy is made (or read) for its own graph: the layers of
  // both networks, as that step runs them.
  LOOM_RETURN_IF_ERROR(CheckDevicesPerProcess(devices, opt_.processes));
  LOOM_ASSIGN_OR_RETURN(Graph forward, Compile(m.graph(), Program::kForward, co));
  const std::string what = discriminator ? "the discriminator's step" : "the generator's step";
  StatusOr<Strategy> strategy = Status::Ok();
  if (c_.strategy() == "auto") {
    // A search per step; each step's strategy goes to the run folder.
    LoopOptions search;
    search.console = console_;
    search.processes = opt_.processes;
    search.search_machine = opt_.search_machine;
    const std::string file = StrCat("strategy_", co.name, ".pbtxt");
    LOOM_ASSIGN_OR_RETURN(std::string text,
                          AutoStrategyText(graph, forward, devices, "", file, search, c_.seed(), co.name));
    strategy = Strategy::Parse(text, file);
    strategy_files_[file] = std::move(text);
  } else {
    strategy = LoadOrMakeStrategy(c_.strategy().empty() ? "dp" : c_.strategy(), forward, devices, "field strategy");
  }
  if (!strategy.ok()) return strategy.status().WithContext(what);
  auto runtime = CreateStepTaskRuntime(graph, forward, *strategy, device_list, opt_.processes, c_.seed(),
                                       !opt_.trace_path.empty());
  if (!runtime.ok()) return runtime.status().WithContext(what);
  return runtime;
}

Status GanTrainer::Prepare() {
  if (opt_.resume) return Unimplemented("--resume of GAN runs is not supported yet; start the run again");
  if (!opt_.init_from.empty()) return Unimplemented("--init-from is not supported for GAN runs yet");
  if (c_.threads() > 0) ThreadPool::SetDefaultThreads(static_cast<int>(c_.threads()));
  LOOM_RETURN_IF_ERROR(ThreadPool::StartDefault());
  fused_ = IsFused(c_);
  if (c_.fusion().has_early_stop() || c_.fusion().per_replica_data_order())
    return Unimplemented("fusion.early_stop and fusion.per_replica_data_order are not supported for GAN runs yet");
  if (fused_) {
    LOOM_ASSIGN_OR_RETURN(std::vector<ReplicaSpec> specs, ExpandReplicas(c_));
    for (const ReplicaSpec& s : specs)
      members_.push_back({s.label, s.config, DiscriminatorConfig(s.config, c_.discriminator_optimizer())});
  } else {
    members_.push_back({"0", c_, DiscriminatorConfig(c_, c_.discriminator_optimizer())});
  }
  LOOM_ASSIGN_OR_RETURN(data_, LoadDatasets(c_.data()));
  if (data_.train->input_spec().dtype != DType::kF32 || data_.train->input_spec().shape.rank() != 3)
    return InvalidArgument("model ", c_.model().name(), " is a GAN of images; data.dataset '", c_.data().dataset(),
                           "' gives ", data_.train->input_spec().ToString());
  LOOM_ASSIGN_OR_RETURN(loader_, DataLoader::Create(data_.train, LoaderOptions(c_, data_, true)));
  const Shape& batch_shape = loader_->input_shape();
  image_ = Shape(std::vector<int64_t>(batch_shape.dims().begin() + 1, batch_shape.dims().end()));

  LOOM_ASSIGN_OR_RETURN(d_step_, CreateStep(models::GanStep::kDiscriminator));
  LOOM_ASSIGN_OR_RETURN(g_step_, CreateStep(models::GanStep::kGenerator));
  LOOM_RETURN_IF_ERROR(d_step_->InitializeState(c_.seed()));
  LOOM_RETURN_IF_ERROR(g_step_->InitializeState(c_.seed()));
  shared_state_ = SharedState(*d_step_, *g_step_);
  LOOM_RETURN_IF_ERROR(CopyState(*d_step_, g_step_.get(), shared_state_));  // one start for both
  const Graph& d_graph = d_step_->graph();
  nz_ = d_graph.type(d_graph.node(*d_graph.FindNode("noise")).outputs[0]).shape[1];
  ExecutorOptions eo;
  eo.seed = c_.seed();
  LOOM_ASSIGN_OR_RETURN(eo.device, RunDevice(c_));

  // The sampler: G in evaluation mode on a fixed noise batch.
  Model sample_model;
  sample_model.set_training(false);
  LOOM_RETURN_IF_ERROR(models::BuildGanStep(sample_model, c_.model().name(),
                                            {c_.model().args().begin(), c_.model().args().end()}, image_,
                                            kSampleGrid * kSampleGrid, models::GanStep::kGenerator));
  CompileOptions sample_options;
  sample_options.name = "sampler";
  sample_options.dump_dir = opt_.dump_graphs_dir;
  sample_options.precision = RunPrecision(c_);  // sampled as trained
  if (fused()) sample_options.fusion = Fusion();
  LOOM_ASSIGN_OR_RETURN(Graph sample_graph, Compile(sample_model.graph(), Program::kForward, sample_options));
  LOOM_ASSIGN_OR_RETURN(sampler_, Executor::Create(sample_graph, eo));

  const int64_t per_epoch = loader_->batches_per_epoch();
  total_steps_ = per_epoch * c_.epochs();
  if (c_.max_steps() > 0) total_steps_ = std::min(total_steps_, c_.max_steps());
  for (const Member& mem : members_) {
    LOOM_ASSIGN_OR_RETURN(auto g, BuildSchedule(mem.generator, per_epoch, total_steps_));
    LOOM_ASSIGN_OR_RETURN(auto d, BuildSchedule(mem.discriminator, per_epoch, total_steps_));
    g_schedules_.push_back(std::move(g));
    d_schedules_.push_back(std::move(d));
  }
  return Status::Ok();
}

StatusOr<int> GanTrainer::StopRequest() const {
  int sig = StopSignals::Received();
  if (opt_.processes == nullptr) return sig;
  Tensor flag = Tensor::Zeros({}, DType::kI32);
  flag.data<int32_t>()[0] = sig;
  LOOM_RETURN_IF_ERROR(opt_.processes->AllReduce(flag, ReduceOp::kMax));  // SIGTERM (15) over SIGINT (2) over 0
  return flag.data<int32_t>()[0];
}

Tensor GanTrainer::LearningRates(bool discriminator) const {
  const auto& schedules = discriminator ? d_schedules_ : g_schedules_;
  Tensor lr = Tensor::Zeros(fused() ? Shape({replicas()}) : Shape{}, DType::kF32);
  for (int64_t r = 0; r < replicas(); ++r) lr.data<float>()[r] = static_cast<float>(schedules[r]->LearningRate(step_));
  return lr;
}

// N(0, 1) noise [rows, nz], a function of (seed, key): shared by the
// replicas and by the two steps of an iteration.
Tensor GanTrainer::Noise(int64_t rows, uint64_t key) const {
  Tensor z = Tensor::Zeros({rows, nz_}, DType::kF32);
  Rng rng = Rng::Stream(c_.seed(), 0x6e6f697365 /* "noise" */, key);
  for (int64_t i = 0; i < z.numel(); ++i) z.data<float>()[i] = static_cast<float>(rng.Normal());
  return z;
}

// An 8 x 8 grid of G's images per replica, [-1, 1] mapped to 0..255; binary
// PGM (one channel) or PPM (three).
Status GanTrainer::WriteSamples(int64_t epoch) {
  // Every rank reads the state (a collective under processes); rank 0 writes.
  LOOM_RETURN_IF_ERROR(CopyState(*g_step_, sampler_.get(), SharedState(*g_step_, *sampler_)));
  if (!writer()) return Status::Ok();
  const int64_t n = kSampleGrid * kSampleGrid;
  LOOM_ASSIGN_OR_RETURN(auto out, sampler_->Run({{"noise", Noise(n, ~uint64_t{0})}}));
  const Tensor& fake = out.at("fake");  // [n, C, H, W], fused [R, n, C, H, W]
  const int64_t c = image_[0], h = image_[1], w = image_[2];
  if (c != 1 && c != 3) return Status::Ok();  // no image format for other channel counts
  std::filesystem::create_directories(out_dir_ + "/samples");
  for (int64_t r = 0; r < replicas(); ++r) {
    const float* images = fake.data<float>() + r * n * c * h * w;
    const int64_t width = kSampleGrid * w, height = kSampleGrid * h;
    std::string file = (c == 1 ? "P5\n" : "P6\n") + std::to_string(width) + " " + std::to_string(height) + "\n255\n";
    const size_t header = file.size();
    file.resize(header + static_cast<size_t>(width * height * c));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t y = 0; y < h; ++y)
          for (int64_t x = 0; x < w; ++x) {
            const float v = images[((i * c + ch) * h + y) * w + x];
            const int64_t row = (i / kSampleGrid) * h + y, col = (i % kSampleGrid) * w + x;
            file[header + static_cast<size_t>((row * width + col) * c + ch)] =
                static_cast<char>(std::clamp(std::lround((v + 1) * 127.5), 0L, 255L));
          }
    const std::string path = out_dir_ + "/samples/epoch_" + std::to_string(epoch) +
                             (fused() ? "_r" + std::to_string(r) : std::string()) + (c == 1 ? ".pgm" : ".ppm");
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(path, file));
  }
  return Status::Ok();
}

// Both steps' state (their shared tensors are equal after each step); each
// step's loss scaler under the step's name ("d_step/loss_scale/scale").
Status GanTrainer::SaveCheckpoint() {
  Checkpoint ckpt;
  for (const StepRunner* runner : {d_step_.get(), g_step_.get()})
    for (const std::string& name : runner->StateNames()) {
      const std::string key = IsLossScalerState(name) ? StrCat(runner == d_step_.get() ? "d_step/" : "g_step/", name)
                                                       : name;
      LOOM_ASSIGN_OR_RETURN(ckpt.tensors[key], runner->GetState(name));
    }
  ckpt.position.global_step = step_;
  ckpt.position.epoch = epoch_;
  ckpt.position.executor_step = d_step_->step();
  ckpt.seeds["init"] = c_.seed();
  ckpt.config_text = TrainConfigToText(c_);
  if (!writer()) return Status::Ok();
  return SaveCheckpointToRunDir(out_dir_, ckpt, static_cast<int>(c_.keep_checkpoints())).status();
}

Status GanTrainer::CheckLossScales(const std::map<std::string, Tensor>& out, const char* network) const {
  auto it = out.find(kLossScaleOutput);
  if (it == out.end()) return Status::Ok();
  const std::vector<double> scales = it->second.ToDoubleVector();
  for (size_t r = 0; r < scales.size(); ++r)
    if (scales[r] < kMinLossScale)
      return FailedPrecondition("GAN ", members_[r].label, ": the ", network,
                                "'s fp16 gradients overflowed at every step until its loss scale fell to ", scales[r],
                                " at iteration ", step_, "; lower the learning rates or use precision: bf16");
  return Status::Ok();
}

Status GanTrainer::WriteTrace() const {
  const auto* d = dynamic_cast<const TaskRuntime*>(d_step_.get());
  const auto* g = dynamic_cast<const TaskRuntime*>(g_step_.get());
  if (!d || !g) return InvalidArgument("--trace FILE needs devices (--devices cpu:N): it traces the task runtime");
  ChromeTrace trace;
  trace.NameGroup(0, "discriminator step");
  const double d_end = d->AppendTrace(trace, 0, 0);
  trace.NameGroup(1, "generator step");
  g->AppendTrace(trace, 1, d_end);
  LOOM_RETURN_IF_ERROR(WriteFileAtomically(opt_.trace_path, trace.Json()));
  std::fprintf(console_, "trace of iteration %lld (both steps): %s\n", static_cast<long long>(step_),
               opt_.trace_path.c_str());
  return Status::Ok();
}

StatusOr<RunResult> GanTrainer::Run() {
  metrics::RunLoggerOptions lo;
  lo.tensorboard = c_.tensorboard();
  lo.replicas = replicas();
  std::optional<metrics::RunLogger> logger;  // rank 0's
  if (writer()) {
    LOOM_ASSIGN_OR_RETURN(logger, metrics::RunLogger::Create(out_dir_, lo));
  }
  const StopSignals stop_signals;
  metrics::ProgressOptions po;
  po.total_steps = total_steps_;
  po.line_every_steps = c_.log_every_steps();
  metrics::ProgressBar progress(console_, po);
  progress.PrintLine(StrCat("run ", out_dir_, ": GAN ", c_.model().name(),
                            fused() ? StrCat(", ", replicas(), " fused replicas") : std::string(), ", ",
                            data_.train->size(), " images ", image_.ToString(), ", ", total_steps_, " iterations, ",
                            ThreadPool::Default().num_threads(), " threads"));
  for (const Member& mem : members_)
    if (fused()) progress.PrintLine(StrCat("  replica ", mem.label));

  const int64_t batch = c_.data().batch_size();
  const int64_t n = replicas();
  struct Window {
    double loss_d = 0, loss_g = 0, d_real = 0, d_fake = 0;
    int64_t skipped_d = 0, skipped_g = 0;  // fp16: updates skipped after an overflow
    double scale_d = 0, scale_g = 0;       // fp16: the loss scales after the last step
  };
  std::vector<Window> window(n), last(n);
  int64_t window_steps = 0;
  auto window_start = Clock::now();
  Tensor step_t = Tensor::Zeros({}, DType::kF32);
  Tensor mask = Tensor::Zeros({n}, DType::kF32);
  mask.Fill(1);
  while (step_ < total_steps_ && epoch_ < c_.epochs()) {
    LOOM_RETURN_IF_ERROR(loader_->Start(epoch_));
    Batch b;
    for (;;) {
      if (step_ >= total_steps_) break;
      LOOM_ASSIGN_OR_RETURN(bool more, loader_->Next(&b));
      if (!more) break;
      step_t.Fill(static_cast<double>(step_ + 1));
      const Tensor z = Noise(batch, static_cast<uint64_t>(step_));
      std::map<std::string, Tensor> feeds = {
          {"real", b.input}, {"noise", z}, {"lr", LearningRates(true)}, {"step", step_t}};
      if (fused()) feeds[kReplicaMaskInput] = mask;
      LOOM_ASSIGN_OR_RETURN(auto d_out, d_step_->Run(feeds));
      LOOM_RETURN_IF_ERROR(CopyState(*d_step_, g_step_.get(), shared_state_));
      feeds.erase("real");
      feeds["lr"] = LearningRates(false);
      LOOM_ASSIGN_OR_RETURN(auto g_out, g_step_->Run(feeds));
      LOOM_RETURN_IF_ERROR(CopyState(*g_step_, d_step_.get(), shared_state_));
      ++step_;
      LOOM_RETURN_IF_ERROR(CheckLossScales(d_out, "discriminator"));
      LOOM_RETURN_IF_ERROR(CheckLossScales(g_out, "generator"));
      const bool loss_scaled = d_out.count(kLossScaleOutput) > 0;
      const std::vector<double> loss_d = d_out["loss"].ToDoubleVector(), loss_g = g_out["loss"].ToDoubleVector();
      std::vector<double> finite_d(n, 1), finite_g(n, 1), scale_d(n, 0), scale_g(n, 0);
      if (loss_scaled) {
        finite_d = d_out[kGradsFiniteOutput].ToDoubleVector();
        finite_g = g_out[kGradsFiniteOutput].ToDoubleVector();
        scale_d = d_out[kLossScaleOutput].ToDoubleVector();
        scale_g = g_out[kLossScaleOutput].ToDoubleVector();
      }
      const std::vector<double> d_real = d_out["d_real"].ToDoubleVector(), d_fake = g_out["d_fake"].ToDoubleVector();
      for (int64_t r = 0; r < n; ++r) {
        if (!std::isfinite(loss_d[r]) || !std::isfinite(loss_g[r]))
          return FailedPrecondition("GAN ", members_[r].label, ": the ", std::isfinite(loss_d[r]) ? "generator" : "discriminator",
                                    " loss became ", std::isfinite(loss_d[r]) ? loss_g[r] : loss_d[r], " at iteration ",
                                    step_, "; lower the learning rates");
        last[r] = {loss_d[r], loss_g[r], d_real[r], d_fake[r]};
        window[r].loss_d += loss_d[r];
        window[r].loss_g += loss_g[r];
        window[r].d_real += d_real[r];
        window[r].d_fake += d_fake[r];
        window[r].skipped_d += finite_d[r] == 0 ? 1 : 0;
        window[r].skipped_g += finite_g[r] == 0 ? 1 : 0;
        window[r].scale_d = scale_d[r];
        window[r].scale_g = scale_g[r];
      }
      ++window_steps;
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      const double samples_per_s = secs > 0 ? static_cast<double>(window_steps * batch * n) / secs : 0;
      progress.Update(step_, loss_d[0], samples_per_s);
      if (step_ % c_.log_every_steps() == 0) {
        for (int64_t r = 0; r < n; ++r) {
          metrics::MetricsRecord rec;
          rec.replica = r;
          rec.epoch = epoch_ + 1;
          rec.step = step_;
          rec.samples_per_s = samples_per_s / static_cast<double>(n);
          rec.time_s = std::chrono::duration<double>(Clock::now() - start_).count();
          const double k = static_cast<double>(window_steps);
          rec.loss = window[r].loss_d / k;
          rec.extra = {{"loss_g", window[r].loss_g / k},
                       {"d_real", window[r].d_real / k},
                       {"d_fake", window[r].d_fake / k},
                       {"lr", g_schedules_[r]->LearningRate(step_ - 1)}};
          if (loss_scaled) {
            rec.extra.push_back({"loss_scale_d", window[r].scale_d});
            rec.extra.push_back({"loss_scale_g", window[r].scale_g});
            rec.extra.push_back({"skipped_steps_d", static_cast<double>(window[r].skipped_d)});
            rec.extra.push_back({"skipped_steps_g", static_cast<double>(window[r].skipped_g)});
          }
          if (logger) LOOM_RETURN_IF_ERROR(logger->Log(rec));
          window[r] = {};
        }
        window_steps = 0;
        window_start = Clock::now();
      }
      LOOM_ASSIGN_OR_RETURN(const int sig, StopRequest());
      if (sig != 0) {
        // GAN runs do not resume yet, so no checkpoint of a part-done epoch.
        progress.Finish();
        std::fprintf(console_, "stopped by %s at iteration %lld; GAN runs do not resume yet (the newest checkpoint "
                     "is of epoch %lld)\n", StopSignals::Name(sig), static_cast<long long>(step_),
                     static_cast<long long>(epoch_));
        RunResult stopped;
        stopped.out_dir = out_dir_;
        stopped.steps = step_;
        stopped.final_train_loss = last[0].loss_d;
        stopped.stop_signal = sig;
        stopped.cancelled = true;
        return stopped;
      }
    }
    ++epoch_;
    LOOM_RETURN_IF_ERROR(WriteSamples(epoch_));
    LOOM_RETURN_IF_ERROR(SaveCheckpoint());
    progress.PrintLine(StrCat("epoch ", epoch_, " iteration ", step_, ": loss_d ", last[0].loss_d, ", loss_g ",
                              last[0].loss_g, ", D(x) ", last[0].d_real, ", D(G(z)) ", last[0].d_fake,
                              fused() ? " (replica 0)" : "", "; samples in ", out_dir_, "/samples"));
  }
  progress.Finish();
  if (!opt_.trace_path.empty() && writer()) LOOM_RETURN_IF_ERROR(WriteTrace());
  RunResult result;
  result.out_dir = out_dir_;
  result.steps = step_;
  result.final_train_loss = last[0].loss_d;
  result.test_loss = result.test_accuracy = NAN;
  result.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  std::vector<metrics::SummaryRow> rows;
  for (int64_t r = 0; r < n; ++r) {
    rows.push_back({members_[r].label, {{"iterations", static_cast<double>(step_)},
                                        {"loss_d", last[r].loss_d},
                                        {"loss_g", last[r].loss_g},
                                        {"d_real", last[r].d_real},
                                        {"d_fake", last[r].d_fake}}});
    result.replicas.push_back({members_[r].label, "running", last[r].loss_d, NAN, NAN});
  }
  LOOM_ASSIGN_OR_RETURN(std::string table, metrics::FormatSummaryTable(rows, metrics::SummaryOptions{}));
  std::fprintf(console_, "%s", table.c_str());
  std::fprintf(console_, "run folder: %s\n", out_dir_.c_str());
  return result;
}

}  // namespace

StatusOr<RunResult> RunGanTraining(const RunOptions& options, const std::string& out_dir) {
  GanTrainer trainer(options, out_dir);
  // Bad input fails here, before the run folder exists.
  LOOM_RETURN_IF_ERROR(trainer.Prepare());
  if (!trainer.writer()) return trainer.Run();  // rank 0 makes the folder
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Internal("cannot create ", out_dir, ": ", ec.message());
  RunOptions written = options;
  written.config.set_out_dir(out_dir);
  LOOM_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/config.pbtxt", TrainConfigToText(written.config)));
  for (const auto& [file, text] : trainer.strategy_files())
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/" + file, text));
  return trainer.Run();
}

}  // namespace loom::train
