// CIFAR-10 in its binary distribution (cifar-10-batches-bin): files of
// records of 1 label byte followed by 3072 pixel bytes (the 1024 red, then
// green, then blue values of a 32x32 image, row-major).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "train/data/dataset.h"

namespace loom {

inline constexpr int64_t kCifar10RecordBytes = 1 + 3 * 32 * 32;

// Published per-channel statistics of the training set (R, G, B), for
// DataLoaderOptions::mean and std.
inline const std::vector<float> kCifar10Mean = {0.4914f, 0.4822f, 0.4465f};
inline const std::vector<float> kCifar10Std = {0.2470f, 0.2435f, 0.2616f};

// The records of `paths`, in order, as one dataset of [3, 32, 32] images
// and 10 classes. Errors name the file and the problem: missing, empty, a
// size that is not a multiple of 3073 bytes, a label above 9.
StatusOr<std::shared_ptr<ByteImageDataset>> LoadCifar10Files(const std::vector<std::string>& paths);

// split "train": dir/data_batch_1.bin .. data_batch_5.bin (50k images);
// split "test": dir/test_batch.bin (10k).
StatusOr<std::shared_ptr<ByteImageDataset>> LoadCifar10(const std::string& dir, const std::string& split);

}  // namespace loom
