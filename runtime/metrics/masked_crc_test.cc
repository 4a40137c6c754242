#include "runtime/metrics/crc32c.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace loom::metrics {
namespace {

std::vector<unsigned char> Bytes(int n, int (*f)(int)) {
  std::vector<unsigned char> v;
  for (int i = 0; i < n; ++i) v.push_back(static_cast<unsigned char>(f(i)));
  return v;
}

TEST_CASE("CRC32C matches the published check values") {
  CHECK(Crc32c("123456789") == 0xE3069283u);  // the Castagnoli check value
  CHECK(Crc32c("") == 0u);
  CHECK(Crc32c("a") == 0xC1D04330u);
  // RFC 3720 (iSCSI) appendix B.4.
  auto zeros = Bytes(32, [](int) { return 0; });
  auto ones = Bytes(32, [](int) { return 0xff; });
  auto ascending = Bytes(32, [](int i) { return i; });
  auto descending = Bytes(32, [](int i) { return 31 - i; });
  CHECK(Crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(Crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(Crc32c(ascending.data(), ascending.size()) == 0x46DD794Eu);
  CHECK(Crc32c(descending.data(), descending.size()) == 0x113FDB5Cu);
}

TEST_CASE("CRC32C extends across any split of the data") {
  const std::string data = "The quick brown fox jumps over the lazy dog";
  const uint32_t whole = Crc32c(data);
  CHECK(whole == 0x22620404u);
  for (size_t cut = 0; cut <= data.size(); ++cut) {
    INFO("cut at " << cut);
    CHECK(Crc32cExtend(Crc32c(data.data(), cut), data.data() + cut, data.size() - cut) == whole);
  }
}

TEST_CASE("CRC masking matches TensorFlow's and inverts") {
  // TensorBoard's own masked_crc32c("123456789").
  CHECK(MaskCrc32c(Crc32c("123456789")) == 0xC78AB0E5u);
  CHECK(MaskCrc32c(0) == 0xA282EAD8u);
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu, 0x80000000u, 0x12345678u}) {
    CHECK(UnmaskCrc32c(MaskCrc32c(crc)) == crc);
    CHECK(MaskCrc32c(crc) != crc);
  }
}

}  // namespace
}  // namespace loom::metrics
