#include <catch2/catch.hpp>

#include "tests/op_harness.h"

namespace loom::testing {
namespace {

// Naive C[b, i, j] = sum_k A'[b, i, k] B'[b, k, j] over rank-2 or rank-3.
std::vector<Tensor> MatMulRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  bool ta = attrs.Bool("transpose_a"), tb = attrs.Bool("transpose_b");
  const Shape& sa = in[0].shape();
  const Shape& sb = in[1].shape();
  int r = sa.rank();
  int64_t batch = r == 3 ? sa[0] : 1;
  int64_t ra = sa[r - 2], ca = sa[r - 1], rb = sb[r - 2], cb = sb[r - 1];
  int64_t m = ta ? ca : ra, k = ta ? ra : ca, n = tb ? rb : cb;
  std::vector<int64_t> out = sa.dims();
  out[r - 2] = m;
  out[r - 1] = n;
  Tensor y = ZerosF64(Shape(out));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          double a = ta ? At(in[0], b * ra * ca + p * ca + i) : At(in[0], b * ra * ca + i * ca + p);
          double bv = tb ? At(in[1], b * rb * cb + j * cb + p) : At(in[1], b * rb * cb + p * cb + j);
          s += a * bv;
        }
        At(y, b * m * n + i * n + j) = s;
      }
  return {y};
}

std::vector<Tensor> LinearRef(const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
  const Shape& x = in[0].shape();
  int64_t in_f = x.dim(-1), out_f = in[1].shape()[0], rows = x.numel() / in_f;
  std::vector<int64_t> out = x.dims();
  out.back() = out_f;
  Tensor y = ZerosF64(Shape(out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out_f; ++o) {
      double s = in.size() == 3 ? At(in[2], o) : 0.0;
      for (int64_t i = 0; i < in_f; ++i) s += At(in[0], r * in_f + i) * At(in[1], o * in_f + i);
      At(y, r * out_f + o) = s;
    }
  return {y};
}

TEST_CASE("matmul ops pass the op harness") {
  std::vector<OpCase> cases = {
      {"matmul", "MatMul", {}, {InputSpec::Uniform({3, 4}), InputSpec::Uniform({4, 5})}, MatMulRef},
      {"matmul A^T", "MatMul", {{"transpose_a", true}}, {InputSpec::Uniform({4, 3}), InputSpec::Uniform({4, 5})}, MatMulRef},
      {"matmul B^T", "MatMul", {{"transpose_b", true}}, {InputSpec::Uniform({3, 4}), InputSpec::Uniform({5, 4})}, MatMulRef},
      {"matmul A^T B^T", "MatMul", {{"transpose_a", true}, {"transpose_b", true}},
       {InputSpec::Uniform({4, 3}), InputSpec::Uniform({5, 4})}, MatMulRef},
      {"matmul large (threaded panels)", "MatMul", {}, {InputSpec::Uniform({64, 48}), InputSpec::Uniform({48, 80})}, MatMulRef},
      {"batch matmul", "BatchMatMul", {}, {InputSpec::Uniform({3, 2, 4}), InputSpec::Uniform({3, 4, 5})}, MatMulRef},
      {"batch matmul B^T", "BatchMatMul", {{"transpose_b", true}},
       {InputSpec::Uniform({2, 3, 4}), InputSpec::Uniform({2, 5, 4})}, MatMulRef},
      {"linear with bias", "Linear", {}, {InputSpec::Uniform({4, 6}), InputSpec::Uniform({3, 6}), InputSpec::Uniform({3})}, LinearRef},
      {"linear no bias rank 3", "Linear", {}, {InputSpec::Uniform({2, 3, 6}), InputSpec::Uniform({5, 6})}, LinearRef},
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

}  // namespace
}  // namespace loom::testing
