// cuBLAS kernels of MatMul, BatchMatMul and Linear (ops/matmul_ops.cc),
// through RowMajorGemm (ops/cuda/cublas_gemm.h): f32 / f64 in their own
// precision, bf16 / f16 with f32 accumulation (cublasGemmEx).
#include <type_traits>

#include "core/half.h"
#include "ops/cuda/cublas_gemm.h"
#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/elementwise_kernels.h"

namespace loom::cuda {
namespace {

// C = op(A) op(B) (+ C when accumulate) over a batch, on the device's cuBLAS
// handle; half types scale in f32.
template <typename T>
Status Product(const KernelContext& ctx, cudaStream_t stream, bool ta, bool tb, int64_t batch, int64_t m, int64_t n,
               int64_t k, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T* c,
               bool accumulate = false) {
  LOOM_ASSIGN_OR_RETURN(CublasLease lease, AcquireCublas(ctx.device.index, stream));
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return RowMajorGemm<T>(lease.handle(), stream, ta, tb, batch, m, n, k, T(1), a, lda, stride_a, b, ldb, stride_b,
                           accumulate ? T(1) : T(0), c);
  } else {
    return RowMajorGemm(lease.handle(), stream, ta, tb, batch, m, n, k, 1.0f, a, lda, stride_a, b, ldb, stride_b,
                        accumulate ? 1.0f : 0.0f, c);
  }
}

// MatMul [m, k] x [k, n] and BatchMatMul [..., m, k] x [..., k, n] (either
// operand transposed by attribute; either may be one 2-D matrix that every
// batch entry reads, stride 0), as one strided-batched GEMM.
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
  auto stride = [&](const Shape& s) { return s.rank() == y.shape().rank() ? s.dim(-1) * s.dim(-2) : 0; };
  return DispatchCudaFloatOrHalf(y.dtype(), "MatMul", [&](auto zero) -> Status {
    using T = decltype(zero);
    return Product<T>(ctx, stream, ta, tb, batch, m, n, k, a.data<T>(), sa.dim(-1), stride(sa), b.data<T>(),
                      sb.dim(-1), stride(sb), y.data<T>());
  });
}
LOOM_REGISTER_KERNEL("MatMul", DeviceType::kCuda, MatMulKernel);
LOOM_REGISTER_KERNEL("BatchMatMul", DeviceType::kCuda, MatMulKernel);
LOOM_REGISTER_KERNEL_SUPPORT("MatMul", DeviceType::kCuda, HalfFloatKernelSupport());
LOOM_REGISTER_KERNEL_SUPPORT("BatchMatMul", DeviceType::kCuda, HalfFloatKernelSupport());

// Linear: x [..., in] viewed as [rows, in], weight [out, in], optional bias
// [out]: y = x W^T (one GEMM with B transposed); batched, x [B, rows, in]
// (or a shared [rows, in], stride 0), weight [B, out, in], bias [B, out],
// one strided-batched GEMM. f32 / f64 add an unbatched bias after; bf16 /
// f16, and every batched bias, start y from the broadcast bias and
// accumulate onto it (beta = 1), so that half types round once, as on the
// CPU.
LOOM_REGISTER_KERNEL("Linear", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  const Tensor& w = ctx.in(1);
  Tensor& y = ctx.out(0);
  const bool batched = w.shape().rank() == 3;
  const int64_t batch = batched ? w.shape()[0] : 1;
  const int64_t out_f = w.shape().dim(-2), in_f = w.shape().dim(-1);
  const bool shared_x = batched && x.shape().rank() == 2;
  int64_t rows = 1;  // per batch entry
  for (int d = batched && !shared_x ? 1 : 0; d < x.shape().rank() - 1; ++d) rows *= x.shape()[d];
  const bool bias = ctx.inputs.size() == 3;
  return DispatchCudaFloatOrHalf(y.dtype(), "Linear", [&](auto zero) -> Status {
    using T = decltype(zero);
    constexpr bool kWide = std::is_same_v<T, float> || std::is_same_v<T, double>;
    const bool prefill = bias && (!kWide || batched);
    if (prefill) {
      LOOM_ASSIGN_OR_RETURN(BroadcastIndex index,
                            MakeBroadcastIndex(Shape({batch, rows, out_f}), {Shape({batch, 1, out_f})}));
      LOOM_CUDA_RETURN_IF_ERROR(LaunchBroadcastTo(ctx.in(2).data<T>(), y.data<T>(), index, stream));
    }
    LOOM_RETURN_IF_ERROR(Product<T>(ctx, stream, /*ta=*/false, /*tb=*/true, batch, rows, out_f, in_f, x.data<T>(),
                                    in_f, shared_x ? 0 : rows * in_f, w.data<T>(), in_f, out_f * in_f, y.data<T>(),
                                    /*accumulate=*/prefill));
    if (bias && !prefill) {
      LOOM_CUDA_RETURN_IF_ERROR(LaunchBiasAdd(y.data<T>(), ctx.in(2).data<T>(), rows, out_f, stream));
    }
    return Status::Ok();
  });
});
LOOM_REGISTER_KERNEL_SUPPORT("Linear", DeviceType::kCuda, HalfFloatKernelSupport());

}  // namespace
}  // namespace loom::cuda
