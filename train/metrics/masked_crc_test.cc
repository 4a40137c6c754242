#include "train/metrics/masked_crc.h"

#include <catch2/catch.hpp>

namespace loom::metrics {
namespace {

TEST_CASE("CRC masking matches TensorFlow's and inverts") {
  // TensorBoard's own masked_crc32c("123456789").
  CHECK(MaskCrc32c(Crc32cOf("123456789")) == 0xC78AB0E5u);
  CHECK(MaskCrc32c(0) == 0xA282EAD8u);
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu, 0x80000000u, 0x12345678u}) {
    CHECK(UnmaskCrc32c(MaskCrc32c(crc)) == crc);
    CHECK(MaskCrc32c(crc) != crc);
  }
}

}  // namespace
}  // namespace loom::metrics
