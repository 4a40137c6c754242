// The AVX-512 kernel of ops/sgemm_kernels.h: 6 x 32 tiles in zmm registers
// (the packing stays AVX2, which every AVX-512 CPU has). Built with
// -mavx512f whatever the rest of the build targets; run only where the CPU
// has it (ops/gemm.cc checks). Its arithmetic is tested lane for lane on
// AVX2 CPUs through Avx2WideKernel, the same code on pairs of ymm registers.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ops/sgemm_kernels.h"

namespace loom::sgemm {
namespace avx512 {

struct Zmm {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_load_ps(p); }
  static V LoadU(const float* p) { return _mm512_loadu_ps(p); }
  static V Broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static V Fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static void StoreU(float* p, V v) { _mm512_storeu_ps(p, v); }
  static __mmask16 Mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }  // n in [0, 16]
  static V MaskLoad(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static void MaskStore(float* p, int64_t n, V v) { _mm512_mask_storeu_ps(p, Mask(n), v); }
};

#include "ops/sgemm_impl.inc"

}  // namespace avx512

Kernel Avx512Kernel() {
  return {avx512::Sgemm<avx512::Zmm>, avx512::SgemmPanels<avx512::Zmm>, avx512::kMR, 2 * avx512::Zmm::kLanes,
          "AVX-512F micro-kernel (6x32)"};
}

}  // namespace loom::sgemm
