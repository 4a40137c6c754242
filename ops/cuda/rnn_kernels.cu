// Element-wise LSTM kernels (ops/rnn_ops.cc): one thread per hidden unit of
// a step (of every replica's slab at once), reading its four gates at
// stride hd, so each gate block is read coalesced. Formulas as the CPU's,
// term for term.
#include "ops/cuda/device_util.cuh"
#include "ops/cuda/rnn_kernels.h"

namespace loom::cuda {
namespace {

template <typename T>
__device__ inline T Sigmoid(T v) {
  return T(1) / (T(1) + Exp(-v));
}

// Each replica's gates [rows, width] follow one another: element i is
// replica i / (rows * width)'s, column i % width.
template <typename T>
__global__ void LstmBiasKernel(T* gates, const T* b_ih, const T* b_hh, int64_t total, int64_t per_replica,
                               int64_t width) {
  for (int64_t i = FirstIndex(); i < total; i += GridStride()) {
    const int64_t j = i / per_replica * width + i % width;
    gates[i] = b_ih[j] + b_hh[j];
  }
}

// Unit e of `units` = R * n * hd: replica e / (n * hd), then row and unit.
template <typename T>
__global__ void LstmCellKernel(T* gates, const T* c_prev, T* c, T* h, int64_t units, int64_t n, int64_t hd,
                               LstmSlabs slabs) {
  for (int64_t e = FirstIndex(); e < units; e += GridStride()) {
    const int64_t rep = e / (n * hd), u = e % (n * hd), r = u / hd, j = u % hd;
    T* gr = gates + rep * slabs.gates + r * 4 * hd;
    const T ig = Sigmoid(gr[j]), fg = Sigmoid(gr[hd + j]), gg = Tanh(gr[2 * hd + j]), og = Sigmoid(gr[3 * hd + j]);
    gr[j] = ig;
    gr[hd + j] = fg;
    gr[2 * hd + j] = gg;
    gr[3 * hd + j] = og;
    const T ce = fg * c_prev[rep * slabs.prev + u] + ig * gg;
    c[rep * slabs.seq + u] = ce;
    h[rep * slabs.seq + u] = og * Tanh(ce);
  }
}

template <typename T>
__global__ void LstmCellBackwardKernel(const T* gates, const T* c, const T* c_prev, const T* dy, const T* dh, T* dc,
                                       T* d_gates, int64_t units, int64_t n, int64_t hd, LstmSlabs slabs) {
  for (int64_t e = FirstIndex(); e < units; e += GridStride()) {
    const int64_t rep = e / (n * hd), u = e % (n * hd), r = u / hd, j = u % hd;
    const T* gr = gates + rep * slabs.gates + r * 4 * hd;
    T* dgr = d_gates + rep * slabs.gates + r * 4 * hd;
    const int64_t s = rep * slabs.seq + u, st = rep * slabs.state + u;
    const T ig = gr[j], fg = gr[hd + j], gg = gr[2 * hd + j], og = gr[3 * hd + j];
    const T tanh_c = Tanh(c[s]);
    const T dh_t = dh[st] + dy[s];
    const T dc_t = dc[st] + dh_t * og * (T(1) - tanh_c * tanh_c);
    dgr[j] = dc_t * gg * ig * (T(1) - ig);
    dgr[hd + j] = dc_t * c_prev[rep * slabs.prev + u] * fg * (T(1) - fg);
    dgr[2 * hd + j] = dc_t * ig * (T(1) - gg * gg);
    dgr[3 * hd + j] = dh_t * tanh_c * og * (T(1) - og);
    dc[st] = dc_t * fg;
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchLstmBias(T* gates, const T* b_ih, const T* b_hh, int64_t replicas, int64_t rows, int64_t hd,
                           cudaStream_t stream) {
  const int64_t per_replica = rows * 4 * hd, total = replicas * per_replica;
  if (total == 0) return cudaSuccess;
  LstmBiasKernel<T><<<Blocks(total), kThreads, 0, stream>>>(gates, b_ih, b_hh, total, per_replica, 4 * hd);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchLstmCell(T* gates, const T* c_prev, T* c, T* h, int64_t n, int64_t hd, const LstmSlabs& slabs,
                           cudaStream_t stream) {
  const int64_t units = slabs.replicas * n * hd;
  if (units == 0) return cudaSuccess;
  LstmCellKernel<T><<<Blocks(units), kThreads, 0, stream>>>(gates, c_prev, c, h, units, n, hd, slabs);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchLstmCellBackward(const T* gates, const T* c, const T* c_prev, const T* dy, const T* dh, T* dc,
                                   T* d_gates, int64_t n, int64_t hd, const LstmSlabs& slabs, cudaStream_t stream) {
  const int64_t units = slabs.replicas * n * hd;
  if (units == 0) return cudaSuccess;
  LstmCellBackwardKernel<T><<<Blocks(units), kThreads, 0, stream>>>(gates, c, c_prev, dy, dh, dc, d_gates, units, n,
                                                                    hd, slabs);
  return cudaGetLastError();
}

#define LOOM_INSTANTIATE_LSTM_KERNELS(T)                                                                       \
  template cudaError_t LaunchLstmBias<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t);     \
  template cudaError_t LaunchLstmCell<T>(T*, const T*, T*, T*, int64_t, int64_t, const LstmSlabs&,             \
                                         cudaStream_t);                                                        \
  template cudaError_t LaunchLstmCellBackward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,     \
                                                 int64_t, int64_t, const LstmSlabs&, cudaStream_t);

LOOM_INSTANTIATE_LSTM_KERNELS(float)
LOOM_INSTANTIATE_LSTM_KERNELS(double)

}  // namespace loom::cuda
