// Host-side geometry of ScaledDotProductAttention, shared by the CPU op
// (ops/attention_ops.cc) and its CUDA kernel (ops/cuda/attention_kernels.cc):
// the extents of q, k, v, the resolved `scale` and `query_offset`
// attributes (and, through ops/attention_causal.h, the causal mask).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/attrs.h"
#include "ops/attention_causal.h"

namespace loom {

// Extents of one attention problem, read from q [B, H, Tq, D],
// k [B, H, Tk, D] and v [B, H, Tk, Dv].
struct AttnDims {
  int64_t b = 0, h = 0, tq = 0, tk = 0, d = 0, dv = 0;
  int64_t heads() const { return b * h; }  // independent (batch, head) problems
};

inline AttnDims AttnDimsOf(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {q.shape()[0], q.shape()[1], q.shape()[2], k.shape()[2], q.shape()[3], v.shape()[3]};
}

// The `scale` attribute, or 1/sqrt(D) when absent.
inline StatusOr<double> ResolveAttentionScale(const std::string& op, const AttrMap& attrs, int64_t d) {
  if (!attrs.Has("scale")) {
    if (d <= 0) return InvalidArgument(op, ": the default scale 1/sqrt(D) needs D > 0, q has D = ", d);
    return 1.0 / std::sqrt(static_cast<double>(d));
  }
  double scale = attrs.Float("scale");
  if (!std::isfinite(scale) || scale <= 0)
    return InvalidArgument(op, ": attribute 'scale' must be a positive finite number, got ", scale);
  return scale;
}

// The key position of query 0 under the causal mask (LastVisibleKey): the
// `query_offset` attribute, or Tk - Tq (aligned bottom-right) when absent.
inline int64_t ResolveQueryOffset(const AttrMap& attrs, int64_t tq, int64_t tk) {
  return attrs.Has("query_offset") ? attrs.Int("query_offset") : tk - tq;
}

}  // namespace loom
