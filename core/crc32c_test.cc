// CRC32C against published check values, and the hardware and table paths
// against each other.
#include "core/crc32c.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace loom {
namespace {

TEST_CASE("CRC32C matches the published check values") {
  // "123456789" is the catalogue check value; the 32-byte vectors are
  // RFC 3720 (iSCSI) B.4.
  const std::string digits = "123456789";
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<unsigned char>(i);
    descending[i] = static_cast<unsigned char>(31 - i);
  }
  for (auto fn : {&Crc32cExtend, &internal::Crc32cExtendPortable}) {
    CHECK(fn(0, digits.data(), digits.size()) == 0xE3069283u);
    CHECK(fn(0, zeros.data(), zeros.size()) == 0x8A9136AAu);
    CHECK(fn(0, ones.data(), ones.size()) == 0x62A8AB43u);
    CHECK(fn(0, ascending.data(), ascending.size()) == 0x46DD794Eu);
    CHECK(fn(0, descending.data(), descending.size()) == 0x113FDB5Cu);
    CHECK(fn(0, nullptr, 0) == 0u);
  }
}

TEST_CASE("CRC32C extends across any split, and both paths agree at every length and alignment") {
  std::vector<unsigned char> data(1000);
  uint32_t x = 12345;
  for (auto& b : data) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{500}, size_t{999}, size_t{1000}}) {
    INFO("split at " << split);
    CHECK(Crc32cExtend(Crc32c(data.data(), split), data.data() + split, data.size() - split) == whole);
  }
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n + offset <= 80; ++n) {
      INFO("offset " << offset << " length " << n);
      CHECK(Crc32cExtend(0x1234u, data.data() + offset, n) ==
            internal::Crc32cExtendPortable(0x1234u, data.data() + offset, n));
    }
  }
  // One flipped bit changes the value.
  data[500] ^= 0x10;
  CHECK(Crc32c(data.data(), data.size()) != whole);
}

}  // namespace
}  // namespace loom
