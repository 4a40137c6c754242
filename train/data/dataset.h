// In-memory datasets: the interface a DataLoader draws examples from, and
// the byte-image dataset behind MNIST, Fashion-MNIST and CIFAR-10.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

namespace loom {

// The type of one example's input or target (no batch axis).
struct ExampleSpec {
  Shape shape;
  DType dtype = DType::kF32;
  std::string ToString() const;  // "[3, 32, 32] f32"
  bool operator==(const ExampleSpec& o) const { return shape == o.shape && dtype == o.dtype; }
};

// A fixed set of examples, immutable once built: Get is const and may be
// called from the loader's prefetch thread while the caller holds the
// dataset too.
//
// Inputs are f32 images [C, H, W] with pixels in [0, 1] (normalisation and
// augmentation are the loader's job, so datasets can keep bytes) or i64
// token ids [T]. Targets are i64: a class label [] or tokens [T].
class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  virtual ExampleSpec input_spec() const = 0;
  virtual ExampleSpec target_spec() const = 0;
  // Class labels are in [0, num_classes); for token data this is the
  // vocabulary size, the range of both input and target ids.
  virtual int64_t num_classes() const = 0;
  // Token inputs: their ids are in [0, input_vocabulary()). 0 for other data.
  virtual int64_t input_vocabulary() const { return 0; }

  // Writes example `index` (in [0, size())) into one batch slot: `input`
  // holds input_spec().shape.numel() elements of input_spec().dtype, `target`
  // target_spec().shape.numel() elements.
  virtual void Get(int64_t index, void* input, int64_t* target) const = 0;
};

// Images kept as bytes ([N, C, H, W] uint8, a quarter of the f32 size: 150 MB
// for CIFAR-10's 50k training images) with one byte label each; Get
// converts a pixel p to p / 255.
class ByteImageDataset : public Dataset {
 public:
  // Checks that pixels holds N images of `image_shape` ([C, H, W]) and that
  // every label is below num_classes; errors name the offending example.
  static StatusOr<std::shared_ptr<ByteImageDataset>> Create(const Shape& image_shape, std::vector<uint8_t> pixels,
                                                            std::vector<uint8_t> labels, int64_t num_classes);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  ExampleSpec input_spec() const override { return {image_shape_, DType::kF32}; }
  ExampleSpec target_spec() const override { return {Shape{}, DType::kI64}; }
  int64_t num_classes() const override { return num_classes_; }
  void Get(int64_t index, void* input, int64_t* target) const override;

  // The stored bytes of image `index` (image_shape().numel() of them).
  const uint8_t* pixels(int64_t index) const { return pixels_.data() + index * image_shape_.numel(); }
  int64_t label(int64_t index) const { return labels_[index]; }
  const Shape& image_shape() const { return image_shape_; }

 private:
  ByteImageDataset(const Shape& image_shape, std::vector<uint8_t> pixels, std::vector<uint8_t> labels,
                   int64_t num_classes)
      : image_shape_(image_shape), pixels_(std::move(pixels)), labels_(std::move(labels)), num_classes_(num_classes) {}

  Shape image_shape_;
  std::vector<uint8_t> pixels_;
  std::vector<uint8_t> labels_;
  int64_t num_classes_;
};

// Examples [begin, end) of `base` as a dataset of their own (sharing base's
// storage): a quick run on the first n examples, or a validation split held
// out of a training set. Errors name the range and the base's size.
StatusOr<std::shared_ptr<const Dataset>> SliceDataset(std::shared_ptr<const Dataset> base, int64_t begin, int64_t end);

// Per-channel mean and standard deviation of an image dataset's inputs (as
// Get returns them, so in [0, 1]) over all examples: the values for
// DataLoaderOptions::mean and std when a dataset has no published ones.
struct ChannelStats {
  std::vector<float> mean, std;
};
StatusOr<ChannelStats> ComputeChannelStats(const Dataset& data);

}  // namespace loom
