#include "train/data/loader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/rng.h"

namespace loom {

namespace {

// Stream tags: keep the loader's draws apart from other users of the seed.
constexpr uint64_t kShuffleStream = 0x5348554646ull;  // "SHUFF"
constexpr uint64_t kAugmentStream = 0x4155474dull;    // "AUGM"

}  // namespace

StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(std::shared_ptr<const Dataset> data,
                                                         const DataLoaderOptions& options) {
  if (!data) return InvalidArgument("DataLoader: no dataset");
  std::unique_ptr<DataLoader> loader(new DataLoader(std::move(data), options));
  LOOM_RETURN_IF_ERROR(loader->Init());
  if (options.prefetch > 0) loader->producer_ = std::thread([l = loader.get()] { l->ProducerLoop(); });
  return loader;
}

Status DataLoader::Init() {
  const DataLoaderOptions& o = options_;
  const int64_t n = data_->size();
  example_in_ = data_->input_spec();
  const ExampleSpec target = data_->target_spec();
  if (n < 1) return InvalidArgument("DataLoader: the dataset is empty");
  if (o.batch_size < 1) return InvalidArgument("DataLoader: batch_size must be >= 1, got ", o.batch_size);
  if (o.prefetch < 0) return InvalidArgument("DataLoader: prefetch must be >= 0, got ", o.prefetch);
  if (o.drop_last && n < o.batch_size)
    return InvalidArgument("DataLoader: batch_size ", o.batch_size, " is larger than the dataset (", n,
                           " examples) and drop_last is set, so an epoch would have no batch");
  if (example_in_.dtype != DType::kF32 && example_in_.dtype != DType::kI64)
    return InvalidArgument("DataLoader: inputs must be f32 or i64, the dataset's are ", example_in_.ToString());
  if (target.dtype != DType::kI64)
    return InvalidArgument("DataLoader: targets must be i64, the dataset's are ", target.ToString());

  const bool crop = o.crop_height != 0 || o.crop_width != 0 || o.crop_padding != 0;
  const bool normalize = !o.mean.empty() || !o.std.empty();
  example_out_ = example_in_.shape;
  if (crop || o.random_flip || normalize) {
    const Shape& s = example_in_.shape;
    if (example_in_.dtype != DType::kF32 || s.rank() != 3)
      return InvalidArgument(
          "DataLoader: crop, flip and normalisation apply to f32 images [C, H, W], the dataset's "
          "inputs are ",
          example_in_.ToString());
    if (o.crop_height < 0 || o.crop_width < 0 || o.crop_padding < 0)
      return InvalidArgument("DataLoader: crop_height, crop_width and crop_padding must be >= 0, got ", o.crop_height,
                             ", ", o.crop_width, ", ", o.crop_padding);
    const int64_t out_h = o.crop_height ? o.crop_height : s[1], out_w = o.crop_width ? o.crop_width : s[2];
    if (out_h > s[1] + 2 * o.crop_padding || out_w > s[2] + 2 * o.crop_padding)
      return InvalidArgument("DataLoader: crop ", out_h, "x", out_w, " is larger than the image ", s.ToString(),
                             " padded by ", o.crop_padding, " on each side");
    example_out_ = Shape{s[0], out_h, out_w};
    augment_ = crop || o.random_flip;
    if (normalize) {
      const auto channels = static_cast<size_t>(s[0]);
      if (o.mean.size() != o.std.size() || (o.mean.size() != 1 && o.mean.size() != channels))
        return InvalidArgument("DataLoader: mean and std need 1 or ", channels, " values each (one per channel of ",
                               s.ToString(), "), got ", o.mean.size(), " and ", o.std.size());
      for (size_t c = 0; c < channels; ++c) {
        const float m = o.mean[o.mean.size() == 1 ? 0 : c], sd = o.std[o.std.size() == 1 ? 0 : c];
        if (!(sd > 0) || !std::isfinite(sd) || !std::isfinite(m))
          return InvalidArgument("DataLoader: channel ", c, " has mean ", m, " and std ", sd,
                                 "; std must be finite and > 0");
        mean_.push_back(m);
        inv_std_.push_back(1.0f / sd);
      }
    }
  }

  std::vector<int64_t> in_dims{o.batch_size}, target_dims{o.batch_size};
  in_dims.insert(in_dims.end(), example_out_.dims().begin(), example_out_.dims().end());
  target_dims.insert(target_dims.end(), target.shape.dims().begin(), target.shape.dims().end());
  input_shape_ = Shape(in_dims);
  target_shape_ = Shape(target_dims);
  input_dtype_ = example_in_.dtype;
  batches_per_epoch_ = o.drop_last ? n / o.batch_size : (n + o.batch_size - 1) / o.batch_size;
  return Status::Ok();
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
}

std::vector<int64_t> DataLoader::EpochOrder(int64_t epoch) const {
  std::vector<int64_t> order(data_->size());
  std::iota(order.begin(), order.end(), 0);
  if (!options_.shuffle) return order;
  Rng rng = Rng::Stream(options_.seed, kShuffleStream, static_cast<uint64_t>(epoch));
  for (int64_t i = static_cast<int64_t>(order.size()) - 1; i > 0; --i)
    std::swap(order[i], order[rng.UniformInt(i + 1)]);
  return order;
}

Status DataLoader::Start(int64_t epoch, int64_t skip_batches) {
  if (epoch < 0) return InvalidArgument("DataLoader::Start: epoch must be >= 0, got ", epoch);
  if (skip_batches < 0 || skip_batches > batches_per_epoch_)
    return InvalidArgument("DataLoader::Start: skip_batches ", skip_batches, " is outside [0, ", batches_per_epoch_,
                           "] (batches per epoch)");
  auto order = std::make_shared<const std::vector<int64_t>>(EpochOrder(epoch));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
    started_ = true;
    epoch_ = epoch;
    order_ = std::move(order);
    next_ = produce_next_ = skip_batches;
    queue_.clear();
  }
  cv_.notify_all();
  return Status::Ok();
}

StatusOr<bool> DataLoader::Next(Batch* batch) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) return FailedPrecondition("DataLoader::Next called before Start");
  if (next_ >= batches_per_epoch_) return false;
  if (options_.prefetch == 0) {
    const int64_t epoch = epoch_, index = next_++;
    std::shared_ptr<const std::vector<int64_t>> order = order_;
    lock.unlock();
    LOOM_ASSIGN_OR_RETURN(*batch, MakeBatch(epoch, *order, index));
    return true;
  }
  if (queue_.empty()) {
    const auto start = std::chrono::steady_clock::now();
    cv_.wait(lock, [this] { return !queue_.empty(); });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  StatusOr<Batch> ready = std::move(queue_.front());
  queue_.pop_front();
  ++next_;
  lock.unlock();
  cv_.notify_all();  // room in the queue
  if (!ready.ok()) return ready.status();
  *batch = std::move(ready).value();
  return true;
}

void DataLoader::ProducerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] {
      return stop_ || (started_ && produce_next_ < batches_per_epoch_ &&
                       static_cast<int64_t>(queue_.size()) < options_.prefetch);
    });
    if (stop_) return;
    const uint64_t generation = generation_;
    const int64_t epoch = epoch_, index = produce_next_++;
    std::shared_ptr<const std::vector<int64_t>> order = order_;
    lock.unlock();
    StatusOr<Batch> batch = MakeBatch(epoch, *order, index);
    lock.lock();
    if (generation != generation_) continue;  // Start was called meanwhile: this batch is stale
    queue_.push_back(std::move(batch));
    cv_.notify_all();
  }
}

int64_t DataLoader::ready_batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

double DataLoader::wait_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wait_seconds_;
}

StatusOr<Batch> DataLoader::MakeBatch(int64_t epoch, const std::vector<int64_t>& order, int64_t index) const {
  const int64_t batch_size = options_.batch_size;
  const int64_t begin = index * batch_size;
  const int64_t count = std::min(batch_size, data_->size() - begin);
  Batch b;
  b.epoch = epoch;
  b.index = index;
  b.valid = count;
  LOOM_ASSIGN_OR_RETURN(b.input, Tensor::Empty(input_shape_, input_dtype_));
  LOOM_ASSIGN_OR_RETURN(b.target, Tensor::Empty(target_shape_, DType::kI64));
  const size_t row_bytes = b.input.nbytes() / static_cast<size_t>(batch_size);
  const int64_t target_row = target_shape_.numel() / batch_size;
  char* input = static_cast<char*>(b.input.raw_data());
  int64_t* target = b.target.data<int64_t>();
  std::vector<float> scratch(augment_ ? example_in_.shape.numel() : 0);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t example = order[begin + r];
    b.examples.push_back(example);
    char* row = input + r * row_bytes;
    if (augment_) {
      data_->Get(example, scratch.data(), target + r * target_row);
      Augment(epoch, example, scratch.data(), reinterpret_cast<float*>(row));
    } else {
      data_->Get(example, row, target + r * target_row);
    }
    if (!mean_.empty()) Normalize(reinterpret_cast<float*>(row));
  }
  std::memset(input + count * row_bytes, 0, (batch_size - count) * row_bytes);
  std::fill(target + count * target_row, target + batch_size * target_row, options_.pad_target);
  return b;
}

void DataLoader::Augment(int64_t epoch, int64_t example, const float* src, float* dst) const {
  const Shape& in = example_in_.shape;
  const int64_t channels = in[0], h = in[1], w = in[2];
  const int64_t out_h = example_out_[1], out_w = example_out_[2], pad = options_.crop_padding;
  // One stream per (epoch, example): the draws do not depend on which
  // thread makes the batch or where in the batch the example lands.
  Rng rng = Rng::Stream(Rng::Stream(options_.seed, kAugmentStream, static_cast<uint64_t>(epoch)).NextU64(),
                        static_cast<uint64_t>(example));
  // Offsets of the crop window in the padded image, as torchvision draws
  // them: uniform in [0, padded - crop].
  const int64_t top = rng.UniformInt(h + 2 * pad - out_h + 1);
  const int64_t left = rng.UniformInt(w + 2 * pad - out_w + 1);
  const bool flip = options_.random_flip && rng.Uniform() < 0.5;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t y = 0; y < out_h; ++y) {
      float* out = dst + (c * out_h + y) * out_w;
      const int64_t sy = y + top - pad;
      if (sy < 0 || sy >= h) {
        std::fill(out, out + out_w, 0.0f);
        continue;
      }
      // Output x reads source column first + step * x; columns outside the
      // image (the zero padding) bound the range [x0, x1) that reads pixels.
      const float* row = src + (c * h + sy) * w;
      const int64_t step = flip ? -1 : 1, first = (flip ? out_w - 1 : 0) + left - pad;
      const int64_t x0 = std::clamp<int64_t>(flip ? first - w + 1 : -first, 0, out_w);
      const int64_t x1 = std::clamp<int64_t>(flip ? first + 1 : w - first, x0, out_w);
      std::fill(out, out + x0, 0.0f);
      for (int64_t x = x0; x < x1; ++x) out[x] = row[first + step * x];
      std::fill(out + x1, out + out_w, 0.0f);
    }
  }
}

void DataLoader::Normalize(float* example) const {
  const int64_t channels = example_out_[0], plane = example_out_[1] * example_out_[2];
  for (int64_t c = 0; c < channels; ++c) {
    float* p = example + c * plane;
    const float mean = mean_[c], inv_std = inv_std_[c];
    for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - mean) * inv_std;
  }
}

}  // namespace loom
