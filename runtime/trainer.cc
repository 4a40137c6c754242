#include "runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "core/rng.h"

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;

// Label of padding rows: CrossEntropy's default ignore_index, so padding
// contributes neither to the loss nor to its mean's denominator.
constexpr int64_t kPaddingLabel = -100;

// Copies the samples order[begin, begin + count) into batch tensors shaped
// like the graph's inputs; rows past `count` are padding.
void GatherBatch(const ImageDataset& data, const std::vector<int64_t>& order, int64_t begin, int64_t count,
                 Tensor* images, Tensor* labels) {
  const int64_t per_image = data.images.numel() / data.size();
  const float* src = data.images.data<float>();
  float* dst = images->data<float>();
  const int64_t* lsrc = data.labels.data<int64_t>();
  int64_t* ldst = labels->data<int64_t>();
  const int64_t batch = labels->numel();
  for (int64_t i = 0; i < batch; ++i) {
    int64_t idx = i < count ? order[begin + i] : order[begin];
    std::memcpy(dst + i * per_image, src + idx * per_image, per_image * sizeof(float));
    ldst[i] = i < count ? lsrc[idx] : kPaddingLabel;
  }
}

}  // namespace

StatusOr<std::unique_ptr<ClassifierTrainer>> ClassifierTrainer::Create(const Graph& forward,
                                                                       const TrainerOptions& options) {
  std::unique_ptr<ClassifierTrainer> t(new ClassifierTrainer(options));
  LOOM_RETURN_IF_ERROR(t->Prepare(forward));
  return t;
}

Status ClassifierTrainer::Prepare(const Graph& forward) {
  auto image = forward.FindNode("image");
  auto label = forward.FindNode("label");
  if (!image || !label) return InvalidArgument("the classifier graph needs inputs named 'image' and 'label'");
  for (const char* out : {"loss", "logits"})
    if (!forward.outputs().count(out)) return InvalidArgument("the classifier graph needs an output named '", out, "'");
  const TensorType& it = forward.type(forward.node(*image).outputs[0]);
  if (it.dtype != DType::kF32) return InvalidArgument("the trainer feeds f32 images, the graph wants ", DTypeName(it.dtype));
  batch_ = it.shape[0];
  dtype_ = it.dtype;
  LOOM_ASSIGN_OR_RETURN(Graph train, BuildTrainingGraph(forward, "loss", options_.optimizer));
  LOOM_ASSIGN_OR_RETURN(Graph eval, BuildEvalGraph(forward));
  ExecutorOptions eo;
  eo.seed = options_.seed;
  LOOM_ASSIGN_OR_RETURN(train_, Executor::Create(train, eo));
  LOOM_ASSIGN_OR_RETURN(eval_, Executor::Create(eval, eo));
  return train_->InitializeState(options_.seed);
}

StatusOr<double> ClassifierTrainer::TrainEpoch(const ImageDataset& data, int report_every,
                                               const std::function<void(const StepReport&)>& on_step) {
  const Shape image_shape = train_->graph().type(train_->graph().node(*train_->graph().FindNode("image")).outputs[0]).shape;
  if (data.images.numel() / std::max<int64_t>(1, data.size()) != image_shape.numel() / batch_)
    return InvalidArgument("dataset images ", data.images.shape().ToString(), " do not fit the model input ",
                           image_shape.ToString());
  std::vector<int64_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  Rng rng = Rng::Stream(options_.seed, 0x5348, static_cast<uint64_t>(epoch_++));
  for (int64_t i = data.size() - 1; i > 0; --i) std::swap(order[i], order[rng.UniformInt(i + 1)]);

  Tensor images = Tensor::Zeros(image_shape, DType::kF32);
  Tensor labels = Tensor::Zeros({batch_}, DType::kI64);
  Tensor lr = Tensor::Zeros({}, dtype_);
  Tensor step = Tensor::Zeros({}, dtype_);
  lr.Fill(options_.learning_rate);
  double loss_sum = 0, window_loss = 0;
  int64_t batches = 0, window = 0;
  auto window_start = Clock::now();
  for (int64_t begin = 0; begin + batch_ <= data.size() && !done(); begin += batch_) {
    GatherBatch(data, order, begin, batch_, &images, &labels);
    step.Fill(static_cast<double>(step_ + 1));
    LOOM_ASSIGN_OR_RETURN(auto out, train_->Run({{"image", images}, {"label", labels}, {"lr", lr}, {"step", step}}));
    ++step_;
    double loss = out["loss"].ScalarAt(0);
    loss_sum += loss;
    window_loss += loss;
    ++batches;
    ++window;
    if (on_step && report_every > 0 && step_ % report_every == 0) {
      double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      on_step({step_, window_loss / window, secs > 0 ? window * batch_ / secs : 0});
      window = 0;
      window_loss = 0;
      window_start = Clock::now();
    }
  }
  return batches ? loss_sum / batches : 0.0;
}

StatusOr<EvalReport> ClassifierTrainer::Evaluate(const ImageDataset& data) {
  for (const auto& [name, t] : eval_->state()) LOOM_RETURN_IF_ERROR(eval_->SetState(name, train_->state().at(name)));
  const Shape image_shape = eval_->graph().type(eval_->graph().node(*eval_->graph().FindNode("image")).outputs[0]).shape;
  std::vector<int64_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  Tensor images = Tensor::Zeros(image_shape, DType::kF32);
  Tensor labels = Tensor::Zeros({batch_}, DType::kI64);
  EvalReport r;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < data.size(); begin += batch_) {
    const int64_t count = std::min(batch_, data.size() - begin);
    GatherBatch(data, order, begin, count, &images, &labels);
    LOOM_ASSIGN_OR_RETURN(auto out, eval_->Run({{"image", images}, {"label", labels}}));
    const Tensor& logits = out["logits"];
    const int64_t classes = logits.shape()[1];
    const float* pl = logits.data<float>();
    for (int64_t i = 0; i < count; ++i) {
      const float* row = pl + i * classes;
      int64_t best = std::max_element(row, row + classes) - row;
      correct += best == labels.data<int64_t>()[i];
    }
    // The loss is the mean over the real rows (padding is ignored).
    loss_sum += out["loss"].ScalarAt(0) * static_cast<double>(count);
  }
  r.samples = data.size();
  r.loss = loss_sum / std::max<int64_t>(1, r.samples);
  r.accuracy = static_cast<double>(correct) / std::max<int64_t>(1, r.samples);
  return r;
}

}  // namespace loom
