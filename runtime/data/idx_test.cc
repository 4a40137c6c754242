#include "runtime/data/idx.h"

#include <catch2/catch.hpp>

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

namespace loom {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("loom_idx_test_" + name)).string();
}

void WriteBytes(const std::string& path, const std::vector<unsigned char>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
}

std::vector<unsigned char> ImageFile(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  std::vector<unsigned char> b;
  for (uint32_t v : {magic, n, rows, cols})
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
  for (uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(static_cast<unsigned char>(i % 256));
  return b;
}

TEST_CASE("IDX images read from gzip and raw files") {
  for (bool gz : {true, false}) {
    std::string path = TempPath(gz ? "img.gz" : "img");
    WriteBytes(path, ImageFile(2, 3, 4), gz);
    auto t = ReadIdxImages(path);
    REQUIRE(t.ok());
    CHECK(t->shape() == Shape({2, 3, 4}));
    CHECK(t->data<float>()[5] == Approx(5.0f / 255.0f));
    std::remove(path.c_str());
  }
}

TEST_CASE("IDX errors name the file and the problem") {
  std::string path = TempPath("bad");
  auto missing = ReadIdxImages(path + "_none");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("no such file") != std::string::npos);

  WriteBytes(path, ImageFile(2, 3, 4, 0x801), false);
  auto magic = ReadIdxImages(path);
  REQUIRE_FALSE(magic.ok());
  CHECK(magic.status().message().find(path + ": bad magic number 0x00000801") != std::string::npos);

  std::vector<unsigned char> truncated = ImageFile(2, 3, 4);
  truncated.resize(truncated.size() - 5);
  WriteBytes(path, truncated, false);
  auto t = ReadIdxImages(path);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().message().find("truncated") != std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("Fashion-MNIST loads with matching counts", "[data]") {
  if (!std::filesystem::exists(kFashionMnistDir)) {
    WARN("dataset-fashion-mnist is not installed; skipped");
    return;
  }
  auto test = LoadFashionMnist(kFashionMnistDir, "test");
  REQUIRE(test.status().ToString() == "OK");
  CHECK(test->images.shape() == Shape({10000, 1, 28, 28}));
  CHECK(test->size() == 10000);
  std::vector<int> counts(10, 0);
  for (int64_t i = 0; i < test->size(); ++i) counts[test->labels.data<int64_t>()[i]]++;
  for (int c : counts) CHECK(c == 1000);  // the test split is balanced
}

}  // namespace
}  // namespace loom
