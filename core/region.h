// A box of a tensor: per dimension the half-open range [lo, hi). Parallel
// splits (graph/task_graph.h) describe what each part of an op reads and
// writes as regions, and the task runtime moves regions between devices.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/inline_vector.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/tensor.h"

namespace loom {

// The bounds of a region: up to four dimensions held in place (a search
// lowers millions of regions).
using RegionBounds = InlineVector<int64_t, 4>;

struct Region {
  RegionBounds lo, hi;

  static Region Whole(const Shape& shape);
  int rank() const { return static_cast<int>(lo.size()); }
  Shape shape() const;  // hi - lo per dimension
  int64_t numel() const {  // without building a Shape: the simulator asks for every piece
    int64_t n = 1;
    for (size_t d = 0; d < lo.size(); ++d) n *= hi[d] - lo[d];
    return n;
  }
  bool Contains(const Region& o) const;
  // The common box, or nullopt when it is empty.
  std::optional<Region> Intersect(const Region& o) const;
  bool operator==(const Region& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const Region& o) const { return !(*this == o); }
  bool operator<(const Region& o) const { return lo != o.lo ? lo < o.lo : hi < o.hi; }
  std::string ToString() const;  // "[0:4, 0:8]"
};

// A box copied between two tensors as strided blocks of rows: block k is
// `height` rows of `row_bytes`, starting `src_offsets[k]` and
// `dst_offsets[k]` bytes into the tensors' data, rows `src_pitch` and
// `dst_pitch` bytes apart (one cudaMemcpy2DAsync per block on a GPU).
struct RegionCopy {
  size_t row_bytes = 0, height = 0, src_pitch = 0, dst_pitch = 0;
  std::vector<int64_t> src_offsets, dst_offsets;
};

// The copy of `box` (in the whole tensor's coordinates) from src, which
// holds `src_region`, into dst, which holds `dst_region`: tensors of one
// dtype on any devices; box must lie in both regions.
StatusOr<RegionCopy> PlanRegionCopy(const Tensor& src, const Region& src_region, const Tensor& dst,
                                    const Region& dst_region, const Region& box);

// `height` rows of `row_bytes` on the host, `src_pitch` and `dst_pitch`
// bytes apart: one block of a RegionCopy.
void CopyRows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t height);

// Copies `box` (in the whole tensor's coordinates) from src, which holds
// region `src_region`, into dst, which holds `dst_region`. Host tensors of
// one dtype; box must lie in both regions.
Status CopyRegion(const Tensor& src, const Region& src_region, Tensor* dst, const Region& dst_region,
                  const Region& box);

}  // namespace loom
