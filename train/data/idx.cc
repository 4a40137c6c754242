#include "train/data/idx.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "train/data/file_io.h"

namespace loom {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// An IDX file of unsigned bytes: its dimensions and its data.
struct IdxBytes {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads and checks the file: the magic number for `dims` dimensions of
// bytes, dimensions whose product fits in int64, and a data size that is
// exactly what the header promises.
StatusOr<IdxBytes> ReadIdx(const std::string& path, uint32_t magic, int dims) {
  LOOM_ASSIGN_OR_RETURN(std::vector<uint8_t> file, ReadFileBytes(path));
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (file.size() < header)
    return DataLoss(path, ": truncated header (", file.size(), " bytes, an IDX ", dims == 3 ? "image" : "label",
                    " header has ", header, ")");
  const uint32_t got = BigEndian32(file.data());
  if (got != magic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "0x%08x, expected 0x%08x", got, magic);
    return DataLoss(path, ": bad magic number ", buf, " (not an IDX ", dims == 3 ? "image" : "label", " file)");
  }
  IdxBytes idx;
  for (int d = 0; d < dims; ++d) idx.dims.push_back(BigEndian32(file.data() + 4 + 4 * d));
  LOOM_ASSIGN_OR_RETURN(const int64_t promised, HeaderBytes(path, idx.dims));
  const size_t total = static_cast<size_t>(promised), have = file.size() - header;
  if (have < total) return DataLoss(path, ": truncated: header promises ", total, " bytes of data, file has ", have);
  if (have > total)
    return DataLoss(path, ": wrong size: header promises ", total, " bytes of data, file has ", have, " (",
                    have - total, " trailing bytes)");
  idx.data.assign(file.begin() + static_cast<std::ptrdiff_t>(header), file.end());
  return idx;
}

// "<dir>/<train|t10k>-<kind>-ubyte.gz" when it exists, else without ".gz".
std::string MnistFile(const std::string& dir, const std::string& split, const std::string& kind) {
  const std::string plain = dir + "/" + (split == "train" ? "train" : "t10k") + "-" + kind + "-ubyte";
  return std::filesystem::exists(plain + ".gz") ? plain + ".gz" : plain;
}

}  // namespace

StatusOr<std::shared_ptr<ByteImageDataset>> LoadIdxDataset(const std::string& images_path,
                                                           const std::string& labels_path, int64_t num_classes) {
  LOOM_ASSIGN_OR_RETURN(IdxBytes images, ReadIdx(images_path, kImagesMagic, 3));
  LOOM_ASSIGN_OR_RETURN(IdxBytes labels, ReadIdx(labels_path, kLabelsMagic, 1));
  if (images.dims[0] != labels.dims[0])
    return DataLoss(images_path, " has ", images.dims[0], " images but ", labels_path, " has ", labels.dims[0],
                    " labels");
  if (images.dims[1] == 0 || images.dims[2] == 0)
    return DataLoss(images_path, ": images of ", images.dims[1], "x", images.dims[2], " pixels");
  const Shape shape{1, images.dims[1], images.dims[2]};
  // With the counts and the image shape checked, only a label can be wrong.
  auto ds = ByteImageDataset::Create(shape, std::move(images.data), std::move(labels.data), num_classes);
  if (!ds.ok()) return ds.status().WithContext(labels_path);
  return ds;
}

StatusOr<std::shared_ptr<ByteImageDataset>> LoadMnist(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "test")
    return InvalidArgument("MNIST split must be 'train' or 'test', got '", split, "'");
  return LoadIdxDataset(MnistImagesPath(dir, split), MnistFile(dir, split, "labels-idx1"));
}

std::string MnistImagesPath(const std::string& dir, const std::string& split) {
  return MnistFile(dir, split, "images-idx3");
}

StatusOr<Tensor> ReadIdxImages(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(IdxBytes idx, ReadIdx(path, kImagesMagic, 3));
  Tensor t = Tensor::Zeros(Shape(idx.dims), DType::kF32);
  float* out = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<float>(idx.data[i]) / 255.0f;
  return t;
}

StatusOr<Tensor> ReadIdxLabels(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(IdxBytes idx, ReadIdx(path, kLabelsMagic, 1));
  Tensor t = Tensor::Zeros(Shape(idx.dims), DType::kI64);
  int64_t* out = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = idx.data[i];
  return t;
}

}  // namespace loom
