// End-to-end autodiff: gradients of small composite models, built by
// BuildGradients and run by the executor, against central finite
// differences in f64.
#include "graph/autodiff.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "graph/builder.h"
#include "graph/verifier.h"
#include "runtime/executor.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;

constexpr DType kF64 = DType::kF64;
const AttrMap kScalarShape{{"shape", std::vector<int64_t>{}}};

Tensor RandomF64(const Shape& shape, Rng* rng, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::Zeros(shape, kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng->Uniform(lo, hi);
  return t;
}

ValueId Op(GraphBuilder& b, const std::string& op, const std::vector<ValueId>& inputs, const AttrMap& attrs = {},
           const std::string& name = "") {
  auto v = b.Add1(op, inputs, attrs, name);
  INFO("adding " << op << ": " << v.status().ToString());
  REQUIRE(v.ok());
  return *v;
}

// Differentiates `loss` w.r.t. `wrt` (Inputs or Parameters), runs the graph
// once for the analytic gradients and twice per element for central
// differences, perturbing a feed or a parameter. Returns the gradient values.
std::map<ValueId, ValueId> CheckAgainstFiniteDifferences(Graph* graph, ValueId loss, const std::vector<ValueId>& wrt,
                                                         std::map<std::string, Tensor> feeds, double tolerance = 1e-6) {
  auto grads = BuildGradients(graph, loss, wrt);
  INFO("autodiff: " << grads.status().ToString());
  REQUIRE(grads.ok());
  REQUIRE(VerifyGraph(*graph).ToString() == "OK");
  graph->outputs()["loss"] = loss;
  for (size_t i = 0; i < wrt.size(); ++i) graph->outputs()["grad" + std::to_string(i)] = grads->at(wrt[i]);

  auto exec = Executor::Create(*graph);
  INFO("executor: " << exec.status().ToString());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(/*seed=*/3).ok());
  auto run = [&]() {
    auto r = (*exec)->Run(feeds);
    INFO("run: " << r.status().ToString());
    REQUIRE(r.ok());
    return *r;
  };
  std::map<std::string, Tensor> analytic = run();

  const double eps = 1e-6;
  for (size_t i = 0; i < wrt.size(); ++i) {
    const Node& source = graph->node(graph->value(wrt[i]).producer);
    const bool is_input = source.op == kInputOp;
    REQUIRE((is_input || source.op == kParameterOp));
    // The tensor to perturb: the feed itself, or a host copy of the state.
    Tensor base;
    if (is_input) {
      base = feeds.at(source.name);
    } else {
      auto state = (*exec)->GetState(source.name);
      REQUIRE(state.ok());
      base = Tensor::FromVector(state->shape(), state->ToDoubleVector());
    }
    auto set = [&](const Tensor& t) {
      if (is_input) feeds[source.name] = t;
      else REQUIRE((*exec)->SetState(source.name, t).ok());
    };
    const Tensor& grad = analytic.at("grad" + std::to_string(i));
    REQUIRE(grad.shape() == base.shape());
    int bad = 0;
    for (int64_t e = 0; e < base.numel(); ++e) {
      std::vector<double> values = base.ToDoubleVector();
      const double orig = values[e];
      values[e] = orig + eps;
      set(Tensor::FromVector(base.shape(), values));
      const double up = run().at("loss").ScalarAt(0);
      values[e] = orig - eps;
      set(Tensor::FromVector(base.shape(), values));
      const double down = run().at("loss").ScalarAt(0);
      const double numeric = (up - down) / (2 * eps), got = grad.ScalarAt(e);
      const bool ok = std::abs(numeric - got) <= tolerance * std::max(1.0, std::abs(numeric));
      if (!ok && bad++ < 3) {
        INFO("d loss / d " << source.name << "[" << e << "]: finite difference " << numeric << ", backprop " << got);
        CHECK(ok);
      }
    }
    set(base);
    INFO("gradient of " << source.name);
    CHECK(bad == 0);
  }
  return *grads;
}

TEST_CASE("autodiff of Linear -> square -> Linear -> weighted sum matches finite differences") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({3, 4}), kF64});
  ValueId c = b.Input("c", {Shape({3, 2}), kF64});
  ValueId w1 = b.Parameter("fc1/w", {Shape({5, 4}), kF64}, AttrMap{{"init", "normal"}, {"std", 0.5}});
  ValueId b1 = b.Parameter("fc1/b", {Shape({5}), kF64}, AttrMap{{"init", "uniform"}, {"low", -0.5}, {"high", 0.5}});
  ValueId w2 = b.Parameter("fc2/w", {Shape({2, 5}), kF64}, AttrMap{{"init", "normal"}, {"std", 0.5}});
  ValueId h = Op(b, "Linear", {x, w1, b1}, {}, "fc1");
  ValueId sq = Op(b, "Mul", {h, h}, {}, "square");
  ValueId y = Op(b, "Linear", {sq, w2}, {}, "fc2");
  ValueId loss = Op(b, "SumToShape", {Op(b, "Mul", {y, c}, {}, "weighted")}, kScalarShape, "loss");

  Rng rng(11);
  std::map<std::string, Tensor> feeds = {{"x", RandomF64(Shape({3, 4}), &rng)}, {"c", RandomF64(Shape({3, 2}), &rng)}};
  auto grads = CheckAgainstFiniteDifferences(&g, loss, {w1, b1, w2, x}, feeds);
  // Recorded on the graph as well.
  for (ValueId v : {w1, b1, w2, x}) CHECK(g.gradients().at(v) == grads.at(v));
}

TEST_CASE("autodiff accumulates a parameter used several times and zero-fills an unused one") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({3, 4}), kF64});
  ValueId weights = b.Input("weights", {Shape({12}), kF64});
  ValueId w = b.Parameter("shared/w", {Shape({4, 4}), kF64}, AttrMap{{"init", "normal"}, {"std", 0.4}});
  ValueId bias = b.Parameter("bias", {Shape({4}), kF64}, AttrMap{{"init", "uniform"}});
  ValueId unused = b.Parameter("unused", {Shape({2, 2}), kF64}, AttrMap{{"init", "ones"}});

  // w feeds two Linears and both operands of a MatMul: four gradient paths.
  ValueId a = Op(b, "Linear", {x, w}, {}, "first");
  ValueId bb = Op(b, "Linear", {Op(b, "PowScalar", {a}, AttrMap{{"value", 2.0}}), w}, {}, "second");
  ValueId ww = Op(b, "MatMul", {w, w}, {}, "w_squared");
  ValueId e = Op(b, "MatMul", {x, ww}, {}, "third");
  // c = b / (a^2 + 1) - a/2 + e + broadcast bias, flattened and weighted.
  ValueId denom = Op(b, "AddScalar", {Op(b, "Mul", {a, a})}, AttrMap{{"value", 1.0}});
  ValueId q = Op(b, "Div", {bb, denom});
  ValueId r = Op(b, "Sub", {q, Op(b, "MulScalar", {a}, AttrMap{{"value", 0.5}})});
  ValueId s = Op(b, "Add", {r, Op(b, "Neg", {e})});
  ValueId t = Op(b, "Add", {s, Op(b, "BroadcastTo", {bias}, AttrMap{{"shape", std::vector<int64_t>{3, 4}}})});
  ValueId flat = Op(b, "Reshape", {Op(b, "Identity", {t})}, AttrMap{{"shape", std::vector<int64_t>{12}}});
  ValueId loss = Op(b, "SumToShape", {Op(b, "Mul", {flat, weights})}, kScalarShape, "loss");

  Rng rng(5);
  std::map<std::string, Tensor> feeds = {{"x", RandomF64(Shape({3, 4}), &rng)},
                                         {"weights", RandomF64(Shape({12}), &rng)}};
  auto grads = CheckAgainstFiniteDifferences(&g, loss, {w, bias, unused, x}, feeds);

  // The shared weight's gradient is a sum of contributions.
  CHECK(g.node(g.value(grads.at(w)).producer).op == "Add");
  // The unused parameter gets an explicit zero gradient of its own type.
  const Node& zero = g.node(g.value(grads.at(unused)).producer);
  CHECK(zero.op == "Fill");
  CHECK(zero.attrs.Float("value", -1) == 0.0);
  CHECK(g.type(grads.at(unused)) == g.type(unused));
}

TEST_CASE("autodiff with an empty wrt list differentiates every parameter") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({2, 3}), kF64});
  ValueId w = b.Parameter("w", {Shape({2, 3}), kF64}, AttrMap{{"init", "normal"}});
  ValueId v = b.Parameter("v", {Shape({3}), kF64}, AttrMap{{"init", "normal"}});
  ValueId prod = Op(b, "Mul", {Op(b, "Mul", {x, w}), v});
  ValueId loss = Op(b, "SumToShape", {Op(b, "Mul", {prod, prod})}, kScalarShape, "loss");
  auto grads = BuildGradients(&g, loss);
  REQUIRE(grads.ok());
  CHECK(grads->size() == 2);
  CHECK(grads->count(w) == 1);
  CHECK(grads->count(v) == 1);
  CHECK(grads->count(x) == 0);
}

TEST_CASE("autodiff refuses a loss that is not a floating scalar, leaving the graph alone") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({3, 4}), kF64});
  ValueId w = b.Parameter("w", {Shape({2, 4}), kF64}, AttrMap{{"init", "normal"}});
  ValueId y = Op(b, "Linear", {x, w}, {}, "logits");
  ValueId n = b.Input("count", {Shape({}), DType::kI64});
  const int before = g.num_nodes();

  auto non_scalar = BuildGradients(&g, y);
  REQUIRE_FALSE(non_scalar.ok());
  CHECK(non_scalar.status().ToString() ==
        "INVALID_ARGUMENT: the loss must be a floating scalar, got [3, 2] f64 (logits)");

  auto integer = BuildGradients(&g, n);
  REQUIRE_FALSE(integer.ok());
  CHECK_THAT(integer.status().ToString(), Contains("the loss must be a floating scalar, got [] i64 (count)"));

  auto missing = BuildGradients(&g, 999);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().ToString(), Contains("loss value 999 is not in the graph"));

  CHECK(g.num_nodes() == before);
  CHECK(g.gradients().empty());
}

}  // namespace
}  // namespace loom
