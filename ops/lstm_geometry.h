// Host-side geometry of LSTM and LSTMBackward, shared by the CPU ops
// (ops/rnn_ops.cc) and their CUDA kernels (ops/cuda/rnn_kernels.cc).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom {

// Extents: x [T, N, I], hidden size Hd (the gates are 4 * Hd wide).
struct LstmDims {
  int64_t t = 0, n = 0, in = 0, hd = 0;
  int64_t gates() const { return 4 * hd; }
};

// From the kernel's x [T, N, I] and h0 [N, Hd].
inline LstmDims LstmDimsOf(const Tensor& x, const Tensor& h0) {
  return {x.shape()[0], x.shape()[1], x.shape()[2], h0.shape()[1]};
}

}  // namespace loom
