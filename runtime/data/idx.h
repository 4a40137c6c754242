// Readers for the IDX format of MNIST and Fashion-MNIST (gzip or raw).
#pragma once

#include <string>

#include "core/tensor.h"

namespace loom {

// Images as f32 in [0, 1], shape [N, rows, cols]. Errors name the file and
// what is wrong (missing, bad magic number, truncated).
StatusOr<Tensor> ReadIdxImages(const std::string& path);
// Labels as i64, shape [N].
StatusOr<Tensor> ReadIdxLabels(const std::string& path);

struct ImageDataset {
  Tensor images;  // [N, 1, H, W] f32, normalised with the training set's mean and std
  Tensor labels;  // [N] i64
  int64_t num_classes = 10;
  int64_t size() const { return labels.numel(); }
};

// The Debian package dataset-fashion-mnist installs the files here.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// split: "train" (60k) or "test" (10k). Checks that image and label counts
// agree. Normalisation uses the training set's statistics for both splits
// (mean 0.2860, std 0.3530).
StatusOr<ImageDataset> LoadFashionMnist(const std::string& dir, const std::string& split);

}  // namespace loom
