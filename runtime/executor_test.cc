#include "runtime/executor.h"

#include <catch2/catch.hpp>
#include <cstring>

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

TEST_CASE("a result stays the caller's: a later step reuses its buffer only once it is let go") {
  Graph g = Chain(3, 1000);
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  auto feed = [](float v) { return std::map<std::string, Tensor>{{"x", Tensor::FromVector<float>({1000}, std::vector<float>(1000, v))}}; };
  Tensor held = (*exec)->Run(feed(1)).value().at("y");
  const void* held_bytes = held.raw_data();
  // Held: the next step's result is a new buffer, and the held one keeps its values.
  Tensor second = (*exec)->Run(feed(2)).value().at("y");
  CHECK(second.raw_data() != held_bytes);
  CHECK(held.data<float>()[999] == -1.0f);
  CHECK(second.data<float>()[999] == -2.0f);
  // A view of a result holds it too.
  const void* second_bytes = second.raw_data();
  Tensor view = second.Reshape({10, 100}).value();
  second = Tensor();
  Tensor third = (*exec)->Run(feed(3)).value().at("y");
  CHECK(third.raw_data() != second_bytes);
  CHECK(view.data<float>()[999] == -2.0f);
  // Let go of: the next step copies into the same buffer.
  const void* third_bytes = third.raw_data();
  third = Tensor();
  Tensor fourth = (*exec)->Run(feed(4)).value().at("y");
  CHECK(fourth.raw_data() == third_bytes);
  CHECK(fourth.data<float>()[999] == -4.0f);
  // A result fed back in is held by the feeds: it is not overwritten.
  std::map<std::string, Tensor> feeds = {{"x", fourth}};
  fourth = Tensor();
  Tensor fifth = (*exec)->Run(feeds).value().at("y");
  CHECK(fifth.raw_data() != feeds.at("x").raw_data());
  CHECK(feeds.at("x").data<float>()[999] == -4.0f);
  CHECK(fifth.data<float>()[999] == 4.0f);
}

TEST_CASE("RunInPlace leaves the outputs in the executor's memory, the values Run returns") {
  Graph g = Chain(3, 1000);
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  CHECK((*exec)->OutputView("y").status().code() == StatusCode::kFailedPrecondition);
  const std::map<std::string, Tensor> feeds = {{"x", Tensor::FromVector<float>({1000}, std::vector<float>(1000, 2))}};
  REQUIRE((*exec)->RunInPlace(feeds).ok());
  CHECK((*exec)->step() == 1);
  const Tensor view = (*exec)->OutputView("y").value();
  CHECK(view.data<float>()[999] == -2.0f);
  const Tensor copy = (*exec)->Run(feeds).value().at("y");
  CHECK(copy.raw_data() != view.raw_data());
  CHECK(std::memcmp(copy.raw_data(), view.raw_data(), copy.nbytes()) == 0);
  CHECK((*exec)->OutputView("z").status().code() == StatusCode::kNotFound);
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

TEST_CASE("a mistyped attribute in a graph built without type inference fails at Create, naming the node") {
  Graph g;
  NodeId x = g.AddNode("x", kInputOp, AttrMap{{"shape", std::vector<int64_t>{2}}}, {}, {{Shape{2}, DType::kF32}});
  NodeId y = g.AddNode("scale", "MulScalar", AttrMap{{"value", std::string("two")}}, {g.node(x).outputs[0]},
                       {{Shape{2}, DType::kF32}});
  g.outputs()["y"] = g.node(y).outputs[0];
  auto exec = Executor::Create(g);
  REQUIRE_FALSE(exec.ok());
  CHECK(exec.status().message().find("node 'scale' (MulScalar): attribute 'value' must be of type float, got \"two\"") ==
        0);
}

TEST_CASE("a hand-built node gets its attribute defaults before kernels read them") {
  Graph g;
  NodeId x = g.AddNode("x", kInputOp, AttrMap{{"shape", std::vector<int64_t>{2, 3}}}, {}, {{Shape{2, 3}, DType::kF32}});
  NodeId y = g.AddNode("sm", "Softmax", {}, {g.node(x).outputs[0]}, {{Shape{2, 3}, DType::kF32}});
  g.outputs()["y"] = g.node(y).outputs[0];
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  auto r = (*exec)->Run({{"x", Tensor::Zeros({2, 3})}});
  REQUIRE(r.ok());
  CHECK(r->at("y").data<float>()[0] == Approx(1.0 / 3));  // over the last axis, the default
}

TEST_CASE("a dtype the device has no kernel for fails at Create, naming the node, op, dtype and device") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape{2}, DType::kI64});
  ValueId y = b.Add1("Mul", {x, x}, {}, "sum").value();  // type inference takes any dtype
  g.outputs()["y"] = y;
  auto exec = Executor::Create(g);
  REQUIRE_FALSE(exec.ok());
  INFO(exec.status().message());
  CHECK(exec.status().message() ==
        "node 'sum' (Mul): the CPU kernel of Mul does not support dtype i64 (an input); the kernel covers f32, f64");

  // A shape op moves any dtype.
  Graph ok;
  GraphBuilder ob(&ok);
  ok.outputs()["y"] = ob.Add1("Transpose", {ob.Input("x", {Shape{2, 3}, DType::kI64})}, {}, "t").value();
  CHECK(Executor::Create(ok).ok());
  // The query itself, as the simulator will ask it.
  const Node& sum = g.node(g.value(y).producer);
  CHECK(OpRegistry::Global().SupportsNode(sum, {{Shape{2}, DType::kF32}, {Shape{2}, DType::kF32}},
                                          {{Shape{2}, DType::kF32}}, DeviceType::kCpu).ok());
  CHECK(OpRegistry::Global().SupportsOp("Add", DeviceType::kCpu));
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

TEST_CASE("a sinusoidal buffer holds PyTorch's position encoding, the same for every seed and replica") {
  // pe [7, 6] as word_language_model's PositionalEncoding(d_model=6,
  // max_len=7) builds it (torch, float64): rows 2 and 6.
  const std::vector<double> row2 = {0.909297426825682, -0.416146836547142, 0.0926985007787272,
                                    0.99569422412374,  0.00430885604674281, 0.999990716836696};
  const std::vector<double> row6 = {-0.279415498198926, 0.960170286650366, 0.274909265000599,
                                    0.961470174273144,  0.012926248143199, 0.999916452564383};
  for (int64_t replicas : {1, 2}) {
    INFO("replicas " << replicas);
    Graph g;
    GraphBuilder b(&g);
    AttrMap init = InitSinusoidalPositions();
    Shape shape = replicas == 1 ? Shape{7, 6} : Shape{replicas, 7, 6};
    if (replicas > 1) init.Set("replica_seeds", std::vector<int64_t>{3, 4});  // as graph/fusion.cc marks fused state
    g.outputs()["pe"] = b.Buffer("pe", {shape, DType::kF64}, init);
    auto exec = Executor::Create(g).value();
    REQUIRE(exec->InitializeState(11).ok());
    const std::vector<double> pe = exec->GetState("pe")->ToDoubleVector();
    REQUIRE(pe.size() == static_cast<size_t>(replicas * 42));
    for (int64_t r = 0; r < replicas; ++r) {
      const double* table = pe.data() + r * 42;
      for (int c = 0; c < 6; ++c) {
        CHECK(table[c] == (c % 2 == 0 ? 0.0 : 1.0));  // position 0: sin 0, cos 0
        CHECK(table[2 * 6 + c] == Approx(row2[c]).margin(1e-14));
        CHECK(table[6 * 6 + c] == Approx(row6[c]).margin(1e-14));
      }
    }
    REQUIRE(exec->InitializeState(12).ok());
    CHECK(exec->GetState("pe")->ToDoubleVector() == pe);
  }
  Graph g;
  GraphBuilder b(&g);
  g.outputs()["pe"] = b.Buffer("pe", {Shape{6}, DType::kF32}, InitSinusoidalPositions());
  auto exec = Executor::Create(g).value();
  const Status s = exec->InitializeState(0);
  CHECK(s.message() == "sinusoidal init of state 'pe' needs an f32 or f64 [max_len, dim] tensor, got [6] f32");
}

TEST_CASE("views share their input's bytes and keep it alive while they are used") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("x", {Shape{2, 3}, DType::kF32});
  ValueId fed_view = b.Add1("Reshape", {x}, {{"shape", std::vector<int64_t>{6}}}, "fed_view").value();
  ValueId n = b.Add1("Neg", {fed_view}, {}, "neg").value();
  ValueId v = b.Add1("Reshape", {n}, {{"shape", std::vector<int64_t>{3, 2}}}, "view").value();
  ValueId t = b.Add1("Neg", {b.Add1("Flatten", {v}, {{"start_dim", int64_t{0}}}, "flat").value()}, {}, "neg2").value();
  // The first Neg's bytes are read through the views after neg2 ran.
  ValueId y = b.Add1("Add", {t, b.Add1("Identity", {n}, {}, "id").value()}, {}, "sum").value();
  g.outputs()["y"] = y;
  g.outputs()["v"] = v;
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  CHECK((*exec)->memory_plan().aliases.size() == 4);
  CHECK((*exec)->memory_plan().slots.count(v) == 0);
  for (float base : {1.0f, 10.0f}) {  // a fed root changes every step
    auto out = (*exec)->Run({{"x", Tensor::FromVector<float>({2, 3}, {base, 2, 3, 4, 5, 6})}});
    REQUIRE(out.ok());
    CHECK(out->at("v").shape() == Shape({3, 2}));
    CHECK(out->at("v").data<float>()[0] == -base);
    CHECK(out->at("y").data<float>()[0] == 0.0f);   // -(-x) + (-x)... = x - x
    CHECK(out->at("y").data<float>()[5] == 0.0f);
  }
}

TEST_CASE("optimizer updates write the state in place when nothing reads it afterwards") {
  Graph g;
  GraphBuilder b(&g);
  const TensorType t{Shape{4}, DType::kF32};
  ValueId w = b.Parameter("w", t, {{"init", "ones"}});
  ValueId grad = b.Input("grad", t);
  ValueId lr = b.Input("lr", {Shape{}, DType::kF32});
  ValueId step = b.Input("step", {Shape{}, DType::kF32});
  ValueId buf = b.Buffer("w/momentum_buffer", t, {{"init", "zeros"}});
  auto outs = b.Add("SgdUpdate", {w, grad, buf, lr, step},
                    {{"momentum", 0.5}, {"dampening", 0.0}, {"weight_decay", 0.0}, {"nesterov", false}}, "update");
  REQUIRE(outs.ok());
  g.state_updates().push_back({w, (*outs)[0]});
  g.state_updates().push_back({buf, (*outs)[1]});
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  CHECK((*exec)->memory_plan().slots.empty());  // both results live in the state tensors
  REQUIRE((*exec)->InitializeState(0).ok());
  std::map<std::string, Tensor> feeds = {{"grad", Tensor::FromVector<float>({4}, {1, 2, 3, 4})},
                                         {"lr", Tensor::FromVector<float>({}, {0.5f})},
                                         {"step", Tensor::FromVector<float>({}, {1})}};
  REQUIRE((*exec)->Run(feeds).ok());
  feeds["step"] = Tensor::FromVector<float>({}, {2});
  REQUIRE((*exec)->Run(feeds).ok());
  // Step 1: buf = g, w = 1 - 0.5 g. Step 2: buf = 0.5 g + g, w -= 0.5 * 1.5 g.
  const Tensor w_now = (*exec)->GetState("w").value();
  const Tensor b_now = (*exec)->GetState("w/momentum_buffer").value();
  for (int i = 0; i < 4; ++i) {
    const float gi = static_cast<float>(i + 1);
    CHECK(b_now.data<float>()[i] == 1.5f * gi);
    CHECK(w_now.data<float>()[i] == 1.0f - 0.5f * gi - 0.75f * gi);
  }
}

TEST_CASE("a parameter that is also read as an output is not updated in place") {
  Graph g;
  GraphBuilder b(&g);
  const TensorType t{Shape{2}, DType::kF32};
  ValueId w = b.Parameter("w", t, {{"init", "ones"}});
  ValueId lr = b.Input("lr", {Shape{}, DType::kF32});
  ValueId step = b.Input("step", {Shape{}, DType::kF32});
  auto outs = b.Add("SgdUpdate", {w, b.Input("grad", t), lr, step},
                    {{"momentum", 0.0}, {"dampening", 0.0}, {"weight_decay", 0.0}, {"nesterov", false}}, "update");
  REQUIRE(outs.ok());
  g.state_updates().push_back({w, (*outs)[0]});
  g.outputs()["w_before"] = b.Add1("Identity", {w}, {}, "w_before").value();
  auto exec = Executor::Create(g);
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(0).ok());
  auto out = (*exec)->Run({{"grad", Tensor::FromVector<float>({2}, {1, 1})},
                           {"lr", Tensor::FromVector<float>({}, {0.25f})},
                           {"step", Tensor::FromVector<float>({}, {1})}});
  REQUIRE(out.ok());
  CHECK(out->at("w_before").data<float>()[0] == 1.0f);  // the value the step read
  CHECK((*exec)->GetState("w").value().data<float>()[0] == 0.75f);
}

// SGD updates of parameters w_k (init ones) by grad inputs, lr 0.5, step 1.
TEST_CASE("runs of like in-place updates run as one group, and only those") {
  Graph g;
  GraphBuilder b(&g);
  const TensorType t{Shape{3}, DType::kF32};
  const ValueId lr = b.Input("lr", {Shape{}, DType::kF32});
  const ValueId step = b.Input("step", {Shape{}, DType::kF32});
  std::map<std::string, Tensor> feeds = {{"lr", Tensor::FromVector<float>({}, {0.5f})},
                                         {"step", Tensor::FromVector<float>({}, {1})}};
  auto param = [&](const std::string& w) { return g.node(*g.FindNode(w)).outputs[0]; };
  auto update = [&](const std::string& w, ValueId grad, double weight_decay) {
    const ValueId p = param(w);
    auto outs = b.Add("SgdUpdate", {p, grad, lr, step}, {{"weight_decay", weight_decay}}, w + "/update");
    REQUIRE(outs.ok());
    g.state_updates().push_back({p, (*outs)[0]});
  };
  auto grad = [&](const std::string& name, float v) {
    feeds[name] = Tensor::FromVector<float>({3}, {v, 2 * v, 3 * v});
    return b.Input(name, t);
  };
  for (int k = 0; k < 8; ++k) b.Parameter("w" + std::to_string(k), t, {{"init", "ones"}});
  update("w0", grad("g0", 1), 0);
  update("w1", grad("g1", 2), 0);  // w0, w1: one group
  g.outputs()["neg"] = b.Add1("Neg", {grad("g2", 3)}, {}, "neg").value();
  update("w2", grad("g3", 4), 0);
  // w3 is also an output, so its update is not in place: alone.
  g.outputs()["w3"] = b.Add1("Identity", {param("w3")}, {}, "w3_out").value();
  update("w3", grad("g4", 5), 0);
  update("w4", grad("g5", 6), 0.2);  // other attributes than w5's
  // w5's update reads w6 as its gradient and w6's update writes it: apart.
  update("w5", param("w6"), 0.1);
  update("w6", grad("g6", 7), 0.1);
  update("w7", grad("g7", 8), 0.1);  // with w6

  std::map<std::string, std::vector<double>> state[2];
  int calls[2] = {0, 0};
  for (int grouped = 0; grouped < 2; ++grouped) {
    ExecutorOptions opts;
    opts.group_kernels = grouped == 1;
    auto exec = Executor::Create(g, opts);
    REQUIRE(exec.ok());
    calls[grouped] = (*exec)->kernel_calls_per_step();
    REQUIRE((*exec)->InitializeState(0).ok());
    REQUIRE((*exec)->Run(feeds).ok());
    for (const std::string& name : (*exec)->StateNames()) state[grouped][name] = (*exec)->GetState(name)->ToDoubleVector();
  }
  CHECK(calls[0] == 9);  // eight updates and the Neg (the Identity is a view)
  // {w0, w1}, neg, w2, w3, w4, w5, {w6, w7}
  CHECK(calls[1] == 7);
  CHECK(state[1] == state[0]);
  // w5 read w6 before w6's update: 1 - 0.5 * (1 + 0.1 * 1).
  CHECK(state[1]["w5"][0] == static_cast<double>(1.0f - 0.5f * (1.0f + 0.1f * 1.0f)));
}

}  // namespace
}  // namespace loom
