#include "ops/cpu_util.h"

namespace loom {

std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  std::vector<int64_t> strides(out.rank(), 0);
  std::vector<int64_t> in_strides = in.Strides();
  const int offset = out.rank() - in.rank();
  for (int d = 0; d < in.rank(); ++d) strides[d + offset] = in[d] == 1 ? 0 : in_strides[d];
  return strides;
}

BroadcastSpace CollapseBroadcast(const Shape& out, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb) {
  BroadcastSpace space;
  // Built innermost first, then reversed.
  std::vector<int64_t> dims, a, b;
  for (int d = out.rank() - 1; d >= 0; --d) {
    if (out[d] == 1) continue;  // steps through nothing
    if (!dims.empty() && sa[d] == a.back() * dims.back() && sb[d] == b.back() * dims.back()) {
      dims.back() *= out[d];  // d continues the dim inside it for both operands
      continue;
    }
    dims.push_back(out[d]);
    a.push_back(sa[d]);
    b.push_back(sb[d]);
  }
  if (dims.empty()) {  // a single element (a scalar, or only extent-1 dims)
    dims = {1};
    a = b = {0};
  }
  space.shape = Shape(std::vector<int64_t>(dims.rbegin(), dims.rend()));
  space.sa.assign(a.rbegin(), a.rend());
  space.sb.assign(b.rbegin(), b.rend());
  return space;
}

}  // namespace loom
