// CUDA kernels of ops/attention_ops.cc: ScaledDotProductAttention and its
// backward. The four (six) products per head are cuBLAS strided-batched
// GEMMs over the B * H heads, in full FP32/FP64 math; the masked softmax and
// its backward are row kernels (attention_kernels.cu). Scores and weights
// live in the forward's probs output, as on the CPU.
#include "ops/attention_geometry.h"
#include "ops/cuda/attention_kernels.h"
#include "ops/cuda/cublas_gemm.h"
#include "ops/cuda/cuda_kernel_util.h"

namespace loom::cuda {
namespace {

constexpr const char* kAttention = "ScaledDotProductAttention";
constexpr const char* kAttentionBackward = "ScaledDotProductAttentionBackward";

StatusOr<KeyPaddingMask> MaskOf(const Tensor& mask) {
  KeyPaddingMask m;
  m.data = mask.raw_data();
  switch (mask.dtype()) {
    case DType::kBool: m.dtype = MaskDType::kBool; break;
    case DType::kI32: m.dtype = MaskDType::kI32; break;
    case DType::kI64: m.dtype = MaskDType::kI64; break;
    case DType::kF32: m.dtype = MaskDType::kF32; break;
    case DType::kF64: m.dtype = MaskDType::kF64; break;
    default: return Unimplemented(kAttention, ": key_padding_mask of dtype ", DTypeName(mask.dtype()));
  }
  return m;
}

//   S = scale Q K^T (into probs), masked softmax in place, out = P V.
Status AttentionKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor &q = ctx.in(0), &k = ctx.in(1), &v = ctx.in(2);
  Tensor &out = ctx.out(0), &probs = ctx.out(1);
  const AttnDims n = AttnDimsOf(q, k, v);
  LOOM_ASSIGN_OR_RETURN(double scale, ResolveAttentionScale(kAttention, *ctx.attrs, n.d));
  KeyPaddingMask mask;
  if (ctx.inputs.size() == 4) {
    LOOM_ASSIGN_OR_RETURN(mask, MaskOf(ctx.in(3)));
  }
  const SoftmaxRows rows{n.heads() * n.tq, n.h, n.tq, n.tk, ctx.attrs->Bool("causal"),
                         ResolveQueryOffset(*ctx.attrs, n.tq, n.tk)};
  return DispatchCudaFloat(q.dtype(), kAttention, [&](auto zero) -> Status {
    using T = decltype(zero);
    T* p = probs.data<T>();  // [B, H, Tq, Tk]
    LOOM_ASSIGN_OR_RETURN(CublasLease lease, AcquireCublas(ctx.device.index, stream));
    LOOM_RETURN_IF_ERROR(RowMajorGemm<T>(lease.handle(), stream, false, true, n.heads(), n.tq, n.tk, n.d,
                                        static_cast<T>(scale), q.data<T>(), n.d, n.tq * n.d, k.data<T>(), n.d,
                                        n.tk * n.d, T(0), p));
    LOOM_CUDA_RETURN_IF_ERROR(LaunchMaskedSoftmax<T>(p, rows, mask, stream));
    // out = P V: [Tq, Tk] x [Tk, Dv] per head (zeros when Tk = 0).
    return RowMajorGemm<T>(lease.handle(), stream, false, false, n.heads(), n.tq, n.dv, n.tk, T(1), p, n.tk,
                          n.tq * n.tk, v.data<T>(), n.dv, n.tk * n.dv, T(0), out.data<T>());
  });
}
LOOM_REGISTER_KERNEL(kAttention, DeviceType::kCuda, AttentionKernel);

//   dV = P^T dO;  G = dO V^T (+ d_probs);  dS = P * (G - rowsum(P * G));
//   dQ = scale dS K;  dK = scale dS^T Q.
Status AttentionBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor &q = ctx.in(0), &k = ctx.in(1), &v = ctx.in(2), &probs = ctx.in(3), &d_out = ctx.in(4);
  const Tensor* d_probs = ctx.inputs.size() == 6 ? &ctx.in(5) : nullptr;
  const AttnDims n = AttnDimsOf(q, k, v);
  const double scale = ctx.attrs->Float("scale");
  LOOM_ASSIGN_OR_RETURN(Tensor ds, Tensor::Empty(probs.shape(), probs.dtype(), ctx.device));  // [B, H, Tq, Tk]
  return DispatchCudaFloat(q.dtype(), kAttentionBackward, [&](auto zero) -> Status {
    using T = decltype(zero);
    const T* p = probs.data<T>();
    const T* g_out = d_out.data<T>();
    T* s = ds.data<T>();
    const int64_t sq = n.tq * n.d, sk = n.tk * n.d, sv = n.tk * n.dv, so = n.tq * n.dv, sp = n.tq * n.tk;
    LOOM_ASSIGN_OR_RETURN(CublasLease lease, AcquireCublas(ctx.device.index, stream));
    cublasHandle_t h = lease.handle();
    // dV = P^T dO: [Tk, Tq] x [Tq, Dv].
    LOOM_RETURN_IF_ERROR(RowMajorGemm<T>(h, stream, true, false, n.heads(), n.tk, n.dv, n.tq, T(1), p, n.tk, sp, g_out,
                                        n.dv, so, T(0), ctx.out(2).data<T>()));
    T beta = 0;
    if (d_probs && probs.numel() > 0) {
      LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s, d_probs->data<T>(), static_cast<size_t>(probs.numel()) * sizeof(T),
                                                cudaMemcpyDeviceToDevice, stream));
      beta = 1;
    }
    // G = dO V^T (+ d_probs) with Dv = 0 leaves d_probs alone, or zeroes G.
    LOOM_RETURN_IF_ERROR(RowMajorGemm<T>(h, stream, false, true, n.heads(), n.tq, n.tk, n.dv, T(1), g_out, n.dv, so,
                                        v.data<T>(), n.dv, sv, beta, s));
    LOOM_CUDA_RETURN_IF_ERROR(LaunchSoftmaxBackward<T>(p, s, n.heads() * n.tq, n.tk, stream));
    // dQ = scale dS K: [Tq, Tk] x [Tk, D]; dK = scale dS^T Q: [Tk, Tq] x [Tq, D].
    const T alpha = static_cast<T>(scale);
    LOOM_RETURN_IF_ERROR(RowMajorGemm<T>(h, stream, false, false, n.heads(), n.tq, n.d, n.tk, alpha, s, n.tk, sp,
                                        k.data<T>(), n.d, sk, T(0), ctx.out(0).data<T>()));
    return RowMajorGemm<T>(h, stream, true, false, n.heads(), n.tk, n.d, n.tq, alpha, s, n.tk, sp, q.data<T>(), n.d,
                          sq, T(0), ctx.out(1).data<T>());
  });
}
LOOM_REGISTER_KERNEL(kAttentionBackward, DeviceType::kCuda, AttentionBackwardKernel);

}  // namespace
}  // namespace loom::cuda
