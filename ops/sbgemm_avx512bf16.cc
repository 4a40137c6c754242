// The bf16 GEMM of ops/sgemm_kernels.h: C (f32) = alpha * op(A) op(B) +
// beta * C with A and B in bf16, on CPUs with AVX512_BF16 (Zen 4, Intel
// Cooper Lake and Sapphire Rapids). Built with -mavx512bf16 whatever the
// rest of the build targets; run only where the CPU has it (ops/gemm.cc
// checks).
//
// VDPBF16PS multiplies pairs of bf16 and adds both products to an f32 lane:
// one instruction does the work of two f32 FMAs. So the packed operands
// hold k in pairs, a pair one 32-bit word: A's micro-panels [k / 2][6] and
// B's [k / 2][32] words, and the micro-kernel is sgemm_impl.inc's 6 x 32
// tile with a k step of two (per pair: two words-vectors of B, six
// broadcast words of A, 12 VDPBF16PS). A product of two bf16 is exact in
// f32; each of the two additions rounds to nearest even, and the
// instruction treats subnormal inputs and results as zero. An odd k pads
// its last pair with a zero. The blocking is sgemm_impl.inc's, k blocks an
// even number of steps long and a function of k alone, so results depend
// neither on the thread count nor on how C is split.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ops/sgemm_kernels.h"
#include "ops/transpose8.h"

namespace loom::sgemm {
namespace avx512bf16 {

constexpr int kMR = 6;
constexpr int kNR = 32;        // two vectors of 16 f32 lanes
constexpr int64_t kKC = 512;   // k block (256 pairs): a B micro-panel is 256 x 32 words, 32 KiB
constexpr int64_t kMC = 144;   // rows of A per block: 144 x 256 words, 144 KiB (L2); a multiple of kMR
constexpr int64_t kNC = 3072;  // columns of B per block: 256 x 3072 words, 3 MiB (L3); a multiple of kNR

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

using Word = uint32_t;  // a pair of bf16: k step 2q in the low half, 2q + 1 in the high one

// Per-thread packing buffers, grown on demand and kept.
struct PackBuffers {
  Word* a = nullptr;
  Word* b = nullptr;
  size_t a_cap = 0, b_cap = 0;
  ~PackBuffers() {
    std::free(a);
    std::free(b);
  }
  static Word* Grow(Word** p, size_t* cap, size_t need) {
    if (need > *cap) {
      std::free(*p);
      *p = nullptr;
      *cap = 0;
      need = (need + 1023) & ~size_t(1023);  // a multiple of the alignment, as aligned_alloc requires
      *p = static_cast<Word*>(std::aligned_alloc(64, need * sizeof(Word)));
      if (*p == nullptr) throw std::bad_alloc();
      *cap = need;
    }
    return *p;
  }
};

PackBuffers& ThreadBuffers() {
  thread_local PackBuffers buffers;
  return buffers;
}

inline Word Pair(uint16_t lo, uint16_t hi) { return Word(lo) | (Word(hi) << 16); }

// out[c] = the pair of rows r0 and r1 (r1 null: zeros) in column c, c < 16.
inline void InterleaveRows16(const uint16_t* r0, const uint16_t* r1, Word* out) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0));
  const __m256i y = r1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1)) : _mm256_setzero_si256();
  const __m256i lo = _mm256_unpacklo_epi16(x, y), hi = _mm256_unpackhi_epi16(x, y);  // columns 0-3, 8-11 | 4-7, 12-15
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
}

// Packs the pairs of `lines` lines of an operand whose k runs along each
// line (line x's k step p at src[x * ld + p]), k steps [0, kc), into
// dst[q * width + x] for pairs q and lines x < width; lines past `lines`
// and the high half of an odd kc's last pair are zero. Whole groups of 8
// lines and 8 pairs go as 8 x 8 transposes of words (ops/transpose8.h: its
// shuffles move bits, so words pass through them as floats).
void PackAlongLines(const uint16_t* src, int64_t ld, int64_t lines, int64_t kc, int width, Word* dst) {
  const int64_t pairs = (kc + 1) / 2, whole = kc / 2;
  int64_t q0 = 0;
  if (lines == width)
    for (; q0 + 8 <= whole; q0 += 8)
      for (int x0 = 0; x0 < width; x0 += 8) {
        const int rows = width - x0 < 8 ? width - x0 : 8;  // 6 for A's panels
        Transpose8(
            [&](int v) {
              return v < rows ? _mm256_loadu_ps(reinterpret_cast<const float*>(src + (x0 + v) * ld + 2 * q0))
                              : _mm256_setzero_ps();
            },
            [&](int q, __m256 c) {
              Word* d = dst + (q0 + q) * width + x0;
              if (rows == 8) {
                _mm256_storeu_ps(reinterpret_cast<float*>(d), c);
              } else {
                alignas(32) Word w[8];
                _mm256_store_ps(reinterpret_cast<float*>(w), c);
                std::memcpy(d, w, static_cast<size_t>(rows) * sizeof(Word));
              }
            });
      }
  for (int64_t q = q0; q < pairs; ++q)
    for (int x = 0; x < width; ++x) {
      const uint16_t* s = src + x * ld + 2 * q;
      dst[q * width + x] = x >= lines ? 0 : Pair(s[0], 2 * q + 1 < kc ? s[1] : 0);
    }
}

// Packs the pairs of `lines` lines of an operand whose lines run along each
// k step (line x's k step p at src[p * ld + x]), k steps [0, kc), into
// dst[q * width + x], zero as PackAlongLines. 16 lines of a pair of rows go
// as one interleave of 16-bit halves.
void PackAcrossLines(const uint16_t* src, int64_t ld, int64_t lines, int64_t kc, int width, Word* dst) {
  for (int64_t q = 0; q < (kc + 1) / 2; ++q) {
    const uint16_t* r0 = src + 2 * q * ld;
    const uint16_t* r1 = 2 * q + 1 < kc ? r0 + ld : nullptr;
    Word* d = dst + q * width;
    int x = 0;
    if (lines == width)
      for (; x + 16 <= width; x += 16) InterleaveRows16(r0 + x, r1 ? r1 + x : nullptr, d + x);
    for (; x < width; ++x) d[x] = x >= lines ? 0 : Pair(r0[x], r1 ? r1[x] : 0);
  }
}

// op(B)[0:kc, 0:nc] (b at its first element) as micro-panels of kNR
// columns: panel j holds dst[j * pairs * kNR + q * kNR + c].
void PackB(bool trans_b, const uint16_t* b, int64_t ldb, int64_t kc, int64_t nc, Word* dst) {
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t j0 = 0; j0 < nc; j0 += kNR, dst += pairs * kNR) {
    const int64_t cols = Min(kNR, nc - j0);
    if (trans_b) {  // op(B)(p, j) = b[j * ldb + p]: k along each column's line
      PackAlongLines(b + j0 * ldb, ldb, cols, kc, kNR, dst);
    } else {
      PackAcrossLines(b + j0, ldb, cols, kc, kNR, dst);
    }
  }
}

// op(A)[0:mc, 0:kc] (a at its first element) as micro-panels of kMR rows:
// panel i holds dst[i * pairs * kMR + q * kMR + r].
void PackA(bool trans_a, const uint16_t* a, int64_t lda, int64_t mc, int64_t kc, Word* dst) {
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t i0 = 0; i0 < mc; i0 += kMR, dst += pairs * kMR) {
    const int64_t rows = Min(kMR, mc - i0);
    if (trans_a) {  // op(A)(i, p) = a[p * lda + i]
      PackAcrossLines(a + i0, lda, rows, kc, kMR, dst);
    } else {
      PackAlongLines(a + i0 * lda, lda, rows, kc, kMR, dst);
    }
  }
}

// C[0:R, 0:cols] = alpha * A B + beta * C over one k block of `pairs`
// pairs, from a packed A micro-panel (R of its kMR rows) and B micro-panel.
// beta == 0 never reads C.
template <int R>
__attribute__((noinline)) void MicroKernel(int64_t pairs, const Word* __restrict a, const Word* __restrict b, float* c,
                                           int64_t ldc, int64_t cols, float alpha, float beta) {
  __m512 acc[2 * kMR];
  for (int i = 0; i < 2 * R; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int64_t q = 0; q < pairs; ++q) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(b));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_load_si512(b + 16));
    for (int r = 0; r < R; ++r) {
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[r])));
      acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], av, b0);
      acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], av, b1);
    }
    a += kMR;
    b += kNR;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xffff : (1u << cols) - 1u);
  const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xffff : cols > 16 ? (1u << (cols - 16)) - 1u : 0u);
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    __m512 t0 = _mm512_mul_ps(va, acc[2 * r]), t1 = _mm512_mul_ps(va, acc[2 * r + 1]);
    if (beta != 0.0f) {
      t0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), t0);
      t1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), t1);
    }
    _mm512_mask_storeu_ps(cr, m0, t0);
    _mm512_mask_storeu_ps(cr + 16, m1, t1);
  }
}

using KernelFn = void (*)(int64_t, const Word*, const Word*, float*, int64_t, int64_t, float, float);
constexpr KernelFn kKernels[kMR + 1] = {nullptr,        MicroKernel<1>, MicroKernel<2>, MicroKernel<3>,
                                        MicroKernel<4>, MicroKernel<5>, MicroKernel<6>};

void Sbgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
            const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {  // C = beta * C (beta == 0 writes zeros, never reads C)
    for (int64_t i = 0; i < m; ++i) {
      float* ci = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) ci[j] = beta == 0.0f ? 0.0f : (beta == 1.0f ? ci[j] : ci[j] * beta);
    }
    return;
  }
  // Equal k blocks of at most kKC steps, an even number of them (pairs never
  // straddle blocks), a function of k only.
  const int64_t k_blocks = (k + kKC - 1) / kKC;
  const int64_t kcb = Min(k, ((k + k_blocks - 1) / k_blocks + 15) / 16 * 16);
  const int64_t pairs_max = (kcb + 1) / 2;
  const int64_t nc_max = Min(kNC, (n + kNR - 1) / kNR * kNR);
  const int64_t mc_max = Min(kMC, (m + kMR - 1) / kMR * kMR);
  PackBuffers& buf = ThreadBuffers();
  Word* pb = PackBuffers::Grow(&buf.b, &buf.b_cap, static_cast<size_t>(pairs_max * nc_max));
  Word* pa = PackBuffers::Grow(&buf.a, &buf.a_cap, static_cast<size_t>(pairs_max * mc_max));
  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = Min(kNC, n - jc);
    for (int64_t pc = 0; pc < k; pc += kcb) {
      const int64_t kc = Min(kcb, k - pc), pairs = (kc + 1) / 2;
      const float beta_blk = pc == 0 ? beta : 1.0f;
      PackB(trans_b, trans_b ? b + jc * ldb + pc : b + pc * ldb + jc, ldb, kc, nc, pb);
      for (int64_t ic = 0; ic < m; ic += kMC) {
        const int64_t mc = Min(kMC, m - ic);
        PackA(trans_a, trans_a ? a + pc * lda + ic : a + ic * lda + pc, lda, mc, kc, pa);
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const int64_t cols = Min(kNR, nc - jr);
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int64_t rows = Min(kMR, mc - ir);
            kKernels[rows](pairs, pa + ir * pairs, pb + jr * pairs, c + (ic + ir) * ldc + jc + jr, ldc, cols, alpha,
                           beta_blk);
          }
        }
      }
    }
  }
}

}  // namespace avx512bf16

Bf16Kernel Avx512Bf16Kernel() { return {avx512bf16::Sbgemm, "AVX512_BF16 micro-kernel (6x32, VDPBF16PS)"}; }

}  // namespace loom::sgemm
