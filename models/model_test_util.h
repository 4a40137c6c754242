// Helpers shared by the zoo's model tests.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "core/rng.h"
#include "core/tensor.h"
#include "graph/ir.h"

namespace loom::models::testing {

// Elements of every Parameter (BatchNorm running statistics are Buffers).
inline int64_t ParameterCount(const Graph& g) {
  int64_t n = 0;
  for (NodeId id : g.NodesWithOp(kParameterOp)) n += g.type(g.node(id).outputs[0]).shape.numel();
  return n;
}

inline std::set<std::string> ParameterNames(const Graph& g) {
  std::set<std::string> names;
  for (NodeId id : g.NodesWithOp(kParameterOp)) names.insert(g.node(id).name);
  return names;
}

// Uniform in [-1, 1), a function of `key` only.
inline Tensor RandomInput(const Shape& s, DType dtype, uint64_t key) {
  Rng rng = Rng::Stream(7, key);
  Tensor t = Tensor::Zeros(s, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.Uniform(-1, 1);
  return *t.Cast(dtype);
}

}  // namespace loom::models::testing
