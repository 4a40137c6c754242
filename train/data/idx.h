// Readers for the IDX format of MNIST and Fashion-MNIST (gzip or raw).
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"
#include "train/data/dataset.h"

namespace loom {

// The Debian package dataset-fashion-mnist installs the files here.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Published per-channel statistics of the training sets, for
// DataLoaderOptions::mean and std.
inline constexpr float kFashionMnistMean = 0.2860f, kFashionMnistStd = 0.3530f;
inline constexpr float kMnistMean = 0.1307f, kMnistStd = 0.3081f;

// An IDX image file ([N, H, W] bytes, magic 0x00000803) and label file ([N]
// bytes, magic 0x00000801) as one dataset of [1, H, W] images. Errors name
// the file and the problem: missing, bad magic number, truncated, trailing
// bytes, a label outside [0, num_classes), image and label counts that
// differ.
StatusOr<std::shared_ptr<ByteImageDataset>> LoadIdxDataset(const std::string& images_path,
                                                           const std::string& labels_path, int64_t num_classes = 10);

// MNIST or Fashion-MNIST (the same file names) from `dir`. split: "train"
// reads train-{images-idx3,labels-idx1}-ubyte, "test" reads t10k-...; each
// file may be gzipped (a ".gz" name is preferred when both exist).
StatusOr<std::shared_ptr<ByteImageDataset>> LoadMnist(const std::string& dir, const std::string& split);
// The image file LoadMnist reads for `split`, for messages about it.
std::string MnistImagesPath(const std::string& dir, const std::string& split);

// Images as f32 in [0, 1], shape [N, rows, cols].
StatusOr<Tensor> ReadIdxImages(const std::string& path);
// Labels as i64, shape [N].
StatusOr<Tensor> ReadIdxLabels(const std::string& path);

}  // namespace loom
