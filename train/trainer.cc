#include "train/trainer.h"

#include "train/run_parts.h"
#include "train/training_loop.h"

namespace loom {

Trainer::Trainer(std::unique_ptr<train::TrainingLoop> loop) : loop_(std::move(loop)) {}
Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::FromConfigFile(const std::string& path, TrainerOptions options) {
  LOOM_ASSIGN_OR_RETURN(proto::TrainConfig config, LoadTrainConfig(path));
  return FromConfig(config, std::move(options));
}

StatusOr<std::unique_ptr<Trainer>> Trainer::FromConfigText(const std::string& text, TrainerOptions options) {
  LOOM_ASSIGN_OR_RETURN(proto::TrainConfig config, ParseTrainConfig(text, "<config text>"));
  return FromConfig(config, std::move(options));
}

StatusOr<std::unique_ptr<Trainer>> Trainer::FromConfig(const proto::TrainConfig& config, TrainerOptions options) {
  train::LoopOptions lo;
  // The checks and defaults a config file gets, for configs built in code.
  LOOM_ASSIGN_OR_RETURN(lo.config, ParseTrainConfig(TrainConfigToText(config), "<TrainConfig>"));
  if (!options.out_dir.empty()) lo.config.set_out_dir(options.out_dir);
  if (lo.config.out_dir().empty()) lo.config.set_out_dir(train::DefaultOutDir(config.model().name()));
  lo.resume = options.resume;
  lo.init_from = std::move(options.init_from);
  lo.console = options.console;
  lo.on_metrics = std::move(options.on_metrics);
  lo.network = std::move(options.network);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<train::TrainingLoop> loop, train::TrainingLoop::Open(std::move(lo)));
  return std::unique_ptr<Trainer>(new Trainer(std::move(loop)));
}

StatusOr<StepReport> Trainer::Step() { return loop_->Step(); }
StatusOr<StepReport> Trainer::RunEpoch() { return loop_->RunEpoch(); }
StatusOr<TrainerResult> Trainer::Run() { return loop_->Run(); }
StatusOr<Evaluation> Trainer::Evaluate() { return loop_->Evaluate(); }
Status Trainer::SaveCheckpoint() { return loop_->SaveCheckpoint(); }
Status Trainer::SaveCheckpoint(const std::string& path) { return loop_->SaveCheckpointTo(path); }
Status Trainer::Restore(const std::string& path) { return loop_->Restore(path); }
void Trainer::Cancel() { loop_->Cancel(); }
bool Trainer::cancelled() const { return loop_->cancelled(); }
bool Trainer::done() const { return loop_->done(); }
int64_t Trainer::step() const { return loop_->step(); }
int64_t Trainer::epoch() const { return loop_->epoch(); }
const std::string& Trainer::out_dir() const { return loop_->out_dir(); }
const proto::TrainConfig& Trainer::config() const { return loop_->config(); }

}  // namespace loom
