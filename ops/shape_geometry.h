// The host-side geometry of the shape ops (ops/shape_ops.cc): axis and
// permutation resolution, [outer, len, inner] views around an axis, Python
// slices and the merged index of a transpose. Their CPU kernels and their
// CUDA kernels (ops/cuda/shape_kernels.cc) read the attributes through these,
// so both see the same element movement.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"
#include "core/status.h"
#include "graph/attrs.h"

namespace loom::shape_ops {

// Resolves a possibly negative axis attribute against `shape`, naming the op
// and the input in the error.
inline StatusOr<int> ResolveAxis(const std::string& op, const char* attr, int64_t axis, const Shape& shape) {
  auto a = NormalizeAxis(axis, shape.rank());
  if (!a.ok()) return InvalidArgument(op, ": attribute '", attr, "' = ", axis, " is out of range for input of shape ",
                                      shape.ToString(), " (rank ", shape.rank(), ")");
  return *a;
}

inline int64_t Product(const Shape& s, int begin, int end) {
  int64_t p = 1;
  for (int d = begin; d < end; ++d) p *= s[d];
  return p;
}

// A tensor seen as [outer, len, inner] around one axis.
struct AxisSplit {
  int64_t outer, len, inner;
};
inline AxisSplit SplitAt(const Shape& s, int axis) {
  return {Product(s, 0, axis), s[axis], Product(s, axis + 1, s.rank())};
}

// Transpose's attribute perm against input x: output dim i is input dim
// perm[i], negative entries counted from the end; empty reverses the axes.
inline StatusOr<std::vector<int>> ResolvePerm(const std::string& op, const AttrMap& attrs, const Shape& x) {
  const int rank = x.rank();
  std::vector<int64_t> given = attrs.Ints("perm");
  std::vector<int> perm(rank);
  if (given.empty()) {
    for (int i = 0; i < rank; ++i) perm[i] = rank - 1 - i;
    return perm;
  }
  auto bad = [&] {
    return InvalidArgument(op, ": attribute 'perm' ", Shape(given).ToString(), " is not a permutation of the ", rank,
                           " axes of input ", x.ToString());
  };
  if (static_cast<int>(given.size()) != rank) return bad();
  std::vector<bool> seen(rank, false);
  for (int i = 0; i < rank; ++i) {
    auto a = NormalizeAxis(given[i], rank);
    if (!a.ok() || seen[*a]) return bad();
    seen[*a] = true;
    perm[i] = *a;
  }
  return perm;
}

// The output of a transpose as a gather: y's dims in row-major order and
// their strides in x, with unit dims dropped and output dims that stay
// adjacent in x merged (so [B, T, H, D] -> [B, H, T, D] walks D-long runs).
// At most one dim means the element order is unchanged.
struct PermutedDims {
  std::vector<int64_t> dims, strides;
};
inline PermutedDims MergePermutedDims(const Shape& x, const std::vector<int>& perm) {
  const std::vector<int64_t> in_strides = x.Strides();
  PermutedDims m;
  for (int p : perm) {
    const int64_t n = x[p], st = in_strides[p];
    if (n == 1) continue;
    if (!m.dims.empty() && m.strides.back() == st * n) {  // continues the previous run in x
      m.dims.back() *= n;
      m.strides.back() = st;
    } else {
      m.dims.push_back(n);
      m.strides.push_back(st);
    }
  }
  return m;
}

// A resolved slice along `axis`: elements start, start + step, ... (count).
struct SliceRange {
  int axis;
  int64_t start, step, count;
};

// Python's slice.indices() for a positive step, from Slice's attributes
// (axis, start, end, step) against input x.
inline StatusOr<SliceRange> ResolveSlice(const std::string& op, const AttrMap& attrs, const Shape& x) {
  SliceRange r;
  LOOM_ASSIGN_OR_RETURN(r.axis, ResolveAxis(op, "axis", attrs.Int("axis"), x));
  r.step = attrs.Int("step");
  if (r.step <= 0) return InvalidArgument(op, ": attribute 'step' must be positive, got ", r.step);
  const int64_t len = x[r.axis];
  auto clamp = [len](int64_t i) {
    if (i < 0) i = std::max<int64_t>(0, i + len);
    return std::min(i, len);
  };
  r.start = clamp(attrs.Int("start"));
  const int64_t end = clamp(attrs.Int("end"));
  r.count = end > r.start ? (end - r.start + r.step - 1) / r.step : 0;
  return r;
}

}  // namespace loom::shape_ops
