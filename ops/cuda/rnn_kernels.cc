// CUDA kernels of ops/rnn_ops.cc: LSTM and LSTMBackward, laid out as the CPU
// kernels, an unfused op as one replica of a fused one (ops/lstm_geometry.h).
// The whole sequence's input projection (and in the backward dx, dw_ih,
// dw_hh and db) are single cuBLAS GEMMs over all T * N rows, the recurrent
// product one GEMM per step, each batched over the replicas, the gate math
// one element-wise launch per step for all replicas (rnn_kernels.cu).
// cuBLAS runs in full FP32/FP64 math, and every sum over time and batch is
// a GEMM, so results are deterministic.
#include "ops/cuda/cublas_gemm.h"
#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/elementwise_kernels.h"
#include "ops/cuda/rnn_kernels.h"
#include "ops/lstm_geometry.h"

namespace loom::cuda {
namespace {

constexpr const char* kLstm = "LSTM";
constexpr const char* kLstmBackward = "LSTMBackward";

// Row-major C[rep] = op(A[rep]) op(B[rep]) + beta C[rep] (beta 0 or 1) for
// each of R replicas; lda and ldb are the row lengths of A and B as stored,
// the strides their slabs' (and C's) distances.
template <typename T>
Status Gemm(cublasHandle_t handle, cudaStream_t stream, bool ta, bool tb, int64_t replicas, int64_t m, int64_t n,
            int64_t k, const T* a, int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, T beta,
            T* c, int64_t stride_c) {
  return RowMajorGemm<T>(handle, stream, ta, tb, replicas, m, n, k, T(1), a, lda, stride_a, b, ldb, stride_b, beta, c,
                         stride_c);
}

// Each replica's [rows] state slab from `src` (at `src_stride`) to `dst`'s
// (at `dst_stride`).
template <typename T>
Status CopySlabs(T* dst, int64_t dst_stride, const T* src, int64_t src_stride, int64_t replicas, int64_t elements,
                 cudaStream_t stream) {
  if (replicas == 0 || elements == 0) return Status::Ok();
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * sizeof(T), src,
                                              static_cast<size_t>(src_stride) * sizeof(T),
                                              static_cast<size_t>(elements) * sizeof(T),
                                              static_cast<size_t>(replicas), cudaMemcpyDeviceToDevice, stream));
  return Status::Ok();
}

//   outputs: y [T, N, Hd], h_T, c_T [N, Hd], gates [T, N, 4Hd] (activated),
//            cells [T, N, Hd] (each [R, ...] fused); with T = 0,
//            (h_T, c_T) = (h0, c0).
Status LstmKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor &x = ctx.in(0), &h0 = ctx.in(1), &c0 = ctx.in(2), &w_ih = ctx.in(3), &w_hh = ctx.in(4);
  const LstmDims n = LstmDimsOf(x.shape(), h0.shape());
  const int64_t G = n.gates(), Hd = n.hd;
  return DispatchCudaFloat(x.dtype(), kLstm, [&](auto zero) -> Status {
    using T = decltype(zero);
    T* y = ctx.out(0).data<T>();      // [T, N, Hd] per replica
    T* gates = ctx.out(3).data<T>();  // [T, N, 4Hd]
    T* cells = ctx.out(4).data<T>();  // [T, N, Hd]
    // Every step's input projection at once: gates = (b_ih + b_hh) + x W_ih^T.
    LOOM_CUDA_RETURN_IF_ERROR(
        LaunchLstmBias<T>(gates, ctx.in(5).data<T>(), ctx.in(6).data<T>(), n.r, n.t * n.n, Hd, stream));
    LOOM_ASSIGN_OR_RETURN(CublasLease lease, AcquireCublas(ctx.device.index, stream));
    cublasHandle_t h = lease.handle();
    LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, false, true, n.r, n.t * n.n, G, n.in, x.data<T>(), n.in, n.x_stride(),
                                 w_ih.data<T>(), n.in, n.w_ih_stride(), T(1), gates, n.gates_stride()));
    const T* h_prev = h0.data<T>();
    const T* c_prev = c0.data<T>();
    LstmSlabs slabs{n.r, n.gates_stride(), n.seq_stride(), n.state_stride(), n.state_stride()};
    for (int64_t t = 0; t < n.t; ++t) {
      T* g = gates + t * n.n * G;
      T* h_t = y + t * n.n * Hd;
      T* c_t = cells + t * n.n * Hd;
      LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, false, true, n.r, n.n, G, Hd, h_prev, Hd, slabs.prev, w_hh.data<T>(),
                                   Hd, n.w_hh_stride(), T(1), g, n.gates_stride()));
      LOOM_CUDA_RETURN_IF_ERROR(LaunchLstmCell<T>(g, c_prev, c_t, h_t, n.n, Hd, slabs, stream));
      h_prev = h_t;
      c_prev = c_t;
      slabs.prev = n.seq_stride();
    }
    LOOM_RETURN_IF_ERROR(
        CopySlabs(ctx.out(1).data<T>(), n.state_stride(), h_prev, slabs.prev, n.r, n.state_stride(), stream));
    return CopySlabs(ctx.out(2).data<T>(), n.state_stride(), c_prev, slabs.prev, n.r, n.state_stride(), stream);
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
  const LstmDims n = LstmDimsOf(x.shape(), h0.shape());
  const int64_t G = n.gates(), Hd = n.hd, rows = n.t * n.n;
  LOOM_ASSIGN_OR_RETURN(Tensor d_pre, Tensor::Empty({n.r, n.t, n.n, G}, x.dtype(), ctx.device));
  LOOM_ASSIGN_OR_RETURN(Tensor ones, Tensor::Empty({rows}, x.dtype(), ctx.device));  // db as a GEMM
  return DispatchCudaFloat(x.dtype(), kLstmBackward, [&](auto zero) -> Status {
    using T = decltype(zero);
    const T* y = ctx.in(5).data<T>();      // [T, N, Hd] per replica
    const T* gates = ctx.in(6).data<T>();  // [T, N, 4Hd], activated
    const T* cells = ctx.in(7).data<T>();  // [T, N, Hd]
    const T* dy = ctx.in(8).data<T>();     // [T, N, Hd]
    T* dpre = d_pre.data<T>();             // [T, N, 4Hd]
    T* dh = ctx.out(1).data<T>();          // [N, Hd]
    T* dc = ctx.out(2).data<T>();          // [N, Hd]
    const size_t state_bytes = static_cast<size_t>(n.r * n.state_stride()) * sizeof(T);
    if (state_bytes > 0) {
      LOOM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dh, ctx.in(9).data<T>(), state_bytes, cudaMemcpyDeviceToDevice, stream));
      LOOM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dc, ctx.in(10).data<T>(), state_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    LOOM_ASSIGN_OR_RETURN(CublasLease lease, AcquireCublas(ctx.device.index, stream));
    cublasHandle_t h = lease.handle();
    for (int64_t t = n.t - 1; t >= 0; --t) {
      const T* c_prev = t > 0 ? cells + (t - 1) * n.n * Hd : c0.data<T>();
      const LstmSlabs slabs{n.r, n.gates_stride(), n.seq_stride(), t > 0 ? n.seq_stride() : n.state_stride(),
                            n.state_stride()};
      T* dg = dpre + t * n.n * G;
      LOOM_CUDA_RETURN_IF_ERROR(LaunchLstmCellBackward<T>(gates + t * n.n * G, cells + t * n.n * Hd, c_prev,
                                                          dy + t * n.n * Hd, dh, dc, dg, n.n, Hd, slabs, stream));
      // dh_{t-1} = d pre_t W_hh: [N, 4Hd] x [4Hd, Hd].
      LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, false, false, n.r, n.n, Hd, G, dg, G, n.gates_stride(), w_hh.data<T>(),
                                   Hd, n.w_hh_stride(), T(0), dh, n.state_stride()));
    }
    // dx = d pre W_ih: [T*N, 4Hd] x [4Hd, I].
    LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, false, false, n.r, rows, n.in, G, dpre, G, n.gates_stride(),
                                 w_ih.data<T>(), n.in, n.w_ih_stride(), T(0), ctx.out(0).data<T>(), n.x_stride()));
    // dw_ih = d pre^T x: [4Hd, T*N] x [T*N, I].
    LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, true, false, n.r, G, n.in, rows, dpre, G, n.gates_stride(), x.data<T>(),
                                 n.in, n.x_stride(), T(0), ctx.out(3).data<T>(), n.w_ih_stride()));
    // dw_hh = sum_t d pre_t^T h_{t-1}: step 0 against h0, steps 1.. against
    // y[0 .. T-2] as one [4Hd, (T-1)N] x [(T-1)N, Hd] product.
    T* dw_hh = ctx.out(4).data<T>();
    if (n.t == 0) {
      if (n.r * G * Hd > 0)
        LOOM_CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(dw_hh, 0, static_cast<size_t>(n.r * n.w_hh_stride()) * sizeof(T), stream));
    } else {
      LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, true, false, n.r, G, Hd, n.n, dpre, G, n.gates_stride(), h0.data<T>(),
                                   Hd, n.state_stride(), T(0), dw_hh, n.w_hh_stride()));
      if (n.t > 1)
        LOOM_RETURN_IF_ERROR(Gemm<T>(h, stream, true, false, n.r, G, Hd, (n.t - 1) * n.n, dpre + n.n * G, G,
                                     n.gates_stride(), y, Hd, n.seq_stride(), T(1), dw_hh, n.w_hh_stride()));
    }
    // db = column sums of d pre: ones[1, T*N] x d pre [T*N, 4Hd], the ones
    // shared by every replica.
    if (rows > 0) LOOM_CUDA_RETURN_IF_ERROR(LaunchFill<T>(ones.data<T>(), rows, T(1), stream));
    return Gemm<T>(h, stream, false, false, n.r, 1, G, rows, ones.data<T>(), rows, 0, dpre, G, n.gates_stride(), T(0),
                   ctx.out(5).data<T>(), G);
  });
}
LOOM_REGISTER_KERNEL(kLstmBackward, DeviceType::kCuda, LstmBackwardKernel);

}  // namespace
}  // namespace loom::cuda
