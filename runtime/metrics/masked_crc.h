// CRC32C (Castagnoli), as used by TFRecord / tfevents framing, and the
// masking TensorFlow applies to stored CRCs (a CRC of data that itself holds
// CRCs is otherwise weak).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace loom::metrics {

// CRC of `crc`'s data followed by data[0, n): Crc32cExtend(Crc32c(a), b) ==
// Crc32c(a + b). Starting from 0 gives the CRC of data alone.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32c(std::string_view data) { return Crc32c(data.data(), data.size()); }

// ((crc >> 15) | (crc << 17)) + 0xa282ead8, and its inverse.
uint32_t MaskCrc32c(uint32_t crc);
uint32_t UnmaskCrc32c(uint32_t masked);

}  // namespace loom::metrics
