#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "graph/autodiff.h"
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
      // Odd sizes: whole 16-byte packs plus a tail, over several blocks.
      Case("gelu exact odd size", "GELU", [](double x) { return x * 0.5 * std::erfc(-x / std::sqrt(2.0)); }, -3, 3, {},
           {1001}),
      Case("silu odd size", "SiLU", [](double x) { return x / (1 + std::exp(-x)); }, -4, 4, {}, {7, 143}),
      Case("hardswish odd size", "Hardswish", [](double x) { return x * Clamp(x + 3, 0, 6) / 6; }, -5, 5, {},
           {37, 29}),
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
  CHECK_THAT(s.message(), Catch::Contains("Sigmoid input must be f32 or f64, got i64"));

  // ReLU alone takes i64; every other unary op keeps the float-only error,
  // and ReLU still rejects the other integer types.
  CHECK(AddUnary("ReLU", {{4}, DType::kI64}, {}).ok());
  for (const char* op : {"ReLU6", "LeakyReLU", "GELU", "Tanh", "Hardswish", "Hardsigmoid", "SiLU", "Exp", "Log",
                         "Sqrt", "Rsqrt", "Abs"}) {
    INFO(op);
    s = AddUnary(op, {{2, 2}, DType::kI64}, {});
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains(std::string(op) + " input must be f32 or f64, got i64"));
  }
  s = AddUnary("ReLU", {{4}, DType::kI32}, {});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("ReLU input must be f32 or f64, got i32"));
  // The backward op stays float-only.
  {
    Graph graph;
    GraphBuilder b(&graph);
    ValueId dy = b.Input("dy", {{3}, DType::kI64});
    ValueId y = b.Input("y", {{3}, DType::kI64});
    auto bad = b.Add("ReLUBackward", {dy, y}, {}, "bad");
    CHECK(bad.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(bad.status().message(), Catch::Contains("ReLUBackward dy must be f32 or f64, got i64"));
  }

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

// ReLU on i64 (e.g. target ids with models::kIgnoreTarget = -100 entries):
// max(x, 0), same shape and dtype, exact for every int64 value.
TEST_CASE("relu on i64 clamps negatives to 0 and keeps the rest") {
  const std::vector<int64_t> x = {-100, -1, 0, 1, 7, 20480, -7, std::numeric_limits<int64_t>::max(),
                                  std::numeric_limits<int64_t>::min(), int64_t{1} << 53, (int64_t{1} << 53) + 1, -100};
  const std::vector<int64_t> want = {0, 0, 0, 1, 7, 20480, 0, std::numeric_limits<int64_t>::max(),
                                     0, int64_t{1} << 53, (int64_t{1} << 53) + 1, 0};
  Graph graph;
  GraphBuilder b(&graph);
  ValueId in = b.Input("x", {{3, 4}, DType::kI64});
  ValueId y = b.Add1("ReLU", {in}, {}, "relu").value();
  CHECK(graph.type(y) == TensorType{{3, 4}, DType::kI64});
  graph.outputs()["y"] = y;
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());
  auto r = (*exec)->Run({{"x", Tensor::FromVector<int64_t>({3, 4}, x)}});
  if (!r.ok()) FAIL(r.status().ToString());
  const Tensor& out = (*r)["y"];
  REQUIRE(out.dtype() == DType::kI64);
  REQUIRE(out.shape() == Shape({3, 4}));
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i]);
    CHECK(out.data<int64_t>()[i] == want[i]);
  }

  SECTION("large (threaded)") {
    const int64_t n = 256 * 300;
    std::vector<int64_t> big(n);
    for (int64_t i = 0; i < n; ++i) big[i] = (i % 2 ? -1 : 1) * (i * 7919 % 100003) - (i % 5 == 0 ? 100 : 0);
    Graph g2;
    GraphBuilder b2(&g2);
    ValueId v = b2.Add1("ReLU", {b2.Input("x", {{256, 300}, DType::kI64})}, {}, "relu").value();
    g2.outputs()["y"] = v;
    auto e2 = Executor::Create(g2);
    REQUIRE(e2.ok());
    auto r2 = (*e2)->Run({{"x", Tensor::FromVector<int64_t>({256, 300}, big)}});
    REQUIRE(r2.ok());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += (*r2)["y"].data<int64_t>()[i] != std::max<int64_t>(big[i], 0);
    CHECK(wrong == 0);
  }
}

// Autodiff only differentiates floating values: a loss reached through an
// i64 ReLU (its ids feed an Embedding) gives the embedding its gradient and
// never asks ReLU for one; asking directly is a clear error, not a bad node.
TEST_CASE("relu on i64 has no gradient") {
  Graph graph;
  GraphBuilder b(&graph);
  ValueId ids = b.Input("ids", {{4}, DType::kI64});
  ValueId clamped = b.Add1("ReLU", {ids}, {}, "relu").value();
  const OpDef* relu = OpRegistry::Global().FindOp("ReLU");
  REQUIRE(relu != nullptr);

  struct Probe final : GradBuilder {
    const Graph* graph;
    const Node* n;
    const Node& node() const override { return *n; }
    const TensorType& type(ValueId v) const override { return graph->type(v); }
    ValueId output_grad(int) const override { return kNoValue; }
    std::vector<ValueId> Emit(const std::string& op, const std::vector<ValueId>&, const AttrMap&) override {
      emitted.push_back(op);
      return {kNoValue};
    }
    bool NeedsInputGrad(int) const override { return true; }
    void SetInputGrad(int, ValueId) override {}
    std::vector<std::string> emitted;
  } probe;
  probe.graph = &graph;
  probe.n = &graph.node(graph.value(clamped).producer);
  Status s = relu->Gradient(probe);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("ReLU") && Catch::Contains("i64"));
  CHECK(probe.emitted.empty());

  // Through autodiff: the clamped ids index a trained embedding.
  ValueId w = b.Parameter("w", {{5, 3}, DType::kF64}, {{"init", "ones"}});
  ValueId e = b.Add1("Embedding", {clamped, w}, {}, "embed").value();
  ValueId loss = b.Add1("ReduceSum", {e}, {}, "loss").value();
  auto grads = BuildGradients(&graph, loss);
  if (!grads.ok()) FAIL(grads.status().ToString());
  CHECK(grads->count(w) == 1);
  for (const Node& n : graph.nodes()) CHECK(n.op != "ReLUBackward");
  graph.outputs()["dw"] = grads->at(w);
  auto exec = Executor::Create(graph);
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  auto r = (*exec)->Run({{"ids", Tensor::FromVector<int64_t>({4}, {-100, 2, -1, 2})}});
  if (!r.ok()) FAIL(r.status().ToString());
  // Rows 0 (twice, from -100 and -1) and 2 (twice) each get 2 per column.
  const std::vector<double> dw = (*r)["dw"].ToDoubleVector();
  for (int64_t row = 0; row < 5; ++row)
    for (int64_t c = 0; c < 3; ++c) CHECK(dw[row * 3 + c] == (row == 0 || row == 2 ? 2.0 : 0.0));
}

}  // namespace
}  // namespace loom::testing
