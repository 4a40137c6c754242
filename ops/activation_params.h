// The activation ops' kinds and the attribute values their formulas read
// (ops/activation_ops.cc), shared by the CPU kernels and the CUDA kernels
// (ops/cuda/activation_kernels.*). Plain C++ with no includes: nvcc-compiled
// device code reads it too. The attributes are parsed by activation_attrs.h.
#pragma once

namespace loom {

// The rows of the activation table, in its order.
enum class Unary {
  kRelu, kRelu6, kLeakyRelu, kGelu, kSigmoid, kTanh, kHardswish, kHardsigmoid, kSilu,
  kExp, kLog, kSqrt, kRsqrt, kAbs,
};

// Attribute values, validated once by type inference and read by kernels.
struct UnaryParams {
  double negative_slope = 0;  // LeakyReLU
  bool gelu_tanh = false;     // GELU approximate="tanh"
};

}  // namespace loom
