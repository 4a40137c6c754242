// The single-precision GEMM kernels of ops/gemm.cc, one per instruction set,
// each compiled in its own file with that set enabled (sgemm_avx2.cc,
// sgemm_avx512.cc) and chosen at run time from the CPU's features, so one
// binary runs the widest kernel each machine has. Every kernel computes
// each element of C with the same FMAs in the same k order (only the
// vector width differs), so their results are bit-identical.
//
// This header is included by those files: declarations only, no inline
// code that a file built for AVX-512 could hand the linker for everyone.
#pragma once

#include <cstdint>

namespace loom::sgemm {

// C = alpha * op(A) op(B) + beta * C on the calling thread (row-major;
// beta == 0 never reads C; alpha == 0 or k == 0 reads neither A nor B).
using SgemmFn = void (*)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                         int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same with op(B) made by its owner, panel by panel: pack(ctx, p0, kc,
// j0, nc, nr, dst) writes op(B)[p0, p0 + kc) x [j0, j0 + nc) as panels of
// nr columns (gemm.h, BPanels), where the kernel would pack B from memory.
using PackBFn = void (*)(const void* ctx, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t nr, float* dst);
using SgemmPanelsFn = void (*)(bool trans_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                               int64_t lda, PackBFn pack, const void* ctx, float beta, float* c, int64_t ldc);

struct Kernel {
  SgemmFn run = nullptr;  // null: not compiled into this build
  SgemmPanelsFn run_panels = nullptr;
  int rows = 0, cols = 0;  // the register tile of C
  const char* name = "";   // "AVX2+FMA micro-kernel (6x16)"
};

// AVX2 + FMA: 6 x 16 tiles in ymm registers.
Kernel Avx2Kernel();
// The AVX-512 kernel's 6 x 32 tiling, each 16-float vector a pair of ymm
// registers: runs on any AVX2 CPU (slower: its accumulators spill), so the
// tiling's packing, edges and masks are tested where AVX-512 is missing.
Kernel Avx2WideKernel();
// AVX-512F: 6 x 32 tiles in zmm registers.
Kernel Avx512Kernel();

// The same product with A and B in bf16 (their bit patterns) and C in f32,
// on the calling thread.
using Bf16GemmFn = void (*)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                            const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                            int64_t ldc);
struct Bf16Kernel {
  Bf16GemmFn run = nullptr;
  const char* name = "";
};
// AVX512_BF16: 6 x 32 tiles, a pair of k steps per VDPBF16PS
// (sbgemm_avx512bf16.cc).
Bf16Kernel Avx512Bf16Kernel();

}  // namespace loom::sgemm
