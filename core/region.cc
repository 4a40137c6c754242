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

Status CopyRegion(const Tensor& src, const Region& src_region, Tensor* dst, const Region& dst_region,
                  const Region& box) {
  if (src.dtype() != dst->dtype())
    return InvalidArgument("CopyRegion: dtypes differ (", DTypeName(src.dtype()), " and ", DTypeName(dst->dtype()), ")");
  if (!src_region.Contains(box) || !dst_region.Contains(box))
    return InvalidArgument("CopyRegion: box ", box.ToString(), " is not inside ", src_region.ToString(), " and ",
                           dst_region.ToString());
  if (src.shape() != src_region.shape() || dst->shape() != dst_region.shape())
    return InvalidArgument("CopyRegion: tensors ", src.shape().ToString(), " and ", dst->shape().ToString(),
                           " do not hold regions ", src_region.ToString(), " and ", dst_region.ToString());
  const int rank = box.rank();
  const size_t elem = DTypeSize(src.dtype());
  if (rank == 0) {
    std::memcpy(dst->raw_data(), src.raw_data(), elem);
    return Status::Ok();
  }
  const std::vector<int64_t> src_strides = src.shape().Strides(), dst_strides = dst->shape().Strides();
  const Shape extent = box.shape();
  if (extent.numel() == 0) return Status::Ok();
  // A row: the box along its last dimension that the tensors do not hold
  // whole (`last`), with every dimension after it, which the box, src and
  // dst all span: contiguous in both (a 3x3 kernel's weights split by
  // output channel copy as one block, not as rows of 3).
  int last = rank - 1;
  auto whole_in_both = [&](int i) {
    return box.lo[i] == src_region.lo[i] && box.hi[i] == src_region.hi[i] && box.lo[i] == dst_region.lo[i] &&
           box.hi[i] == dst_region.hi[i];
  };
  while (last > 0 && whole_in_both(last)) --last;
  const size_t row_bytes = static_cast<size_t>(extent[last] * src_strides[last]) * elem;
  std::vector<int64_t> index(static_cast<size_t>(last + 1), 0);
  const char* s = static_cast<const char*>(src.raw_data());
  char* d = static_cast<char*>(dst->raw_data());
  while (true) {
    int64_t so = 0, doff = 0;
    for (int i = 0; i <= last; ++i) {
      const int64_t at = box.lo[i] + index[i];
      so += (at - src_region.lo[i]) * src_strides[i];
      doff += (at - dst_region.lo[i]) * dst_strides[i];
    }
    std::memcpy(d + doff * static_cast<int64_t>(elem), s + so * static_cast<int64_t>(elem), row_bytes);
    int i = last - 1;
    for (; i >= 0; --i) {
      if (++index[i] < extent[i]) break;
      index[i] = 0;
    }
    if (i < 0) break;
  }
  return Status::Ok();
}

}  // namespace loom
