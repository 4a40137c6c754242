// The AVX2 + FMA kernels of ops/sgemm_kernels.h: 6 x 16 tiles in ymm
// registers, and the AVX-512 tiling (6 x 32) on pairs of them. Built with
// -mavx2 -mfma whatever the rest of the build targets; run only where the
// CPU has both (ops/gemm.cc checks).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ops/sgemm_kernels.h"

namespace loom::sgemm {
namespace avx2 {

// Lane masks for the first `n` (0..8) lanes.
inline __m256i LaneMask(int64_t n) {
  alignas(32) static const int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - n));
}

struct Ymm {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_load_ps(p); }
  static V LoadU(const float* p) { return _mm256_loadu_ps(p); }
  static V Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V Fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void StoreU(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V MaskLoad(const float* p, int64_t n) { return _mm256_maskload_ps(p, LaneMask(n)); }
  static void MaskStore(float* p, int64_t n, V v) { _mm256_maskstore_ps(p, LaneMask(n), v); }
};

// 16 lanes as two ymm registers: the AVX-512 kernel's arithmetic, lane for
// lane, on AVX2.
struct YmmPair {
  struct V {
    __m256 lo, hi;
  };
  static constexpr int kLanes = 16;
  static V Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V Set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static V Load(const float* p) { return {_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }
  static V LoadU(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static V Broadcast(const float* p) {
    const __m256 x = _mm256_broadcast_ss(p);
    return {x, x};
  }
  static V Fmadd(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static V Mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static void StoreU(float* p, V v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
  static V MaskLoad(const float* p, int64_t n) {
    return {_mm256_maskload_ps(p, LaneMask(n < 8 ? n : 8)), _mm256_maskload_ps(p + 8, LaneMask(n > 8 ? n - 8 : 0))};
  }
  static void MaskStore(float* p, int64_t n, V v) {
    _mm256_maskstore_ps(p, LaneMask(n < 8 ? n : 8), v.lo);
    _mm256_maskstore_ps(p + 8, LaneMask(n > 8 ? n - 8 : 0), v.hi);
  }
};

#include "ops/sgemm_impl.inc"

}  // namespace avx2

Kernel Avx2Kernel() {
  return {avx2::Sgemm<avx2::Ymm>, avx2::SgemmPanels<avx2::Ymm>, avx2::kMR, 2 * avx2::Ymm::kLanes,
          "AVX2+FMA micro-kernel (6x16)"};
}

Kernel Avx2WideKernel() {
  return {avx2::Sgemm<avx2::YmmPair>, avx2::SgemmPanels<avx2::YmmPair>, avx2::kMR, 2 * avx2::YmmPair::kLanes,
          "AVX2+FMA, 6x32 tiles as ymm pairs"};
}

}  // namespace loom::sgemm
