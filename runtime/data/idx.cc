#include "runtime/data/idx.h"

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

namespace loom {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension

// Whole file contents; gzread passes plain files through unchanged.
StatusOr<std::vector<unsigned char>> ReadMaybeGzip(const std::string& path) {
  if (!std::filesystem::exists(path)) return NotFound(path, ": no such file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return NotFound(path, ": cannot open");
  std::vector<unsigned char> data;
  unsigned char chunk[1 << 16];
  for (;;) {
    int n = gzread(f, chunk, sizeof(chunk));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return DataLoss(path, ": corrupt gzip data (", msg, ")");
    }
    if (n == 0) break;
    data.insert(data.end(), chunk, chunk + n);
  }
  gzclose(f);
  return data;
}

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Parses the header; returns the dimensions and the offset of the data.
StatusOr<std::vector<int64_t>> ParseHeader(const std::string& path, const std::vector<unsigned char>& data,
                                           uint32_t magic, int dims) {
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (data.size() < header) return DataLoss(path, ": truncated header (", data.size(), " bytes)");
  uint32_t got = BigEndian32(data.data());
  if (got != magic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "0x%08x, expected 0x%08x", got, magic);
    return DataLoss(path, ": bad magic number ", buf, " (not an IDX ", dims == 3 ? "image" : "label", " file)");
  }
  std::vector<int64_t> shape;
  int64_t total = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(BigEndian32(data.data() + 4 + 4 * d));
    total *= shape.back();
  }
  if (data.size() - header < static_cast<size_t>(total))
    return DataLoss(path, ": truncated: header promises ", total, " bytes of data, file has ", data.size() - header);
  return shape;
}

}  // namespace

StatusOr<Tensor> ReadIdxImages(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::vector<unsigned char> data, ReadMaybeGzip(path));
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseHeader(path, data, kImagesMagic, 3));
  Tensor t = Tensor::Zeros(Shape(shape), DType::kF32);
  float* out = t.data<float>();
  const unsigned char* in = data.data() + 16;
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<float>(in[i]) / 255.0f;
  return t;
}

StatusOr<Tensor> ReadIdxLabels(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::vector<unsigned char> data, ReadMaybeGzip(path));
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseHeader(path, data, kLabelsMagic, 1));
  Tensor t = Tensor::Zeros(Shape(shape), DType::kI64);
  int64_t* out = t.data<int64_t>();
  const unsigned char* in = data.data() + 8;
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = in[i];
  return t;
}

StatusOr<ImageDataset> LoadFashionMnist(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "test") return InvalidArgument("split must be train or test, got '", split, "'");
  const std::string prefix = dir + "/" + (split == "train" ? "train" : "t10k");
  auto find = [&](const std::string& stem) {
    std::string gz = prefix + stem + ".gz";
    return std::filesystem::exists(gz) ? gz : prefix + stem;
  };
  const std::string image_path = find("-images-idx3-ubyte"), label_path = find("-labels-idx1-ubyte");
  LOOM_ASSIGN_OR_RETURN(Tensor images, ReadIdxImages(image_path));
  LOOM_ASSIGN_OR_RETURN(Tensor labels, ReadIdxLabels(label_path));
  if (images.shape()[0] != labels.numel())
    return DataLoss(image_path, " has ", images.shape()[0], " images but ", label_path, " has ", labels.numel(),
                    " labels");
  for (int64_t i = 0; i < labels.numel(); ++i)
    if (labels.data<int64_t>()[i] > 9) return DataLoss(label_path, ": label ", labels.data<int64_t>()[i], " at ", i, " is not in 0..9");
  constexpr float kMean = 0.2860f, kStd = 0.3530f;
  float* p = images.data<float>();
  for (int64_t i = 0; i < images.numel(); ++i) p[i] = (p[i] - kMean) / kStd;
  ImageDataset ds;
  ds.images = images.Reshape({images.shape()[0], 1, images.shape()[1], images.shape()[2]}).value();
  ds.labels = labels;
  return ds;
}

}  // namespace loom
