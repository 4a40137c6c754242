#include "train/data/idx.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "train/data/test_files.h"

namespace loom {
namespace {

using testing::ErrorOf;
using testing::IdxFile;
using testing::TempPath;
using testing::WriteFile;

std::vector<uint8_t> Ramp(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i % 256);
  return v;
}

std::vector<uint8_t> ImageFile(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  return IdxFile(magic, {n, rows, cols}, Ramp(static_cast<size_t>(n) * rows * cols));
}

std::vector<uint8_t> LabelFile(const std::vector<uint8_t>& labels) {
  return IdxFile(0x801, {static_cast<uint32_t>(labels.size())}, labels);
}

// The message of a failed load; "" when it succeeded.
using Catch::Matchers::Contains;

TEST_CASE("IDX images read from gzip and raw files") {
  for (bool gz : {true, false}) {
    std::string path = TempPath(gz ? "img.gz" : "img");
    WriteFile(path, ImageFile(2, 3, 4), gz);
    auto t = ReadIdxImages(path);
    REQUIRE(t.ok());
    CHECK(t->shape() == Shape({2, 3, 4}));
    CHECK(t->data<float>()[5] == Approx(5.0f / 255.0f));
    std::remove(path.c_str());
  }
}

TEST_CASE("IDX errors name the file and the problem") {
  const std::string path = TempPath("bad");
  CHECK_THAT(ErrorOf(ReadIdxImages(path + "_none")), Contains(path + "_none: no such file"));

  WriteFile(path, ImageFile(2, 3, 4, 0x801));
  CHECK_THAT(ErrorOf(ReadIdxImages(path)), Contains(path + ": bad magic number 0x00000801, expected 0x00000803"));

  std::vector<uint8_t> truncated = ImageFile(2, 3, 4);
  truncated.resize(truncated.size() - 5);
  WriteFile(path, truncated);
  CHECK_THAT(ErrorOf(ReadIdxImages(path)),
             Contains(path + ": truncated: header promises 24 bytes of data, file has 19"));

  WriteFile(path, {0, 0, 8, 3, 0, 0});
  CHECK_THAT(ErrorOf(ReadIdxImages(path)), Contains(path + ": truncated header (6 bytes"));

  std::vector<uint8_t> longer = ImageFile(2, 3, 4);
  longer.push_back(7);
  WriteFile(path, longer);
  CHECK_THAT(ErrorOf(ReadIdxImages(path)),
             Contains(path + ": wrong size: header promises 24 bytes of data, file has 25"));

  // A gzip stream cut short.
  const std::string gz = TempPath("cut.gz");
  WriteFile(gz, ImageFile(50, 28, 28), true);
  std::filesystem::resize_file(gz, std::filesystem::file_size(gz) - 20);
  CHECK_THAT(ErrorOf(ReadIdxImages(gz)), Contains(gz + ": truncated gzip data"));
  std::remove(path.c_str());
  std::remove(gz.c_str());
}

TEST_CASE("IDX dimensions whose product overflows are an error, not a wrapped size") {
  // 4 x 1073807362 x 4294705160 = 2^64 + 64: wrapped, the header promised
  // exactly the 64 bytes present, and the loader read far past them.
  const std::string images = TempPath("wrap_images"), labels = TempPath("wrap_labels");
  WriteFile(images, IdxFile(0x803, {4, 1073807362, 4294705160u}, Ramp(64)));
  WriteFile(labels, LabelFile({0, 1, 2, 3}));
  const std::string message =
      images + ": header dimensions 4 x 1073807362 x 4294705160 overflow (more than 2^63 bytes)";
  CHECK_THAT(ErrorOf(LoadIdxDataset(images, labels)), Contains(message));
  CHECK_THAT(ErrorOf(ReadIdxImages(images)), Contains(message));

  // No images of an absurd size: each one's size must fit too.
  WriteFile(images, IdxFile(0x803, {0, 4294967295u, 4294967295u}, {}));
  WriteFile(labels, LabelFile({}));
  CHECK_THAT(ErrorOf(LoadIdxDataset(images, labels)),
             Contains(images + ": header dimensions 0 x 4294967295 x 4294967295 overflow"));
  std::remove(images.c_str());
  std::remove(labels.c_str());
}

TEST_CASE("LoadMnist pairs images with labels as a byte dataset") {
  const std::string dir = TempPath("mnist");
  std::filesystem::create_directories(dir);
  // Training files gzipped, test files raw: both spellings are found.
  WriteFile(dir + "/train-images-idx3-ubyte.gz", ImageFile(3, 2, 2), true);
  WriteFile(dir + "/train-labels-idx1-ubyte.gz", LabelFile({7, 0, 9}), true);
  WriteFile(dir + "/t10k-images-idx3-ubyte", ImageFile(1, 2, 2));
  WriteFile(dir + "/t10k-labels-idx1-ubyte", LabelFile({4}));

  auto train = LoadMnist(dir, "train");
  REQUIRE(train.status().ToString() == "OK");
  const Dataset& ds = **train;
  CHECK(ds.size() == 3);
  CHECK(ds.input_spec() == ExampleSpec{Shape{1, 2, 2}, DType::kF32});
  CHECK(ds.target_spec() == ExampleSpec{Shape{}, DType::kI64});
  CHECK(ds.num_classes() == 10);
  float pixels[4];
  int64_t label = -1;
  ds.Get(1, pixels, &label);
  CHECK(label == 0);
  CHECK(pixels[0] == Approx(4 / 255.0f));  // the ramp continues over images: image 1 starts at byte 4
  CHECK(pixels[3] == Approx(7 / 255.0f));
  CHECK((*train)->pixels(2)[0] == 8);

  auto test = LoadMnist(dir, "test");
  REQUIRE(test.ok());
  CHECK(test.value()->label(0) == 4);

  CHECK_THAT(ErrorOf(LoadMnist(dir, "val")), Contains("split must be 'train' or 'test', got 'val'"));

  // Counts that differ, and a label outside the classes.
  WriteFile(dir + "/t10k-labels-idx1-ubyte", LabelFile({4, 5}));
  CHECK_THAT(ErrorOf(LoadMnist(dir, "test")), Contains(dir + "/t10k-images-idx3-ubyte has 1 images but " + dir +
                                                       "/t10k-labels-idx1-ubyte has 2 labels"));
  WriteFile(dir + "/t10k-labels-idx1-ubyte", LabelFile({10}));
  CHECK_THAT(ErrorOf(LoadMnist(dir, "test")),
             Contains("t10k-labels-idx1-ubyte: label 10 of example 0 is not in [0, 10)"));
  std::filesystem::remove(dir + "/t10k-labels-idx1-ubyte");
  CHECK_THAT(ErrorOf(LoadMnist(dir, "test")), Contains(dir + "/t10k-labels-idx1-ubyte: no such file"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("Fashion-MNIST loads with matching counts", "[data]") {
  if (!std::filesystem::exists(kFashionMnistDir)) {
    WARN("dataset-fashion-mnist is not installed; skipped");
    return;
  }
  auto test = LoadMnist(kFashionMnistDir, "test");
  REQUIRE(test.status().ToString() == "OK");
  CHECK(test.value()->image_shape() == Shape({1, 28, 28}));
  CHECK(test.value()->size() == 10000);
  std::vector<int> counts(10, 0);
  for (int64_t i = 0; i < test.value()->size(); ++i) counts[test.value()->label(i)]++;
  for (int c : counts) CHECK(c == 1000);  // the test split is balanced
}

}  // namespace
}  // namespace loom
