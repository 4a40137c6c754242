// A training loop for classifiers over an in-memory dataset: shuffled
// mini-batches through the training-step graph, evaluation through the eval
// graph with the same parameters. The forward graph must have the inputs
// "image" [B, ...] and "label" [B] and the outputs "loss" and "logits"; the
// loss must skip label -100 (CrossEntropy's default ignore_index), which pads
// the last evaluation batch.
#pragma once

#include <functional>
#include <memory>

#include "graph/training.h"
#include "runtime/data/idx.h"
#include "runtime/executor.h"

namespace loom {

struct TrainerOptions {
  OptimizerConfig optimizer;
  double learning_rate = 0.05;
  uint64_t seed = 0;      // initialisation, shuffling and dropout
  int64_t max_steps = 0;  // 0 = no limit
};

struct StepReport {
  int64_t step = 0;  // 1-based
  double loss = 0;
  double samples_per_s = 0;  // over the steps since the last report
};

struct EvalReport {
  double loss = 0;  // mean over samples
  double accuracy = 0;
  int64_t samples = 0;
};

class ClassifierTrainer {
 public:
  static StatusOr<std::unique_ptr<ClassifierTrainer>> Create(const Graph& forward, const TrainerOptions& options);

  // One pass over `data` in a fresh shuffled order, dropping the last
  // partial batch. Calls `on_step` every `report_every` steps. Stops early at
  // max_steps; returns the mean training loss of the epoch.
  StatusOr<double> TrainEpoch(const ImageDataset& data, int report_every,
                              const std::function<void(const StepReport&)>& on_step);
  // Loss and accuracy over all of `data` (a last partial batch is padded and
  // the padding is not counted).
  StatusOr<EvalReport> Evaluate(const ImageDataset& data);

  int64_t steps() const { return step_; }
  bool done() const { return options_.max_steps > 0 && step_ >= options_.max_steps; }
  int64_t batch_size() const { return batch_; }
  Executor& train_executor() { return *train_; }

 private:
  ClassifierTrainer(TrainerOptions options) : options_(options) {}
  Status Prepare(const Graph& forward);

  TrainerOptions options_;
  std::unique_ptr<Executor> train_, eval_;
  int64_t batch_ = 0;
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace loom
