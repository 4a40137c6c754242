// Host-side logic of Dropout and Embedding (ops/dropout_embedding_ops.cc)
// that their CPU kernels and their CUDA kernels
// (ops/cuda/dropout_embedding_kernels.cc) share: whether a dropout draws,
// the keys it draws with, and the index dispatch and out-of-range error of
// the embedding ops.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/op.h"

namespace loom::dropout_embedding {

inline bool DropoutActive(const AttrMap& attrs) { return attrs.Bool("training") && attrs.Float("p") > 0; }

// The draws of an active dropout over x: element n of replica r's elements
// (in the order a single model holds them) is dropped iff
// CounterUniform(keys[r], n) < p. Replica r's elements are
// x[o, r, i] of x seen as [outer, replicas, inner] around replica_axis;
// unfused, replicas = outer = 1 and inner = x.numel(). Each key is the first
// number of the node's per-step stream (ctx.rng), or fused (attrs
// replica_seeds, replica_axis) of the stream of replica r's seed.
struct DropoutKeys {
  std::vector<uint64_t> keys;
  int64_t replicas = 1, outer = 1, inner = 1;
};
inline DropoutKeys MakeDropoutKeys(const KernelContext& ctx) {
  DropoutKeys k;
  const Shape& s = ctx.in(0).shape();
  if (ctx.attrs->Has("replica_seeds")) {
    const int axis = static_cast<int>(ctx.attrs->Int("replica_axis"));
    k.replicas = s[axis];
    for (int d = 0; d < axis; ++d) k.outer *= s[d];
    for (int d = axis + 1; d < s.rank(); ++d) k.inner *= s[d];
    for (int64_t seed : ctx.attrs->Ints("replica_seeds"))
      k.keys.push_back(ctx.StreamFor(static_cast<uint64_t>(seed)).NextU64());
  } else {
    k.inner = s.numel();
    k.keys.push_back(ctx.rng->NextU64());
  }
  return k;
}

// Dropout drops draw n of a stream iff CounterUniform(key, n) < p, that is
// (CounterU64(key, n) >> 11) * 2^-53 < p: exactly when CounterU64(key, n)
// >> 11 is below DropThreshold(p) = ceil(p * 2^53) (scaling by a power of
// two rounds nothing), an integer compare with no conversion to double.
inline uint64_t DropThreshold(double p) { return static_cast<uint64_t>(std::ceil(p * 0x1.0p53)); }
inline bool Dropped(uint64_t draw, uint64_t threshold) { return (draw >> 11) < threshold; }

// "[1, 0]": the multi-index of a flat position, for error messages.
inline std::string PositionString(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.rank());
  for (int d = shape.rank() - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return Shape(idx).ToString();
}

// Calls fn(I{}) with I = int32_t or int64_t for the index dtype.
template <typename Fn>
Status DispatchIndex(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kI32: return fn(int32_t{});
    case DType::kI64: return fn(int64_t{});
    default: return InvalidArgument("indices must be i32 or i64, got ", DTypeName(dtype));
  }
}

// The error of an index `value` outside [0, num_embeddings), the first one
// at flat position `at` of `indices`.
inline Status IndexOutOfRange(const std::string& op, int64_t value, int64_t at, const Shape& indices,
                              int64_t num_embeddings) {
  return InvalidArgument(op, ": index ", value, " at position ", PositionString(indices, at), " of indices ",
                         indices.ToString(), " is out of range for ", num_embeddings, " embeddings");
}

}  // namespace loom::dropout_embedding
