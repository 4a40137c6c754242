#include <catch2/catch.hpp>

#include "tests/op_harness.h"
#include "tests/reference_ops.h"

namespace loom::testing {
namespace {

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
