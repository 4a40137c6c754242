#include "graph/pass.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/dce.h"
#include "graph/serialize.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;

Graph ParseGraph(const std::string& text) {
  auto g = GraphFromText(text, "test graph");
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  return std::move(g).value();
}

// x -> Neg -> out, with a dead branch x -> Neg -> AddScalar.
const char* kDeadBranch = R"pb(
  nodes { name: "x" op: "Input"
          attrs { key: "shape" value { ints { values: [2, 3] } } }
          attrs { key: "dtype" value { s: "f32" } } }
  nodes { name: "unused" op: "Input"
          attrs { key: "shape" value { ints { values: [4] } } }
          attrs { key: "dtype" value { s: "f32" } } }
  nodes { name: "live" op: "Neg" inputs { name: "x" } }
  nodes { name: "dead1" op: "Neg" inputs { name: "x" } }
  nodes { name: "dead2" op: "AddScalar" inputs { name: "dead1" } attrs { key: "value" value { f: 1 } } }
  outputs { key: "y" value { name: "live" } }
)pb";

// A pass that records that it ran and reports a fixed result.
class CountingPass : public Pass {
 public:
  CountingPass(std::string name, bool changes, int* runs) : name_(std::move(name)), changes_(changes), runs_(runs) {}
  std::string name() const override { return name_; }
  StatusOr<bool> Run(Graph*) override {
    ++*runs_;
    return changes_;
  }

 private:
  std::string name_;
  bool changes_;
  int* runs_;
};

// Appends a Neg of the first node's first output: a visible, valid change.
class AppendNegPass : public Pass {
 public:
  std::string name() const override { return "append-neg"; }
  StatusOr<bool> Run(Graph* graph) override {
    GraphBuilder b(graph);
    LOOM_ASSIGN_OR_RETURN(ValueId v, b.Add1("Neg", {graph->nodes().front().outputs[0]}, {}, "appended"));
    graph->outputs()["appended"] = v;
    return true;
  }
};

// Corrupts a stored type, which the verifier after it must catch.
class BreakTypesPass : public Pass {
 public:
  std::string name() const override { return "break-types"; }
  StatusOr<bool> Run(Graph* graph) override {
    NodeId id = *graph->FindNode("live");
    graph->mutable_value(graph->node(id).outputs[0]).type.dtype = DType::kF64;
    return true;
  }
};

class FailingPass : public Pass {
 public:
  std::string name() const override { return "failing"; }
  StatusOr<bool> Run(Graph*) override { return InvalidArgument("cannot handle op Frob"); }
};

TEST_CASE("the pipeline runs passes in order and reports whether any changed the graph") {
  Graph g = ParseGraph(kDeadBranch);
  int a = 0, b = 0;
  SECTION("none changes") {
    PassPipeline p("opt");
    p.AddPass<CountingPass>("a", false, &a);
    p.AddPass<CountingPass>("b", false, &b);
    auto changed = p.Run(&g);
    REQUIRE(changed.ok());
    CHECK_FALSE(*changed);
  }
  SECTION("one changes") {
    PassPipeline p("opt");
    p.AddPass<CountingPass>("a", false, &a);
    p.AddPass<CountingPass>("b", true, &b);
    auto changed = p.Run(&g);
    REQUIRE(changed.ok());
    CHECK(*changed);
  }
  CHECK(a == 1);
  CHECK(b == 1);
}

TEST_CASE("disabled passes are skipped by name") {
  Graph g = ParseGraph(kDeadBranch);
  int a = 0, b = 0;
  PassPipelineOptions options;
  options.disabled_passes = {"b", "not-a-pass"};
  PassPipeline p("opt", options);
  p.AddPass<CountingPass>("a", false, &a);
  p.AddPass<CountingPass>("b", true, &b);
  p.AddPass<CountingPass>("b", true, &b);
  auto changed = p.Run(&g);
  REQUIRE(changed.ok());
  CHECK_FALSE(*changed);
  CHECK(a == 1);
  CHECK(b == 0);
  CHECK(p.PassNames() == std::vector<std::string>{"a", "b", "b"});
}

TEST_CASE("a pass that leaves an invalid graph is named by the pipeline") {
  Graph g = ParseGraph(kDeadBranch);
  int runs = 0;
  PassPipeline p("opt");
  p.AddPass<CountingPass>("harmless", false, &runs);
  p.AddPass<BreakTypesPass>();
  p.AddPass<CountingPass>("never", false, &runs);
  auto result = p.Run(&g);
  REQUIRE_FALSE(result.ok());
  std::string msg = result.status().ToString();
  CHECK_THAT(msg, Contains("pass pipeline 'opt', pass 'break-types' (2 of 3) left an invalid graph"));
  CHECK_THAT(msg,
             Contains("node 'live' (Neg): stored output types ([2, 3] f64) differ from the inferred ([2, 3] f32)"));
  CHECK(runs == 1);  // nothing runs after the failure
}

TEST_CASE("a pass error is returned with the pass named") {
  Graph g = ParseGraph(kDeadBranch);
  PassPipeline p("lowering");
  p.AddPass<FailingPass>();
  auto result = p.Run(&g);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().ToString() ==
        "INVALID_ARGUMENT: pass pipeline 'lowering', pass 'failing' (1 of 1): cannot handle op Frob");
}

TEST_CASE("the verifier runs before the first pass") {
  Graph g = ParseGraph(kDeadBranch);
  g.outputs()["ghost"] = 999;
  int runs = 0;
  PassPipeline p("opt");
  p.AddPass<CountingPass>("a", true, &runs);
  auto result = p.Run(&g);
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(result.status().ToString(),
             Contains("pass pipeline 'opt': invalid graph before the first pass: graph output 'ghost'"));
  CHECK(runs == 0);
}

TEST_CASE("the graph is dumped after each pass to a callback and a directory") {
  Graph g = ParseGraph(kDeadBranch);
  const char* tmp = std::getenv("TEST_TMPDIR");
  namespace fs = std::filesystem;
  fs::path dir = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / "pass_dumps" / "nested";
  fs::remove_all(dir);

  std::vector<std::string> seen;
  std::map<std::string, std::string> texts;
  PassPipelineOptions options;
  options.dump_dir = dir.string();
  options.disabled_passes = {"skipped"};
  options.dump_callback = [&](const PassDump& d) {
    seen.push_back(d.pipeline + "/" + std::to_string(d.index) + "/" + d.pass + (d.changed ? "/changed" : "/same"));
    texts[d.pass] = d.graph->ToString();
  };
  int runs = 0;
  PassPipeline p("opt", options);
  p.AddPass<AppendNegPass>();
  p.AddPass<CountingPass>("skipped", true, &runs);
  p.AddPass<DeadCodeElimination>();
  REQUIRE(p.Run(&g).ok());

  CHECK(seen == std::vector<std::string>{"opt/1/append-neg/changed", "opt/3/dce/changed"});
  CHECK_THAT(texts["append-neg"], Contains("appended = Neg(x)"));
  CHECK_THAT(texts["append-neg"], Contains("dead2 = AddScalar(dead1)"));
  CHECK_THAT(texts["dce"], !Contains("dead2"));
  CHECK(texts["dce"] == g.ToString());

  auto read = [](const fs::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  REQUIRE(fs::exists(dir / "opt.01.append-neg.txt"));
  REQUIRE(fs::exists(dir / "opt.03.dce.txt"));
  CHECK_FALSE(fs::exists(dir / "opt.02.skipped.txt"));
  CHECK(read(dir / "opt.01.append-neg.txt") == "# after pass 'append-neg' of pipeline 'opt'\n" + texts["append-neg"]);
  CHECK(read(dir / "opt.03.dce.txt") == "# after pass 'dce' of pipeline 'opt'\n" + texts["dce"]);
}

TEST_CASE("pipelines nest and report the inner pass") {
  Graph g = ParseGraph(kDeadBranch);
  PassPipeline outer("outer");
  PassPipeline& inner = outer.AddPass<PassPipeline>("inner");
  inner.AddPass<DeadCodeElimination>();
  inner.AddPass<BreakTypesPass>();
  auto result = outer.Run(&g);
  REQUIRE_FALSE(result.ok());
  CHECK_THAT(result.status().ToString(),
             Contains("pass pipeline 'outer', pass 'inner' (1 of 1): "
                      "pass pipeline 'inner', pass 'break-types' (2 of 2) left an invalid graph"));
}

// ---- DCE ----

TEST_CASE("dce removes a dead branch and keeps sources") {
  Graph g = ParseGraph(kDeadBranch);
  DeadCodeElimination dce;
  auto changed = dce.Run(&g);
  REQUIRE(changed.ok());
  CHECK(*changed);
  CHECK(g.ToString() ==
        "x = Input() {dtype=\"f32\", shape=[2, 3]} -> [2, 3] f32\n"
        "unused = Input() {dtype=\"f32\", shape=[4]} -> [4] f32\n"
        "live = Neg(x) -> [2, 3] f32\n"
        "output y = live\n");
  // A second run finds nothing more.
  auto again = dce.Run(&g);
  REQUIRE(again.ok());
  CHECK_FALSE(*again);
}

TEST_CASE("dce can remove unused sources too") {
  Graph g = ParseGraph(kDeadBranch);
  DceOptions options;
  options.remove_unused_sources = true;
  DeadCodeElimination dce(options);
  REQUIRE(dce.Run(&g).ok());
  CHECK(g.ToString() ==
        "x = Input() {dtype=\"f32\", shape=[2, 3]} -> [2, 3] f32\n"
        "live = Neg(x) -> [2, 3] f32\n"
        "output y = live\n");
}

TEST_CASE("dce keeps what state updates and gradients reach, even unused state") {
  Graph g = ParseGraph(R"pb(
    nodes { name: "step" op: "Buffer"
            attrs { key: "shape" value { ints { } } }
            attrs { key: "dtype" value { s: "f32" } } }
    nodes { name: "w" op: "Parameter"
            attrs { key: "shape" value { ints { values: [3] } } }
            attrs { key: "dtype" value { s: "f32" } } }
    nodes { name: "next_step" op: "AddScalar" inputs { name: "step" } attrs { key: "value" value { f: 1 } } }
    nodes { name: "g" op: "Fill"
            attrs { key: "shape" value { ints { values: [3] } } }
            attrs { key: "value" value { f: 0 } } }
    nodes { name: "dead" op: "MulScalar" inputs { name: "w" } attrs { key: "value" value { f: 2 } } }
    state_updates { state { name: "step" } new_value { name: "next_step" } }
    gradients { value { name: "w" } gradient { name: "g" } }
  )pb");
  DceOptions options;
  options.remove_unused_sources = true;
  DeadCodeElimination dce(options);
  auto changed = dce.Run(&g);
  REQUIRE(changed.ok());
  CHECK(*changed);
  CHECK_FALSE(g.FindNode("dead"));
  for (const char* kept : {"step", "w", "next_step", "g"}) {
    INFO(kept);
    CHECK(g.FindNode(kept));
  }
}

// x [4, 3] -> fc1 (Linear 5) -> square -> fc2 (Linear 2) -> loss.
struct Mlp {
  Graph graph;
  ValueId x, w1, b1, w2, loss;
};

Mlp BuildMlp() {
  Mlp m;
  GraphBuilder b(&m.graph);
  const DType dt = DType::kF32;
  m.x = b.Input("image", {Shape({4, 3}), dt});
  m.w1 = b.Parameter("fc1/w", {Shape({5, 3}), dt}, AttrMap{{"init", "normal"}, {"std", 0.1}});
  m.b1 = b.Parameter("fc1/b", {Shape({5}), dt}, AttrMap{{"init", "zeros"}});
  m.w2 = b.Parameter("fc2/w", {Shape({2, 5}), dt}, AttrMap{{"init", "normal"}, {"std", 0.1}});
  ValueId h = b.Add1("Linear", {m.x, m.w1, m.b1}, {}, "fc1").value();
  ValueId sq = b.Add1("Mul", {h, h}, {}, "square").value();
  ValueId y = b.Add1("Linear", {sq, m.w2}, {}, "fc2").value();
  m.loss = b.Add1("SumToShape", {y}, AttrMap{{"shape", std::vector<int64_t>{}}}, "loss").value();
  m.graph.outputs()["loss"] = m.loss;
  return m;
}

std::map<std::string, int> OpCounts(const Graph& g) {
  std::map<std::string, int> counts;
  for (const Node& n : g.nodes()) ++counts[n.op];
  return counts;
}

TEST_CASE("dce drops the image gradient that nobody asked for") {
  // Reference: gradients of the parameters only.
  Mlp ref = BuildMlp();
  REQUIRE(BuildGradients(&ref.graph, ref.loss, {ref.w1, ref.b1, ref.w2}).ok());
  DeadCodeElimination dce;
  auto ref_changed = dce.Run(&ref.graph);
  REQUIRE(ref_changed.ok());
  CHECK_FALSE(*ref_changed);  // autodiff emits nothing dead here

  // The same, but also differentiated w.r.t. the image, whose gradient is
  // then dropped: exactly the extra backward work must go.
  Mlp m = BuildMlp();
  auto grads = BuildGradients(&m.graph, m.loss, {m.w1, m.b1, m.w2, m.x});
  REQUIRE(grads.ok());
  ValueId dx = grads->at(m.x);
  NodeId dx_node = m.graph.value(dx).producer;
  int before = m.graph.num_nodes();
  m.graph.gradients().erase(m.x);

  auto changed = dce.Run(&m.graph);
  REQUIRE(changed.ok());
  CHECK(*changed);
  CHECK_FALSE(m.graph.has_node(dx_node));
  CHECK_FALSE(m.graph.has_value(dx));
  CHECK(m.graph.num_nodes() < before);
  CHECK(m.graph.num_nodes() == ref.graph.num_nodes());
  CHECK(OpCounts(m.graph) == OpCounts(ref.graph));
  // The image is still read by fc1 and by the weight gradient (dW = dy^T x).
  REQUIRE(m.graph.FindNode("image"));
  std::vector<NodeId> readers = m.graph.Consumers()[m.x];
  std::vector<NodeId> expected = {*m.graph.FindNode("fc1"), m.graph.value(m.graph.gradients().at(m.w1)).producer};
  std::sort(readers.begin(), readers.end());
  std::sort(expected.begin(), expected.end());
  CHECK(readers == expected);
  for (ValueId p : {m.w1, m.b1, m.w2}) CHECK(m.graph.has_value(m.graph.gradients().at(p)));
}

}  // namespace
}  // namespace loom
