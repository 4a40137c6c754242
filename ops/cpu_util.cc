#include "ops/cpu_util.h"

namespace loom {

std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  std::vector<int64_t> strides(out.rank(), 0);
  std::vector<int64_t> in_strides = in.Strides();
  const int offset = out.rank() - in.rank();
  for (int d = 0; d < in.rank(); ++d) strides[d + offset] = in[d] == 1 ? 0 : in_strides[d];
  return strides;
}

}  // namespace loom
