#include "runtime/data/file_io.h"

#include <zlib.h>

#include <filesystem>

namespace loom {

StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound(path, ": no such file");
  if (std::filesystem::is_directory(path, ec)) return InvalidArgument(path, ": is a directory, not a file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return NotFound(path, ": cannot open");
  std::vector<uint8_t> data;
  uint8_t chunk[1 << 16];
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
  // gzread does not fail on a gzip stream cut short; gzclose reports it.
  if (gzclose(f) == Z_BUF_ERROR)
    return DataLoss(path, ": truncated gzip data (the stream ends after ", data.size(), " uncompressed bytes)");
  return data;
}

}  // namespace loom
