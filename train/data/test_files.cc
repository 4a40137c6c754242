#include "train/data/test_files.h"

#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace loom::testing {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::filesystem::path base = dir ? std::filesystem::path(dir) : std::filesystem::temp_directory_path();
  return (base / ("loom_data_test_" + name)).string();
}

std::vector<uint8_t> Gzip(const std::vector<uint8_t>& bytes) {
  z_stream zs{};
  // 15 + 16 window bits: a gzip header and trailer around the deflate data.
  deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::vector<uint8_t> out(deflateBound(&zs, bytes.size()));
  zs.next_in = const_cast<uint8_t*>(bytes.data());
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  const std::vector<uint8_t> data = gzip ? Gzip(bytes) : bytes;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), data.size());
}

std::vector<uint8_t> IdxFile(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> b;
  std::vector<uint32_t> header{magic};
  header.insert(header.end(), dims.begin(), dims.end());
  for (uint32_t v : header)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

}  // namespace loom::testing
