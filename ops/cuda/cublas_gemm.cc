#include "ops/cuda/cublas_gemm.h"

#include <climits>
#include <optional>

#include "core/cuda/cuda_device.h"
#include "ops/cuda/cuda_kernel_util.h"

namespace loom::cuda {
namespace {

cublasStatus_t Gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta, float* c,
                    int ldc) {
  return cublasSgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
cublasStatus_t Gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const double* alpha, const double* a, int lda, const double* b, int ldb, const double* beta,
                    double* c, int ldc) {
  return cublasDgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
cublasStatus_t GemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float* alpha, const float* a, int lda, long long stride_a, const float* b,
                                  int ldb, long long stride_b, const float* beta, float* c, int ldc, long long stride_c,
                                  int batch) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                                   stride_c, batch);
}
cublasStatus_t GemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const double* alpha, const double* a, int lda, long long stride_a, const double* b,
                                  int ldb, long long stride_b, const double* beta, double* c, int ldc,
                                  long long stride_c, int batch) {
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                                   stride_c, batch);
}

// cuBLAS takes sizes as int.
Status FitsInt(const char* what, int64_t value) {
  if (value > INT_MAX) return Unimplemented("cuBLAS GEMM: ", what, " = ", value, " exceeds its 32-bit size limit");
  return Status::Ok();
}

// The column-major call for a row-major GEMM, in cuBLAS's int sizes.
struct CublasCall {
  cublasOperation_t op1, op2;
  int m, n, k, ld1, ld2, ldc;
};

// What every element type shares: the beta rule, the empty cases (C left as
// it is, or zeroed for an empty sum with beta 0: all bits clear is +0 in
// every float format) and the int limits. Returns the call, or nullopt when
// no cuBLAS call is needed.
StatusOr<std::optional<CublasCall>> PlanGemm(cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m,
                                             int64_t n, int64_t k, int64_t lda, int64_t ldb, double beta,
                                             size_t element_bytes, void* c, int64_t stride_c) {
  if (beta != 0 && beta != 1) return InvalidArgument("RowMajorGemm: beta must be 0 or 1, got ", beta);
  if (stride_c < m * n) return InvalidArgument("RowMajorGemm: C's batch stride ", stride_c, " < m * n = ", m * n);
  if (batch == 0 || m == 0 || n == 0) return std::optional<CublasCall>();
  if (k == 0) {  // cuBLAS would reject the zero leading dims
    if (beta == 0)
      LOOM_CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(c, static_cast<size_t>(stride_c) * element_bytes, 0,
                                                  static_cast<size_t>(m * n) * element_bytes,
                                                  static_cast<size_t>(batch), stream));
    return std::optional<CublasCall>();
  }
  LOOM_RETURN_IF_ERROR(FitsInt("m", m));
  LOOM_RETURN_IF_ERROR(FitsInt("n", n));
  LOOM_RETURN_IF_ERROR(FitsInt("k", k));
  LOOM_RETURN_IF_ERROR(FitsInt("lda", lda));
  LOOM_RETURN_IF_ERROR(FitsInt("ldb", ldb));
  LOOM_RETURN_IF_ERROR(FitsInt("batch", batch));
  const CublasGemmShape g = RowMajorGemmToCublas(ta, tb, m, n, k, lda, ldb);
  return std::optional<CublasCall>(CublasCall{
      g.transpose_first ? CUBLAS_OP_T : CUBLAS_OP_N, g.transpose_second ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), static_cast<int>(g.ld_first),
      static_cast<int>(g.ld_second), static_cast<int>(g.ldc)});
}

}  // namespace

template <typename T>
Status RowMajorGemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                    int64_t k, T alpha, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb,
                    int64_t stride_b, T beta, T* c, int64_t stride_c) {
  LOOM_ASSIGN_OR_RETURN(const std::optional<CublasCall> call,
                        PlanGemm(stream, ta, tb, batch, m, n, k, lda, ldb, beta, sizeof(T), c, stride_c));
  if (!call) return Status::Ok();
  const auto [op1, op2, gm, gn, gk, ld1, ld2, ldc] = *call;
  if (batch == 1) {
    LOOM_CUBLAS_RETURN_IF_ERROR(Gemm(handle, op1, op2, gm, gn, gk, &alpha, b, ld1, a, ld2, &beta, c, ldc));
  } else {
    LOOM_CUBLAS_RETURN_IF_ERROR(GemmStridedBatched(handle, op1, op2, gm, gn, gk, &alpha, b, ld1, stride_b, a, ld2,
                                                   stride_a, &beta, c, ldc, stride_c, static_cast<int>(batch)));
  }
  return Status::Ok();
}

template <typename T>
Status RowMajorGemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                    int64_t k, T alpha, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb,
                    int64_t stride_b, T beta, T* c) {
  return RowMajorGemm<T>(handle, stream, ta, tb, batch, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                         m * n);
}

namespace {

// The half-precision GEMM on elements of `dtype` (CUDA_R_16BF / CUDA_R_16F), 2 bytes each.
Status HalfRowMajorGemm(cublasHandle_t handle, cudaStream_t stream, cudaDataType_t dtype, bool ta, bool tb,
                        int64_t batch, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                        int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, float beta, void* c) {
  LOOM_ASSIGN_OR_RETURN(const std::optional<CublasCall> call,
                        PlanGemm(stream, ta, tb, batch, m, n, k, lda, ldb, beta, 2, c, m * n));
  if (!call) return Status::Ok();
  const auto [op1, op2, gm, gn, gk, ld1, ld2, ldc] = *call;
  if (batch == 1) {
    LOOM_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(handle, op1, op2, gm, gn, gk, &alpha, b, dtype, ld1, a, dtype, ld2, &beta,
                                             c, dtype, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    LOOM_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(handle, op1, op2, gm, gn, gk, &alpha, b, dtype, ld1,
                                                           stride_b, a, dtype, ld2, stride_a, &beta, c, dtype, ldc,
                                                           m * n, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
                                                           CUBLAS_GEMM_DEFAULT));
  }
  return Status::Ok();
}

}  // namespace

Status RowMajorGemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                    int64_t k, float alpha, const BFloat16* a, int64_t lda, int64_t stride_a, const BFloat16* b,
                    int64_t ldb, int64_t stride_b, float beta, BFloat16* c) {
  return HalfRowMajorGemm(handle, stream, CUDA_R_16BF, ta, tb, batch, m, n, k, alpha, a, lda, stride_a, b, ldb,
                          stride_b, beta, c);
}
Status RowMajorGemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
                    int64_t k, float alpha, const Float16* a, int64_t lda, int64_t stride_a, const Float16* b,
                    int64_t ldb, int64_t stride_b, float beta, Float16* c) {
  return HalfRowMajorGemm(handle, stream, CUDA_R_16F, ta, tb, batch, m, n, k, alpha, a, lda, stride_a, b, ldb,
                          stride_b, beta, c);
}

template Status RowMajorGemm<float>(cublasHandle_t, cudaStream_t, bool, bool, int64_t, int64_t, int64_t, int64_t, float,
                                    const float*, int64_t, int64_t, const float*, int64_t, int64_t, float, float*);
template Status RowMajorGemm<double>(cublasHandle_t, cudaStream_t, bool, bool, int64_t, int64_t, int64_t, int64_t,
                                     double, const double*, int64_t, int64_t, const double*, int64_t, int64_t, double,
                                     double*);
template Status RowMajorGemm<float>(cublasHandle_t, cudaStream_t, bool, bool, int64_t, int64_t, int64_t, int64_t, float,
                                    const float*, int64_t, int64_t, const float*, int64_t, int64_t, float, float*,
                                    int64_t);
template Status RowMajorGemm<double>(cublasHandle_t, cudaStream_t, bool, bool, int64_t, int64_t, int64_t, int64_t,
                                     double, const double*, int64_t, int64_t, const double*, int64_t, int64_t, double,
                                     double*, int64_t);

}  // namespace loom::cuda
