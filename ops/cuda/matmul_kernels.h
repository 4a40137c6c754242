// How a row-major GEMM maps onto cuBLAS's column-major one (used by
// matmul_kernels.cc; a pure function, so the mapping is testable without a GPU).
#pragma once

#include <cstdint>

namespace loom::cuda {

// The cuBLAS GEMM that computes the row-major C[m, n] = op(A) op(B), with A
// and B stored row-major with row lengths lda and ldb. cuBLAS computes
// C' = op1(X1) op2(X2) column-major: X1 is B and X2 is A (see the .cc).
struct CublasGemmShape {
  bool transpose_first = false;   // transa of the cuBLAS call (applies to B)
  bool transpose_second = false;  // transb of the cuBLAS call (applies to A)
  int64_t m = 0, n = 0, k = 0;    // of the column-major product: n, m, k
  int64_t ld_first = 0;           // leading dim of B as cuBLAS sees it
  int64_t ld_second = 0;          // leading dim of A
  int64_t ldc = 0;
};

inline CublasGemmShape RowMajorGemmToCublas(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                                            int64_t ldb) {
  CublasGemmShape s;
  s.transpose_first = tb;
  s.transpose_second = ta;
  s.m = n;
  s.n = m;
  s.k = k;
  s.ld_first = ldb;
  s.ld_second = lda;
  s.ldc = n;
  return s;
}

}  // namespace loom::cuda
