// The per-replica attributes of the optimizer ops (ops/optimizer_ops.cc),
// read the same way by their CPU kernels and their CUDA kernels
// (ops/cuda/optimizer_kernels.cc): the `replicas` attribute, and float
// attributes that hold one value or (fused) one value per replica.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"
#include "graph/attrs.h"

namespace loom::optimizer {

// The `replicas` attribute: 0 for an unfused op, else R >= 1.
inline int64_t Replicas(const AttrMap& attrs) { return attrs.Int("replicas"); }

// How many sets of scalars an op's attributes describe: 1 unfused, R fused.
inline int64_t ReplicaCount(const AttrMap& attrs) { return std::max<int64_t>(1, Replicas(attrs)); }

// A float attribute given as a list (one value per replica), or nullopt when
// it is absent or a single number.
inline std::optional<std::vector<double>> FloatList(const AttrMap& attrs, const std::string& name) {
  auto it = attrs.values().find(name);
  if (it == attrs.values().end()) return std::nullopt;
  if (const auto* v = std::get_if<std::vector<double>>(&it->second)) return *v;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second))
    return std::vector<double>(v->begin(), v->end());
  return std::nullopt;
}

// Replica r's value of a float attribute: entry r of a list, or the single
// value. Lists are only read after type inference (CheckFloatAttrs) accepted
// them.
inline double ReplicaFloat(const AttrMap& attrs, const std::string& name, int64_t r) {
  if (auto list = FloatList(attrs, name)) {
    LOOM_CHECK(r >= 0 && r < static_cast<int64_t>(list->size()), "attribute ", name, " has no value for replica ", r);
    return (*list)[static_cast<size_t>(r)];
  }
  return attrs.Float(name);
}

}  // namespace loom::optimizer
