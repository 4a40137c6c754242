// Row-major GEMM on the CPU: C = alpha * op(A) * op(B) + beta * C, with
// Eigen doing the blocked multiply and the thread pool splitting C into
// column (or row) panels. All CPU ops that reduce to matrix products
// (Linear, MatMul, BatchMatMul, convolution via im2col) call this.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace loom {

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, ThreadPool* pool);

// Batched: `batch` independent GEMMs at fixed strides (elements) apart.
template <typename T>
void BatchedGemm(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
                 int64_t stride_c, ThreadPool* pool);

}  // namespace loom
