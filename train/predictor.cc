#include "train/predictor.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>

#include "core/thread_pool.h"
#include "graph/dce.h"
#include "graph/model.h"
#include "runtime/executor.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/data_spec.h"
#include "train/checkpoint/replica_export.h"
#include "train/config/replicas.h"
#include "train/config/train_config.h"
#include "train/data/dataset.h"
#include "train/data/loader.h"
#include "train/run_parts.h"

namespace loom::train {

namespace {

// The examples of one Predict call as a dataset, so that the DataLoader
// batches, pads and normalises them exactly as the run's evaluation loader
// did (Trainer::Evaluate's logits, bit for bit). Targets are never read.
class ExampleDataset : public Dataset {
 public:
  ExampleDataset(const Tensor& input, const models::DataSpec& spec)
      : input_(input), spec_(spec), row_bytes_(spec.input.numel() * DTypeSize(spec.input_dtype)) {}
  int64_t size() const override { return input_.shape()[0]; }
  ExampleSpec input_spec() const override { return {spec_.input, spec_.input_dtype}; }
  ExampleSpec target_spec() const override { return {spec_.target, DType::kI64}; }
  int64_t num_classes() const override { return spec_.num_classes; }
  void Get(int64_t index, void* input, int64_t* target) const override {
    std::memcpy(input, static_cast<const char*>(input_.raw_data()) + index * row_bytes_, row_bytes_);
    std::fill(target, target + spec_.target.numel(), 0);
  }

 private:
  Tensor input_;
  const models::DataSpec& spec_;
  size_t row_bytes_;
};

Shape WithBatch(int64_t batch, const Shape& example) {
  std::vector<int64_t> dims = {batch};
  dims.insert(dims.end(), example.dims().begin(), example.dims().end());
  return Shape(dims);
}

// What a checkpoint's examples are: as recorded, or (checkpoints from before
// the record) as the config's data block loads them.
StatusOr<RecordedData> DataOf(const Checkpoint& ckpt, const proto::TrainConfig& config) {
  LOOM_ASSIGN_OR_RETURN(std::optional<RecordedData> recorded, ReadDataSpec(ckpt));
  if (recorded) return *recorded;
  auto data = LoadDatasets(config.data());
  if (!data.ok())
    return data.status().WithContext(StrCat(ckpt.source, " records no data spec, and its config's data block (",
                                            config.data().dataset(), ") does not load"));
  const DataLoaderOptions eval = LoaderOptions(config, *data, /*training=*/false);
  return RecordedData{DataSpecOf(*data->train), eval.mean, eval.std};
}

}  // namespace

class PredictorImpl {
 public:
  static StatusOr<std::unique_ptr<PredictorImpl>> Load(const std::string& path, const PredictorOptions& options);

  StatusOr<Tensor> Predict(const Tensor& input) const;
  const models::DataSpec& data() const { return data_.spec; }
  const proto::TrainConfig& config() const { return config_; }
  int64_t batch_size() const { return batch_; }

 private:
  PredictorImpl() = default;
  // The model of `config` (the checkpoint's own, or its replica's) with the
  // checkpoint's tensors.
  Status Init(const Checkpoint& ckpt, proto::TrainConfig config, const PredictorOptions& options);
  StatusOr<std::unique_ptr<Executor>> NewExecutor() const;
  // An executor for one call: an idle one, or a new one when every one is busy.
  StatusOr<std::unique_ptr<Executor>> Acquire() const;
  void Release(std::unique_ptr<Executor> executor) const;
  Status CheckInput(const Tensor& input) const;

  std::string source_;  // the file (and replica) served, for messages
  proto::TrainConfig config_;
  RecordedData data_;
  DataLoaderOptions loader_;
  int64_t batch_ = 0;
  Graph graph_;                          // the evaluation graph, "input" -> "logits"
  std::map<std::string, Tensor> state_;  // its parameters and buffers
  std::unique_ptr<ThreadPool> pool_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<Executor>> idle_;
};

StatusOr<std::unique_ptr<PredictorImpl>> PredictorImpl::Load(const std::string& path, const PredictorOptions& options) {
  LOOM_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(path));
  if (ckpt.config_text.empty())
    return FailedPrecondition(path, " holds no training config, which the Predictor rebuilds the model from (",
                              "loom train and loom::Trainer write it into every checkpoint)");
  auto config = ParseTrainConfig(ckpt.config_text, path + " (its config)");
  if (!config.ok()) return config.status().WithContext("reading the config stored in " + path);
  if (IsFused(*config)) {
    auto exported = ExportReplica(ckpt, options.replica, "PredictorOptions::replica");
    if (!exported.ok()) {
      if (options.replica == -1)
        return exported.status().WithContext(StrCat(path, " is a fused run's checkpoint: set PredictorOptions::replica"));
      return exported.status();
    }
    ckpt = std::move(exported->checkpoint);
    config = ParseTrainConfig(ckpt.config_text, ckpt.source + " (its config)");
    if (!config.ok()) return config.status();
  } else if (options.replica != -1) {
    return InvalidArgument("PredictorOptions::replica ", options.replica, ": ", path,
                           " is a single model's checkpoint (its config describes no replicas); leave replica unset (-1)");
  }
  std::unique_ptr<PredictorImpl> impl(new PredictorImpl);
  LOOM_RETURN_IF_ERROR(impl->Init(ckpt, std::move(*config), options));
  return impl;
}

Status PredictorImpl::Init(const Checkpoint& ckpt, proto::TrainConfig config, const PredictorOptions& options) {
  source_ = ckpt.source;
  config_ = std::move(config);
  if (options.batch_size < 0) return InvalidArgument("PredictorOptions::batch_size must be >= 0, got ", options.batch_size);
  LOOM_RETURN_IF_ERROR(CheckThreadCount(options.threads).WithContext("PredictorOptions::threads"));
  batch_ = options.batch_size > 0 ? options.batch_size : config_.data().eval_batch_size();
  if (batch_ < 1) return InvalidArgument(source_, ": the config's data.eval_batch_size is ", batch_,
                                         "; set PredictorOptions::batch_size");
  LOOM_ASSIGN_OR_RETURN(data_, DataOf(ckpt, config_));
  loader_.batch_size = batch_;
  loader_.shuffle = false;
  loader_.drop_last = false;
  loader_.prefetch = 0;  // batches are made on the calling thread
  loader_.mean = data_.mean;
  loader_.std = data_.std;

  // The evaluation graph as the trainer builds it, less the loss: what
  // reaches "logits" from "input".
  const std::string& name = config_.model().name();
  Model m;
  m.set_training(false);
  LOOM_RETURN_IF_ERROR(BuildConfigModel(m, config_, data_.spec, batch_, options.network).WithContext(source_));
  graph_ = m.graph();
  for (auto it = graph_.outputs().begin(); it != graph_.outputs().end();)
    it = it->first == "logits" ? std::next(it) : graph_.outputs().erase(it);
  DceOptions dce;
  dce.remove_unused_sources = true;
  LOOM_RETURN_IF_ERROR(DeadCodeElimination(dce).Run(&graph_).status());
  if (graph_.FindNode("target"))
    return Unimplemented(source_, ": model ", name, "'s logits read the targets (teacher forcing); the Predictor ",
                         "serves models whose logits depend on the input alone");

  for (const Node& n : graph_.nodes()) {
    if (!IsStateOp(n.op)) continue;
    const TensorType& want = graph_.type(n.outputs[0]);
    auto it = ckpt.tensors.find(n.name);
    if (it == ckpt.tensors.end())
      return InvalidArgument(source_, ": no tensor '", n.name, "' (", want.ToString(), ") for the model's ", n.op);
    if (it->second.shape() != want.shape || it->second.dtype() != want.dtype)
      return InvalidArgument(source_, ": tensor '", n.name, "' is ", it->second.shape().ToString(), " ",
                             DTypeName(it->second.dtype()), ", the model's ", n.op, " is ", want.ToString());
    state_[n.name] = it->second;
  }
  LOOM_ASSIGN_OR_RETURN(pool_, ThreadPool::Create(std::max(1, options.threads)));
  // The first executor now: a model the CPU cannot run fails Load, not Predict.
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Executor> first, NewExecutor());
  idle_.push_back(std::move(first));
  return Status::Ok();
}

StatusOr<std::unique_ptr<Executor>> PredictorImpl::NewExecutor() const {
  ExecutorOptions eo;
  eo.pool = pool_.get();
  eo.seed = config_.seed();
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec, Executor::Create(graph_, eo));
  for (const auto& [name, t] : state_) LOOM_RETURN_IF_ERROR(exec->SetState(name, t));
  return exec;
}

StatusOr<std::unique_ptr<Executor>> PredictorImpl::Acquire() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<Executor> exec = std::move(idle_.back());
      idle_.pop_back();
      return exec;
    }
  }
  return NewExecutor();  // outside the lock: other callers keep going meanwhile
}

void PredictorImpl::Release(std::unique_ptr<Executor> executor) const {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(executor));
}

Status PredictorImpl::CheckInput(const Tensor& input) const {
  const Shape want = WithBatch(-1, data_.spec.input);
  auto expected = [&] {
    std::string dims = "[N";
    for (int64_t d : data_.spec.input.dims()) dims += StrCat(", ", d);
    return StrCat(dims, "] ", DTypeName(data_.spec.input_dtype), " (N examples of ", data_.spec.input.ToString(), " ",
                  DTypeName(data_.spec.input_dtype), ")");
  };
  if (!input.defined()) return InvalidArgument("Predict: the input tensor is empty (default-constructed); expected ", expected());
  bool fits = input.dtype() == data_.spec.input_dtype && input.shape().rank() == want.rank();
  for (int i = 1; fits && i < want.rank(); ++i) fits = input.shape()[i] == want[i];
  if (!fits)
    return InvalidArgument("Predict: input is ", input.shape().ToString(), " ", DTypeName(input.dtype()), ", expected ",
                           expected());
  return Status::Ok();
}

StatusOr<Tensor> PredictorImpl::Predict(const Tensor& given) const {
  LOOM_RETURN_IF_ERROR(CheckInput(given));
  Tensor input = given;
  if (input.device() != Device::Cpu()) {
    LOOM_ASSIGN_OR_RETURN(input, given.To(Device::Cpu()));
  }
  const int64_t n = input.shape()[0];
  std::vector<int64_t> out_dims = WithBatch(n, data_.spec.target).dims();
  out_dims.push_back(data_.spec.num_classes);
  Tensor out = Tensor::Zeros(Shape(out_dims), DType::kF32);
  if (n == 0) return out;
  const size_t example_bytes = out.nbytes() / static_cast<size_t>(n);

  LOOM_ASSIGN_OR_RETURN(auto loader, DataLoader::Create(std::make_shared<ExampleDataset>(input, data_.spec), loader_));
  LOOM_RETURN_IF_ERROR(loader->Start(0));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec, Acquire());
  Status status;
  int64_t done = 0;
  for (Batch batch;;) {
    StatusOr<bool> more = loader->Next(&batch);
    if (!more.ok() || !*more) {
      status = more.status();
      break;
    }
    StatusOr<std::map<std::string, Tensor>> result = exec->Run({{"input", batch.input}});
    if (!result.ok()) {
      status = result.status().WithContext(StrCat("Predict: examples ", done, " to ", done + batch.valid - 1));
      break;
    }
    std::memcpy(static_cast<char*>(out.raw_data()) + done * example_bytes, result->at("logits").raw_data(),
                static_cast<size_t>(batch.valid) * example_bytes);
    done += batch.valid;
  }
  Release(std::move(exec));  // a failed run leaves the executor reusable: its state is only read
  LOOM_RETURN_IF_ERROR(status);
  return out;
}

}  // namespace loom::train

namespace loom {

Predictor::Predictor(std::unique_ptr<train::PredictorImpl> impl) : impl_(std::move(impl)) {}
Predictor::~Predictor() = default;

StatusOr<std::unique_ptr<Predictor>> Predictor::Load(const std::string& checkpoint, PredictorOptions options) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<train::PredictorImpl> impl, train::PredictorImpl::Load(checkpoint, options));
  return std::unique_ptr<Predictor>(new Predictor(std::move(impl)));
}

StatusOr<Tensor> Predictor::Predict(const Tensor& input) const { return impl_->Predict(input); }

StatusOr<std::vector<int64_t>> Predictor::Classify(const Tensor& input) const {
  LOOM_ASSIGN_OR_RETURN(Tensor logits, impl_->Predict(input));
  const int64_t classes = data().num_classes;
  const int64_t rows = logits.numel() / classes;
  std::vector<int64_t> out(static_cast<size_t>(rows));
  const float* p = logits.data<float>();
  for (int64_t i = 0; i < rows; ++i, p += classes) out[i] = std::max_element(p, p + classes) - p;
  return out;
}

const models::DataSpec& Predictor::data() const { return impl_->data(); }
int64_t Predictor::batch_size() const { return impl_->batch_size(); }
const proto::TrainConfig& Predictor::config() const { return impl_->config(); }

}  // namespace loom
