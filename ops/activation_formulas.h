// The element-wise formulas of the activations that the BatchNorm ops can
// do in their own passes (attr activation), shared by the activations' own
// kernels (ops/activation_ops.cc, ops/cuda/activation_kernels.cu) and the
// BatchNorm ones (ops/norm_ops.cc, ops/cuda/norm_kernels.cu), so that a
// folded activation gives the same bits as the op apart. Comparisons let
// NaN through (x < 0 is false for NaN, which then falls through to x).
// nvcc-compiled device code reads it too.
//
// The same formula gives the same bits only where the compiler contracts
// no product in it into an FMA with what follows: the BatchNorm kernels,
// which inline a gradient into their own sums, are compiled without
// contraction (ops/BUILD, ops/cuda/BUILD).
#pragma once

#include "core/host_device.h"

namespace loom::activation {

template <typename T>
LOOM_HOST_DEVICE inline T Relu(T x) {
  return x < T(0) ? T(0) : x;
}

template <typename T>
LOOM_HOST_DEVICE inline T Relu6(T x) {
  return x < T(0) ? T(0) : (x > T(6) ? T(6) : x);
}

template <typename T>
LOOM_HOST_DEVICE inline T Hardswish(T x) {
  return x <= T(-3) ? T(0) : (x >= T(3) ? x : x * (x + T(3)) / T(6));
}

// The gradients, from dy and the tensor the backward op saves: ReLU's
// output y (y > 0 exactly where x > 0), ReLU6's input or output (0 < s < 6
// holds for both alike), Hardswish's input.
template <typename T>
LOOM_HOST_DEVICE inline T ReluGrad(T dy, T y) {
  return y > T(0) ? dy : T(0);
}

template <typename T>
LOOM_HOST_DEVICE inline T Relu6Grad(T dy, T s) {
  return (s > T(0) && s < T(6)) ? dy : T(0);
}

// Hardswish's derivative between -3 and 3.
template <typename T>
LOOM_HOST_DEVICE inline T HardswishSlope(T x) {
  return x / T(3) + T(0.5);
}

template <typename T>
LOOM_HOST_DEVICE inline T HardswishGrad(T dy, T x) {
  return x < T(-3) ? T(0) : (x <= T(3) ? dy * HardswishSlope(x) : dy);
}

}  // namespace loom::activation
