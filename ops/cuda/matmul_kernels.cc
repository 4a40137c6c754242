// cuBLAS kernels of MatMul, BatchMatMul and Linear (ops/matmul_ops.cc).
//
// loom is row-major and cuBLAS column-major. A row-major [r, c] matrix is,
// read column-major, the [c, r] matrix of the same memory: its transpose.
// So the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T:
// cuBLAS gets B as its first operand and A as its second, with m and n
// swapped, each operand keeping its own transpose flag and leading dim.
#include <climits>

#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/elementwise_kernels.h"
#include "ops/cuda/matmul_kernels.h"

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

// Row-major C[b] = op(A[b]) op(B[b]) for b < batch; C is contiguous
// [batch, m, n]; lda/ldb are the row lengths of A and B as stored.
template <typename T>
Status RowMajorGemm(const KernelContext& ctx, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m,
                    int64_t n, int64_t k, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb,
                    int64_t stride_b, T* c) {
  if (batch == 0 || m == 0 || n == 0) return Status::Ok();
  if (k == 0) {  // empty sums: cuBLAS would reject the zero leading dims
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c, 0, static_cast<size_t>(batch * m * n) * sizeof(T), stream));
    return Status::Ok();
  }
  LOOM_RETURN_IF_ERROR(FitsInt("m", m));
  LOOM_RETURN_IF_ERROR(FitsInt("n", n));
  LOOM_RETURN_IF_ERROR(FitsInt("k", k));
  LOOM_RETURN_IF_ERROR(FitsInt("lda", lda));
  LOOM_RETURN_IF_ERROR(FitsInt("ldb", ldb));
  LOOM_RETURN_IF_ERROR(FitsInt("batch", batch));
  LOOM_ASSIGN_OR_RETURN(CublasLease lease, CublasLease::Acquire(ctx.device.index, stream));
  const T alpha = 1, beta = 0;
  const CublasGemmShape g = RowMajorGemmToCublas(ta, tb, m, n, k, lda, ldb);
  const cublasOperation_t op1 = g.transpose_first ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op2 = g.transpose_second ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int gm = static_cast<int>(g.m), gn = static_cast<int>(g.n), gk = static_cast<int>(g.k);
  const int ld1 = static_cast<int>(g.ld_first), ld2 = static_cast<int>(g.ld_second), ldc = static_cast<int>(g.ldc);
  if (batch == 1) {
    LOOM_CUBLAS_RETURN_IF_ERROR(Gemm(lease.handle(), op1, op2, gm, gn, gk, &alpha, b, ld1, a, ld2, &beta, c, ldc));
  } else {
    LOOM_CUBLAS_RETURN_IF_ERROR(GemmStridedBatched(lease.handle(), op1, op2, gm, gn, gk, &alpha, b, ld1, stride_b, a,
                                                   ld2, stride_a, &beta, c, ldc, m * n, static_cast<int>(batch)));
  }
  return Status::Ok();
}

// MatMul [m, k] x [k, n] and BatchMatMul [..., m, k] x [..., k, n] (either
// operand transposed by attribute), as one strided-batched GEMM.
Status MatMulKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  Tensor& y = ctx.out(0);
  const bool ta = ctx.attrs->Bool("transpose_a"), tb = ctx.attrs->Bool("transpose_b");
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const int64_t m = y.shape().dim(-2), n = y.shape().dim(-1), k = ta ? sa.dim(-2) : sa.dim(-1);
  int64_t batch = 1;
  for (int d = 0; d < y.shape().rank() - 2; ++d) batch *= y.shape()[d];
  return DispatchCudaFloat(y.dtype(), "MatMul", [&](auto zero) -> Status {
    using T = decltype(zero);
    return RowMajorGemm<T>(ctx, stream, ta, tb, batch, m, n, k, a.data<T>(), sa.dim(-1), sa.dim(-1) * sa.dim(-2),
                           b.data<T>(), sb.dim(-1), sb.dim(-1) * sb.dim(-2), y.data<T>());
  });
}
LOOM_REGISTER_KERNEL("MatMul", DeviceType::kCuda, MatMulKernel);
LOOM_REGISTER_KERNEL("BatchMatMul", DeviceType::kCuda, MatMulKernel);

// Linear: x [..., in] viewed as [rows, in], weight [out, in], optional bias
// [out]: y = x W^T (one GEMM with B transposed), then the bias-add kernel.
LOOM_REGISTER_KERNEL("Linear", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  const Tensor& w = ctx.in(1);
  Tensor& y = ctx.out(0);
  const int64_t out_f = w.shape()[0], in_f = w.shape()[1];
  int64_t rows = 1;
  for (int d = 0; d < x.shape().rank() - 1; ++d) rows *= x.shape()[d];
  return DispatchCudaFloat(y.dtype(), "Linear", [&](auto zero) -> Status {
    using T = decltype(zero);
    LOOM_RETURN_IF_ERROR(RowMajorGemm<T>(ctx, stream, /*ta=*/false, /*tb=*/true, /*batch=*/1, rows, out_f, in_f,
                                         x.data<T>(), in_f, 0, w.data<T>(), in_f, 0, y.data<T>()));
    if (ctx.inputs.size() == 3)
      LOOM_CUDA_RETURN_IF_ERROR(LaunchBiasAdd(y.data<T>(), ctx.in(2).data<T>(), rows, out_f, stream));
    return Status::Ok();
  });
});

}  // namespace
}  // namespace loom::cuda
