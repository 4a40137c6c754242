#include "graph/verifier.h"

#include <catch2/catch.hpp>

#include "graph/autodiff.h"
#include "graph/builder.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;

const TensorType kF32x23{Shape({2, 3}), DType::kF32};

AttrMap SourceAttrs(const TensorType& t) {
  return AttrMap{{"shape", t.shape.dims()}, {"dtype", std::string(DTypeName(t.dtype))}};
}

// x [2, 3] -> y = Linear(x, w [4, 3]) -> loss = sum(y), with an SGD update.
struct SmallModel {
  Graph graph;
  ValueId x, w, y, loss;
};

SmallModel BuildSmallModel() {
  SmallModel m;
  GraphBuilder b(&m.graph);
  m.x = b.Input("x", kF32x23);
  m.w = b.Parameter("w", {Shape({4, 3}), DType::kF32}, AttrMap{{"init", "normal"}, {"std", 0.1}});
  m.y = b.Add1("Linear", {m.x, m.w}, {}, "fc").value();
  m.loss = b.Add1("SumToShape", {m.y}, AttrMap{{"shape", std::vector<int64_t>{}}}, "loss").value();
  m.graph.outputs()["loss"] = m.loss;
  return m;
}

std::string Verify(const Graph& g) { return VerifyGraph(g).ToString(); }

TEST_CASE("a graph from the builder, with gradients and an update, verifies") {
  SmallModel m = BuildSmallModel();
  auto grads = BuildGradients(&m.graph, m.loss);
  REQUIRE(grads.ok());
  GraphBuilder b(&m.graph);
  ValueId step = b.Add1("MulScalar", {grads->at(m.w)}, AttrMap{{"value", 0.1}}, "sgd/step").value();
  ValueId next = b.Add1("Sub", {m.w, step}, {}, "sgd/w").value();
  m.graph.state_updates().push_back({m.w, next});
  CHECK(Verify(m.graph) == "OK");
}

TEST_CASE("stored output types that differ from type inference are reported with both") {
  SmallModel m = BuildSmallModel();
  m.graph.AddNode("bad_add", "Add", {}, {m.x, m.x}, {TensorType{Shape({2, 2}), DType::kF32}});
  std::string msg = Verify(m.graph);
  CHECK_THAT(msg, Contains("node 'bad_add' (Add)"));
  CHECK_THAT(msg, Contains("stored output types ([2, 2] f32) differ from the inferred ([2, 3] f32)"));
  CHECK_THAT(msg, Contains("for inputs ([2, 3] f32, [2, 3] f32)"));
}

TEST_CASE("a wrong dtype or a wrong number of outputs is a type mismatch too") {
  SmallModel m = BuildSmallModel();
  SECTION("dtype") {
    m.graph.AddNode("neg", "Neg", {}, {m.x}, {TensorType{Shape({2, 3}), DType::kF64}});
    CHECK_THAT(Verify(m.graph),
               Contains("node 'neg' (Neg): stored output types ([2, 3] f64) differ from the inferred ([2, 3] f32)"));
  }
  SECTION("count") {
    m.graph.AddNode("neg", "Neg", {}, {m.x}, {kF32x23, kF32x23});
    CHECK_THAT(Verify(m.graph),
               Contains("node 'neg' (Neg): stored output types ([2, 3] f32, [2, 3] f32) "
                        "differ from the inferred ([2, 3] f32)"));
  }
  SECTION("a source whose attributes say another shape") {
    m.graph.AddNode("z", kInputOp, SourceAttrs(kF32x23), {}, {TensorType{Shape({3, 2}), DType::kF32}});
    CHECK_THAT(Verify(m.graph),
               Contains("node 'z' (Input): stored output types ([3, 2] f32) differ from the inferred ([2, 3] f32)"));
  }
}

TEST_CASE("type inference failing on stored input types names the node and the shapes") {
  SmallModel m = BuildSmallModel();
  // y is [2, 4]; adding it to x [2, 3] does not broadcast.
  m.graph.AddNode("mix", "Add", {}, {m.x, m.y}, {kF32x23});
  std::string msg = Verify(m.graph);
  CHECK_THAT(msg, Contains("node 'mix' (Add)"));
  CHECK_THAT(msg, Contains("[2, 3] f32, [2, 4] f32"));
}

TEST_CASE("a node using a value that runs later after SetNodeOrder is reported") {
  Graph g;
  GraphBuilder b(&g);
  ValueId a = b.Input("a", kF32x23);
  ValueId neg = b.Add1("Neg", {a}, {}, "first").value();
  ValueId twice = b.Add1("Neg", {neg}, {}, "second").value();
  g.outputs()["out"] = twice;
  REQUIRE(Verify(g) == "OK");
  NodeId na = g.value(a).producer, n1 = g.value(neg).producer, n2 = g.value(twice).producer;
  g.SetNodeOrder({na, n2, n1});
  CHECK_THAT(Verify(g),
             Contains("node 'second' (Neg): input 0 'first' is produced by 'first', which does not run before it"));
}

TEST_CASE("a node using a value whose producer was removed is reported") {
  SmallModel m = BuildSmallModel();
  m.graph.RemoveNodes({m.graph.value(m.y).producer});
  CHECK_THAT(Verify(m.graph),
             Contains("node 'loss' (SumToShape): input 0 is value " + std::to_string(m.y) + ", which does not exist"));
}

TEST_CASE("a node reading its own output is reported") {
  SmallModel m = BuildSmallModel();
  NodeId id = m.graph.AddNode("loop", "Neg", {}, {m.x}, {kF32x23});
  m.graph.mutable_node(id).inputs = {m.graph.node(id).outputs[0]};
  CHECK_THAT(Verify(m.graph),
             Contains("node 'loop' (Neg): input 0 'loop' is produced by 'loop', which does not run before it"));
}

TEST_CASE("an unknown op is reported with the node name") {
  SmallModel m = BuildSmallModel();
  m.graph.AddNode("mystery", "Frobnicate", {}, {m.x}, {kF32x23});
  std::string msg = Verify(m.graph);
  CHECK_THAT(msg, Contains("node 'mystery' (Frobnicate)"));
  CHECK_THAT(msg, Contains("Frobnicate"));
}

TEST_CASE("duplicate node names are reported") {
  SmallModel m = BuildSmallModel();
  m.graph.mutable_node(m.graph.value(m.y).producer).name = "x";
  CHECK_THAT(Verify(m.graph), Contains("node name 'x' is used by more than one node"));
}

TEST_CASE("graph outputs must refer to existing values") {
  SmallModel m = BuildSmallModel();
  m.graph.outputs()["ghost"] = 999;
  CHECK_THAT(Verify(m.graph), Contains("graph output 'ghost' refers to value 999, which is not produced by any node"));
}

TEST_CASE("state updates: the state must be a Parameter or Buffer, of the same type, updated once") {
  SmallModel m = BuildSmallModel();
  GraphBuilder b(&m.graph);
  SECTION("mismatched type") {
    AttrMap f64_zeros{{"shape", std::vector<int64_t>{4, 3}}, {"value", 0.0}, {"dtype", "f64"}};
    ValueId wrong = b.Add1("Fill", {}, f64_zeros, "w64").value();
    m.graph.state_updates().push_back({m.w, wrong});
    CHECK_THAT(Verify(m.graph),
               Contains("state update 0 of 'w': new value 'w64' has type [4, 3] f64, the state has [4, 3] f32"));
  }
  SECTION("not a state node") {
    ValueId neg = b.Add1("Neg", {m.x}, {}, "negx").value();
    m.graph.state_updates().push_back({m.x, neg});
    CHECK_THAT(Verify(m.graph),
               Contains("state update 0 of 'x': the state must be the output of a Parameter or Buffer node, "
                                         "but it is produced by node 'x' (Input)"));
  }
  SECTION("updated twice") {
    ValueId neg = b.Add1("Neg", {m.w}, {}, "negw").value();
    m.graph.state_updates().push_back({m.w, neg});
    m.graph.state_updates().push_back({m.w, m.w});
    CHECK_THAT(Verify(m.graph), Contains("state update 1 of 'w': the state is updated more than once"));
  }
  SECTION("missing new value") {
    m.graph.state_updates().push_back({m.w, 12345});
    CHECK_THAT(Verify(m.graph), Contains("state update 0 of 'w': new value value 12345 is not produced by any node"));
  }
}

TEST_CASE("gradients must refer to existing values of the same type") {
  SmallModel m = BuildSmallModel();
  SECTION("missing gradient value") {
    m.graph.gradients()[m.w] = 777;
    CHECK_THAT(Verify(m.graph), Contains("gradient of 'w': value 777 is not produced by any node"));
  }
  SECTION("missing key") {
    m.graph.gradients()[555] = m.w;
    CHECK_THAT(Verify(m.graph), Contains("gradient entry for value 555: the value is not produced by any node"));
  }
  SECTION("type mismatch") {
    m.graph.gradients()[m.w] = m.y;
    CHECK_THAT(Verify(m.graph), Contains("gradient of 'w': 'fc' has type [2, 4] f32, the value has [4, 3] f32"));
  }
}

}  // namespace
}  // namespace loom
