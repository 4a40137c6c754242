// loom::Predictor: a trained model served from a checkpoint.
//
//   auto predictor = loom::Predictor::Load("runs/mlp/ckpt-900.loom");
//   auto logits = (*predictor)->Predict(images);      // [N, classes]
//   auto classes = (*predictor)->Classify(images);    // N class ids
//
// The checkpoint carries the resolved training config, so the predictor
// rebuilds the model's evaluation graph (BatchNorm and Dropout in eval mode)
// and loads its parameters and buffers; of a fused run's checkpoint it
// serves one replica (as `loom export --replica` takes it out). Inputs are
// examples as the dataset gives them (f32 images with pixels in [0, 1], i64
// token ids): the predictor normalises images as the run's evaluation loader
// did, so its logits are those Trainer::Evaluate scores.
//
// Predict and Classify are safe to call from many threads at once: each call
// runs on an executor of its own, taken from a pool that grows to the number
// of concurrent callers (each holds a copy of the parameters and its own
// activation arena), and nothing global is touched (the predictor owns its
// CPU thread pool). A Predictor must outlive the calls in flight on it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "models/zoo.h"
#include "train/trainer.h"

namespace loom {

namespace train {
class PredictorImpl;
}

struct PredictorOptions {
  // A fused run's replica (config order); must be unset (-1) for a
  // single-model checkpoint.
  int64_t replica = -1;
  // Examples per executor run; 0: the config's eval_batch_size. Predict
  // takes any number of examples and pads the last batch.
  int64_t batch_size = 0;
  // Threads of the predictor's own pool, which every call's kernels share;
  // 0: 1. With one thread each call runs on its caller's thread alone, so
  // concurrent callers run fully in parallel; with more, the kernels of
  // concurrent calls take turns on the pool.
  int threads = 0;
  // The network the run was trained with, when it was not a zoo model
  // (TrainerOptions::network).
  NetworkBuilder network;
};

class Predictor {
 public:
  // Errors: the file is not a checkpoint or holds no config (as
  // LoadCheckpoint); a fused run's checkpoint without a replica in range, or
  // a single model's with one; a GAN, or a model that reads its targets
  // (nmt); a tensor of the model missing from the checkpoint or of another
  // shape. Each names the file (and replica, tensor, shape).
  static StatusOr<std::unique_ptr<Predictor>> Load(const std::string& checkpoint, PredictorOptions options = {});
  ~Predictor();
  Predictor(const Predictor&) = delete;
  Predictor& operator=(const Predictor&) = delete;

  // input [N, example...] with the data spec's dtype (N >= 0, any N: split
  // into batches of batch_size, the last one padded) -> logits
  // [N, target..., classes] (f32). Errors (InvalidArgument) name the shape
  // and dtype expected.
  StatusOr<Tensor> Predict(const Tensor& input) const;
  // The arg-max class of every target entry, N x target entries.
  StatusOr<std::vector<int64_t>> Classify(const Tensor& input) const;

  // What one example is (shape, dtype, classes).
  const models::DataSpec& data() const;
  int64_t batch_size() const;  // examples per executor run
  const proto::TrainConfig& config() const;  // the replica's own config

 private:
  explicit Predictor(std::unique_ptr<train::PredictorImpl> impl);
  std::unique_ptr<train::PredictorImpl> impl_;
};

}  // namespace loom
