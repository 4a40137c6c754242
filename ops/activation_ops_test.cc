#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>

#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

// y[i] = f(x[i]), written out in plain double arithmetic.
ReferenceFn Elementwise(std::function<double(double)> f) {
  return [f](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
    Tensor y = ZerosF64(in[0].shape());
    for (int64_t i = 0; i < y.numel(); ++i) At(y, i) = f(At(in[0], i));
    return std::vector<Tensor>{y};
  };
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double Clamp(double x, double lo, double hi) { return std::min(std::max(x, lo), hi); }

OpCase Case(const std::string& name, const std::string& op, std::function<double(double)> f, double lo, double hi,
            AttrMap attrs = {}, Shape shape = {3, 5}) {
  return OpCase{name, op, std::move(attrs), {InputSpec::Uniform(std::move(shape), lo, hi)}, Elementwise(std::move(f))};
}

TEST_CASE("activation ops pass the op harness") {
  const double pi = std::acos(-1.0);
  std::vector<OpCase> cases = {
      Case("relu", "ReLU", [](double x) { return x > 0 ? x : 0.0; }, -1, 1),
      Case("relu large (threaded)", "ReLU", [](double x) { return x > 0 ? x : 0.0; }, -1, 1, {}, {256, 300}),
      Case("relu6 straddles 0 and 6", "ReLU6", [](double x) { return Clamp(x, 0, 6); }, -2, 8, {}, {4, 6}),
      Case("leaky relu default slope", "LeakyReLU", [](double x) { return x >= 0 ? x : 0.01 * x; }, -1, 1),
      Case("leaky relu slope 0.2", "LeakyReLU", [](double x) { return x >= 0 ? x : 0.2 * x; }, -1, 1,
           {{"negative_slope", 0.2}}),
      Case("gelu exact", "GELU", [](double x) { return x * 0.5 * std::erfc(-x / std::sqrt(2.0)); }, -3, 3),
      Case("gelu tanh", "GELU",
           [pi](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * std::pow(x, 3)))); },
           -3, 3, {{"approximate", std::string("tanh")}}),
      Case("sigmoid", "Sigmoid", Sigmoid, -6, 6),
      Case("tanh", "Tanh", [](double x) { return (std::exp(2 * x) - 1) / (std::exp(2 * x) + 1); }, -3, 3),
      Case("hardswish straddles +-3", "Hardswish", [](double x) { return x * Clamp(x + 3, 0, 6) / 6; }, -5, 5, {},
           {4, 6}),
      Case("hardsigmoid straddles +-3", "Hardsigmoid", [](double x) { return Clamp(x / 6 + 0.5, 0, 1); }, -5, 5, {},
           {4, 6}),
      Case("silu", "SiLU", [](double x) { return x / (1 + std::exp(-x)); }, -4, 4),
      Case("exp", "Exp", [](double x) { return std::exp(x); }, -2, 2),
      Case("log", "Log", [](double x) { return std::log(x); }, 0.2, 3),
      Case("sqrt", "Sqrt", [](double x) { return std::sqrt(x); }, 0.2, 3),
      Case("rsqrt", "Rsqrt", [](double x) { return std::pow(x, -0.5); }, 0.2, 3),
      Case("abs", "Abs", [](double x) { return x < 0 ? -x : x; }, -1, 1),
      Case("exp rank 0", "Exp", [](double x) { return std::exp(x); }, -1, 1, {}, Shape{}),
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// Adds `op` to a fresh graph on one input and returns the builder's status.
Status AddUnary(const std::string& op, const TensorType& input, const AttrMap& attrs) {
  Graph graph;
  GraphBuilder b(&graph);
  ValueId x = b.Input("x", input);
  return b.Add(op, {x}, attrs, "op").status();
}

TEST_CASE("activation ops reject bad attributes and inputs") {
  Status s = AddUnary("GELU", {{2, 3}, DType::kF32}, {{"approximate", std::string("fast")}});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("approximate") && Catch::Contains("fast"));

  s = AddUnary("LeakyReLU", {{2, 3}, DType::kF32}, {{"negative_slope", std::nan("")}});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("negative_slope"));

  s = AddUnary("Sigmoid", {{4}, DType::kI64}, {});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("Sigmoid input") && Catch::Contains("i64"));

  CHECK(AddUnary("GELU", {{2, 3}, DType::kF64}, {{"approximate", std::string("none")}}).ok());
}

TEST_CASE("activation backward ops check their operands") {
  Graph graph;
  GraphBuilder b(&graph);
  ValueId dy = b.Input("dy", {{2, 3}, DType::kF32});
  ValueId x = b.Input("x", {{3, 2}, DType::kF32});
  auto bad = b.Add("GELUBackward", {dy, x}, {}, "bad");
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("[2, 3]") && Catch::Contains("[3, 2]"));
}

TEST_CASE("activation costs count FLOPs per element") {
  const OpDef* gelu = OpRegistry::Global().FindOp("GELU");
  REQUIRE(gelu != nullptr);
  std::vector<TensorType> in = {{{10, 10}, DType::kF32}};
  OpCost exact = gelu->Cost({}, in, in);
  OpCost tanh = gelu->Cost({{"approximate", std::string("tanh")}}, in, in);
  CHECK(exact.flops == 500);
  CHECK(tanh.flops == 900);
  CHECK(exact.bytes_read == 400);
  CHECK(exact.bytes_written == 400);
  const OpDef* relu = OpRegistry::Global().FindOp("ReLU");
  REQUIRE(relu != nullptr);
  CHECK(relu->Cost({}, in, in).flops == 100);
}

// ReLU at 0 and NaN follow PyTorch: relu(0) = 0 with zero gradient, NaN
// propagates through the forward pass.
TEST_CASE("relu passes NaN and has zero gradient at 0") {
  Graph graph;
  GraphBuilder b(&graph);
  ValueId x = b.Input("x", {{3}, DType::kF64});
  ValueId y = b.Add1("ReLU", {x}, {}, "relu").value();
  ValueId dy = b.Input("dy", {{3}, DType::kF64});
  ValueId dx = b.Add1("ReLUBackward", {dy, y}, {}, "relu_grad").value();
  graph.outputs()["y"] = y;
  graph.outputs()["dx"] = dx;
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());
  auto r = (*exec)->Run({{"x", Tensor::FromVector<double>({3}, {0.0, std::nan(""), 2.0})},
                         {"dy", Tensor::FromVector<double>({3}, {1.0, 1.0, 1.0})}});
  REQUIRE(r.ok());
  CHECK((*r)["y"].ScalarAt(0) == 0.0);
  CHECK(std::isnan((*r)["y"].ScalarAt(1)));
  CHECK((*r)["y"].ScalarAt(2) == 2.0);
  CHECK((*r)["dx"].ScalarAt(0) == 0.0);
  CHECK((*r)["dx"].ScalarAt(2) == 1.0);
}

}  // namespace
}  // namespace loom::testing
