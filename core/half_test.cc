#include "core/half.h"
#include "core/half_convert.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/tensor.h"

namespace loom {
namespace {

uint16_t Bf16(float f) { return ToBFloat16(f).bits; }
uint16_t F16(float f) { return ToFloat16(f).bits; }
uint16_t Bf16(double d) { return ToBFloat16(d).bits; }
uint16_t F16(double d) { return ToFloat16(d).bits; }
float FromBf16(uint16_t b) { return ToFloat(BFloat16{b}); }
float FromF16(uint16_t b) { return ToFloat(Float16{b}); }

TEST_CASE("f16 known bit patterns") {
  CHECK(F16(1.0f) == 0x3C00);
  CHECK(F16(-2.5f) == 0xC100);
  CHECK(F16(0.0f) == 0x0000);
  CHECK(F16(-0.0f) == 0x8000);
  CHECK(F16(65504.0f) == 0x7BFF);  // the largest finite
  CHECK(F16(65519.0f) == 0x7BFF);  // below the halfway point
  CHECK(F16(65520.0f) == 0x7C00);  // the tie rounds to even: inf
  CHECK(F16(-65520.0f) == 0xFC00);
  CHECK(F16(1e10f) == 0x7C00);
  CHECK(F16(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(F16(-std::numeric_limits<float>::infinity()) == 0xFC00);
  CHECK(F16(std::ldexp(1.0f, -14)) == 0x0400);   // the smallest normal
  CHECK(F16(std::ldexp(1.0f, -24)) == 0x0001);   // the smallest subnormal
  CHECK(F16(-std::ldexp(1.0f, -24)) == 0x8001);
  CHECK(F16(std::ldexp(1023.0f, -24)) == 0x03FF);  // the largest subnormal
  CHECK(F16(std::ldexp(1.0f, -25)) == 0x0000);   // half the smallest subnormal: tie to even 0
  CHECK(F16(std::ldexp(1.5f, -25)) == 0x0001);   // above the tie
  CHECK(F16(std::ldexp(3.0f, -25)) == 0x0002);   // 1.5 ulp: tie to even 2
  CHECK(F16(std::ldexp(5.0f, -25)) == 0x0002);   // 2.5 ulp: tie to even 2
  CHECK(F16(std::ldexp(1.0f, -26)) == 0x0000);
  CHECK(F16(std::ldexp(2047.0f, -25)) == 0x0400);  // 1023.5 ulp rounds up into the normals
  // Ties between normals: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  CHECK(F16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);
  CHECK(F16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  CHECK(F16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3C01);
  CHECK(F16(2047.0f / 1024.0f) == 0x3FFF);  // all mantissa bits set
  CHECK(F16(4095.0f / 2048.0f) == 0x4000);  // ... plus a tie: rounds up, carrying into the exponent
}

TEST_CASE("f16 to f32 is exact") {
  CHECK(FromF16(0x3C00) == 1.0f);
  CHECK(FromF16(0xC100) == -2.5f);
  CHECK(FromF16(0x7BFF) == 65504.0f);
  CHECK(FromF16(0x0001) == std::ldexp(1.0f, -24));
  CHECK(FromF16(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(FromF16(0x0400) == std::ldexp(1.0f, -14));
  CHECK(std::signbit(FromF16(0x8000)));
  CHECK(FromF16(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(FromF16(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(FromF16(0x7E00)));
  CHECK(std::isnan(FromF16(0x7C01)));  // a signalling NaN stays NaN
  // Every one of the 65536 patterns round-trips (NaNs to the canonical NaN).
  int bad = 0;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    const uint16_t expected = nan ? static_cast<uint16_t>((h & 0x8000) | 0x7E00) : h;
    if (F16(FromF16(h)) != expected) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("f16 NaN stays NaN") {
  CHECK(F16(std::numeric_limits<float>::quiet_NaN()) == 0x7E00);
  CHECK(F16(-std::numeric_limits<float>::quiet_NaN()) == 0xFE00);
  CHECK(F16(std::numeric_limits<float>::signaling_NaN()) == 0x7E00);
  CHECK(std::isnan(FromF16(F16(std::nanf("")))));
}

TEST_CASE("bf16 known bit patterns and rounding ties") {
  CHECK(Bf16(1.0f) == 0x3F80);
  CHECK(Bf16(-2.5f) == 0xC020);
  CHECK(Bf16(-0.0f) == 0x8000);
  CHECK(Bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(Bf16(std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
  CHECK(Bf16(-std::numeric_limits<float>::quiet_NaN()) == 0xFFC0);
  CHECK(Bf16(std::numeric_limits<float>::signaling_NaN()) == 0x7FC0);  // not rounded into inf
  // Ties: 0x3F808000 is halfway between 0x3F80 and 0x3F81 -> even 0x3F80;
  // 0x3F818000 is halfway between 0x3F81 and 0x3F82 -> even 0x3F82.
  CHECK(Bf16(FloatFromBits(0x3F808000u)) == 0x3F80);
  CHECK(Bf16(FloatFromBits(0x3F818000u)) == 0x3F82);
  CHECK(Bf16(FloatFromBits(0x3F808001u)) == 0x3F81);
  CHECK(Bf16(FloatFromBits(0x3F807FFFu)) == 0x3F80);
  // The largest finite f32 rounds up to inf; the largest bf16 stays.
  CHECK(Bf16(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(Bf16(FloatFromBits(0x7F7F0000u)) == 0x7F7F);
  CHECK(Bf16(FloatFromBits(0x7F7F7FFFu)) == 0x7F7F);
  // Subnormals are kept: the smallest f32 subnormal rounds to 0, 2^-133 stays.
  CHECK(Bf16(FloatFromBits(0x00000001u)) == 0x0000);
  CHECK(Bf16(std::ldexp(1.0f, -133)) == 0x0001);
  CHECK(FromBf16(0x0001) == std::ldexp(1.0f, -133));
  CHECK(FromBf16(0x3F80) == 1.0f);
  CHECK(FromBf16(0xC020) == -2.5f);
  CHECK(std::isnan(FromBf16(0x7FC0)));
  CHECK(std::isnan(FromBf16(0x7F81)));
}

TEST_CASE("f64 narrows with one rounding") {
  // 65519.99999 is below the f16 halfway point 65520; double -> float alone
  // would round it to 65520.0f and then to inf.
  CHECK(F16(65519.99999) == 0x7BFF);
  CHECK(F16(65520.0) == 0x7C00);
  CHECK(F16(1.0) == 0x3C00);
  CHECK(F16(-2.5) == 0xC100);
  CHECK(F16(std::ldexp(1.0, -24)) == 0x0001);
  CHECK(F16(std::ldexp(1.0, -25)) == 0x0000);
  CHECK(F16(std::ldexp(1.0, -25) + std::ldexp(1.0, -60)) == 0x0001);  // just past the tie
  CHECK(F16(1e300) == 0x7C00);
  CHECK(F16(-1e-300) == 0x8000);
  CHECK(F16(std::numeric_limits<double>::quiet_NaN()) == 0x7E00);
  // bf16: 1 + 2^-8 is a tie (to even: 1); a hair above it rounds up.
  CHECK(Bf16(1.0 + std::ldexp(1.0, -8)) == 0x3F80);
  CHECK(Bf16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)) == 0x3F81);
  CHECK(Bf16(1e300) == 0x7F80);
  CHECK(Bf16(-std::numeric_limits<double>::infinity()) == 0xFF80);
  CHECK(Bf16(std::numeric_limits<double>::quiet_NaN()) == 0x7FC0);
}

TEST_CASE("ConvertFloat between the four float types") {
  CHECK(ConvertFloat<float>(BFloat16{0x3F80}) == 1.0f);
  CHECK(ConvertFloat<double>(Float16{0xC100}) == -2.5);
  CHECK(ConvertFloat<Float16>(BFloat16{0x3F80}).bits == 0x3C00);
  CHECK(ConvertFloat<BFloat16>(Float16{0x7BFF}).bits == 0x4780);  // 65504 -> 65536 in bf16
  CHECK(ConvertFloat<BFloat16>(2.5).bits == 0x4020);
  CHECK(ConvertFloat<float>(0.1) == 0.1f);
}

TEST_CASE("Tensor::Cast to and from bf16 and f16") {
  Tensor x = Tensor::FromVector<float>({5}, {1.0f, -2.5f, 65520.0f, std::ldexp(1.0f, -24), 0.1f});
  Tensor h = x.Cast(DType::kF16).value();
  REQUIRE(h.dtype() == DType::kF16);
  const Float16* hp = h.data<Float16>();
  CHECK(hp[0].bits == 0x3C00);
  CHECK(hp[1].bits == 0xC100);
  CHECK(hp[2].bits == 0x7C00);
  CHECK(hp[3].bits == 0x0001);
  Tensor back = h.Cast(DType::kF32).value();
  CHECK(back.data<float>()[0] == 1.0f);
  CHECK(back.data<float>()[2] == std::numeric_limits<float>::infinity());
  CHECK(back.data<float>()[4] == FromF16(F16(0.1f)));

  Tensor b = x.Cast(DType::kBF16).value();
  CHECK(b.data<BFloat16>()[0].bits == 0x3F80);
  CHECK(b.data<BFloat16>()[1].bits == 0xC020);
  Tensor b64 = b.Cast(DType::kF64).value();
  CHECK(b64.data<double>()[4] == static_cast<double>(FromBf16(Bf16(0.1f))));
  // Between the two half types, and from f64.
  CHECK(b.Cast(DType::kF16).value().data<Float16>()[1].bits == 0xC100);
  Tensor d = Tensor::FromVector<double>({1}, {65519.99999});
  CHECK(d.Cast(DType::kF16).value().data<Float16>()[0].bits == 0x7BFF);
  // To integers, as from f32.
  CHECK(h.Cast(DType::kI64).value().data<int64_t>()[1] == -2);
}

// The bulk conversions (F16C where the build targets it) against the scalar
// ones, bit for bit: every f16 pattern widened, and f32 patterns narrowed
// across every f16 region (rounding boundaries, subnormals, overflow, NaNs
// with payloads); offsets and lengths that leave tails.
TEST_CASE("bulk f16 conversions give the scalar conversions' bits") {
  std::vector<Float16> halves(65536);
  for (uint32_t b = 0; b < 65536; ++b) halves[b].bits = static_cast<uint16_t>(b);
  std::vector<float> wide(65536);
  for (int64_t offset : {0, 3}) {
    WidenF16(halves.data() + offset, wide.data() + offset, 65536 - offset - 5);
    int64_t bad = 0;
    for (int64_t b = offset; b < 65536 - 5; ++b)
      if (FloatBits(wide[b]) != FloatBits(FromF16(static_cast<uint16_t>(b)))) ++bad;
    CHECK(bad == 0);
  }
  // Each f16 value's neighbourhood in f32 (the values between halves and
  // the ties), plus a stride through all f32 patterns.
  std::vector<float> floats;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t u = FloatBits(FromF16(static_cast<uint16_t>(b)));
    for (uint32_t d : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x1FFFu}) floats.push_back(FloatFromBits(u + d));
  }
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 65537) floats.push_back(FloatFromBits(static_cast<uint32_t>(u)));
  for (uint32_t nan : {0x7F800001u, 0x7FC00000u, 0xFFFFFFFFu, 0x7FA5A5A5u, 0xFF812345u}) floats.push_back(FloatFromBits(nan));
  std::vector<Float16> narrow(floats.size());
  NarrowToF16(floats.data() + 1, narrow.data() + 1, static_cast<int64_t>(floats.size()) - 2);
  int64_t bad = 0;
  for (size_t i = 1; i + 1 < floats.size(); ++i)
    if (narrow[i].bits != F16(floats[i]) && bad++ == 0) {
      INFO("f32 bits " << std::hex << FloatBits(floats[i]) << ": bulk " << narrow[i].bits << ", scalar " << F16(floats[i]));
      CHECK(false);
    }
  CHECK(bad == 0);
}

}  // namespace
}  // namespace loom
