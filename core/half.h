// bf16 and IEEE 754 binary16 (f16) storage types and their conversions to
// and from f32 / f64, bit-exact on the host and in CUDA device code (integer
// arithmetic only: no dependence on the FPU's rounding mode, FTZ or fast-math
// flags). Narrowing rounds to nearest, ties to even, as PyTorch and IEEE do:
// overflow goes to +-inf (f16: |x| >= 65520; bf16: past the largest finite
// value by half an ulp or more), subnormals are kept (no flush to zero), the
// sign of zero is kept, and NaN stays NaN (the canonical quiet NaN, as
// PyTorch's CPU conversions give: bf16 0x7FC0, f16 0x7E00). Widening is exact.
// f64 narrows straight to bf16 / f16 (rounding once: via a round-to-odd f32,
// which is innocuous), where PyTorch's double -> float -> half can round twice.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace loom {

// Element types of DType::kBF16 / kF16 tensors: the raw bits.
struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};

LOOM_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
LOOM_HOST_DEVICE inline float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- bf16: the top half of an f32 ----

LOOM_HOST_DEVICE inline uint16_t Bf16BitsFromFloat(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7FC0u);
  // Adding 0x7FFF plus the kept part's lowest bit rounds to nearest even;
  // a carry out of the mantissa bumps the exponent (up to inf) as it should.
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
LOOM_HOST_DEVICE inline float FloatFromBf16Bits(uint16_t h) { return FloatFromBits(static_cast<uint32_t>(h) << 16); }

// ---- f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits ----

LOOM_HOST_DEVICE inline uint16_t F16BitsFromFloat(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (or inf): inf
  if (a >= 0x38800000u) {
    // Normal (>= 2^-14): rebias the exponent by 127 - 15 and round off 13
    // mantissa bits to nearest even; a carry moves into the exponent.
    const uint32_t rounded = a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to +-0
  // Subnormal: the result is round(|f| / 2^-24), the significand shifted
  // right by 126 - exponent (14..24 places). Rounding up from 1023 gives
  // 0x400, the smallest normal, as it should.
  const uint32_t exponent = a >> 23;
  const uint32_t significand = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exponent;
  const uint32_t kept = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  const uint32_t up = (rest > half || (rest == half && (kept & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (kept + up));
}

LOOM_HOST_DEVICE inline float FloatFromF16Bits(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return FloatFromBits(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN (payload kept)
  if (exponent != 0) return FloatFromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return FloatFromBits(sign);
  // Subnormal m * 2^-24: normalise (at most 10 shifts).
  uint32_t e = 113;
  while (!(mantissa & 0x400u)) {
    mantissa <<= 1;
    --e;
  }
  return FloatFromBits(sign | (e << 23) | ((mantissa & 0x3FFu) << 13));
}

// f64 -> f32 rounded to odd: truncated, with the lowest bit set when
// anything was cut off. Rounding that to a format with at least 2 fewer
// mantissa bits (bf16: 8, f16: 11, against 24) rounds exactly as rounding
// the f64 directly would. NaN stays NaN; past the f32 range gives the
// largest f32 with the lowest bit set, which still narrows to inf.
LOOM_HOST_DEVICE inline float FloatRoundedToOdd(double d) {
  if (d != d) return static_cast<float>(d);
  const float nearest = static_cast<float>(d);
  uint32_t u = FloatBits(nearest);
  const double back = static_cast<double>(nearest);
  if (back == d) return nearest;
  // The f32 magnitude ordering matches its bits' (sign aside): step the
  // magnitude down by one ulp if rounding went away from zero.
  if (d >= 0 ? back > d : back < d) u -= 1;
  return FloatFromBits(u | 1u);
}

LOOM_HOST_DEVICE inline BFloat16 ToBFloat16(float f) { return BFloat16{Bf16BitsFromFloat(f)}; }
LOOM_HOST_DEVICE inline BFloat16 ToBFloat16(double d) { return BFloat16{Bf16BitsFromFloat(FloatRoundedToOdd(d))}; }
LOOM_HOST_DEVICE inline Float16 ToFloat16(float f) { return Float16{F16BitsFromFloat(f)}; }
LOOM_HOST_DEVICE inline Float16 ToFloat16(double d) { return Float16{F16BitsFromFloat(FloatRoundedToOdd(d))}; }
LOOM_HOST_DEVICE inline float ToFloat(BFloat16 h) { return FloatFromBf16Bits(h.bits); }
LOOM_HOST_DEVICE inline float ToFloat(Float16 h) { return FloatFromF16Bits(h.bits); }

// ConvertFloat<To>(x) between float, double, BFloat16 and Float16, rounding
// once to nearest even (exact when widening), for code templated on both
// element types (the Cast kernels).
LOOM_HOST_DEVICE inline float WidenFloat(BFloat16 h) { return ToFloat(h); }
LOOM_HOST_DEVICE inline float WidenFloat(Float16 h) { return ToFloat(h); }
LOOM_HOST_DEVICE inline float WidenFloat(float x) { return x; }
LOOM_HOST_DEVICE inline double WidenFloat(double x) { return x; }

template <typename To>
struct NarrowFloat {
  template <typename Wide>
  LOOM_HOST_DEVICE static To From(Wide x) {
    return static_cast<To>(x);
  }
};
template <>
struct NarrowFloat<BFloat16> {
  template <typename Wide>
  LOOM_HOST_DEVICE static BFloat16 From(Wide x) {
    return ToBFloat16(x);
  }
};
template <>
struct NarrowFloat<Float16> {
  template <typename Wide>
  LOOM_HOST_DEVICE static Float16 From(Wide x) {
    return ToFloat16(x);
  }
};

template <typename To, typename From>
LOOM_HOST_DEVICE inline To ConvertFloat(From x) {
  return NarrowFloat<To>::From(WidenFloat(x));
}

}  // namespace loom

// Tensor::data<BFloat16>() / data<Float16>() on the host (device code uses
// raw pointers and never sees core/dtype.h).
#if !defined(__CUDACC__)
#include "core/dtype.h"
namespace loom {
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<Float16> { static constexpr DType value = DType::kF16; };
}  // namespace loom
#endif
