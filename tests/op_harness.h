// The one harness every op goes through (ggml's test-backend-ops idea):
//  1. forward in f32 and f64 against an independent naive reference (f64);
//  2. backward against central finite differences in f64;
//  3. the CUDA kernels against the CPU kernels in f32, where a GPU is
//     present: the op's outputs, and the gradients of the same loss through
//     the backward ops its gradient rule emits (which must all have CUDA
//     kernels), to 4x the forward tolerance.
// Adding an op to the harness is one OpCase entry in its family's test.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/attrs.h"
#include "graph/ir.h"

namespace loom::testing {

struct InputSpec {
  enum class Kind { kUniform, kIndex };
  Shape shape;
  Kind kind = Kind::kUniform;
  double low = -1.0, high = 1.0;  // kUniform range
  int64_t num_classes = 0;        // kIndex: integers in [0, num_classes)
  DType index_dtype = DType::kI64;
  bool differentiable = true;     // checked against finite differences

  static InputSpec Uniform(Shape s, double lo = -1.0, double hi = 1.0) {
    InputSpec i;
    i.shape = std::move(s);
    i.low = lo;
    i.high = hi;
    return i;
  }
  // Float input that the gradient check leaves alone (e.g. running stats).
  static InputSpec Constant(Shape s, double lo = -1.0, double hi = 1.0) {
    InputSpec i = Uniform(std::move(s), lo, hi);
    i.differentiable = false;
    return i;
  }
  static InputSpec Index(Shape s, int64_t classes, DType dtype = DType::kI64) {
    InputSpec i;
    i.shape = std::move(s);
    i.kind = Kind::kIndex;
    i.num_classes = classes;
    i.index_dtype = dtype;
    i.differentiable = false;
    return i;
  }
};

// Reference: f64 host inputs (indices as given) -> expected outputs in f64.
// `actual` holds the op's own f64 outputs, for random ops whose reference
// must read the mask the op drew; deterministic references ignore it.
using ReferenceFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, const AttrMap& attrs,
                                                      const std::vector<Tensor>& actual)>;

struct OpCase {
  std::string name;  // shown in failures, e.g. "conv2d stride 2 groups 2"
  std::string op;
  AttrMap attrs;
  std::vector<InputSpec> inputs;
  ReferenceFn reference;
  std::vector<int> checked_outputs;  // outputs compared to the reference (default: all)
  std::vector<int> loss_outputs;     // outputs that feed the gradient check (default: all float)
  double f32_tolerance = 2e-4;       // forward, relative to max(1, |expected|)
  double f64_tolerance = 1e-9;
  double grad_tolerance = 1e-5;      // backward vs finite differences, relative
  bool check_gradient = true;
  uint64_t seed = 1;
};

// Runs the three checks; reports through Catch2 (CHECK/INFO), so a failing
// case names itself, the output or input and the first bad element.
void RunOpCase(const OpCase& c);

// `actual` holds the same bits as `expected` (shape and dtype too); a
// failure names `what` and the first element that differs.
void CheckBitwiseEqual(const std::string& what, const Tensor& expected, const Tensor& actual);

// The case's f32 outputs and gradients on the CPU are the same bits on each
// of `threads` (the default pool's size): results never depend on the
// thread count (checkpoints resume bit for bit on another machine).
void CheckSameAcrossThreads(const OpCase& c, const std::vector<int>& threads = {1, 2, 3, 4});

// Backprop against central finite differences in f64 for a whole graph:
// d(loss)/d(node) for each named Input (fed in `feeds`) or Parameter/Buffer
// (initialised from `seed`). For model-level tests (several ops, the model
// API, chained layers).
void CheckGraphGradients(Graph graph, ValueId loss, const std::map<std::string, Tensor>& feeds,
                         const std::vector<std::string>& wrt_nodes, double tolerance = 1e-5, uint64_t seed = 1,
                         const std::string& label = "graph");

// The error message of an op's type inference for these inputs (the
// inference must fail).
std::string InferError(const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& inputs);

// Whether the CUDA comparisons can run on cuda:0: true with a GPU; false
// without one (logged once), except under LOOM_REQUIRE_CUDA=1 (the GPU
// check), where a missing GPU fails the calling test instead of skipping.
bool GpuAvailable();
// The CPU, and cuda:0 where GpuAvailable(): for tests that check every
// device the same way.
std::vector<Device> TestDevices();

// Helpers for references.
Tensor ZerosF64(const Shape& shape);
inline double& At(Tensor& t, int64_t i) { return t.data<double>()[i]; }
inline double At(const Tensor& t, int64_t i) { return t.data<double>()[i]; }

}  // namespace loom::testing
