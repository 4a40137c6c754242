// Host-side attributes of the pooling ops, shared by the CPU kernels
// (ops/pool_ops.cc) and the CUDA kernels (ops/cuda/pool_kernels.cc); the
// windows themselves are in ops/pool_window.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"
#include "graph/attrs.h"
#include "ops/pool_window.h"

namespace loom::pool {

using Pair = std::array<int64_t, 2>;  // (h, w)

inline std::string PairString(const Pair& p) { return StrCat("[", p[0], ", ", p[1], "]"); }

// An int or a list of two.
inline StatusOr<Pair> PairAttr(const AttrMap& attrs, const std::string& op, const char* name) {
  auto it = attrs.values().find(name);
  if (it == attrs.values().end()) return InvalidArgument(op, ": missing attribute '", name, "'");
  if (const int64_t* i = std::get_if<int64_t>(&it->second)) return Pair{*i, *i};
  const auto* list = std::get_if<std::vector<int64_t>>(&it->second);
  if (list == nullptr || list->size() != 2)
    return InvalidArgument(op, ": attribute '", name, "' must be an int or a list of 2 ints, got ",
                           AttrValueToString(it->second));
  return Pair{(*list)[0], (*list)[1]};
}

enum class PoolKind { kMax, kAvg, kAdaptiveAvg };

// The attributes of a sliding-window pool (MaxPool2d, AvgPool2d), checked.
struct SlidingAttrs {
  Pair kernel{1, 1}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  bool ceil_mode = false;
  bool include_pad = true;  // divide by the padded window (always for max pools)
  // Max pools only, set on a part of a row split (PoolOp::PartAttrs): the
  // rows of padding below the input (padding[0] is then the rows above),
  // and the input's first row in the whole plane, which the indices count
  // from.
  int64_t bottom_padding = 0, row_offset = 0;
};

inline StatusOr<SlidingAttrs> ParseSlidingAttrs(PoolKind kind, const std::string& op, const AttrMap& attrs) {
  const bool max = kind == PoolKind::kMax;
  SlidingAttrs s;
  LOOM_ASSIGN_OR_RETURN(s.kernel, PairAttr(attrs, op, "kernel"));
  s.stride = s.kernel;  // absent or []: the kernel, as stride=None in PyTorch
  if (attrs.Has("stride") && attrs.values().at("stride") != AttrValue(std::vector<int64_t>{})) {
    LOOM_ASSIGN_OR_RETURN(s.stride, PairAttr(attrs, op, "stride"));
  }
  LOOM_ASSIGN_OR_RETURN(s.padding, PairAttr(attrs, op, "padding"));
  // Average pools have no dilation (theirs is 1); max pools divide by no
  // extent, so count_include_pad does not matter to them.
  if (max) {
    LOOM_ASSIGN_OR_RETURN(s.dilation, PairAttr(attrs, op, "dilation"));
  }
  s.ceil_mode = attrs.Bool("ceil_mode");
  s.include_pad = max || attrs.Bool("count_include_pad");
  s.bottom_padding = s.padding[0];
  if (max) {
    const int64_t bottom = attrs.Has("bottom_padding") ? attrs.Int("bottom_padding") : -1;
    const int64_t span = s.dilation[0] * (s.kernel[0] - 1) + 1;
    if (bottom != -1) {
      if (bottom < 0 || bottom >= span)
        return InvalidArgument(op, ": bottom_padding ", bottom, " must be -1 (the padding) or in [0, ", span,
                               ") (a window must hold an input row)");
      s.bottom_padding = bottom;
    }
    s.row_offset = attrs.Has("row_offset") ? attrs.Int("row_offset") : 0;
    if (s.row_offset < 0) return InvalidArgument(op, ": row_offset must be >= 0, got ", s.row_offset);
  }
  for (int a = 0; a < 2; ++a) {
    if (s.kernel[a] < 1) return InvalidArgument(op, ": kernel must be >= 1, got ", PairString(s.kernel));
    if (s.stride[a] < 1) return InvalidArgument(op, ": stride must be >= 1, got ", PairString(s.stride));
    if (s.dilation[a] < 1) return InvalidArgument(op, ": dilation must be >= 1, got ", PairString(s.dilation));
    if (s.padding[a] < 0 || s.padding[a] > s.kernel[a] / 2)
      return InvalidArgument(op, ": padding ", PairString(s.padding), " must be between 0 and half the kernel ",
                             PairString(s.kernel));
  }
  return s;
}

}  // namespace loom::pool
