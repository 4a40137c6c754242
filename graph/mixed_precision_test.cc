#include "graph/mixed_precision.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/verifier.h"
#include "ops/op.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom {
namespace {

using Catch::Contains;

// A real MLP on the GEMMs:
//   h = Linear(x, w1, b1); r = ReLU(h); y = Linear(r, w2, b2); z = MatMul(y, w3)
//   loss = sum(z * z) + sum(y * y)
// x [4, 8], w1 [16, 8], b1 [16], w2 [6, 16], b2 [6], w3 [6, 5]. y feeds a
// GEMM directly and also the loss, so its low-precision gradient is the Add of two.
struct TestNet {
  Graph graph;
  ValueId x, w1, b1, w2, b2, w3, h, r, y, z, loss;
};

// Parameters (with initializers) or, for runs fed from the test, Inputs.
void Build(TestNet* net, DType dtype = DType::kF32, bool fed_weights = false) {
  GraphBuilder b(&net->graph);
  auto weight = [&](const char* name, Shape shape) {
    const TensorType t{shape, dtype};
    return fed_weights ? b.Input(name, t) : b.Parameter(name, t, AttrMap{{"init", "normal"}});
  };
  net->x = b.Input("x", {{4, 8}, dtype});
  net->w1 = weight("w1", {16, 8});
  net->b1 = weight("b1", {16});
  net->w2 = weight("w2", {6, 16});
  net->b2 = weight("b2", {6});
  net->w3 = weight("w3", {6, 5});
  net->h = b.Add1("Linear", {net->x, net->w1, net->b1}, {}, "h").value();
  net->r = b.Add1("ReLU", {net->h}, {}, "r").value();
  net->y = b.Add1("Linear", {net->r, net->w2, net->b2}, {}, "y").value();
  net->z = b.Add1("MatMul", {net->y, net->w3}, {}, "z").value();
  const AttrMap scalar{{"shape", std::vector<int64_t>{}}};
  ValueId sz = b.Add1("SumToShape", {b.Add1("Mul", {net->z, net->z}, {}, "zz").value()}, scalar, "sum_zz").value();
  ValueId sy = b.Add1("SumToShape", {b.Add1("Mul", {net->y, net->y}, {}, "yy").value()}, scalar, "sum_yy").value();
  net->loss = b.Add1("Add", {sz, sy}, {}, "loss").value();
  net->graph.outputs() = {{"loss", net->loss}, {"y", net->y}};
}

const Node& Producer(const Graph& g, ValueId v) { return g.node(g.value(v).producer); }

std::vector<const Node*> NodesWithOp(const Graph& g, const std::string& op) {
  std::vector<const Node*> out;
  for (const Node& n : g.nodes())
    if (n.op == op) out.push_back(&n);
  return out;
}

TEST_CASE("the low-precision op list") {
  const std::vector<std::string> want = {"MatMul", "BatchMatMul", "Linear", "Conv1d",
                                         "Conv2d", "ConvTranspose1d", "ConvTranspose2d"};
  CHECK(LowPrecisionOps() == want);
  for (const std::string& op : LowPrecisionOps()) CHECK(OpRegistry::Global().FindOp(op) != nullptr);
}

TEST_CASE("mixed precision casts the inputs and outputs of the GEMMs of an MLP, once per value") {
  for (DType low : {DType::kBF16, DType::kF16}) {
    const std::string low_name = DTypeName(low);
    INFO("precision " << low_name);
    TestNet net;
    Build(&net);
    Graph& g = net.graph;
    const int nodes_before = g.num_nodes();
    auto changed = ApplyMixedPrecision(&g, low);
    REQUIRE(changed.status().ToString() == "OK");
    CHECK(*changed);
    REQUIRE(VerifyGraph(g).ToString() == "OK");

    // Input casts: x, the five parameters and r, one each; z reads y's
    // low-precision output, so y is not cast again. Output casts: one per GEMM.
    int to_low = 0, to_f32 = 0;
    for (const Node* c : NodesWithOp(g, "Cast")) {
      if (c->attrs.Str("to") == low_name) ++to_low;
      if (c->attrs.Str("to") == "f32") ++to_f32;
    }
    CHECK(to_low == 7);
    CHECK(to_f32 == 3);

    // Every GEMM reads and writes the low dtype and keeps its name.
    for (const char* name : {"h", "y", "z"}) {
      INFO("node " << name);
      auto id = g.FindNode(name);
      REQUIRE(id.has_value());
      const Node& n = g.node(*id);
      for (ValueId v : n.inputs) CHECK(g.type(v).dtype == low);
      CHECK(g.type(n.outputs[0]).dtype == low);
      CHECK(g.value(n.outputs[0]).name == name);
    }
    // The values callers hold are still f32, now produced by the casts back.
    for (ValueId v : {net.h, net.y, net.z}) {
      CHECK(g.type(v).dtype == DType::kF32);
      const Node& c = Producer(g, v);
      CHECK(c.op == "Cast");
      CHECK(g.type(c.inputs[0]).dtype == low);
    }
    // z reads y's low-precision output itself.
    const Node& z = Producer(g, Producer(g, net.z).inputs[0]);
    CHECK(z.name == "z");
    CHECK(z.inputs[0] == Producer(g, net.y).inputs[0]);
    // Everything else stays f32: parameters (master weights), whose only
    // consumers are their casts, ReLU, the element-wise ops, the loss.
    const std::map<ValueId, std::vector<NodeId>> consumers_of = g.Consumers();
    for (ValueId p : {net.w1, net.b1, net.w2, net.b2, net.w3}) {
      CHECK(g.type(p).dtype == DType::kF32);
      REQUIRE(consumers_of.at(p).size() == 1);
      CHECK(g.node(consumers_of.at(p)[0]).op == "Cast");
    }
    for (const char* name : {"r", "zz", "yy", "sum_zz", "sum_yy", "loss"}) {
      const Node& n = g.node(*g.FindNode(name));
      for (ValueId v : n.inputs) CHECK(g.type(v).dtype == DType::kF32);
      CHECK(g.type(n.outputs[0]).dtype == DType::kF32);
    }
    CHECK(g.outputs().at("loss") == net.loss);
    CHECK(g.outputs().at("y") == net.y);
    CHECK(g.type(net.loss).dtype == DType::kF32);
    CHECK(g.num_nodes() == nodes_before + 10);

    // Running it again finds nothing to do (every GEMM input is low already).
    auto again = ApplyMixedPrecision(&g, low);
    REQUIRE(again.ok());
    CHECK_FALSE(*again);
  }
}

TEST_CASE("gradients of a mixed-precision MLP flow through the casts back to the f32 parameters") {
  TestNet net;
  Build(&net);
  Graph& g = net.graph;
  REQUIRE(ApplyMixedPrecision(&g, DType::kBF16).ok());
  const int forward_nodes = g.num_nodes();
  std::set<NodeId> forward;
  for (const Node& n : g.nodes()) forward.insert(n.id);
  auto grads = BuildGradients(&g, net.loss);
  REQUIRE(grads.status().ToString() == "OK");
  REQUIRE(VerifyGraph(g).ToString() == "OK");
  // The gradient of each parameter is the backward of its cast: a Cast of
  // the bf16 gradient back to f32.
  for (ValueId p : {net.w1, net.b1, net.w2, net.b2, net.w3}) {
    REQUIRE(grads->count(p));
    CHECK(g.type(grads->at(p)).dtype == DType::kF32);
    const Node& c = Producer(g, grads->at(p));
    CHECK(c.op == "Cast");
    CHECK(c.attrs.Str("to") == "f32");
    CHECK(g.type(c.inputs[0]).dtype == DType::kBF16);
  }
  // Every backward Cast undoes a forward one: bf16 <-> f32, and the GEMMs'
  // backward ops (MatMul, SumToShape, Reshape, the Add accumulating y's two
  // gradients) run in bf16: every backward node is bf16 or f32 throughout.
  int backward_casts = 0, backward_gemms = 0, low_adds = 0;
  for (const Node& n : g.nodes()) {
    if (forward.count(n.id)) continue;
    if (n.op == "Cast") {
      ++backward_casts;
      const DType in = g.type(n.inputs[0]).dtype, out = g.type(n.outputs[0]).dtype;
      CHECK(((in == DType::kBF16 && out == DType::kF32) || (in == DType::kF32 && out == DType::kBF16)));
    }
    if (n.op == "MatMul") {
      ++backward_gemms;
      for (ValueId v : n.inputs) CHECK(g.type(v).dtype == DType::kBF16);
    }
    if (n.op == "Add" && g.type(n.outputs[0]).dtype == DType::kBF16) ++low_adds;
    if (n.op == "SumToShape" && n.inputs.size() == 1 && g.type(n.inputs[0]).shape.rank() == 2 &&
        g.type(n.outputs[0]).shape.rank() == 1)
      CHECK(g.type(n.inputs[0]).dtype == DType::kBF16);  // the bias gradients
  }
  CHECK(backward_casts > 0);
  CHECK(backward_gemms >= 5);  // dW1, dW2, dr, dW3, dy (dx is not needed)
  CHECK(low_adds == 1);
  CHECK(g.num_nodes() > forward_nodes);
}

// The loss and the parameter gradients of the MLP in bf16 / f16 mixed
// precision against the f32 graph, on every device: within 2e-2 (bf16) and
// 2e-3 (f16) of the largest magnitude of each tensor (bf16 keeps 8
// significant bits, f16 11; the inputs, weights and every GEMM output round
// once each).
TEST_CASE("a mixed-precision MLP's loss and gradients match the f32 graph") {
  Rng rng(3);
  auto uniform = [&](Shape shape, double scale) {
    std::vector<float> v(shape.numel());
    for (float& f : v) f = static_cast<float>(rng.Uniform(-scale, scale));
    return Tensor::FromVector<float>(shape, v);
  };
  const std::map<std::string, Tensor> feeds = {{"x", uniform({4, 8}, 1.0)},  {"w1", uniform({16, 8}, 0.5)},
                                               {"b1", uniform({16}, 0.5)},   {"w2", uniform({6, 16}, 0.5)},
                                               {"b2", uniform({6}, 0.5)},    {"w3", uniform({6, 5}, 0.5)}};
  const std::vector<std::string> weights = {"w1", "b1", "w2", "b2", "w3"};
  // Runs the net, mixed in `precision` (f32: as built), and returns the loss and d(loss)/d(weights).
  auto run = [&](DType precision, Device device) {
    TestNet net;
    Build(&net, DType::kF32, /*fed_weights=*/true);
    Graph& g = net.graph;
    REQUIRE(ApplyMixedPrecision(&g, precision).ok());
    const std::vector<ValueId> wrt = {net.w1, net.b1, net.w2, net.b2, net.w3};
    auto grads = BuildGradients(&g, net.loss, wrt);
    REQUIRE(grads.status().ToString() == "OK");
    g.outputs() = {{"loss", net.loss}};
    for (size_t i = 0; i < wrt.size(); ++i) {
      CHECK(g.type(grads->at(wrt[i])).dtype == DType::kF32);  // master weights' gradients stay f32
      g.outputs()["d" + weights[i]] = grads->at(wrt[i]);
    }
    ExecutorOptions opts;
    opts.device = device;
    auto exec = Executor::Create(g, opts);
    REQUIRE(exec.status().ToString() == "OK");
    auto got = (*exec)->Run(feeds);
    REQUIRE(got.status().ToString() == "OK");
    return *got;
  };
  for (Device device : testing::TestDevices()) {
    const std::map<std::string, Tensor> want = run(DType::kF32, device);
    for (auto [low, tol] : {std::pair{DType::kBF16, 2e-2}, std::pair{DType::kF16, 2e-3}}) {
      INFO(DTypeName(low) << " on " << device.ToString());
      const std::map<std::string, Tensor> got = run(low, device);
      for (const auto& [name, w] : want) {
        INFO(name);
        const Tensor& gt = got.at(name);
        REQUIRE(gt.dtype() == DType::kF32);
        REQUIRE(gt.shape() == w.shape());
        double scale = 0, err = 0;
        for (int64_t i = 0; i < w.numel(); ++i) {
          scale = std::max(scale, std::abs(static_cast<double>(w.data<float>()[i])));
          err = std::max(err, std::abs(static_cast<double>(gt.data<float>()[i]) - w.data<float>()[i]));
        }
        INFO("max error " << err << " against max magnitude " << scale);
        CHECK(scale > 0);
        CHECK(err <= tol * scale);
        CHECK(err > 0);  // it did run in low precision
      }
    }
  }
}

TEST_CASE("mixed precision f32 leaves the graph as it is") {
  TestNet net;
  Build(&net);
  const std::string before = net.graph.ToString();
  auto changed = MixedPrecisionPass(DType::kF32).Run(&net.graph);
  REQUIRE(changed.ok());
  CHECK_FALSE(*changed);
  CHECK(net.graph.ToString() == before);
  auto applied = ApplyMixedPrecision(&net.graph, DType::kF32);
  REQUIRE(applied.ok());
  CHECK_FALSE(*applied);
  CHECK(net.graph.ToString() == before);
}

TEST_CASE("mixed precision leaves f64 graphs alone and rejects other precisions") {
  TestNet net;
  Build(&net, DType::kF64);
  const std::string before = net.graph.ToString();
  auto changed = MixedPrecisionPass(DType::kBF16).Run(&net.graph);
  REQUIRE(changed.ok());
  CHECK_FALSE(*changed);
  CHECK(net.graph.ToString() == before);
  auto bad = MixedPrecisionPass(DType::kF64).Run(&net.graph);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Contains("precision must be f32, bf16 or f16, got f64"));
}

// An op on the list whose type inference does not take the low dtype (average
// pooling, f32 / f64 only): the pass refuses the graph, naming the node, and
// changes nothing, not even the GEMM it could convert.
TEST_CASE("mixed precision refuses an op without half support, naming the node") {
  for (DType low : {DType::kBF16, DType::kF16}) {
    Graph g;
    GraphBuilder b(&g);
    ValueId x = b.Input("x", {{1, 2, 6, 6}, DType::kF32});
    ValueId p = b.Add1("AvgPool2d", {x}, AttrMap{{"kernel", std::vector<int64_t>{2, 2}}}, "pool").value();
    ValueId flat = b.Add1("Reshape", {p}, AttrMap{{"shape", std::vector<int64_t>{1, 18}}}, "flat").value();
    ValueId fw = b.Parameter("fc/weight", {{4, 18}, DType::kF32}, AttrMap{{"init", "normal"}});
    ValueId y = b.Add1("Linear", {flat, fw}, {}, "fc").value();
    g.outputs() = {{"y", y}};
    const std::string before = g.ToString();
    MixedPrecisionPass pass(low, {"Linear", "AvgPool2d"});
    auto r = pass.Run(&g);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(),
               Contains(std::string("node 'pool' (AvgPool2d) does not take ") + DTypeName(low) + " inputs"));
    CHECK(g.ToString() == before);
  }
}

}  // namespace
}  // namespace loom
