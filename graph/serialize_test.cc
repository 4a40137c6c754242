#include "graph/serialize.h"

#include <catch2/catch.hpp>

#include "tests/temp_files.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/fusion.h"
#include "runtime/executor.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;
namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) { return testing::FreshTempDir("serialize_test_" + name); }
using testing::ReadBytes;
using testing::WriteBytes;

// x [4, 3] -> Linear(w1, b1) -> h*h -> Linear(w2) + Add(c) -> loss = sum(out * t),
// gradients of all parameters and one SGD step as state updates.
struct Mlp {
  Graph graph;
  ValueId x, t, w1, b1, w2, loss;
};

Mlp BuildMlp() {
  Mlp m;
  GraphBuilder b(&m.graph);
  const DType dt = DType::kF32;
  m.x = b.Input("x", {Shape({4, 3}), dt});
  m.t = b.Input("target_weight", {Shape({4, 2}), dt});
  b.PushScope("mlp");
  m.w1 = b.Parameter("fc1/w", {Shape({5, 3}), dt}, AttrMap{{"init", "normal"}, {"mean", 0.0}, {"std", 0.3}});
  m.b1 = b.Parameter("fc1/b", {Shape({5}), dt}, AttrMap{{"init", "uniform"}, {"low", -0.1}, {"high", 0.1}});
  m.w2 = b.Parameter("fc2/w", {Shape({2, 5}), dt}, AttrMap{{"init", "normal"}, {"std", 0.3}});
  ValueId c = b.Buffer("offset", {Shape({2}), dt}, AttrMap{{"init", "constant"}, {"value", 0.25}});
  ValueId h = b.Add1("Linear", {m.x, m.w1, m.b1}, {}, "fc1").value();
  ValueId sq = b.Add1("Mul", {h, h}, {}, "square").value();
  ValueId y = b.Add1("Linear", {sq, m.w2}, {}, "fc2").value();
  ValueId out = b.Add1("Add", {y, c}, {}, "out").value();
  b.PopScope();
  ValueId weighted = b.Add1("Mul", {out, m.t}, {}, "weighted").value();
  m.loss = b.Add1("SumToShape", {weighted}, AttrMap{{"shape", std::vector<int64_t>{}}}, "loss").value();
  m.graph.outputs()["loss"] = m.loss;
  m.graph.outputs()["out"] = out;
  auto grads = BuildGradients(&m.graph, m.loss);
  REQUIRE(grads.ok());
  for (ValueId p : {m.w1, m.b1, m.w2}) {
    std::string name = m.graph.value(p).name;
    ValueId step = b.Add1("MulScalar", {grads->at(p)}, AttrMap{{"value", 0.05}}, "sgd/" + name + "/step").value();
    ValueId next = b.Add1("Sub", {p, step}, {}, "sgd/" + name).value();
    m.graph.state_updates().push_back({p, next});
    m.graph.outputs()["grad/" + name] = grads->at(p);
  }
  return m;
}

// Gradients by value names, since ids may differ between graphs.
std::map<std::string, std::string> NamedGradients(const Graph& g) {
  std::map<std::string, std::string> named;
  for (const auto& [v, grad] : g.gradients()) named[g.value(v).name] = g.value(grad).name;
  return named;
}

void CheckSameGraph(const Graph& expected, const Graph& actual) {
  CHECK(actual.ToString() == expected.ToString());
  REQUIRE(actual.num_nodes() == expected.num_nodes());
  for (int i = 0; i < expected.num_nodes(); ++i) {
    INFO("node " << expected.nodes()[i].name);
    // ToString rounds floats; the attributes themselves must be exact.
    CHECK(actual.nodes()[i].attrs == expected.nodes()[i].attrs);
  }
  CHECK(NamedGradients(actual) == NamedGradients(expected));
}

std::map<std::string, Tensor> MlpFeeds() {
  Rng rng(7);
  Tensor x = Tensor::Zeros(Shape({4, 3}), DType::kF32), t = Tensor::Zeros(Shape({4, 2}), DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
  return {{"x", x}, {"target_weight", t}};
}

// Two training steps from the same seed: every output of both steps, then
// the state after them.
std::map<std::string, std::vector<double>> Train(const Graph& graph) {
  auto exec = Executor::Create(graph);
  INFO(exec.status().ToString());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(/*seed=*/42).ok());
  std::map<std::string, std::vector<double>> results;
  for (int step = 0; step < 2; ++step) {
    auto out = (*exec)->Run(MlpFeeds());
    INFO(out.status().ToString());
    REQUIRE(out.ok());
    for (const auto& [name, t] : *out) results["step" + std::to_string(step) + "/" + name] = t.ToDoubleVector();
  }
  for (const auto& [name, t] : (*exec)->state()) results["state/" + name] = t.ToDoubleVector();
  return results;
}

TEST_CASE("an MLP training graph round-trips through text and binary files") {
  Mlp m = BuildMlp();
  fs::path dir = TempDir("round_trip");
  auto expected = Train(m.graph);
  REQUIRE(expected.size() == 2 * 5 + 4);  // 5 outputs per step, 4 state tensors

  for (const char* file : {"mlp.pbtxt", "mlp.pb"}) {
    DYNAMIC_SECTION(file) {
      fs::path path = dir / file;
      Status saved = SaveGraph(m.graph, path.string());
      INFO(saved.ToString());
      REQUIRE(saved.ok());
      auto loaded = LoadGraph(path.string());
      INFO(loaded.status().ToString());
      REQUIRE(loaded.ok());
      CheckSameGraph(m.graph, *loaded);
      CHECK(Train(*loaded) == expected);
      // Nothing but the file itself is left in the directory.
      int entries = 0;
      for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename() == file ? 0 : 1;
      CHECK(entries == 0);
    }
  }
}

TEST_CASE("the text form is readable and saving is deterministic") {
  Mlp m = BuildMlp();
  auto text = GraphToText(m.graph);
  REQUIRE(text.ok());
  CHECK_THAT(*text, Contains("name: \"mlp/fc1\""));
  CHECK_THAT(*text, Contains("op: \"Linear\""));
  CHECK_THAT(*text, Contains("inputs {\n    name: \"mlp/fc1/w\"\n  }"));
  CHECK_THAT(*text, Contains("key: \"init\"\n    value {\n      s: \"normal\""));

  fs::path dir = TempDir("deterministic");
  REQUIRE(SaveGraph(m.graph, (dir / "a.pb").string()).ok());
  REQUIRE(SaveGraph(BuildMlp().graph, (dir / "b.pb").string()).ok());
  CHECK(ReadBytes(dir / "a.pb") == ReadBytes(dir / "b.pb"));
  // Saving again replaces the file whole.
  REQUIRE(SaveGraph(m.graph, (dir / "a.pb").string()).ok());
  CHECK(ReadBytes(dir / "a.pb") == ReadBytes(dir / "b.pb"));
}

// x [4, 3] + an embedding of ids [4] -> Linear -> ReLU -> Linear -> sum,
// fused as 3 replicas, with the gradients of the sum of the replicas'
// losses. The embedding of the shared ids is one lookup in the tables side
// by side: [4, 3*3], replica layout R*3@1.
Graph FusedMlpWithGradients() {
  Graph model;
  GraphBuilder b(&model);
  const DType dt = DType::kF32;
  ValueId x = b.Input("x", {Shape({4, 3}), dt});
  ValueId ids = b.Input("ids", {Shape({4}), DType::kI64});
  ValueId table = b.Parameter("embed/w", {Shape({6, 3}), dt}, AttrMap{{"init", "normal"}, {"std", 0.3}});
  ValueId w1 = b.Parameter("fc1/w", {Shape({5, 3}), dt}, AttrMap{{"init", "normal"}, {"std", 0.3}});
  ValueId w2 = b.Parameter("fc2/w", {Shape({2, 5}), dt}, AttrMap{{"init", "normal"}, {"std", 0.3}});
  ValueId e = b.Add1("Embedding", {ids, table}, {}, "embed").value();
  ValueId in = b.Add1("Add", {x, e}, {}, "in").value();
  ValueId h = b.Add1("ReLU", {b.Add1("Linear", {in, w1}, {}, "fc1").value()}, {}, "relu").value();
  ValueId y = b.Add1("Linear", {h, w2}, {}, "fc2").value();
  model.outputs()["y"] = y;
  model.outputs()["loss"] = b.Add1("ReduceSum", {y}, {}, "loss").value();
  auto fused = FuseReplicas(model, FusionOptions{3, {1, 2, 3}, {}, {}});
  REQUIRE(fused.ok());
  GraphBuilder fb(&*fused);
  auto grads = BuildGradients(&*fused, fb.Add1("ReduceSum", {fused->outputs().at("loss")}, {}, "total").value());
  REQUIRE(grads.ok());
  return *fused;
}

TEST_CASE("a fused graph keeps its replica count and value layouts through files") {
  const Graph g = FusedMlpWithGradients();
  auto text = GraphToText(g);
  REQUIRE(text.ok());
  CHECK_THAT(*text, Contains("replicas: 3"));
  CHECK_THAT(*text, Contains("replica_layout {\n      dim: 1\n      per_replica: 3\n    }"));  // embed [4, 3*3]
  CHECK_THAT(*text, Contains("replica_layout {\n      dim: -1\n    }"));  // x, shared
  fs::path dir = TempDir("fused");
  for (const char* file : {"fused.pbtxt", "fused.pb"}) {
    DYNAMIC_SECTION(file) {
      const fs::path path = dir / file;
      REQUIRE(SaveGraph(g, path.string()).ok());
      auto loaded = LoadGraph(path.string());
      INFO(loaded.status().ToString());
      REQUIRE(loaded.ok());
      CheckSameGraph(g, *loaded);  // ToString lists the layouts and the replica count
      CHECK(loaded->replicas() == 3);
    }
  }
}

TEST_CASE("a loaded replica layout that does not fit its value is rejected") {
  auto p = GraphToProto(FusedMlpWithGradients());
  REQUIRE(p.ok());
  for (proto::NodeProto& n : *p->mutable_nodes())
    if (n.name() == "fc1") n.mutable_outputs(0)->mutable_replica_layout()->set_dim(7);
  auto loaded = GraphFromProto(*p);
  REQUIRE(!loaded.ok());
  CHECK_THAT(loaded.status().ToString(),
             Contains("node 'fc1' (Linear): output 0 'fc1' ([3, 4, 5] f32): its replica dim 7 is outside its shape"));
}

// An op taking one attribute of every kind (the ops of the build have no
// such mix); its output is a scalar f64.
class AttrKindsOp : public OpDef {
 public:
  AttrKindsOp() {
    DeclareAttrs()
        .Required("shape", AttrType::kInts, "an int list")
        .Required("dtype", AttrType::kString, "a string")
        .Required("value", AttrType::kFloat, "a float")
        .Required("an_int", AttrType::kInt, "an int")
        .Required("a_flag", AttrType::kBool, "a bool")
        .Required("empty_string", AttrType::kString, "a string")
        .Required("floats", AttrType::kFloats, "a float list");
  }
  std::string name() const override { return "TestAttrKinds"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>&) const override {
    return std::vector<TensorType>{{Shape({}), DType::kF64}};
  }
};
LOOM_REGISTER_OP(AttrKindsOp);

TEST_CASE("attribute kinds and exact values survive the round trip") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({}), DType::kF64});  // a scalar: empty shape list
  AttrMap attrs{{"shape", std::vector<int64_t>{}},
                {"dtype", "f64"},
                {"value", 0.1 + 0.2},
                {"an_int", int64_t{-3}},
                {"a_flag", false},
                {"empty_string", std::string()},
                {"floats", std::vector<double>{1e-300, -2.5, 1.0 / 3.0}}};
  NodeId id = g.AddNode("fill", "TestAttrKinds", attrs, {}, {TensorType{Shape({}), DType::kF64}});
  ValueId sum = b.Add1("Add", {x, g.node(id).outputs[0]}, {}, "sum").value();
  g.outputs()["sum"] = sum;
  for (bool binary : {false, true}) {
    INFO((binary ? "binary" : "text"));
    auto p = GraphToProto(g);
    REQUIRE(p.ok());
    proto::GraphProto copy;
    if (binary) {
      REQUIRE(copy.ParseFromString(p->SerializeAsString()));
    } else {
      auto text = GraphToText(g);
      REQUIRE(text.ok());
      auto back = GraphFromText(*text);
      REQUIRE(back.ok());
      REQUIRE(GraphToProto(*back).ok());
      copy = *GraphToProto(*back);
    }
    auto loaded = GraphFromProto(copy);
    INFO(loaded.status().ToString());
    REQUIRE(loaded.ok());
    CHECK(loaded->node(*loaded->FindNode("fill")).attrs == attrs);
    CHECK(loaded->ToString() == g.ToString());
  }
}

TEST_CASE("values with clashing or custom names are referred to by id") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({2}), DType::kF32});
  ValueId a = b.Add1("Neg", {x}, {}, "a").value();
  ValueId c = b.Add1("Neg", {a}, {}, "c").value();
  g.mutable_value(c).name = "a";  // two values now answer to "a"
  ValueId d = b.Add1("Add", {a, c}, {}, "d").value();
  g.mutable_value(d).name = "result";
  g.outputs()["out"] = d;

  auto p = GraphToProto(g);
  REQUIRE(p.ok());
  const proto::NodeProto& dp = p->nodes(3);
  REQUIRE(dp.inputs_size() == 2);
  CHECK(dp.inputs(0).ref_case() == proto::ValueRef::kId);
  CHECK(dp.outputs(0).name() == "result");
  CHECK(p->outputs().at("out").name() == "result");

  auto loaded = GraphFromProto(*p);
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(loaded->ToString() == g.ToString());
  const Node& ld = loaded->node(*loaded->FindNode("d"));
  CHECK(ld.inputs[0] == loaded->node(*loaded->FindNode("a")).outputs[0]);
  CHECK(ld.inputs[1] == loaded->node(*loaded->FindNode("c")).outputs[0]);

  // A hand-written reference to the ambiguous name is refused.
  proto::GraphProto bad = *p;
  bad.mutable_nodes(3)->mutable_inputs(0)->set_name("a");
  auto refused = GraphFromProto(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().ToString(),
             Contains("node 'd' (Add): input 0: value name 'a' is ambiguous (several values have it); "
                      "refer to it by id"));
}

TEST_CASE("hand-written text may leave out output types") {
  auto g = GraphFromText(R"pb(
    nodes { name: "x" op: "Input"
            attrs { key: "shape" value { ints { values: [2, 3] } } }
            attrs { key: "dtype" value { s: "f64" } } }
    nodes { name: "w" op: "Parameter"
            attrs { key: "shape" value { ints { values: [4, 3] } } }
            attrs { key: "dtype" value { s: "f64" } } }
    nodes { name: "y" op: "Linear" inputs { name: "x" } inputs { name: "w" } }
    outputs { key: "y" value { name: "y" } }
  )pb");
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  CHECK(g->type(g->outputs().at("y")) == TensorType{Shape({2, 4}), DType::kF64});
}

TEST_CASE("a loaded node gets its attribute defaults; an undeclared one is an error naming it") {
  const std::string input = R"pb(
    nodes { name: "x" op: "Input"
            attrs { key: "shape" value { ints { values: [2, 3] } } } }
    nodes { name: "y" op: "Softmax" inputs { name: "x" } )pb";
  auto g = GraphFromText(input + "}");
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  CHECK(g->node(*g->FindNode("y")).attrs == AttrMap{{"axis", int64_t{-1}}});
  CHECK(g->node(*g->FindNode("x")).attrs.Str("dtype") == "f32");

  auto bad = GraphFromText(input + R"pb(attrs { key: "axiss" value { i: 0 } } })pb");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("node 'y' (Softmax): unknown attribute 'axiss'") &&
                                         Catch::Contains("axis: int = -1"));
}

// ---- bad input ----

// A valid two-node graph to break in one place.
proto::GraphProto SmallProto() {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape({2, 3}), DType::kF32});
  ValueId y = b.Add1("Neg", {x}, {}, "y").value();
  g.outputs()["y"] = y;
  auto p = GraphToProto(g);
  REQUIRE(p.ok());
  return *p;
}

std::string FromProtoError(const proto::GraphProto& p) {
  auto g = GraphFromProto(p);
  REQUIRE_FALSE(g.ok());
  return g.status().ToString();
}

TEST_CASE("GraphFromProto names the node for each kind of bad input") {
  proto::GraphProto p = SmallProto();
  REQUIRE(GraphFromProto(p).ok());
  SECTION("unknown op") {
    p.mutable_nodes(1)->set_op("Negate");
    CHECK_THAT(FromProtoError(p), Contains("node 'y' (Negate)"));
  }
  SECTION("unknown input value") {
    p.mutable_nodes(1)->mutable_inputs(0)->set_name("z");
    CHECK_THAT(FromProtoError(p),
               Contains("node 'y' (Neg): input 0: unknown value 'z' (no earlier node produces a value of that name)"));
  }
  SECTION("unknown input id") {
    p.mutable_nodes(1)->mutable_inputs(0)->set_id(17);
    CHECK_THAT(FromProtoError(p), Contains("node 'y' (Neg): input 0: unknown value id 17"));
  }
  SECTION("an input produced later") {
    std::swap(*p.mutable_nodes(0), *p.mutable_nodes(1));
    CHECK_THAT(FromProtoError(p), Contains("node 'y' (Neg): input 0: unknown value 'x'"));
  }
  SECTION("attribute of the wrong kind") {
    (*p.mutable_nodes(0)->mutable_attrs())["shape"].set_s("2x3");
    CHECK_THAT(FromProtoError(p),
               Contains("node 'x' (Input): attribute 'shape' must be a int list (ints), got a string (s) \"2x3\""));
  }
  SECTION("attribute without a value") {
    (*p.mutable_nodes(1)->mutable_attrs())["value"];
    CHECK_THAT(FromProtoError(p), Contains("node 'y' (Neg): attribute 'value' has no value"));
  }
  SECTION("stored type that type inference disagrees with") {
    p.mutable_nodes(1)->mutable_outputs(0)->mutable_type()->set_shape(0, 7);
    CHECK_THAT(FromProtoError(p),
               Contains("node 'y' (Neg): stored output types ([7, 3] f32) differ from the inferred ([2, 3] f32)"));
  }
  SECTION("unknown dtype") {
    p.mutable_nodes(1)->mutable_outputs(0)->mutable_type()->set_dtype("float17");
    std::string msg = FromProtoError(p);
    CHECK_THAT(msg, Contains("node 'y' (Neg): output 0"));
    CHECK_THAT(msg, Contains("float17"));
  }
  SECTION("duplicate node name") {
    p.mutable_nodes(1)->set_name("x");
    CHECK_THAT(FromProtoError(p), Contains("node 'x' (Neg): a node of that name already exists"));
  }
  SECTION("graph output to nowhere") {
    (*p.mutable_outputs())["loss"].set_name("nope");
    CHECK_THAT(FromProtoError(p), Contains("graph output 'loss': unknown value 'nope'"));
  }
  SECTION("state update of an input") {
    proto::StateUpdateProto* u = p.add_state_updates();
    u->mutable_state()->set_name("x");
    u->mutable_new_value()->set_name("y");
    CHECK_THAT(FromProtoError(p),
               Contains("state update 0 of 'x': the state must be the output of a Parameter or Buffer node"));
  }
  SECTION("node count that does not match") {
    p.set_num_nodes(3);
    CHECK_THAT(FromProtoError(p), Contains("the graph records 3 nodes but holds 2"));
  }
  SECTION("newer format") {
    p.set_format_version(2);
    CHECK_THAT(FromProtoError(p), Contains("graph format version 2 is newer than this reader (1)"));
  }
}

TEST_CASE("a malformed text file is reported with file, line and column") {
  fs::path dir = TempDir("malformed");
  fs::path path = dir / "broken.pbtxt";
  WriteBytes(path,
             "nodes {\n"
             "  name: \"x\"\n"
             "  op: Input\n"  // an unquoted string
             "}\n");
  auto g = LoadGraph(path.string());
  REQUIRE_FALSE(g.ok());
  std::string msg = g.status().ToString();
  CHECK_THAT(msg, Contains(path.string() + ":3:7: "));
  CHECK_THAT(msg, Contains("Expected string"));

  WriteBytes(path, "nodes { name: \"x\" colour: \"red\" }\n");
  auto unknown_field = LoadGraph(path.string());
  REQUIRE_FALSE(unknown_field.ok());
  // protobuf points just after the unknown field's name.
  CHECK_THAT(unknown_field.status().ToString(), Contains(path.string() + ":1:25: "));
  CHECK_THAT(unknown_field.status().ToString(), Contains("colour"));
}

TEST_CASE("a well-formed text file with a bad graph names the file and the node") {
  fs::path dir = TempDir("bad_graph");
  fs::path path = dir / "g.pbtxt";
  WriteBytes(path, "nodes { name: \"x\" op: \"Conv9d\" }\n");
  auto g = LoadGraph(path.string());
  REQUIRE_FALSE(g.ok());
  CHECK_THAT(g.status().ToString(), Contains("graph file '" + path.string() + "': node 'x' (Conv9d)"));
}

TEST_CASE("a corrupt or truncated binary file is reported, never half-loaded") {
  Mlp m = BuildMlp();
  fs::path dir = TempDir("corrupt");
  fs::path good = dir / "good.pb";
  REQUIRE(SaveGraph(m.graph, good.string()).ok());
  const std::string bytes = ReadBytes(good);
  REQUIRE(bytes.size() > 100);

  SECTION("garbage") {
    fs::path path = dir / "garbage.pb";
    WriteBytes(path, std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01 not a graph", 22));
    auto g = LoadGraph(path.string());
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(g.status().ToString(),
               Contains("graph file '" + path.string() + "' (22 bytes) is not a valid binary GraphProto"));
  }
  SECTION("cut anywhere") {
    // Every cut either fails to parse or lacks the closing node count.
    fs::path path = dir / "cut.pb";
    for (size_t keep : {bytes.size() / 3, bytes.size() / 2, bytes.size() - 1, bytes.size() - 3}) {
      INFO("kept " << keep << " of " << bytes.size() << " bytes");
      WriteBytes(path, bytes.substr(0, keep));
      auto g = LoadGraph(path.string());
      REQUIRE_FALSE(g.ok());
      CHECK(g.status().code() == StatusCode::kDataLoss);
      CHECK_THAT(g.status().ToString(), Contains("graph file '" + path.string() + "'"));
    }
  }
  SECTION("cut exactly at a node boundary") {
    // Parses cleanly as a shorter graph: only the node count catches it.
    proto::GraphProto whole;
    REQUIRE(whole.ParseFromString(bytes));
    proto::GraphProto head;
    head.set_format_version(whole.format_version());
    for (int i = 0; i < 3; ++i) *head.add_nodes() = whole.nodes(i);
    fs::path path = dir / "short.pb";
    WriteBytes(path, head.SerializeAsString());
    auto g = LoadGraph(path.string());
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.status().ToString(), Contains("is truncated: its closing node count is missing (3 nodes read)"));
  }
  SECTION("a text file without the .pbtxt name") {
    fs::path path = dir / "text.pb";
    WriteBytes(path, *GraphToText(m.graph));
    auto g = LoadGraph(path.string());
    REQUIRE_FALSE(g.ok());
    CHECK_THAT(g.status().ToString(), Contains("graph file '" + path.string() + "'"));
  }
}

TEST_CASE("file errors name the file, and a failed save leaves nothing behind") {
  fs::path dir = TempDir("files");
  auto missing = LoadGraph((dir / "absent.pb").string());
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().ToString(), Contains("cannot open graph file '" + (dir / "absent.pb").string() + "'"));

  auto directory = LoadGraph(dir.string());
  REQUIRE_FALSE(directory.ok());
  CHECK_THAT(directory.status().ToString(), Contains("cannot read graph file '" + dir.string() + "': Is a directory"));

  WriteBytes(dir / "empty.pb", "");
  auto empty = LoadGraph((dir / "empty.pb").string());
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().ToString() == "DATA_LOSS: graph file '" + (dir / "empty.pb").string() + "' is empty");
  fs::remove(dir / "empty.pb");

  Mlp m = BuildMlp();
  fs::path nowhere = dir / "no_such_dir" / "g.pbtxt";
  Status s = SaveGraph(m.graph, nowhere.string());
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.ToString(), Contains("saving the graph: cannot create a temporary file for '" + nowhere.string() + "'"));
  CHECK(fs::is_empty(dir));

  // An invalid graph is refused before anything is written.
  m.graph.outputs()["ghost"] = 12345;
  Status invalid = SaveGraph(m.graph, (dir / "g.pb").string());
  REQUIRE_FALSE(invalid.ok());
  CHECK_THAT(invalid.ToString(), Contains("saving graph file '" + (dir / "g.pb").string() +
                                          "': cannot serialize an invalid graph: graph output 'ghost'"));
  CHECK(fs::is_empty(dir));
}

}  // namespace
}  // namespace loom
