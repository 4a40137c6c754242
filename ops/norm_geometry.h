// Host-side geometry of the norm ops, shared by the CPU kernels
// (ops/norm_ops.cc) and the CUDA kernels (ops/cuda/norm_kernels.cc): how
// BatchNorm sees x as [n, c, s] and LayerNorm as [rows, d].
#pragma once

#include <cstdint>

#include "core/shape.h"

namespace loom {

// BatchNorm's x viewed as [n, c, s]: batch, channels, and the flattened
// spatial dims.
struct ChannelLayout {
  int64_t n = 0, c = 0, s = 1;
  int64_t per_channel() const { return n * s; }
};

inline ChannelLayout ChannelLayoutOf(const Shape& x) {
  ChannelLayout l;
  l.n = x[0];
  l.c = x[1];
  for (int d = 2; d < x.rank(); ++d) l.s *= x[d];
  return l;
}

// LayerNorm's x viewed as [rows, d]: d is the element count of the
// normalized_shape (the last `normalized_rank` dims).
struct RowLayout {
  int64_t rows = 0, d = 1;
};

inline RowLayout NormRowsOf(const Shape& x, int normalized_rank) {
  RowLayout l;
  l.rows = 1;
  for (int i = 0; i < x.rank(); ++i) (i < x.rank() - normalized_rank ? l.rows : l.d) *= x[i];
  return l;
}

}  // namespace loom
