// Host-side geometry of LSTM and LSTMBackward, shared by the CPU ops
// (ops/rnn_ops.cc) and their CUDA kernels (ops/cuda/rnn_kernels.cc).
//
// A fused op (attribute replicas = R, horizontal fusion) holds R replicas'
// LSTMs replica-major: every input and output gains a leading axis of R,
// and replica r's slab of each is exactly the unfused op's tensor. The
// kernels run the unfused op's products and passes on each slab (batched
// over the replicas), so replica r gets the unfused op's bits.
#pragma once

#include <cstdint>

#include "core/shape.h"

namespace loom {

// Extents: R replicas (1 for an unfused op) of x [T, N, I] with hidden size
// Hd (the gates are 4 * Hd wide); the strides, in elements, between one
// replica's slab and the next.
struct LstmDims {
  int64_t r = 1, t = 0, n = 0, in = 0, hd = 0;
  int64_t gates() const { return 4 * hd; }
  int64_t x_stride() const { return t * n * in; }        // x, dx
  int64_t seq_stride() const { return t * n * hd; }      // y, cells, dy
  int64_t gates_stride() const { return t * n * gates(); }
  int64_t state_stride() const { return n * hd; }        // h0, c0, h_T, c_T, their gradients
  int64_t w_ih_stride() const { return gates() * in; }
  int64_t w_hh_stride() const { return gates() * hd; }
};

// From valid shapes of x ([T, N, I], or [R, T, N, I] fused) and h0 ([N, Hd]
// or [R, N, Hd]): a kernel's inputs, a node's types.
inline LstmDims LstmDimsOf(const Shape& x, const Shape& h0) {
  if (x.rank() == 4) return {x[0], x[1], x[2], x[3], h0[2]};
  return {1, x[0], x[1], x[2], h0[1]};
}

}  // namespace loom
