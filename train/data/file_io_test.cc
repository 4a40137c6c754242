#include "train/data/file_io.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "train/data/test_files.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;
using testing::ErrorOf;
using testing::Gzip;
using testing::TempPath;
using testing::WriteFile;

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::vector<uint8_t> Concat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_CASE("ReadFileBytes passes plain files through and gunzips gzip files") {
  const std::string path = TempPath("io_plain");
  // 1f alone is not the gzip magic: the file is plain.
  for (const std::vector<uint8_t>& plain : {Bytes(""), Bytes("x"), std::vector<uint8_t>{0x1f, 0x00, 0x8b}}) {
    WriteFile(path, plain);
    CHECK(ReadFileBytes(path).value() == plain);
  }
  std::vector<uint8_t> big(3 << 20);  // several output buffers' worth
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 7) ^ (i >> 9));
  WriteFile(path, big, /*gzip=*/true);
  CHECK(ReadFileBytes(path).value() == big);
  WriteFile(path, {}, /*gzip=*/true);
  CHECK(ReadFileBytes(path).value().empty());
  std::remove(path.c_str());
}

TEST_CASE("ReadFileBytes reads concatenated gzip members as one stream") {
  const std::string path = TempPath("io_members.gz");
  WriteFile(path, Concat(Concat(Gzip(Bytes("abc")), Gzip({})), Gzip(Bytes("defg"))));
  CHECK(ReadFileBytes(path).value() == Bytes("abcdefg"));
  std::remove(path.c_str());
}

TEST_CASE("ReadFileBytes rejects bytes after the last gzip member") {
  const std::string path = TempPath("io_trailing.gz");
  const std::vector<uint8_t> gz = Gzip(Bytes("abcdef"));
  const std::string at = std::to_string(gz.size());
  WriteFile(path, Concat(gz, Bytes("junk")));
  CHECK_THAT(ErrorOf(ReadFileBytes(path)),
             Contains(path + ": 4 bytes of trailing garbage after the gzip data at offset " + at));
  // Zero padding is garbage too; so is one byte of a gzip magic number.
  WriteFile(path, Concat(Concat(gz, gz), std::vector<uint8_t>(3, 0)));
  CHECK_THAT(ErrorOf(ReadFileBytes(path)),
             Contains(path + ": 3 bytes of trailing garbage after the gzip data at offset " +
                      std::to_string(2 * gz.size())));
  WriteFile(path, Concat(gz, {0x1f}));
  CHECK_THAT(ErrorOf(ReadFileBytes(path)), Contains(path + ": 1 bytes of trailing garbage"));
  std::remove(path.c_str());
}

TEST_CASE("ReadFileBytes errors name the file: missing, a folder, corrupt or truncated gzip") {
  const std::string path = TempPath("io_bad.gz");
  CHECK_THAT(ErrorOf(ReadFileBytes(path + "_none")), Contains(path + "_none: no such file"));
  const std::string dir = TempPath("io_dir");
  std::filesystem::create_directories(dir);
  CHECK_THAT(ErrorOf(ReadFileBytes(dir)), Contains(dir + ": is a directory"));

  std::vector<uint8_t> big(100000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * i >> 5);
  const std::vector<uint8_t> gz = Gzip(big);
  std::vector<uint8_t> corrupt = gz;
  corrupt[10] |= 0x06;  // the first deflate block header: block type 3, which is invalid
  WriteFile(path, corrupt);
  CHECK_THAT(ErrorOf(ReadFileBytes(path)), Contains(path + ": corrupt gzip data ("));
  std::vector<uint8_t> bad_crc = gz;
  bad_crc[gz.size() - 8] ^= 1;
  WriteFile(path, bad_crc);
  CHECK_THAT(ErrorOf(ReadFileBytes(path)), Contains(path + ": corrupt gzip data (incorrect data check)"));

  for (size_t cut : {size_t{3}, gz.size() / 2, gz.size() - 1}) {
    WriteFile(path, std::vector<uint8_t>(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(cut)));
    CHECK_THAT(ErrorOf(ReadFileBytes(path)), Contains(path + ": truncated gzip data"));
  }
  // A second member cut short.
  WriteFile(path, Concat(gz, std::vector<uint8_t>(gz.begin(), gz.begin() + 20)));
  CHECK_THAT(ErrorOf(ReadFileBytes(path)), Contains(path + ": truncated gzip data"));
  std::remove(path.c_str());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom
