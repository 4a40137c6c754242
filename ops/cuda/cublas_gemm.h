// Row-major GEMMs on cuBLAS, for every kernel that multiplies matrices
// (MatMul, Linear, attention, LSTM).
//
// loom is row-major and cuBLAS column-major. A row-major [r, c] matrix is,
// read column-major, the [c, r] matrix of the same memory: its transpose.
// So the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T:
// cuBLAS gets B as its first operand and A as its second, with m and n
// swapped, each operand keeping its own transpose flag and leading dim.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"

namespace loom {
struct BFloat16;  // core/half.h
struct Float16;
}  // namespace loom

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

// Row-major C[i] = alpha op(A[i]) op(B[i]) + beta C[i] for i < batch, with
// C[i] a contiguous [m, n] at stride m * n; lda and ldb are the row lengths
// of A and B as stored, stride_a and stride_b their batch strides. The
// handle must be bound to `stream` (AcquireCublas). beta is 0 (overwrite)
// or 1 (accumulate), so an empty sum (k = 0) is zeros or C as it is. T:
// float or double. Sizes past cuBLAS's int are UNIMPLEMENTED.
template <typename T>
Status RowMajorGemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                    int64_t k, T alpha, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb,
                    int64_t stride_b, T beta, T* c);
// The same with C[i] at stride `stride_c` (>= m * n): slabs of larger
// tensors (a fused LSTM's step in each replica's sequence).
template <typename T>
Status RowMajorGemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                    int64_t k, T alpha, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb,
                    int64_t stride_b, T beta, T* c, int64_t stride_c);

// The same in bf16 / f16 (operands and C), through cublasGemmEx /
// cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F: f32 accumulation,
// alpha and beta in f32, C (read when beta is 1) and the result rounded to the
// half type once, by cuBLAS. Tensor cores, as the default math mode allows.
Status RowMajorGemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                    int64_t k, float alpha, const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b,
                    int64_t ldb, int64_t stride_b, float beta, BFloat16* c);
Status RowMajorGemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                    int64_t k, float alpha, const Float16* a, int64_t lda, int64_t stride_a, const Float16* b,
                    int64_t ldb, int64_t stride_b, float beta, Float16* c);

}  // namespace loom::cuda
