#include "core/region.h"

#include <algorithm>
#include <cstring>

#include "core/logging.h"

namespace loom {

Region Region::Whole(const Shape& shape) {
  Region r;
  r.lo.assign(static_cast<size_t>(shape.rank()), 0);
  r.hi = shape.dims();
  return r;
}

Shape Region::shape() const {
  std::vector<int64_t> dims(lo.size());
  for (size_t i = 0; i < lo.size(); ++i) dims[i] = hi[i] - lo[i];
  return Shape(std::move(dims));
}

bool Region::Contains(const Region& o) const {
  if (o.rank() != rank()) return false;
  for (size_t i = 0; i < lo.size(); ++i)
    if (o.lo[i] < lo[i] || o.hi[i] > hi[i]) return false;
  return true;
}

std::optional<Region> Region::Intersect(const Region& o) const {
  if (o.rank() != rank()) return std::nullopt;
  Region r;
  for (size_t i = 0; i < lo.size(); ++i) {
    r.lo.push_back(std::max(lo[i], o.lo[i]));
    r.hi.push_back(std::min(hi[i], o.hi[i]));
    if (r.lo.back() >= r.hi.back()) return std::nullopt;
  }
  return r;
}

std::string Region::ToString() const {
  std::string s = "[";
  for (size_t i = 0; i < lo.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(lo[i]) + ":" + std::to_string(hi[i]);
  }
  return s + "]";
}

StatusOr<RegionCopy> PlanRegionCopy(const Tensor& src, const Region& src_region, const Tensor& dst,
                                    const Region& dst_region, const Region& box) {
  if (src.dtype() != dst.dtype())
    return InvalidArgument("CopyRegion: dtypes differ (", DTypeName(src.dtype()), " and ", DTypeName(dst.dtype()), ")");
  const Shape& src_shape = src.shape();
  const Shape& dst_shape = dst.shape();
  if (!src_region.Contains(box) || !dst_region.Contains(box))
    return InvalidArgument("CopyRegion: box ", box.ToString(), " is not inside ", src_region.ToString(), " and ",
                           dst_region.ToString());
  if (src_shape != src_region.shape() || dst_shape != dst_region.shape())
    return InvalidArgument("CopyRegion: tensors ", src_shape.ToString(), " and ", dst_shape.ToString(),
                           " do not hold regions ", src_region.ToString(), " and ", dst_region.ToString());
  const int rank = box.rank();
  const size_t elem = DTypeSize(src.dtype());
  RegionCopy copy;
  if (rank == 0) {
    copy.row_bytes = elem;
    copy.height = 1;
    copy.src_offsets = copy.dst_offsets = {0};
    return copy;
  }
  const Shape extent = box.shape();
  if (extent.numel() == 0) return copy;
  const std::vector<int64_t> src_strides = src_shape.Strides(), dst_strides = dst_shape.Strides();
  // A row: the box along its last dimension that the tensors do not hold
  // whole (`last`), with every dimension after it, which the box, src and
  // dst all span: contiguous in both (a 3x3 kernel's weights split by
  // output channel copy as one block, not as rows of 3). A block: the rows
  // along the dimension before `last`.
  int last = rank - 1;
  auto whole_in_both = [&](int i) {
    return box.lo[i] == src_region.lo[i] && box.hi[i] == src_region.hi[i] && box.lo[i] == dst_region.lo[i] &&
           box.hi[i] == dst_region.hi[i];
  };
  while (last > 0 && whole_in_both(last)) --last;
  copy.row_bytes = static_cast<size_t>(extent[last] * src_strides[last]) * elem;
  const int rows_dim = last - 1;  // -1: one row per block
  copy.height = rows_dim >= 0 ? static_cast<size_t>(extent[rows_dim]) : 1;
  copy.src_pitch = rows_dim >= 0 ? static_cast<size_t>(src_strides[rows_dim]) * elem : copy.row_bytes;
  copy.dst_pitch = rows_dim >= 0 ? static_cast<size_t>(dst_strides[rows_dim]) * elem : copy.row_bytes;
  // Blocks over the dimensions before rows_dim, odometer order.
  std::vector<int64_t> index(static_cast<size_t>(std::max(rows_dim, 0)), 0);
  while (true) {
    int64_t so = 0, doff = 0;
    for (int i = 0; i <= last; ++i) {
      const int64_t at = box.lo[i] + (i < rows_dim ? index[static_cast<size_t>(i)] : 0);
      so += (at - src_region.lo[i]) * src_strides[i];
      doff += (at - dst_region.lo[i]) * dst_strides[i];
    }
    copy.src_offsets.push_back(so * static_cast<int64_t>(elem));
    copy.dst_offsets.push_back(doff * static_cast<int64_t>(elem));
    int i = rows_dim - 1;
    for (; i >= 0; --i) {
      if (++index[static_cast<size_t>(i)] < extent[i]) break;
      index[static_cast<size_t>(i)] = 0;
    }
    if (i < 0) break;
  }
  return copy;
}

Status CopyRegion(const Tensor& src, const Region& src_region, Tensor* dst, const Region& dst_region,
                  const Region& box) {
  LOOM_ASSIGN_OR_RETURN(const RegionCopy copy, PlanRegionCopy(src, src_region, *dst, dst_region, box));
  const char* s = static_cast<const char*>(src.raw_data());
  char* d = static_cast<char*>(dst->raw_data());
  for (size_t k = 0; k < copy.src_offsets.size(); ++k)
    CopyRows(d + copy.dst_offsets[k], copy.dst_pitch, s + copy.src_offsets[k], copy.src_pitch, copy.row_bytes,
             copy.height);
  return Status::Ok();
}

void CopyRows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t height) {
  for (size_t r = 0; r < height; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
}

}  // namespace loom
