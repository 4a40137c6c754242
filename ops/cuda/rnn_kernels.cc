// CUDA kernels of ops/rnn_ops.cc: LSTM and LSTMBackward, laid out as the CPU
// kernels. The whole sequence's input projection (and in the backward dx,
// dw_ih, dw_hh and db) are single cuBLAS GEMMs over all T * N rows, the
// recurrent product one GEMM per step, the gate math element-wise kernels
// (rnn_kernels.cu). cuBLAS runs in full FP32/FP64 math, and every sum over
// time and batch is a GEMM, so results are deterministic.
#include "ops/cuda/cublas_gemm.h"
#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/elementwise_kernels.h"
#include "ops/cuda/rnn_kernels.h"
#include "ops/lstm_geometry.h"

namespace loom::cuda {
namespace {

constexpr const char* kLstm = "LSTM";
constexpr const char* kLstmBackward = "LSTMBackward";

// Row-major C[m, n] = op(A) op(B) + beta C (beta 0 or 1), C contiguous; lda
// and ldb are the row lengths of A and B as stored.
template <typename T>
Status Gemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a,
            int64_t lda, const T* b, int64_t ldb, T beta, T* c) {
  return RowMajorGemm<T>(handle, stream, ta, tb, /*batch=*/1, m, n, k, T(1), a, lda, 0, b, ldb, 0, beta, c);
}

Status CopyOnDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  return Status::Ok();
}

//   outputs: y [T, N, Hd], h_T, c_T [N, Hd], gates [T, N, 4Hd] (activated),
//            cells [T, N, Hd]; with T = 0, (h_T, c_T) = (h0, c0).
Status LstmKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor &x = ctx.in(0), &h0 = ctx.in(1), &c0 = ctx.in(2), &w_ih = ctx.in(3), &w_hh = ctx.in(4);
  const LstmDims n = LstmDimsOf(x, h0);
  const int64_t G = n.gates(), Hd = n.hd;
  return DispatchCudaFloat(x.dtype(), kLstm, [&](auto zero) -> Status {
    using T = decltype(zero);
    T* y = ctx.out(0).data<T>();      // [T, N, Hd]
    T* gates = ctx.out(3).data<T>();  // [T, N, 4Hd]
    T* cells = ctx.out(4).data<T>();  // [T, N, Hd]
    // Every step's input projection at once: gates = (b_ih + b_hh) + x W_ih^T.
    LOOM_CUDA_RETURN_IF_ERROR(
        LaunchLstmBias<T>(gates, ctx.in(5).data<T>(), ctx.in(6).data<T>(), n.t * n.n, Hd, stream));
    LOOM_ASSIGN_OR_RETURN(CublasLease lease, AcquireCublas(ctx.device.index, stream));
    cublasHandle_t h = lease.handle();
    LOOM_RETURN_IF_ERROR(
        Gemm<T>(h, stream, false, true, n.t * n.n, G, n.in, x.data<T>(), n.in, w_ih.data<T>(), n.in, T(1), gates));
    const T* h_prev = h0.data<T>();
    const T* c_prev = c0.data<T>();
    for (int64_t t = 0; t < n.t; ++t) {
      T* g = gates + t * n.n * G;
      T* h_t = y + t * n.n * Hd;
      T* c_t = cells + t * n.n * Hd;
      LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, false, true, n.n, G, Hd, h_prev, Hd, w_hh.data<T>(), Hd, T(1), g));
      LOOM_CUDA_RETURN_IF_ERROR(LaunchLstmCell<T>(g, c_prev, c_t, h_t, n.n, Hd, stream));
      h_prev = h_t;
      c_prev = c_t;
    }
    const size_t state_bytes = static_cast<size_t>(n.n * Hd) * sizeof(T);
    LOOM_RETURN_IF_ERROR(CopyOnDevice(ctx.out(1).data<T>(), h_prev, state_bytes, stream));
    return CopyOnDevice(ctx.out(2).data<T>(), c_prev, state_bytes, stream);
  });
}
LOOM_REGISTER_KERNEL(kLstm, DeviceType::kCuda, LstmKernel);

//   inputs: x, h0, c0, w_ih, w_hh, y, gates, cells, dy, dh_T, dc_T
//   outputs: dx, dh0, dc0, dw_ih, dw_hh, db.
// Backwards over the steps with (dh, dc) in the dh0 / dc0 outputs, keeping
// every step's pre-activation gradient for the whole-sequence GEMMs.
Status LstmBackwardKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor &x = ctx.in(0), &h0 = ctx.in(1), &c0 = ctx.in(2), &w_ih = ctx.in(3), &w_hh = ctx.in(4);
  const LstmDims n = LstmDimsOf(x, h0);
  const int64_t G = n.gates(), Hd = n.hd, rows = n.t * n.n;
  LOOM_ASSIGN_OR_RETURN(Tensor d_pre, Tensor::Empty({n.t, n.n, G}, x.dtype(), ctx.device));
  LOOM_ASSIGN_OR_RETURN(Tensor ones, Tensor::Empty({rows}, x.dtype(), ctx.device));  // db as a GEMM
  return DispatchCudaFloat(x.dtype(), kLstmBackward, [&](auto zero) -> Status {
    using T = decltype(zero);
    const T* y = ctx.in(5).data<T>();      // [T, N, Hd]
    const T* gates = ctx.in(6).data<T>();  // [T, N, 4Hd], activated
    const T* cells = ctx.in(7).data<T>();  // [T, N, Hd]
    const T* dy = ctx.in(8).data<T>();     // [T, N, Hd]
    T* dpre = d_pre.data<T>();             // [T, N, 4Hd]
    T* dh = ctx.out(1).data<T>();          // [N, Hd]
    T* dc = ctx.out(2).data<T>();          // [N, Hd]
    const size_t state_bytes = static_cast<size_t>(n.n * Hd) * sizeof(T);
    LOOM_RETURN_IF_ERROR(CopyOnDevice(dh, ctx.in(9).data<T>(), state_bytes, stream));
    LOOM_RETURN_IF_ERROR(CopyOnDevice(dc, ctx.in(10).data<T>(), state_bytes, stream));
    LOOM_ASSIGN_OR_RETURN(CublasLease lease, AcquireCublas(ctx.device.index, stream));
    cublasHandle_t h = lease.handle();
    for (int64_t t = n.t - 1; t >= 0; --t) {
      const T* c_prev = t > 0 ? cells + (t - 1) * n.n * Hd : c0.data<T>();
      T* dg = dpre + t * n.n * G;
      LOOM_CUDA_RETURN_IF_ERROR(LaunchLstmCellBackward<T>(gates + t * n.n * G, cells + t * n.n * Hd, c_prev,
                                                          dy + t * n.n * Hd, dh, dc, dg, n.n, Hd, stream));
      // dh_{t-1} = d pre_t W_hh: [N, 4Hd] x [4Hd, Hd].
      LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, false, false, n.n, Hd, G, dg, G, w_hh.data<T>(), Hd, T(0), dh));
    }
    // dx = d pre W_ih: [T*N, 4Hd] x [4Hd, I].
    LOOM_RETURN_IF_ERROR(
        Gemm<T>(h, stream, false, false, rows, n.in, G, dpre, G, w_ih.data<T>(), n.in, T(0), ctx.out(0).data<T>()));
    // dw_ih = d pre^T x: [4Hd, T*N] x [T*N, I].
    LOOM_RETURN_IF_ERROR(
        Gemm<T>(h, stream, true, false, G, n.in, rows, dpre, G, x.data<T>(), n.in, T(0), ctx.out(3).data<T>()));
    // dw_hh = sum_t d pre_t^T h_{t-1}: step 0 against h0, steps 1.. against
    // y[0 .. T-2] as one [4Hd, (T-1)N] x [(T-1)N, Hd] product.
    T* dw_hh = ctx.out(4).data<T>();
    if (n.t == 0) {
      if (G * Hd > 0)
        LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dw_hh, 0, static_cast<size_t>(G * Hd) * sizeof(T), stream));
    } else {
      LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, true, false, G, Hd, n.n, dpre, G, h0.data<T>(), Hd, T(0), dw_hh));
      if (n.t > 1)
        LOOM_RETURN_IF_ERROR(
            Gemm<T>(h, stream, true, false, G, Hd, (n.t - 1) * n.n, dpre + n.n * G, G, y, Hd, T(1), dw_hh));
    }
    // db = column sums of d pre: ones[1, T*N] x d pre [T*N, 4Hd].
    if (rows > 0) LOOM_CUDA_RETURN_IF_ERROR(LaunchFill<T>(ones.data<T>(), rows, T(1), stream));
    return Gemm<T>(h, stream, false, false, 1, G, rows, ones.data<T>(), rows, dpre, G, T(0), ctx.out(5).data<T>());
  });
}
LOOM_REGISTER_KERNEL(kLstmBackward, DeviceType::kCuda, LstmBackwardKernel);

}  // namespace
}  // namespace loom::cuda
