#include "ops/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LOOM_GEMM_AVX2 1
#else
#define LOOM_GEMM_AVX2 0
#endif

namespace loom {

std::string GemmInstructionSets() {
  const std::string eigen = std::string("Eigen (") + Eigen::SimdInstructionSetsInUse() + ")";
  return (LOOM_GEMM_AVX2 ? "f32: AVX2+FMA micro-kernel (6x16); f64: " : "f32 and f64: ") + eigen;
}

namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using MutMap = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;

// One single-threaded Eigen GEMM on a panel of C (double, and float where
// the AVX2 kernel is not compiled in).
template <typename T>
void EigenPanel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  MutMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    C.setZero();
  } else if (beta != T(1)) {
    C *= beta;
  }
  if (k == 0) return;
  // op(A) is m x k; stored A is (m x k) or (k x m) row-major.
  ConstMap<T> A(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  ConstMap<T> B(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!trans_a && !trans_b) C.noalias() += alpha * A * B;
  else if (trans_a && !trans_b) C.noalias() += alpha * A.transpose() * B;
  else if (!trans_a && trans_b) C.noalias() += alpha * A * B.transpose();
  else C.noalias() += alpha * A.transpose() * B.transpose();
}

#if LOOM_GEMM_AVX2
// ---------------------------------------------------------------------------
// Single-precision GEMM in the BLIS / GotoBLAS layout:
//
//   for jc in n step NC:            B block  [KC x NC]  packed, L2 / L3
//     for pc in k step KC:
//       pack op(B)[pc:+kc, jc:+nc] into NR-column micro-panels
//       for ic in m step MC:        A block  [MC x KC]  packed, L2
//         pack op(A)[ic:+mc, pc:+kc] into MR-row micro-panels
//           (unless nc is small: then the kernel reads op(A) in place)
//         for jr in nc step NR:     B micro-panel [KC x NR] stays in L1
//           for ir in mc step MR:   6 x 16 register tile of C
//
// The micro-kernel keeps a 6 x 16 tile of C in 12 ymm accumulators and per
// k step loads two vectors of B and broadcasts six values of A (12 FMAs).
// Edge tiles: B panels are zero-padded to 16 columns and C is written with
// masked stores; partial row tiles run a kernel instantiated for 1-5 rows.
// Every element of C is the same sequence of FMAs over k (in KC blocks
// whose size depends only on k), whatever the tile, the way op(A) is read
// or the thread it falls in, so results do not depend on the thread count.
namespace sgemm {

constexpr int kMR = 6;
constexpr int kNR = 16;
constexpr int64_t kKC = 320;   // k block: a B micro-panel is kc x 16 floats (about 20 KiB, L1)
constexpr int64_t kMC = 144;   // rows of A per block (144 x 320 floats = 180 KiB, L2); a multiple of kMR
constexpr int64_t kNC = 3072;  // columns of B per block (320 x 3072 floats = 3.75 MiB, L3); a multiple of kNR
constexpr int64_t kSlack = 16;  // floats past a packed buffer that the A packing may overwrite

// Per-thread packing buffers, grown on demand and kept.
struct PackBuffers {
  float* a = nullptr;
  float* b = nullptr;
  size_t a_cap = 0, b_cap = 0;
  ~PackBuffers() {
    std::free(a);
    std::free(b);
  }
  static float* Grow(float** p, size_t* cap, size_t need) {
    if (need > *cap) {
      std::free(*p);
      *p = nullptr;
      *cap = 0;
      need = (need + 1023) & ~size_t(1023);  // a multiple of the alignment, as aligned_alloc requires
      *p = static_cast<float*>(std::aligned_alloc(64, need * sizeof(float)));
      if (*p == nullptr) throw std::bad_alloc();
      *cap = need;
    }
    return *p;
  }
  float* A(size_t need) { return Grow(&a, &a_cap, need); }
  float* B(size_t need) { return Grow(&b, &b_cap, need); }
};

PackBuffers& ThreadBuffers() {
  thread_local PackBuffers buffers;
  return buffers;
}

inline void Transpose8x8(__m256& r0, __m256& r1, __m256& r2, __m256& r3, __m256& r4, __m256& r5, __m256& r6,
                         __m256& r7) {
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r0 = _mm256_permute2f128_ps(s0, s4, 0x20);
  r1 = _mm256_permute2f128_ps(s1, s5, 0x20);
  r2 = _mm256_permute2f128_ps(s2, s6, 0x20);
  r3 = _mm256_permute2f128_ps(s3, s7, 0x20);
  r4 = _mm256_permute2f128_ps(s0, s4, 0x31);
  r5 = _mm256_permute2f128_ps(s1, s5, 0x31);
  r6 = _mm256_permute2f128_ps(s2, s6, 0x31);
  r7 = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Packs op(B)[0:kc, 0:nc] (b points at its first element) into micro-panels
// of kNR columns: panel j holds dst[j * kc * kNR + p * kNR + c]. Columns past
// nc are zero.
void PackB(bool trans_b, const float* b, int64_t ldb, int64_t kc, int64_t nc, float* dst) {
  for (int64_t j0 = 0; j0 < nc; j0 += kNR, dst += kc * kNR) {
    const int64_t cols = std::min<int64_t>(kNR, nc - j0);
    if (!trans_b) {  // op(B)(p, j) = b[p * ldb + j]: rows are contiguous
      const float* src = b + j0;
      if (cols == kNR) {
        for (int64_t p = 0; p < kc; ++p) {
          _mm256_store_ps(dst + p * kNR, _mm256_loadu_ps(src + p * ldb));
          _mm256_store_ps(dst + p * kNR + 8, _mm256_loadu_ps(src + p * ldb + 8));
        }
      } else {
        for (int64_t p = 0; p < kc; ++p) {
          float* d = dst + p * kNR;
          int64_t c = 0;
          for (; c < cols; ++c) d[c] = src[p * ldb + c];
          for (; c < kNR; ++c) d[c] = 0.0f;
        }
      }
    } else {  // op(B)(p, j) = b[j * ldb + p]: transpose 8 x 8 blocks
      const float* src = b + j0 * ldb;
      if (cols == kNR) {
        int64_t p = 0;
        for (; p + 8 <= kc; p += 8) {
          for (int h = 0; h < 2; ++h) {
            const float* s = src + h * 8 * ldb + p;
            __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ldb), r2 = _mm256_loadu_ps(s + 2 * ldb),
                   r3 = _mm256_loadu_ps(s + 3 * ldb), r4 = _mm256_loadu_ps(s + 4 * ldb),
                   r5 = _mm256_loadu_ps(s + 5 * ldb), r6 = _mm256_loadu_ps(s + 6 * ldb),
                   r7 = _mm256_loadu_ps(s + 7 * ldb);
            Transpose8x8(r0, r1, r2, r3, r4, r5, r6, r7);
            float* d = dst + p * kNR + h * 8;
            _mm256_store_ps(d, r0);
            _mm256_store_ps(d + kNR, r1);
            _mm256_store_ps(d + 2 * kNR, r2);
            _mm256_store_ps(d + 3 * kNR, r3);
            _mm256_store_ps(d + 4 * kNR, r4);
            _mm256_store_ps(d + 5 * kNR, r5);
            _mm256_store_ps(d + 6 * kNR, r6);
            _mm256_store_ps(d + 7 * kNR, r7);
          }
        }
        for (; p < kc; ++p)
          for (int64_t c = 0; c < kNR; ++c) dst[p * kNR + c] = src[c * ldb + p];
      } else {
        for (int64_t p = 0; p < kc; ++p) {
          float* d = dst + p * kNR;
          int64_t c = 0;
          for (; c < cols; ++c) d[c] = src[c * ldb + p];
          for (; c < kNR; ++c) d[c] = 0.0f;
        }
      }
    }
  }
}

// Packs op(A)[0:mc, 0:kc] (a points at its first element) into micro-panels
// of kMR rows: panel i holds dst[i * kc * kMR + p * kMR + r]. Rows past mc are
// zero. May write up to kSlack floats past the last panel.
void PackA(bool trans_a, const float* a, int64_t lda, int64_t mc, int64_t kc, float* dst) {
  for (int64_t i0 = 0; i0 < mc; i0 += kMR, dst += kc * kMR) {
    const int64_t rows = std::min<int64_t>(kMR, mc - i0);
    if (trans_a) {  // op(A)(i, p) = a[p * lda + i]: kMR contiguous floats per p
      const float* src = a + i0;
      if (rows == kMR) {
        for (int64_t p = 0; p < kc; ++p) std::memcpy(dst + p * kMR, src + p * lda, kMR * sizeof(float));
      } else {
        for (int64_t p = 0; p < kc; ++p) {
          float* d = dst + p * kMR;
          int64_t r = 0;
          for (; r < rows; ++r) d[r] = src[p * lda + r];
          for (; r < kMR; ++r) d[r] = 0.0f;
        }
      }
    } else {  // op(A)(i, p) = a[i * lda + p]: transpose 8 (p) x 6 (rows) blocks
      const float* src = a + i0 * lda;
      int64_t p = 0;
      if (rows == kMR) {
        const __m256 z = _mm256_setzero_ps();
        for (; p + 8 <= kc; p += 8) {
          const float* s = src + p;
          __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + lda), r2 = _mm256_loadu_ps(s + 2 * lda),
                 r3 = _mm256_loadu_ps(s + 3 * lda), r4 = _mm256_loadu_ps(s + 4 * lda),
                 r5 = _mm256_loadu_ps(s + 5 * lda), r6 = z, r7 = z;
          Transpose8x8(r0, r1, r2, r3, r4, r5, r6, r7);
          // Each store writes 8 floats, 6 of them p's rows; the next store
          // overwrites the 2 extra (the last ones spill into kSlack or the
          // next panel, packed after this one).
          float* d = dst + p * kMR;
          _mm256_storeu_ps(d, r0);
          _mm256_storeu_ps(d + kMR, r1);
          _mm256_storeu_ps(d + 2 * kMR, r2);
          _mm256_storeu_ps(d + 3 * kMR, r3);
          _mm256_storeu_ps(d + 4 * kMR, r4);
          _mm256_storeu_ps(d + 5 * kMR, r5);
          _mm256_storeu_ps(d + 6 * kMR, r6);
          _mm256_storeu_ps(d + 7 * kMR, r7);
        }
      }
      for (; p < kc; ++p) {
        float* d = dst + p * kMR;
        int64_t r = 0;
        for (; r < rows; ++r) d[r] = src[r * lda + p];
        for (; r < kMR; ++r) d[r] = 0.0f;
      }
    }
  }
}

// Lane masks for the first `cols` (0..8) lanes.
inline __m256i LaneMask(int64_t cols) {
  alignas(32) static const int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - cols));
}

// How the micro-kernel reads its kMR x kc slice of op(A): element (r, p) is
// a[p * sa + r] (kStepMajor: a packed panel with sa = kMR, or op(A) = A^T
// read in place with sa = lda) or a[r * sa + p] (kRowMajor: op(A) = A read
// in place, sa = lda).
enum class AMode { kStepMajor, kRowMajor };

// C[0:R, 0:cols] = alpha * op(A) op(B) + beta * C over one kc block, from R
// rows of op(A) (see AMode; rows >= R are never read) and a packed B
// micro-panel (kNR floats per k step). beta == 0 never reads C. The
// accumulators are named variables (GCC keeps arrays of vectors on the
// stack); rows >= R compile away. Both modes run the same FMAs in the same
// order, so packed and in-place reads give bit-identical results.
template <int R, AMode kMode>
__attribute__((noinline)) void MicroKernel(int64_t kc, const float* __restrict a, int64_t sa,
                                           const float* __restrict b, float* c, int64_t ldc, int64_t cols,
                                           float alpha, float beta) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int r = 0; r < R; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 15), _MM_HINT_T0);
  }
#define LOOM_SGEMM_ROW(r, addr)                           \
  if constexpr (R > r) {                                  \
    const __m256 av = _mm256_broadcast_ss(addr);          \
    c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);           \
    c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);           \
  }
  if constexpr (kMode == AMode::kStepMajor) {
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
      const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
      LOOM_SGEMM_ROW(0, a)
      LOOM_SGEMM_ROW(1, a + 1)
      LOOM_SGEMM_ROW(2, a + 2)
      LOOM_SGEMM_ROW(3, a + 3)
      LOOM_SGEMM_ROW(4, a + 4)
      LOOM_SGEMM_ROW(5, a + 5)
      a += sa;
      b += kNR;
    }
  } else {
    const float* a0 = a;
    const float* a1 = a + std::min(1, R - 1) * sa;
    const float* a2 = a + std::min(2, R - 1) * sa;
    const float* a3 = a + std::min(3, R - 1) * sa;
    const float* a4 = a + std::min(4, R - 1) * sa;
    const float* a5 = a + std::min(5, R - 1) * sa;
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
      const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
      LOOM_SGEMM_ROW(0, a0 + p)
      LOOM_SGEMM_ROW(1, a1 + p)
      LOOM_SGEMM_ROW(2, a2 + p)
      LOOM_SGEMM_ROW(3, a3 + p)
      LOOM_SGEMM_ROW(4, a4 + p)
      LOOM_SGEMM_ROW(5, a5 + p)
      b += kNR;
    }
  }
#undef LOOM_SGEMM_ROW
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  const __m256 acc[2 * kMR] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
  if (cols == kNR) {
    for (int r = 0; r < R; ++r) {
      float* cr = c + r * ldc;
      __m256 t0 = _mm256_mul_ps(va, acc[2 * r]), t1 = _mm256_mul_ps(va, acc[2 * r + 1]);
      if (beta != 0.0f) {
        t0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), t0);
        t1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), t1);
      }
      _mm256_storeu_ps(cr, t0);
      _mm256_storeu_ps(cr + 8, t1);
    }
  } else {
    const __m256i m0 = LaneMask(std::min<int64_t>(cols, 8)), m1 = LaneMask(std::max<int64_t>(cols - 8, 0));
    for (int r = 0; r < R; ++r) {
      float* cr = c + r * ldc;
      __m256 t0 = _mm256_mul_ps(va, acc[2 * r]), t1 = _mm256_mul_ps(va, acc[2 * r + 1]);
      if (beta != 0.0f) {
        t0 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(cr, m0), t0);
        if (cols > 8) t1 = _mm256_fmadd_ps(vb, _mm256_maskload_ps(cr + 8, m1), t1);
      }
      _mm256_maskstore_ps(cr, m0, t0);
      if (cols > 8) _mm256_maskstore_ps(cr + 8, m1, t1);
    }
  }
}

using KernelFn = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t, float, float);
template <AMode kMode>
constexpr KernelFn kKernels[kMR + 1] = {nullptr,
                                        MicroKernel<1, kMode>,
                                        MicroKernel<2, kMode>,
                                        MicroKernel<3, kMode>,
                                        MicroKernel<4, kMode>,
                                        MicroKernel<5, kMode>,
                                        MicroKernel<6, kMode>};

// op(A) is read in place rather than packed when a block of it is used by
// at most this many B micro-panels: packing costs a pass over the block and
// pays off only through reuse. In place, op(A) = A is six sequential row
// streams, cheap at any lda; op(A) = A^T steps lda floats per k, which for
// power-of-two lda lands every step in the same few cache sets, so A^T is
// read in place only when a block is used once (n <= 16).
#ifndef LOOM_SGEMM_DIRECT_A
#define LOOM_SGEMM_DIRECT_A 8
#endif
#ifndef LOOM_SGEMM_DIRECT_AT
#define LOOM_SGEMM_DIRECT_AT 1
#endif
constexpr int64_t kDirectAMaxPanels = LOOM_SGEMM_DIRECT_A;
constexpr int64_t kDirectATransMaxPanels = LOOM_SGEMM_DIRECT_AT;

// C = alpha * op(A) op(B) + beta * C on the calling thread.
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {  // C = beta * C (beta == 0 writes zeros, never reads C)
    for (int64_t i = 0; i < m; ++i) {
      float* ci = c + i * ldc;
      if (beta == 0.0f) std::fill(ci, ci + n, 0.0f);
      else if (beta != 1.0f)
        for (int64_t j = 0; j < n; ++j) ci[j] *= beta;
    }
    return;
  }
  // Equal k blocks of at most kKC (a multiple of 8 where k allows), a
  // function of k only: the summation order never depends on m, n or threads.
  const int64_t k_blocks = (k + kKC - 1) / kKC;
  const int64_t kcb = std::min(k, ((k + k_blocks - 1) / k_blocks + 7) / 8 * 8);
  const int64_t nc_max = std::min(kNC, (n + kNR - 1) / kNR * kNR);
  const int64_t mc_max = std::min(kMC, (m + kMR - 1) / kMR * kMR);
  PackBuffers& buf = ThreadBuffers();
  float* pb = buf.B(static_cast<size_t>(kcb * nc_max + kSlack));
  float* pa = buf.A(static_cast<size_t>(kcb * mc_max + kSlack));

  for (int64_t jc = 0; jc < n; jc += kNC) {
    const int64_t nc = std::min(kNC, n - jc);
    for (int64_t pc = 0; pc < k; pc += kcb) {
      const int64_t kc = std::min(kcb, k - pc);
      const float beta_blk = pc == 0 ? beta : 1.0f;
      PackB(trans_b, trans_b ? b + jc * ldb + pc : b + pc * ldb + jc, ldb, kc, nc, pb);
      const int64_t panels = (nc + kNR - 1) / kNR;
      const bool direct_a = panels <= (trans_a ? kDirectATransMaxPanels : kDirectAMaxPanels);
      for (int64_t ic = 0; ic < m; ic += kMC) {
        const int64_t mc = std::min(kMC, m - ic);
        const float* ablk = trans_a ? a + pc * lda + ic : a + ic * lda + pc;
        if (!direct_a) PackA(trans_a, ablk, lda, mc, kc, pa);
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const int64_t cols = std::min<int64_t>(kNR, nc - jr);
          const float* bp = pb + jr * kc;
          float* cj = c + ic * ldc + jc + jr;
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int64_t rows = std::min<int64_t>(kMR, mc - ir);
            if (!direct_a) {
              kKernels<AMode::kStepMajor>[rows](kc, pa + ir * kc, kMR, bp, cj + ir * ldc, ldc, cols, alpha, beta_blk);
            } else if (trans_a) {
              kKernels<AMode::kStepMajor>[rows](kc, ablk + ir, lda, bp, cj + ir * ldc, ldc, cols, alpha, beta_blk);
            } else {
              kKernels<AMode::kRowMajor>[rows](kc, ablk + ir * lda, lda, bp, cj + ir * ldc, ldc, cols, alpha, beta_blk);
            }
          }
        }
      }
    }
  }
}

}  // namespace sgemm
#endif  // LOOM_GEMM_AVX2

template <typename T>
void GemmPanel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  EigenPanel(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#if LOOM_GEMM_AVX2
template <>
void GemmPanel<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm::Sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

// Panel granularity of the thread split (rows, columns): whole register
// tiles of the AVX2 kernel, so no thread gets extra edge tiles.
#if LOOM_GEMM_AVX2
constexpr int64_t kRowGrain = sgemm::kMR, kColGrain = sgemm::kNR;
#else
constexpr int64_t kRowGrain = 16, kColGrain = 16;
#endif

// Least work (flops) worth handing to another thread. Waking a pool worker
// costs ~5 us back to back and 20-40 us when its vCPU has gone idle on these
// VMs, more when a neighbouring process holds it; each panel also repacks
// the shared operand. Measured on the 2-vCPU EPYC VM, two threads beat one
// (by 1.2-1.8x) from ~25 MFLOP up and mostly lose below ~8 MFLOP.
constexpr double kMinFlopsPerThread = 8e6;

}  // namespace

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, ThreadPool* pool) {
  if (m == 0 || n == 0) return;
  const double flops = 2.0 * m * n * k;
  const int64_t parts =
      std::min<int64_t>(pool ? pool->num_threads() : 1, static_cast<int64_t>(flops / kMinFlopsPerThread));
  if (parts <= 1) {
    GemmPanel(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Split the larger side of C into `parts` panels of whole register tiles;
  // each is an independent GEMM reading a slice of A (rows) or B (columns),
  // and computes each of its elements exactly as one thread would (the same
  // FMAs in the same k order), so results do not depend on the split.
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n, grain = by_rows ? kRowGrain : kColGrain;
  const int64_t tiles = (extent + grain - 1) / grain;
  const int64_t panels = std::min(parts, tiles);
  pool->ParallelFor(panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t lo = tiles * p / panels * grain, hi = std::min(extent, tiles * (p + 1) / panels * grain);
      if (by_rows) {
        const T* a_panel = trans_a ? a + lo : a + lo * lda;
        GemmPanel(trans_a, trans_b, hi - lo, n, k, alpha, a_panel, lda, b, ldb, beta, c + lo * ldc, ldc);
      } else {
        const T* b_panel = trans_b ? b + lo * ldb : b + lo;
        GemmPanel(trans_a, trans_b, m, hi - lo, k, alpha, a, lda, b_panel, ldb, beta, c + lo, ldc);
      }
    }
  });
}

template <typename T>
void BatchedGemm(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
                 int64_t stride_c, ThreadPool* pool) {
  const int threads = pool ? pool->num_threads() : 1;
  if (batch >= threads && threads > 1) {
    // Enough independent products: one thread per group of batch entries,
    // each group at least kMinFlopsPerThread of work (else all on this one).
    const double entry_flops = std::max(1.0, 2.0 * m * n * k);
    const int64_t min_chunk = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMinFlopsPerThread / entry_flops)));
    pool->ParallelFor(batch, min_chunk, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i)
        GemmPanel(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
                  c + i * stride_c, ldc);
    });
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    Gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc,
         pool);
}

#define LOOM_INSTANTIATE_GEMM(T)                                                                                   \
  template void Gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*,      \
                        int64_t, ThreadPool*);                                                                     \
  template void BatchedGemm<T>(bool, bool, int64_t, int64_t, int64_t, int64_t, T, const T*, int64_t, int64_t,       \
                               const T*, int64_t, int64_t, T, T*, int64_t, int64_t, ThreadPool*);
LOOM_INSTANTIATE_GEMM(float)
LOOM_INSTANTIATE_GEMM(double)
#undef LOOM_INSTANTIATE_GEMM

}  // namespace loom
