// The CRC masking TensorFlow applies to the CRC32C fields of TFRecord /
// tfevents framing (a CRC of data that itself holds CRCs is otherwise weak).
// The CRC32C itself is core/crc32c.h.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/crc32c.h"

namespace loom::metrics {

inline uint32_t Crc32cOf(std::string_view data) { return Crc32c(data.data(), data.size()); }

// ((crc >> 15) | (crc << 17)) + 0xa282ead8, and its inverse.
uint32_t MaskCrc32c(uint32_t crc);
uint32_t UnmaskCrc32c(uint32_t masked);

}  // namespace loom::metrics
