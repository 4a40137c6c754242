// Row-major GEMM on the CPU: C = alpha * op(A) * op(B) + beta * C. All CPU
// ops that reduce to matrix products (Linear, MatMul, BatchMatMul,
// convolution via im2col) call this.
//
// Single precision runs a packed, cache-blocked micro-kernel for the widest
// vector instruction set the CPU has, chosen at run time (AVX-512F: 6 x 32
// register tiles, AVX2 + FMA: 6 x 16; ops/sgemm_kernels.h), else Eigen;
// double precision always runs Eigen. beta == 0 never reads C (it may hold
// garbage), and in the micro-kernels alpha == 0 or k == 0 reads neither A
// nor B. A product big enough is split into one panel of C per thread; the
// micro-kernels compute each element's sum in the same order whatever the
// split or the vector width, so results are bit-identical for any thread
// count and on AVX2 and AVX-512 machines alike. A product of a few rows
// against a wide B runs as C^T = op(B)^T op(A)^T, which reads B in place
// instead of packing it for those rows (the same bits).
#pragma once

#include <string>

#include <cstdint>

#include "core/half.h"
#include "core/thread_pool.h"

namespace loom {

// The instruction sets the GEMMs run with here: "f32: AVX-512F micro-kernel
// (6x32), chosen at run time; f64: Eigen (AVX SSE2 ...)", or Eigen's for
// both (what `loom bench kernels` reports beside the CPU's own).
std::string GemmInstructionSets();

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, ThreadPool* pool);

// op(B) [k, n] made by its owner as the GEMM needs it, panel by panel,
// instead of read from a matrix in memory: a convolution's image side
// packed straight from the image planes, where an im2col copy would be
// written and then read again to be packed. pack(ctx, p0, kc, j0, nc, nr,
// dst) writes op(B)(p, j) for p in [p0, p0 + kc), j in [j0, j0 + nc) at
// dst[((j - j0) / nr) * kc * nr + (p - p0) * nr + (j - j0) % nr], and zeros
// in the last panel's columns past nc. The results are those of the same
// op(B) read from memory, bit for bit.
template <typename T>
struct BPanels {
  void (*pack)(const void* ctx, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t nr, T* dst) = nullptr;
  const void* ctx = nullptr;
};

// C = alpha * op(A) * B + beta * C with B made by `b`.
template <typename T>
void Gemm(bool trans_a, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const BPanels<T>& b,
          T beta, T* c, int64_t ldc, ThreadPool* pool);

// Batched: `batch` independent GEMMs at fixed strides (elements) apart.
template <typename T>
void BatchedGemm(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
                 int64_t stride_c, ThreadPool* pool);

// bf16 A and B, f32 C, on CPUs with AVX512_BF16 (ops/sbgemm_avx512bf16.cc:
// pairs of bf16 products added in f32 by one instruction, subnormals as
// zero), split over threads as Gemm and with results as independent of the
// split. HasBf16Gemm() says whether this CPU has the kernel (and
// LOOM_BF16_GEMM=widen did not turn it off); callers widen to f32
// otherwise.
bool HasBf16Gemm();
void BatchedGemm(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                 const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b, int64_t ldb, int64_t stride_b,
                 float beta, float* c, int64_t ldc, int64_t stride_c, ThreadPool* pool);

}  // namespace loom
