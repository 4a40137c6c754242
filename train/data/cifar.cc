#include "train/data/cifar.h"

#include "train/data/file_io.h"

namespace loom {

StatusOr<std::shared_ptr<ByteImageDataset>> LoadCifar10Files(const std::vector<std::string>& paths) {
  if (paths.empty()) return InvalidArgument("CIFAR-10: no files given");
  constexpr int64_t kPixels = kCifar10RecordBytes - 1;
  std::vector<uint8_t> pixels, labels;
  for (const std::string& path : paths) {
    LOOM_ASSIGN_OR_RETURN(std::vector<uint8_t> file, ReadFileBytes(path));
    const int64_t bytes = static_cast<int64_t>(file.size());
    if (bytes == 0) return DataLoss(path, ": empty file (no CIFAR-10 records)");
    if (bytes % kCifar10RecordBytes != 0)
      return DataLoss(path, ": size ", bytes, " bytes is not a multiple of the CIFAR-10 record size ",
                      kCifar10RecordBytes, " (", bytes / kCifar10RecordBytes, " records and ",
                      bytes % kCifar10RecordBytes, " bytes left over: truncated, or not a CIFAR-10 binary file)");
    const int64_t records = bytes / kCifar10RecordBytes;
    pixels.reserve(pixels.size() + records * kPixels);
    labels.reserve(labels.size() + records);
    for (int64_t r = 0; r < records; ++r) {
      const uint8_t* rec = file.data() + r * kCifar10RecordBytes;
      if (rec[0] > 9)
        return DataLoss(path, ": label ", int{rec[0]}, " of record ", r, " (byte offset ", r * kCifar10RecordBytes,
                        ") is not in [0, 10)");
      labels.push_back(rec[0]);
      pixels.insert(pixels.end(), rec + 1, rec + 1 + kPixels);
    }
  }
  return ByteImageDataset::Create(Shape{3, 32, 32}, std::move(pixels), std::move(labels), 10);
}

StatusOr<std::shared_ptr<ByteImageDataset>> LoadCifar10(const std::string& dir, const std::string& split) {
  if (split == "test") return LoadCifar10Files({dir + "/test_batch.bin"});
  if (split != "train") return InvalidArgument("CIFAR-10 split must be 'train' or 'test', got '", split, "'");
  std::vector<std::string> paths;
  for (int i = 1; i <= 5; ++i) paths.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
  return LoadCifar10Files(paths);
}

}  // namespace loom
