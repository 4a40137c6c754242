// Reduced-width variants of the zoo's models (width_mult): every conv's
// output channels scaled alike, as Inception-v3, AlexNet and VGG take it,
// so tests and benchmarks can train the architectures at a fraction of
// their size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace loom::models {

// round(channels * width_mult), at least 1.
inline int64_t ScaledChannels(int64_t channels, double width_mult) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(channels) * width_mult));
}

}  // namespace loom::models
