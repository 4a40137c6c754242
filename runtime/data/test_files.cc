#include "runtime/data/test_files.h"

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

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
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
