// Host-side geometry of the reduce family, shared by the CPU kernels
// (ops/reduce_ops.cc) and the CUDA kernels (ops/cuda/reduce_kernels.cc): the
// reduced axes of attribute `axes`, the index groups a reduction walks, and
// the [outer, len, inner] view around the softmax axis.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"
#include "core/status.h"
#include "graph/attrs.h"

namespace loom {

// Which axes of x the reductions' attribute `axes` names (negative entries
// count from the end; empty: all).
inline StatusOr<std::vector<bool>> ResolveReduceAxes(const std::string& op, const AttrMap& attrs, const Shape& x) {
  const std::vector<int64_t> axes = attrs.Ints("axes");
  std::vector<bool> mask(x.rank(), axes.empty());
  for (int64_t a : axes) {
    auto axis = NormalizeAxis(a, x.rank());
    if (!axis.ok())
      return InvalidArgument(op, ": attribute 'axes' ", Shape(axes).ToString(), " has axis ", a,
                             ", out of range for input of shape ", x.ToString(), " (rank ", x.rank(), ")");
    if (mask[*axis])
      return InvalidArgument(op, ": attribute 'axes' ", Shape(axes).ToString(), " names axis ", *axis, " twice");
    mask[*axis] = true;
  }
  return mask;
}

// x seen as rows of output vectors: output element (row, j) folds the
// `reduced` input vectors at KeptOffset(row) + ReducedOffset(r) + j, j <
// inner, the offsets decomposing row over kept_dims and r over red_dims
// (row-major, with their strides). Adjacent axes of the same kind are merged
// and unit axes dropped, so reducing the last axis walks contiguous memory
// and reducing a leading axis adds contiguous inner vectors.
struct ReduceGroups {
  int64_t rows = 1, inner = 1, reduced = 1;
  std::vector<int64_t> kept_dims, kept_strides;
  std::vector<int64_t> red_dims, red_strides;  // never empty
};

inline ReduceGroups ReduceGroupsOf(const Shape& x, const std::vector<bool>& mask) {
  const std::vector<int64_t> strides = x.Strides();
  struct Group {
    bool reduced;
    int64_t size, stride;
  };
  std::vector<Group> groups;
  for (int d = 0; d < x.rank(); ++d) {
    if (x[d] == 1) continue;
    if (!groups.empty() && groups.back().reduced == mask[d]) {
      groups.back().size *= x[d];
      groups.back().stride = strides[d];
    } else {
      groups.push_back({static_cast<bool>(mask[d]), x[d], strides[d]});
    }
  }
  ReduceGroups r;
  if (!groups.empty() && !groups.back().reduced) {
    r.inner = groups.back().size;
    groups.pop_back();
  }
  for (const Group& g : groups) {
    (g.reduced ? r.red_dims : r.kept_dims).push_back(g.size);
    (g.reduced ? r.red_strides : r.kept_strides).push_back(g.stride);
    (g.reduced ? r.reduced : r.rows) *= g.size;
  }
  if (r.red_dims.empty()) {  // nothing (or only unit axes) reduced
    r.red_dims.push_back(1);
    r.red_strides.push_back(0);
  }
  return r;
}

// x seen as [outer, len, inner] around the softmax axis.
struct AxisLayout {
  int64_t outer = 1, len = 1, inner = 1;
};

// The softmax ops' attribute `axis` (negative: from the end) against x.
inline StatusOr<AxisLayout> ResolveSoftmaxAxis(const std::string& op, const AttrMap& attrs, const Shape& x) {
  const int64_t given = attrs.Int("axis");
  auto axis = NormalizeAxis(given, x.rank());
  if (!axis.ok())
    return InvalidArgument(op, ": attribute 'axis' = ", given, " is out of range for input of shape ", x.ToString(),
                           " (rank ", x.rank(), ")");
  AxisLayout L;
  for (int d = 0; d < x.rank(); ++d) {
    if (d < *axis) L.outer *= x[d];
    else if (d > *axis) L.inner *= x[d];
  }
  L.len = x[*axis];
  return L;
}

}  // namespace loom
