#include "ops/gemm.h"

#include <Eigen/Core>
#include <algorithm>

namespace loom {

namespace {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using MutMap = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;

// One single-threaded GEMM on a panel of C.
template <typename T>
void GemmPanel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
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

}  // namespace

template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc, ThreadPool* pool) {
  if (m == 0 || n == 0) return;
  const int threads = pool ? pool->num_threads() : 1;
  const double flops = 2.0 * m * n * k;
  if (threads <= 1 || flops < 2e5) {
    GemmPanel(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Split the larger side of C into one panel per thread; each panel is an
  // independent GEMM reading a slice of A (rows) or B (columns).
  if (m >= n) {
    pool->ParallelFor(m, 16, [&](int64_t r0, int64_t r1) {
      const T* a_panel = trans_a ? a + r0 : a + r0 * lda;
      GemmPanel(trans_a, trans_b, r1 - r0, n, k, alpha, a_panel, lda, b, ldb, beta, c + r0 * ldc, ldc);
    });
  } else {
    pool->ParallelFor(n, 16, [&](int64_t c0, int64_t c1) {
      const T* b_panel = trans_b ? b + c0 * ldb : b + c0;
      GemmPanel(trans_a, trans_b, m, c1 - c0, k, alpha, a, lda, b_panel, ldb, beta, c + c0, ldc);
    });
  }
}

template <typename T>
void BatchedGemm(bool trans_a, bool trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta, T* c, int64_t ldc,
                 int64_t stride_c, ThreadPool* pool) {
  const int threads = pool ? pool->num_threads() : 1;
  if (batch >= threads && threads > 1) {
    // Enough independent products: one thread per group of batch entries.
    pool->ParallelFor(batch, 1, [&](int64_t b0, int64_t b1) {
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
