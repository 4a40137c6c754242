// DataLoader: mini-batches from a Dataset, shuffled, augmented and
// normalised, prepared ahead on a background thread.
//
// Determinism: the order of epoch e is a pure function of (seed, e), and
// the augmentation of an example a pure function of (seed, e, its dataset
// index). So batches do not depend on prefetching or timing, and
// Start(e, k) reproduces batches k, k+1, ... of epoch e exactly, e.g. when a
// run resumes from a checkpoint taken after k steps of epoch e.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "train/data/dataset.h"

namespace loom {

struct DataLoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = true;
  uint64_t seed = 0;  // shuffling and augmentation

  // The last partial batch: dropped, or padded to batch_size. Padding rows
  // have zero inputs and targets equal to pad_target (CrossEntropy's default
  // ignore_index, so they add nothing to the loss); Batch::valid counts the
  // real rows.
  bool drop_last = true;
  int64_t pad_target = -100;

  // Image inputs ([C, H, W] f32) only. Per example, in torchvision's order:
  // random crop (RandomCrop(size, padding): zero-pad each side by
  // crop_padding pixels, then cut a crop_height x crop_width window at a
  // uniform random offset; 0 = keep the input's size), horizontal flip with
  // probability 1/2, then (x - mean[c]) / std[c]. Crop padding is 0 in pixel
  // space, before normalisation, as in torchvision. mean and std hold one
  // value per channel, or one for all channels; empty = no normalisation.
  int64_t crop_height = 0, crop_width = 0;
  int64_t crop_padding = 0;
  bool random_flip = false;
  std::vector<float> mean, std;

  // Batches prepared ahead on the loader's thread; 0 prepares each batch in
  // Next on the caller's thread.
  int prefetch = 2;
};

struct Batch {
  Tensor input;       // f32 [B, C, H, W] (after crop) or i64 tokens [B, T]
  Tensor target;      // i64 [B] labels or [B, T] tokens
  int64_t valid = 0;  // rows [0, valid) are examples, the rest padding
  int64_t epoch = 0;
  int64_t index = 0;              // the batch's position in its epoch
  std::vector<int64_t> examples;  // dataset indices of the valid rows
};

// One thread drives a loader: Start and Next must not race each other.
class DataLoader {
 public:
  // Errors: an empty dataset, batch_size < 1, drop_last with fewer examples
  // than one batch, augmentation or normalisation of inputs that are not
  // images, a crop larger than the padded image, mean/std sizes that do not
  // match the channels, a std <= 0.
  static StatusOr<std::unique_ptr<DataLoader>> Create(std::shared_ptr<const Dataset> data,
                                                      const DataLoaderOptions& options);
  // Stops the prefetch thread (it finishes at most the batch in hand).
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Begins epoch `epoch` at batch `skip_batches` (0 <= skip_batches <=
  // batches_per_epoch()), dropping whatever was prepared for an earlier
  // Start.
  Status Start(int64_t epoch, int64_t skip_batches = 0);
  // The next batch of the current epoch into *batch: true, or false at the
  // epoch's end. FailedPrecondition before the first Start.
  StatusOr<bool> Next(Batch* batch);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  const Shape& input_shape() const { return input_shape_; }    // [B, ...] as batches have it
  const Shape& target_shape() const { return target_shape_; }  // [B] or [B, T]
  DType input_dtype() const { return input_dtype_; }
  const Dataset& dataset() const { return *data_; }

  // Example indices in the order epoch `epoch` visits them (identity
  // without shuffle); a pure function of (seed, epoch).
  std::vector<int64_t> EpochOrder(int64_t epoch) const;
  // Batches ready in the prefetch queue now (at most options.prefetch).
  int64_t ready_batches() const;
  // Total time Next has spent waiting for the prefetch thread: input-bound
  // training shows here.
  double wait_seconds() const;

 private:
  DataLoader(std::shared_ptr<const Dataset> data, const DataLoaderOptions& options)
      : data_(std::move(data)), options_(options) {}
  // Checks the options against the dataset and derives the batch shapes.
  Status Init();
  // Batch `index` of an epoch whose order is `order`; const and
  // self-contained, so the prefetch thread can run it.
  StatusOr<Batch> MakeBatch(int64_t epoch, const std::vector<int64_t>& order, int64_t index) const;
  // Random crop and flip of one example from `src` ([C, H, W] as the
  // dataset gives it) into `dst` ([C, crop H, crop W]).
  void Augment(int64_t epoch, int64_t example, const float* src, float* dst) const;
  // (x - mean[c]) / std[c] in place over one example.
  void Normalize(float* example) const;
  void ProducerLoop();

  std::shared_ptr<const Dataset> data_;
  DataLoaderOptions options_;
  ExampleSpec example_in_;             // what the dataset gives
  Shape example_out_;                  // one row of a batch (the example after cropping)
  bool augment_ = false;               // crop or flip: examples go through a scratch buffer
  std::vector<float> mean_, inv_std_;  // per channel; empty = no normalisation
  Shape input_shape_, target_shape_;
  DType input_dtype_ = DType::kF32;
  int64_t batches_per_epoch_ = 0;

  // State of the current epoch, guarded by mu_ (the producer reads it).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  int64_t epoch_ = 0;
  std::shared_ptr<const std::vector<int64_t>> order_;
  int64_t next_ = 0;          // the next batch Next returns
  int64_t produce_next_ = 0;  // the next batch the producer makes
  uint64_t generation_ = 0;   // bumped by Start: batches of older ones are dropped
  std::deque<StatusOr<Batch>> queue_;
  bool stop_ = false;
  double wait_seconds_ = 0;
  std::thread producer_;
};

}  // namespace loom
