#include "runtime/executor.h"

#include <catch2/catch.hpp>

#include "graph/builder.h"
#include "graph/model.h"

namespace loom {
namespace {

// x -> Neg -> Neg -> ... (n times): only two intermediates are ever live.
Graph Chain(int n, int64_t size) {
  Graph g;
  GraphBuilder b(&g);
  ValueId v = b.Input("x", {Shape{size}, DType::kF32});
  for (int i = 0; i < n; ++i) v = b.Add1("Neg", {v}, {}, "neg").value();
  g.outputs()["y"] = v;
  return g;
}

TEST_CASE("the memory plan reuses buffers whose lifetimes do not overlap") {
  Graph g = Chain(10, 1000);
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  const MemoryPlan& plan = (*exec)->memory_plan();
  CHECK(plan.unplanned_bytes == 10 * 4032);
  CHECK(plan.arena_bytes == 2 * 4032);  // 4000 bytes rounded up to 64, two live at a time
  auto out = (*exec)->Run({{"x", Tensor::FromVector<float>({1000}, std::vector<float>(1000, 1.5f))}});
  REQUIRE(out.ok());
  CHECK(out->at("y").data<float>()[999] == 1.5f);  // ten negations
}

TEST_CASE("values that are live at the same time never share bytes") {
  // A small MLP training step has many values with interleaved lifetimes.
  Model m;
  Sym x = m.input("x", {8, 12});
  Sym h = m.relu(m.linear(x, 16));
  Sym y = m.linear(m.concat({h, m.tanh(h)}, 1), 3);
  m.set_output("loss", m.mse(y, m.input("t", {8, 3})));
  REQUIRE(m.status().ok());
  Graph g = m.graph();
  MemoryPlan plan = PlanMemory(g, {g.outputs().at("loss")});
  REQUIRE(plan.slots.size() > 5);
  for (const auto& [a, sa] : plan.slots)
    for (const auto& [b, sb] : plan.slots) {
      if (a >= b) continue;
      bool live_together = sa.first <= sb.last && sb.first <= sa.last;
      bool share_bytes = sa.offset < sb.offset + sb.bytes && sb.offset < sa.offset + sa.bytes;
      INFO("values " << a << " and " << b);
      CHECK_FALSE((live_together && share_bytes));
    }
}

TEST_CASE("the executor's allocations are what it reports") {
  Graph g = Chain(6, 4096);
  Allocator* cpu = GetAllocator(Device::Cpu()).value();
  int64_t before = cpu->stats().current_bytes;
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  CHECK(cpu->stats().current_bytes - before == static_cast<int64_t>((*exec)->PeakStepBytes()));
}

TEST_CASE("bad feeds are rejected with the input's name and shapes") {
  Graph g = Chain(2, 4);
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  auto missing = (*exec)->Run({});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message() == "input 'x' was not fed");
  auto shape = (*exec)->Run({{"x", Tensor::Zeros({5})}});
  REQUIRE_FALSE(shape.ok());
  CHECK(shape.status().message() == "input 'x' expects [4] f32, got [5] f32");
  auto extra = (*exec)->Run({{"x", Tensor::Zeros({4})}, {"z", Tensor::Zeros({4})}});
  REQUIRE_FALSE(extra.ok());
  CHECK(extra.status().message() == "feed 'z' is not an input of the graph");
}

TEST_CASE("a kernel's error names the node") {
  Model m;
  Sym idx = m.input("idx", {3}, DType::kI64);
  m.set_output("e", m.embedding(idx, 4, 2, -1, "emb"));
  REQUIRE(m.status().ok());
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  auto r = (*exec)->Run({{"idx", Tensor::FromVector<int64_t>({3}, {0, 9, 1})}});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("node 'emb' (Embedding)") == 0);
  CHECK(r.status().message().find("9") != std::string::npos);
}

TEST_CASE("a mistyped attribute in a graph built without type inference fails the step, naming the node") {
  Graph g;
  NodeId x = g.AddNode("x", kInputOp, AttrMap{{"shape", std::vector<int64_t>{2}}}, {}, {{Shape{2}, DType::kF32}});
  NodeId y = g.AddNode("scale", "MulScalar", AttrMap{{"value", std::string("two")}}, {g.node(x).outputs[0]},
                       {{Shape{2}, DType::kF32}});
  g.outputs()["y"] = g.node(y).outputs[0];
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  auto r = (*exec)->Run({{"x", Tensor::Zeros({2})}});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "node 'scale' (MulScalar): attribute 'value' is \"two\", of the wrong type");
}

TEST_CASE("state initialisation is seeded and independent of graph order") {
  auto build = [](bool extra_first) {
    Model m;
    Sym x = m.input("x", {2, 3});
    if (extra_first) m.linear(x, 7, {}, "other");
    m.set_output("y", m.linear(x, 4, {}, "fc"));
    return m.graph();
  };
  auto a = Executor::Create(build(false)).value();
  auto b = Executor::Create(build(true)).value();
  REQUIRE(a->InitializeState(5).ok());
  REQUIRE(b->InitializeState(5).ok());
  CHECK(a->GetState("fc/weight")->ToDoubleVector() == b->GetState("fc/weight")->ToDoubleVector());
  REQUIRE(b->InitializeState(6).ok());
  CHECK(a->GetState("fc/weight")->ToDoubleVector() != b->GetState("fc/weight")->ToDoubleVector());
  CHECK_FALSE(a->GetState("fc/weights").ok());
}

}  // namespace
}  // namespace loom
