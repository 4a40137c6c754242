#include "train/data/dataset.h"

#include <algorithm>
#include <cmath>

#include "train/data/file_io.h"

namespace loom {

std::string ExampleSpec::ToString() const { return StrCat(shape.ToString(), " ", DTypeName(dtype)); }

StatusOr<std::shared_ptr<ByteImageDataset>> ByteImageDataset::Create(const Shape& image_shape,
                                                                     std::vector<uint8_t> pixels,
                                                                     std::vector<uint8_t> labels, int64_t num_classes) {
  // The shape and counts may come from a file header: no product may wrap.
  int64_t per_image = 0;
  if (image_shape.rank() == 3 && !CheckedProduct(image_shape.dims(), &per_image))
    return InvalidArgument("images of ", image_shape.ToString(), " have more than 2^63 bytes each");
  if (image_shape.rank() != 3 || per_image <= 0)
    return InvalidArgument("images must have a non-empty shape [C, H, W], got ", image_shape.ToString());
  if (num_classes < 1 || num_classes > 256)
    return InvalidArgument("byte labels allow 1 to 256 classes, got ", num_classes);
  int64_t need = 0;
  const bool fits = CheckedProduct({static_cast<int64_t>(labels.size()), per_image}, &need);
  if (!fits || static_cast<uint64_t>(need) != pixels.size())
    return InvalidArgument(labels.size(), " labels need ", labels.size(), " images of ", image_shape.ToString(), " (",
                           fits ? StrCat(need, " bytes") : std::string("more than 2^63 bytes"), "), got ",
                           pixels.size(), " bytes");
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= num_classes)
      return InvalidArgument("label ", int{labels[i]}, " of example ", i, " is not in [0, ", num_classes, ")");
  return std::shared_ptr<ByteImageDataset>(
      new ByteImageDataset(image_shape, std::move(pixels), std::move(labels), num_classes));
}

void ByteImageDataset::Get(int64_t index, void* input, int64_t* target) const {
  const int64_t n = image_shape_.numel();
  const uint8_t* src = pixels(index);
  float* dst = static_cast<float*>(input);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * (1.0f / 255.0f);
  *target = labels_[index];
}

namespace {

class SlicedDataset final : public Dataset {
 public:
  SlicedDataset(std::shared_ptr<const Dataset> base, int64_t begin, int64_t end)
      : base_(std::move(base)), begin_(begin), size_(end - begin) {}
  int64_t size() const override { return size_; }
  ExampleSpec input_spec() const override { return base_->input_spec(); }
  ExampleSpec target_spec() const override { return base_->target_spec(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  int64_t input_vocabulary() const override { return base_->input_vocabulary(); }
  void Get(int64_t index, void* input, int64_t* target) const override { base_->Get(begin_ + index, input, target); }

 private:
  std::shared_ptr<const Dataset> base_;
  int64_t begin_, size_;
};

}  // namespace

StatusOr<std::shared_ptr<const Dataset>> SliceDataset(std::shared_ptr<const Dataset> base, int64_t begin, int64_t end) {
  if (!base) return InvalidArgument("SliceDataset: no dataset");
  if (begin < 0 || begin >= end || end > base->size())
    return InvalidArgument("SliceDataset: examples [", begin, ", ", end, ") are not a non-empty part of a dataset of ",
                           base->size(), " examples");
  return std::shared_ptr<const Dataset>(std::make_shared<SlicedDataset>(std::move(base), begin, end));
}

StatusOr<ChannelStats> ComputeChannelStats(const Dataset& data) {
  const ExampleSpec in = data.input_spec();
  if (in.dtype != DType::kF32 || in.shape.rank() != 3)
    return InvalidArgument("channel statistics need f32 images [C, H, W], the dataset's inputs are ", in.ToString());
  if (data.size() == 0) return InvalidArgument("channel statistics of an empty dataset");
  const int64_t channels = in.shape[0], plane = in.shape[1] * in.shape[2];
  std::vector<float> image(in.shape.numel());
  std::vector<int64_t> target(data.target_spec().shape.numel());
  // Sums in double: 50k CIFAR images are 51M values per channel.
  std::vector<double> sum(channels, 0.0), sum_sq(channels, 0.0);
  for (int64_t i = 0; i < data.size(); ++i) {
    data.Get(i, image.data(), target.data());
    for (int64_t c = 0; c < channels; ++c) {
      const float* p = image.data() + c * plane;
      double s = 0, s2 = 0;
      for (int64_t j = 0; j < plane; ++j) {
        s += p[j];
        s2 += static_cast<double>(p[j]) * p[j];
      }
      sum[c] += s;
      sum_sq[c] += s2;
    }
  }
  ChannelStats stats;
  const double count = static_cast<double>(data.size()) * static_cast<double>(plane);
  for (int64_t c = 0; c < channels; ++c) {
    const double mean = sum[c] / count;
    stats.mean.push_back(static_cast<float>(mean));
    stats.std.push_back(static_cast<float>(std::sqrt(std::max(0.0, sum_sq[c] / count - mean * mean))));
  }
  return stats;
}

}  // namespace loom
