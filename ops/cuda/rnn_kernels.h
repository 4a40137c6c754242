// Launchers of the rnn family's device code (rnn_kernels.cu): the LSTM's
// element-wise parts. The GEMMs (input projection, recurrent step, weight
// gradients) are cuBLAS calls in rnn_kernels.cc. Gates are [rows, 4 * hd]
// with blocks i | f | g | o, states [rows, hd]. Each launch covers R
// replicas' slabs (a fused op's; R = 1 unfused) at the strides below.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// Elements between one replica's slab and the next, per kind of operand.
struct LstmSlabs {
  int64_t replicas = 1;
  int64_t gates = 0;  // gates, d_gates
  int64_t seq = 0;    // c, h, dy
  int64_t prev = 0;   // c_prev (the state's slab at step 0, the sequence's after)
  int64_t state = 0;  // dh, dc
};

// gates[rep, r, j] = b_ih[rep, j] + b_hh[rep, j] for r < rows, j < 4 * hd:
// each replica's gates [rows, 4 * hd] contiguous, one after another.
template <typename T>
cudaError_t LaunchLstmBias(T* gates, const T* b_ih, const T* b_hh, int64_t replicas, int64_t rows, int64_t hd,
                           cudaStream_t stream);

// One step over n rows: gates (pre-activations) are activated in place
// (sigmoid i, f, o; tanh g), c = f * c_prev + i * g, h = o * tanh(c).
template <typename T>
cudaError_t LaunchLstmCell(T* gates, const T* c_prev, T* c, T* h, int64_t n, int64_t hd, const LstmSlabs& slabs,
                           cudaStream_t stream);

// One step backwards: from the activated gates, c, c_prev, dy, and the
// running (dh, dc) of the state leaving the step, writes the pre-activation
// gradients d_gates and replaces dc by the gradient of c_prev (dh is left
// for the recurrent GEMM to overwrite).
template <typename T>
cudaError_t LaunchLstmCellBackward(const T* gates, const T* c, const T* c_prev, const T* dy, const T* dh, T* dc,
                                   T* d_gates, int64_t n, int64_t hd, const LstmSlabs& slabs, cudaStream_t stream);

}  // namespace loom::cuda
