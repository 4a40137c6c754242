// 8 x 8 transposes of 32-bit lanes in AVX registers, shared by the
// convolutions' blocked layouts (ops/conv_ops.cc) and Transpose's tiles
// (ops/shape_ops.cc). The shuffles move bits only, so any 4-byte type
// goes through them as floats unchanged.
#pragma once

#include <cstdint>

#if defined(__AVX__)
#include <immintrin.h>

namespace loom {

// Transpose8(row, emit): emit(i, c) for i < 8, c[k] = row(k)[i], the eight
// rows in 24 shuffles instead of 64 scattered stores. Rows come from and
// go to functors, not arrays: GCC turns a loop that copies a local array of
// vectors to or from contiguous memory into a memcpy through the stack.
template <typename Row, typename Emit>
inline void Transpose8(Row&& row, Emit&& emit) {
  __m256 t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    const __m256 a = row(k), b = row(k + 1);
    t[k] = _mm256_unpacklo_ps(a, b);      // k0 k+1,0 k1 k+1,1 | k4 k+1,4 k5 k+1,5
    t[k + 1] = _mm256_unpackhi_ps(a, b);  // k2 k+1,2 k3 k+1,3 | k6 ...
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));      // column 0 (and 4) of rows k..k+3
    u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));  // column 1 (5)
    u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));  // column 2 (6)
    u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));  // column 3 (7)
  }
  for (int i = 0; i < 4; ++i) {
    emit(i, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    emit(i + 4, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}
// dst[i * dst_ld + k] = src[k * src_ld + i] (+ add[i]) for i, k < 8.
inline void Transpose8x8(const float* src, int64_t src_ld, float* dst, int64_t dst_ld, const float* add) {
  Transpose8([&](int k) { return _mm256_loadu_ps(src + k * src_ld); },
             [&](int i, __m256 c) {
               _mm256_storeu_ps(dst + i * dst_ld, add ? _mm256_add_ps(_mm256_set1_ps(add[i]), c) : c);
             });
}

}  // namespace loom

#endif  // __AVX__
