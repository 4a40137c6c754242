#include "train/metrics/masked_crc.h"

namespace loom::metrics {

namespace {
constexpr uint32_t kMaskDelta = 0xa282ead8;
}  // namespace

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

uint32_t UnmaskCrc32c(uint32_t masked) {
  const uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

}  // namespace loom::metrics
