#include "train/data/file_io.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

namespace loom {

namespace {

bool IsGzipMember(const uint8_t* p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

// Inflates the gzip members of `in` (one or more, back to back); errors
// name `path`.
StatusOr<std::vector<uint8_t>> Gunzip(const std::string& path, const std::vector<uint8_t>& in) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) return Internal(path, ": zlib's inflateInit2 failed");
  std::unique_ptr<z_stream, int (*)(z_stream*)> ender(&zs, inflateEnd);
  // The last member's trailer ends with its size mod 2^32 (little-endian):
  // exact for one member, unless beyond zlib's largest ratio (1032:1). One
  // byte more lets inflate read the trailer in the same call.
  const size_t n = in.size();
  const uint32_t isize = n < 18 ? 0
                                : uint32_t{in[n - 4]} | uint32_t{in[n - 3]} << 8 | uint32_t{in[n - 2]} << 16 |
                                      uint32_t{in[n - 1]} << 24;
  std::vector<uint8_t> out(std::max<size_t>(isize <= n * 1032 ? size_t{isize} + 1 : n * 4, 1 << 12));
  zs.next_in = const_cast<uint8_t*>(in.data());
  size_t in_left = n, produced = 0;
  for (;;) {
    if (produced == out.size()) out.resize(out.size() * 2);
    zs.avail_in = static_cast<uInt>(std::min<size_t>(in_left, UINT_MAX));
    zs.next_out = out.data() + produced;
    zs.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - produced, UINT_MAX));
    const uInt avail_in = zs.avail_in, avail_out = zs.avail_out;
    const int ret = inflate(&zs, Z_NO_FLUSH);
    in_left -= avail_in - zs.avail_in;
    produced += avail_out - zs.avail_out;
    if (ret == Z_STREAM_END) {
      // Another member may follow; nothing else may.
      if (in_left == 0) break;
      const size_t offset = n - in_left;
      if (!IsGzipMember(in.data() + offset, in_left))
        return DataLoss(path, ": ", in_left, " bytes of trailing garbage after the gzip data at offset ", offset);
      inflateReset(&zs);
      continue;
    }
    if (ret != Z_OK && ret != Z_BUF_ERROR)
      return DataLoss(path, ": corrupt gzip data (", zs.msg ? zs.msg : zError(ret), ")");
    // All input used with output room left, and no stream end: the file stops mid-stream.
    if (in_left == 0 && zs.avail_out > 0)
      return DataLoss(path, ": truncated gzip data (the stream ends after ", produced, " uncompressed bytes)");
  }
  out.resize(produced);
  return out;
}

}  // namespace

StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFound(path, ": no such file");
  if (std::filesystem::is_directory(path, ec)) return InvalidArgument(path, ": is a directory, not a file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) return NotFound(path, ": cannot open (", std::strerror(errno), ")");
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return DataLoss(path, ": cannot read its size (", ec.message(), ")");
  std::vector<uint8_t> data(size);
  if (std::fread(data.data(), 1, data.size(), f.get()) != data.size())
    return DataLoss(path, ": read error or file shortened while reading (", std::strerror(errno), ")");
  if (!IsGzipMember(data.data(), data.size())) return data;
  return Gunzip(path, data);
}

bool CheckedProduct(const std::vector<int64_t>& dims, int64_t* product) {
  int64_t nonzero = 1;
  bool any_zero = false;
  for (int64_t d : dims) {
    if (d == 0)
      any_zero = true;
    else if (__builtin_mul_overflow(nonzero, d, &nonzero))
      return false;
  }
  *product = any_zero ? 0 : nonzero;
  return true;
}

StatusOr<int64_t> HeaderBytes(const std::string& path, const std::vector<int64_t>& dims) {
  int64_t bytes = 0;
  if (CheckedProduct(dims, &bytes)) return bytes;
  std::string list;
  for (size_t i = 0; i < dims.size(); ++i) list += (i ? " x " : "") + std::to_string(dims[i]);
  return DataLoss(path, ": header dimensions ", list, " overflow (more than 2^63 bytes)");
}

}  // namespace loom
