// Naive references shared by op tests: plain loops over f64 tensors, written
// independently of the kernels they check.
#pragma once

#include <functional>

#include "tests/op_harness.h"

namespace loom::testing {

// The offset into `in` of element `flat` of `out`, numpy broadcasting.
int64_t BroadcastOffset(const Shape& in, const Shape& out, int64_t flat);
// C = op(A) op(B) over any number of leading batch dims (attrs transpose_a/b).
std::vector<Tensor> MatMulRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&);
// y = x W^T (+ b), x [..., in], W [out, in].
std::vector<Tensor> LinearRef(const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&);
// Element-wise with broadcasting, and unary.
ReferenceFn BinaryRef(double (*f)(double, double));
ReferenceFn UnaryRef(std::function<double(double)> f);

}  // namespace loom::testing
