// Host-side geometry of the norm ops, shared by the CPU kernels
// (ops/norm_ops.cc) and the CUDA kernels (ops/cuda/norm_kernels.cc): how
// BatchNorm sees x as [n, c, s] and LayerNorm as [rows, d] (with a fused
// array's replicas).
#pragma once

#include <cstdint>

#include "core/shape.h"
#include "graph/attrs.h"

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
// normalized_shape (the last `normalized_rank` dims). A fused array's
// LayerNorm (graph/fusion.h) holds each replica's gamma and beta as a row
// of [R, d]: its rows are then [outer, R, block], and row r reads replica
// r / block % R's (replicas 1: every row reads row 0).
struct RowLayout {
  int64_t rows = 0, d = 1;
  int64_t replicas = 1, block = 1;
  int64_t ReplicaOf(int64_t row) const { return row / block % replicas; }
};

inline RowLayout NormRowsOf(const Shape& x, int normalized_rank) {
  RowLayout l;
  l.rows = 1;
  for (int i = 0; i < x.rank(); ++i) (i < x.rank() - normalized_rank ? l.rows : l.d) *= x[i];
  return l;
}

// LayerNorm's and LayerNormBackward's view of x from their attributes:
// replica_dim (-1: gamma and beta shared by every row) holds R blocks of
// per_replica (a part of x split along the replicas holds fewer).
inline RowLayout LayerNormRowsOf(const Shape& x, const AttrMap& attrs) {
  const int normalized_rank = static_cast<int>(attrs.Ints("normalized_shape").size());
  RowLayout l = NormRowsOf(x, normalized_rank);
  const int replica_dim = static_cast<int>(attrs.Int("replica_dim", -1));
  if (replica_dim < 0) return l;
  const int64_t per_replica = attrs.Int("per_replica", 1);
  l.replicas = x[replica_dim] / per_replica;
  l.block = per_replica;
  for (int i = replica_dim + 1; i < x.rank() - normalized_rank; ++i) l.block *= x[i];
  return l;
}

}  // namespace loom
