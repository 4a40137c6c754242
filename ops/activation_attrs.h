// Parsing the attributes of the activation ops (ops/activation_ops.cc, which
// declares them), shared by the CPU kernels and the CUDA kernels
// (ops/cuda/activation_kernels.cc).
#pragma once

#include <cmath>
#include <string>

#include "core/status.h"
#include "graph/attrs.h"
#include "ops/activation_params.h"

namespace loom {

// The attribute values of a forward op of the table or of its backward op
// (LeakyReLU negative_slope, GELU approximate), or an error naming `op` and
// the attribute.
inline StatusOr<UnaryParams> ParseUnaryParams(Unary kind, const std::string& op, const AttrMap& attrs) {
  UnaryParams p;
  if (kind == Unary::kLeakyRelu) {
    p.negative_slope = attrs.Float("negative_slope");
    if (!std::isfinite(p.negative_slope))
      return InvalidArgument(op, ": attribute negative_slope must be finite, got ", p.negative_slope);
  }
  if (kind == Unary::kGelu) {
    std::string approximate = attrs.Str("approximate");
    if (approximate != "none" && approximate != "tanh")
      return InvalidArgument(op, ": attribute approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
    p.gelu_tanh = approximate == "tanh";
  }
  return p;
}

}  // namespace loom
