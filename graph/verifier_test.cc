#include "graph/verifier.h"

#include <catch2/catch.hpp>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/fusion.h"

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

// Nodes added without the builder (a pass, a hand-built graph) are held to
// the op's declared attributes.
TEST_CASE("an undeclared attribute is reported with the node, op and the declared ones") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({1, 4, 8, 8}), DType::kF32});
  ValueId w = b.Input("w", {Shape({4, 2, 3, 3}), DType::kF32});
  g.AddNode("conv", "Conv2d", AttrMap{{"grups", int64_t{2}}}, {x, w}, {{Shape({1, 4, 6, 6}), DType::kF32}});
  std::string msg = Verify(g);
  CHECK_THAT(msg, Contains("node 'conv' (Conv2d): unknown attribute 'grups'") && Contains("groups: int = 1"));
}

TEST_CASE("an attribute of the wrong type or a missing required one is reported") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({1, 4, 8, 8}), DType::kF32});
  ValueId w = b.Input("w", {Shape({4, 4, 3, 3}), DType::kF32});
  g.AddNode("conv", "Conv2d", AttrMap{{"groups", 1.5}}, {x, w}, {{Shape({1, 4, 6, 6}), DType::kF32}});
  CHECK_THAT(Verify(g), Contains("node 'conv' (Conv2d): attribute 'groups' must be of type int, got 1.5"));

  Graph g2;
  GraphBuilder b2(&g2);
  ValueId y = b2.Input("y", kF32x23);
  g2.AddNode("ln", "LayerNorm", {}, {y}, {kF32x23, {Shape({2}), DType::kF32}, {Shape({2}), DType::kF32}});
  CHECK_THAT(Verify(g2), Contains("node 'ln' (LayerNorm): missing required attribute 'normalized_shape'"));
}

TEST_CASE("a node without its defaulted attributes still verifies (they are implied)") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({1, 4, 8, 8}), DType::kF32});
  ValueId w = b.Input("w", {Shape({4, 4, 3, 3}), DType::kF32});
  g.AddNode("conv", "Conv2d", {}, {x, w}, {{Shape({1, 4, 6, 6}), DType::kF32}});
  CHECK(Verify(g) == "OK");
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

// The small model fused as 2 replicas: x shared, w [2, 4, 3], the Linear
// "fc" a batched product into [2, 2, 4] (each replica's rows, replica axis
// first).
Graph FusedSmallModel() {
  auto fused = FuseReplicas(BuildSmallModel().graph, FusionOptions{2, {1, 2}, {}, {}});
  REQUIRE(fused.ok());
  return *fused;
}

ValueId ValueOf(const Graph& g, const std::string& node) { return g.node(*g.FindNode(node)).outputs[0]; }

TEST_CASE("a fused graph records where each value holds its replicas, through copies and autodiff") {
  Graph fused = FusedSmallModel();
  REQUIRE(Verify(fused) == "OK");
  CHECK(fused.replicas() == 2);
  CHECK(fused.value(ValueOf(fused, "x")).replica_layout == ReplicaLayout::Shared());
  CHECK(fused.value(ValueOf(fused, "w")).replica_layout == ReplicaLayout::Axis(0));
  CHECK(fused.value(ValueOf(fused, "fc")).replica_layout == ReplicaLayout::Axis(0));
  CHECK(fused.value(fused.outputs().at("loss")).replica_layout == ReplicaLayout::Axis(0));

  Graph copy = fused;
  CHECK(copy.replicas() == 2);
  CHECK(copy.value(ValueOf(copy, "fc")).replica_layout == ReplicaLayout::Axis(0));

  GraphBuilder b(&copy);
  ValueId total = b.Add1("ReduceSum", {copy.outputs().at("loss")}, {}, "total").value();
  auto grads = BuildGradients(&copy, total);
  REQUIRE(grads.ok());
  CHECK(copy.value(grads->at(ValueOf(copy, "w"))).replica_layout == ReplicaLayout::Axis(0));
  CHECK(Verify(copy) == "OK");
  // An unfused graph records none.
  const Graph single = BuildSmallModel().graph;
  CHECK(single.replicas() == 0);
  CHECK(!single.value(ValueOf(single, "fc")).replica_layout.known());
}

TEST_CASE("a replica layout that does not fit its value is reported") {
  Graph fused = FusedSmallModel();
  ReplicaLayout& fc = fused.mutable_value(ValueOf(fused, "fc")).replica_layout;
  SECTION("the replica dim's extent is not R x per_replica") {
    fc = ReplicaLayout::Merged(1, 3);
    CHECK_THAT(Verify(fused), Contains("node 'fc' (Linear): output 0 'fc' ([2, 2, 4] f32): its replica layout R*3@1 "
                                       "needs dim 1 of extent 2 x 3, its shape is [2, 2, 4]"));
  }
  SECTION("the replica dim is outside the shape") {
    fc = ReplicaLayout::Axis(3);
    CHECK_THAT(Verify(fused), Contains("its replica dim 3 is outside its shape [2, 2, 4]"));
  }
  SECTION("an invalid dim") {
    fc = ReplicaLayout{-5, 1};
    CHECK_THAT(Verify(fused), Contains("its replica layout has dim -5"));
  }
  SECTION("a layout in a graph that is not fused") {
    fused.set_replicas(0);
    CHECK_THAT(Verify(fused), Contains("node 'w' (Parameter): output 0 'w' ([2, 4, 3] f32): it records replica "
                                       "layout R@0 in a graph that is not fused"));
  }
}

TEST_CASE("a fused graph's state and outputs hold the replicas on dim 0") {
  Graph fused = FusedSmallModel();
  SECTION("a Parameter laid out elsewhere") {
    fused.mutable_value(ValueOf(fused, "w")).replica_layout = ReplicaLayout::Merged(1, 2);  // fits [2, 4, 3]
    CHECK_THAT(Verify(fused), Contains("node 'w' (Parameter): the Parameter of a fused graph of 2 replicas is laid "
                                       "out R*2@1, but must hold the 2 replicas on dim 0 (R@0)"));
  }
  SECTION("a Buffer that is not [R, ...]") {
    GraphBuilder b(&fused);
    b.Buffer("stats", {Shape({3, 5}), DType::kF32}, {});
    CHECK_THAT(Verify(fused), Contains("node 'stats' (Buffer): the Buffer of a fused graph of 2 replicas has shape "
                                       "[3, 5], but must be [2, ...] (one per replica)"));
  }
  SECTION("a shared output") {
    fused.outputs()["x"] = ValueOf(fused, "x");
    CHECK_THAT(Verify(fused), Contains("graph output 'x' ('x') of a fused graph of 2 replicas is laid out shared, "
                                       "but must hold the 2 replicas on dim 0 (R@0)"));
  }
  SECTION("an output without a layout that is not [R, ...]") {
    GraphBuilder b(&fused);
    fused.outputs()["sum"] = b.Add1("ReduceSum", {fused.outputs().at("loss")}, {}, "sum").value();
    CHECK_THAT(Verify(fused), Contains("graph output 'sum' ('sum') of a fused graph of 2 replicas has shape [], but "
                                       "must be [2, ...] (one per replica)"));
  }
}

}  // namespace
}  // namespace loom
