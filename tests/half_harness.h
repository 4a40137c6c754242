// Test helpers for ops in bf16 / f16 (mixed precision): inputs exactly
// representable in the low dtype, an op run forward and backward through
// the executor in that dtype, and the check that a result was computed with
// f32 accumulation and rounded once (docs/mixed_precision.md).
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "graph/attrs.h"

namespace loom::testing {

// Values in [-1, 1) exactly representable in `low`, so that an f64
// reference sees what the kernels see.
std::vector<double> RandomHalfValues(int64_t n, DType low, Rng& rng);
Tensor HalfTensor(const Shape& shape, const std::vector<double>& values, DType low);

// The exact f64 result of each element and the sum of its terms' magnitudes
// (which bounds the f32 accumulation error).
struct Exact {
  std::vector<double> value, magnitude;
  explicit Exact(int64_t n) : value(n, 0.0), magnitude(n, 0.0) {}
  void Add(int64_t i, double term) {
    value[i] += term;
    magnitude[i] += std::abs(term);
  }
};

// Each element of `got` (dtype `low`) within one ulp of `low` at the exact
// value (|x| 2^-7 for bf16, 2^-10 for f16: the rounding, possibly to the
// other neighbour after the f32 error) plus the f32 accumulation error of
// k terms (4 k 2^-24 per unit of term magnitude).
void CheckHalf(const Tensor& got, const Exact& want, DType low, int64_t k, const std::string& what);

// y = op(inputs "in0", "in1", ...) in `low`; loss = sum(Cast(y, f32) * g)
// with g exact in `low`, so dy = g and the op's backward ops run on half
// inputs. Outputs "y" and "d<i>" (the gradient of input i, in `low`).
// With low = f64 it computes the reference of the same values.
struct HalfOpRun {
  std::map<std::string, Tensor> outputs;
};
HalfOpRun RunHalfOp(const std::string& op, const AttrMap& attrs, const std::vector<Shape>& shapes,
                    const std::vector<std::vector<double>>& values, const Shape& y_shape,
                    const std::vector<double>& g_values, DType low, Device device);

}  // namespace loom::testing
