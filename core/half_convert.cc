#include "core/half_convert.h"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

namespace loom {

#if defined(__F16C__) && defined(__AVX2__)
namespace {

// 8 halves -> 8 floats. The hardware widens exactly but quiets a signaling
// NaN; half.h keeps the payload as it is, so the NaN lanes (exponent 31,
// mantissa != 0) take sign | 0x7F800000 | mantissa << 13.
inline __m256 Widen8(__m128i h) {
  const __m256 hw = _mm256_cvtph_ps(h);
  const __m256i wide = _mm256_cvtepu16_epi32(h);
  const __m256i magnitude = _mm256_and_si256(wide, _mm256_set1_epi32(0x7FFF));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7C00));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x8000)), 16);
  const __m256i payload = _mm256_slli_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x3FF)), 13);
  const __m256i exact = _mm256_or_si256(_mm256_or_si256(sign, payload), _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_ps(hw, _mm256_castsi256_ps(exact), _mm256_castsi256_ps(nan));
}

// 8 floats -> 8 halves, rounding to nearest even; NaN lanes become the
// canonical sign | 0x7E00 (the hardware keeps the payload's top bits).
inline __m128i Narrow8(__m256 x) {
  const __m128i hw = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan32 = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
  const __m256i canonical32 =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7E00));
  // 32-bit lanes to 16-bit ones (both values fit in 16 bits; the pack's
  // lane order is fixed by the permute).
  const __m256i packed_nan = _mm256_permute4x64_epi64(_mm256_packs_epi32(nan32, nan32), 0xD8);
  const __m256i packed_canonical = _mm256_permute4x64_epi64(_mm256_packus_epi32(canonical32, canonical32), 0xD8);
  return _mm_blendv_epi8(hw, _mm256_castsi256_si128(packed_canonical), _mm256_castsi256_si128(packed_nan));
}

}  // namespace

void WidenF16(const Float16* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, Widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = ToFloat(in[i]);
}

void NarrowToF16(const float* in, Float16* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), Narrow8(_mm256_loadu_ps(in + i)));
  for (; i < n; ++i) out[i] = ToFloat16(in[i]);
}

#else

void WidenF16(const Float16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ToFloat(in[i]);
}

void NarrowToF16(const float* in, Float16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ToFloat16(in[i]);
}

#endif

}  // namespace loom
