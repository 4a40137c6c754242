#include <catch2/catch.hpp>

#include <array>
#include <cmath>

#include "core/allocator.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "runtime/executor.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

double SigmoidRef(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// Naive single-layer LSTM in PyTorch's formulation (gate rows i, f, g, o of
// w_ih / w_hh / b_ih / b_hh). Inputs (x, h0, c0, w_ih, w_hh, b_ih, b_hh);
// returns {y, h_T, c_T, gates (activated), cells}.
std::vector<Tensor> LstmRef(const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
  const int64_t T = in[0].shape()[0], N = in[0].shape()[1], I = in[0].shape()[2], H = in[1].shape()[1];
  Tensor y = ZerosF64({T, N, H}), hT = ZerosF64({N, H}), cT = ZerosF64({N, H});
  Tensor gates = ZerosF64({T, N, 4 * H}), cells = ZerosF64({T, N, H});
  std::vector<double> h(in[1].data<double>(), in[1].data<double>() + N * H);
  std::vector<double> c(in[2].data<double>(), in[2].data<double>() + N * H);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> h_next(N * H), c_next(N * H);
    for (int64_t b = 0; b < N; ++b)
      for (int64_t u = 0; u < H; ++u) {
        double act[4];
        for (int k = 0; k < 4; ++k) {
          const int64_t row = k * H + u;
          double s = At(in[5], row) + At(in[6], row);
          for (int64_t i = 0; i < I; ++i) s += At(in[3], row * I + i) * At(in[0], (t * N + b) * I + i);
          for (int64_t j = 0; j < H; ++j) s += At(in[4], row * H + j) * h[b * H + j];
          act[k] = k == 2 ? std::tanh(s) : SigmoidRef(s);
          At(gates, (t * N + b) * 4 * H + row) = act[k];
        }
        c_next[b * H + u] = act[1] * c[b * H + u] + act[0] * act[2];
        h_next[b * H + u] = act[3] * std::tanh(c_next[b * H + u]);
        At(cells, (t * N + b) * H + u) = c_next[b * H + u];
        At(y, (t * N + b) * H + u) = h_next[b * H + u];
      }
    h = h_next;
    c = c_next;
  }
  for (int64_t e = 0; e < N * H; ++e) {
    At(hT, e) = h[e];
    At(cT, e) = c[e];
  }
  return {y, hT, cT, gates, cells};
}

// An LSTM case: x [T, N, I], hidden size H; the initial state is drawn from
// [-state, state] (0: a zero state, still differentiated).
OpCase Lstm(std::string name, int64_t T, int64_t N, int64_t I, int64_t H, double state,
            std::vector<int> loss_outputs = {0, 1, 2}) {
  OpCase c{std::move(name), "LSTM", {},
           {InputSpec::Uniform({T, N, I}), InputSpec::Uniform({N, H}, -state, state),
            InputSpec::Uniform({N, H}, -state, state), InputSpec::Uniform({4 * H, I}, -0.7, 0.7),
            InputSpec::Uniform({4 * H, H}, -0.7, 0.7), InputSpec::Uniform({4 * H}, -0.5, 0.5),
            InputSpec::Uniform({4 * H}, -0.5, 0.5)},
           LstmRef};
  c.loss_outputs = std::move(loss_outputs);  // outputs 3 and 4 are saved state, not differentiable
  return c;
}

// The fused op (attribute replicas = R): LstmRef on each replica's slab of
// every input, the outputs stacked replica-major.
std::vector<Tensor> FusedLstmRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const int64_t R = attrs.Int("replicas");
  std::vector<Tensor> stacked;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<Tensor> slabs;
    for (const Tensor& t : in) slabs.push_back(t.Row(r).value());
    const std::vector<Tensor> out = LstmRef(slabs, {}, {});
    if (stacked.empty())
      for (const Tensor& o : out) {
        std::vector<int64_t> dims = {R};
        for (int i = 0; i < o.shape().rank(); ++i) dims.push_back(o.shape()[i]);
        stacked.push_back(ZerosF64(Shape(dims)));
      }
    for (size_t i = 0; i < out.size(); ++i)
      std::copy(out[i].data<double>(), out[i].data<double>() + out[i].numel(),
                stacked[i].data<double>() + r * out[i].numel());
  }
  return stacked;
}

// R replicas of Lstm(...) as one fused op: every input [R, ...].
OpCase FusedLstm(std::string name, int64_t R, int64_t T, int64_t N, int64_t I, int64_t H, double state,
                 std::vector<int> loss_outputs = {0, 1, 2}) {
  OpCase c = Lstm(std::move(name), T, N, I, H, state, std::move(loss_outputs));
  c.attrs.Set("replicas", R);
  for (InputSpec& in : c.inputs) {
    std::vector<int64_t> dims = {R};
    for (int i = 0; i < in.shape.rank(); ++i) dims.push_back(in.shape[i]);
    in.shape = Shape(dims);
  }
  c.reference = FusedLstmRef;
  return c;
}

TEST_CASE("rnn ops pass the op harness") {
  std::vector<OpCase> cases = {
      Lstm("lstm zero initial state", 3, 2, 3, 4, 0.0),
      Lstm("lstm nonzero initial state", 3, 2, 3, 4, 1.0),
      Lstm("lstm single step", 1, 3, 2, 3, 1.0),
      Lstm("lstm loss on h_T only", 3, 2, 3, 4, 1.0, {1}),
      Lstm("lstm loss on c_T only", 3, 2, 3, 4, 1.0, {2}),
      Lstm("lstm loss on y only", 3, 2, 3, 4, 1.0, {0}),
      Lstm("lstm larger (threaded GEMMs)", 4, 16, 24, 32, 1.0),
      Lstm("lstm one sequence, wide hidden state", 5, 1, 7, 80, 0.5),
      FusedLstm("lstm fused, 2 replicas", 2, 3, 2, 3, 4, 1.0),
      FusedLstm("lstm fused, 3 replicas, zero state, loss on h_T only", 3, 3, 2, 3, 4, 0.0, {1}),
      FusedLstm("lstm fused, 1 replica, loss on y only", 1, 2, 3, 2, 3, 1.0, {0}),
  };
  // Many rows: the per-step passes over all replicas' rows split over the
  // pool (forward against the reference; the gradients are the unfused
  // op's bits, checked below).
  OpCase large = FusedLstm("lstm fused, 3 replicas, threaded passes", 3, 4, 48, 16, 64, 1.0);
  large.check_gradient = false;
  cases.push_back(large);
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

Tensor RandomF64(const Shape& shape, Rng& rng, double scale = 1.0) {
  Tensor t = ZerosF64(shape);
  for (int64_t i = 0; i < t.numel(); ++i) At(t, i) = rng.Uniform(-scale, scale);
  return t;
}

// Two stacked layers (layer 0's y is layer 1's x), as the model API composes
// them. Forward against the reference applied twice; gradients of a loss on
// y, h_T and c_T of the top layer and h_T of the bottom one against central
// finite differences for every element of every input.
TEST_CASE("two chained LSTM layers: forward and gradients vs finite differences") {
  const int64_t T = 3, N = 2, I = 3, H = 4;
  Graph graph;
  GraphBuilder b(&graph);
  Rng rng(11);
  std::map<std::string, Tensor> feeds;
  std::vector<std::string> param_names;
  auto input = [&](const std::string& name, const Shape& shape, double scale) {
    feeds[name] = RandomF64(shape, rng, scale);
    param_names.push_back(name);
    return b.Input(name, {shape, DType::kF64});
  };
  ValueId x = input("x", {T, N, I}, 1.0);
  std::vector<std::vector<ValueId>> layer_in(2), layer_out(2);
  ValueId layer_x = x;
  for (int l = 0; l < 2; ++l) {
    const int64_t in_f = l == 0 ? I : H;
    const std::string p = "l" + std::to_string(l) + "_";
    layer_in[l] = {layer_x,
                   input(p + "h0", {N, H}, 1.0),
                   input(p + "c0", {N, H}, 1.0),
                   input(p + "w_ih", {4 * H, in_f}, 0.7),
                   input(p + "w_hh", {4 * H, H}, 0.7),
                   input(p + "b_ih", {4 * H}, 0.5),
                   input(p + "b_hh", {4 * H}, 0.5)};
    auto outs = b.Add("LSTM", layer_in[l], {}, "lstm" + std::to_string(l));
    REQUIRE(outs.status().ToString() == "OK");
    layer_out[l] = *outs;
    layer_x = layer_out[l][0];
  }
  // loss = sum(y1 w_y) + sum(hT1 w_h1) + sum(cT1 w_c1) + sum(hT0 w_h0).
  ValueId loss = kNoValue;
  auto add_term = [&](ValueId v, const std::string& wname) {
    const TensorType& t = graph.type(v);
    feeds[wname] = RandomF64(t.shape, rng);
    ValueId w = b.Input(wname, t);
    ValueId term = b.Add1("SumToShape", {b.Add1("Mul", {v, w}, {}, "").value()},
                          AttrMap{{"shape", std::vector<int64_t>{}}}, "")
                       .value();
    loss = loss == kNoValue ? term : b.Add1("Add", {loss, term}, {}, "").value();
  };
  add_term(layer_out[1][0], "w_y1");
  add_term(layer_out[1][1], "w_h1");
  add_term(layer_out[1][2], "w_c1");
  add_term(layer_out[0][1], "w_h0");

  std::vector<ValueId> wrt;
  for (const std::string& name : param_names) wrt.push_back(*graph.node(*graph.FindNode(name)).outputs.begin());
  auto grads = BuildGradients(&graph, loss, wrt);
  REQUIRE(grads.status().ToString() == "OK");
  graph.outputs()["loss"] = loss;
  graph.outputs()["y1"] = layer_out[1][0];
  for (size_t i = 0; i < wrt.size(); ++i) graph.outputs()["d_" + param_names[i]] = grads->at(wrt[i]);
  auto exec = Executor::Create(graph);
  REQUIRE(exec.status().ToString() == "OK");
  auto run = [&]() {
    auto r = (*exec)->Run(feeds);
    REQUIRE(r.status().ToString() == "OK");
    return *r;
  };
  std::map<std::string, Tensor> got = run();

  // Forward: the reference, chained.
  auto ref_inputs = [&](int l, const Tensor& layer_x_value) {
    const std::string p = "l" + std::to_string(l) + "_";
    return std::vector<Tensor>{layer_x_value,     feeds[p + "h0"],   feeds[p + "c0"],  feeds[p + "w_ih"],
                               feeds[p + "w_hh"], feeds[p + "b_ih"], feeds[p + "b_hh"]};
  };
  std::vector<Tensor> ref0 = LstmRef(ref_inputs(0, feeds["x"]), {}, {});
  std::vector<Tensor> ref1 = LstmRef(ref_inputs(1, ref0[0]), {}, {});
  for (int64_t i = 0; i < ref1[0].numel(); ++i) CHECK(got["y1"].ScalarAt(i) == Approx(At(ref1[0], i)).margin(1e-12));

  const double eps = 1e-6;
  for (const std::string& name : param_names) {
    Tensor& v = feeds[name];
    const Tensor grad = got["d_" + name];
    for (int64_t e = 0; e < v.numel(); ++e) {
      const double orig = At(v, e);
      At(v, e) = orig + eps;
      const double up = run()["loss"].ScalarAt(0);
      At(v, e) = orig - eps;
      const double down = run()["loss"].ScalarAt(0);
      At(v, e) = orig;
      INFO("d loss / d " << name << "[" << e << "]");
      CHECK(grad.ScalarAt(e) == Approx((up - down) / (2 * eps)).margin(1e-7).epsilon(1e-5));
    }
  }
}

// An empty sequence passes the initial state through; gradients flow to it.
TEST_CASE("lstm with T = 0") {
  Graph graph;
  GraphBuilder b(&graph);
  const TensorType state{{2, 3}, DType::kF64};
  std::vector<ValueId> ins = {b.Input("x", {{0, 2, 5}, DType::kF64}), b.Input("h0", state), b.Input("c0", state),
                              b.Input("w_ih", {{12, 5}, DType::kF64}), b.Input("w_hh", {{12, 3}, DType::kF64}),
                              b.Input("b_ih", {{12}, DType::kF64}), b.Input("b_hh", {{12}, DType::kF64})};
  auto outs = b.Add("LSTM", ins, {}, "lstm");
  REQUIRE(outs.status().ToString() == "OK");
  ValueId loss = b.Add1("SumToShape", {b.Add1("Add", {(*outs)[1], (*outs)[2]}, {}, "").value()},
                        AttrMap{{"shape", std::vector<int64_t>{}}}, "loss")
                     .value();
  auto grads = BuildGradients(&graph, loss, {ins[1], ins[2], ins[4]});
  REQUIRE(grads.status().ToString() == "OK");
  graph.outputs() = {{"hT", (*outs)[1]}, {"cT", (*outs)[2]}, {"dh0", grads->at(ins[1])},
                     {"dc0", grads->at(ins[2])}, {"dw_hh", grads->at(ins[4])}};
  for (Device device : TestDevices()) {
    INFO("on " << device.ToString());
    ExecutorOptions opts;
    opts.device = device;
    auto exec = Executor::Create(graph, opts);
    REQUIRE(exec.status().ToString() == "OK");
    Rng rng(3);
    const char* names[] = {"x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh"};
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < ins.size(); ++i) feeds[names[i]] = RandomF64(graph.type(ins[i]).shape, rng);
    auto got = (*exec)->Run(feeds);
    REQUIRE(got.status().ToString() == "OK");
    for (int64_t i = 0; i < 6; ++i) {
      CHECK((*got)["hT"].ScalarAt(i) == At(feeds["h0"], i));
      CHECK((*got)["cT"].ScalarAt(i) == At(feeds["c0"], i));
      CHECK((*got)["dh0"].ScalarAt(i) == 1.0);
      CHECK((*got)["dc0"].ScalarAt(i) == 1.0);
    }
    for (int64_t i = 0; i < 36; ++i) CHECK((*got)["dw_hh"].ScalarAt(i) == 0.0);
  }
}

// y, h_T, c_T and the gradients of every input for loss = sum(y w_y) +
// sum(h_T w_h) + sum(c_T w_c), of an LSTM with attributes `attrs`.
std::map<std::string, Tensor> RunLstmStep(const AttrMap& attrs, const std::vector<Tensor>& inputs,
                                          const std::vector<Tensor>& weights) {
  Graph graph;
  GraphBuilder b(&graph);
  const char* names[] = {"x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh"};
  std::map<std::string, Tensor> feeds;
  std::vector<ValueId> ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ins.push_back(b.Input(names[i], {inputs[i].shape(), inputs[i].dtype()}));
    feeds[names[i]] = inputs[i];
  }
  auto outs = b.Add("LSTM", ins, attrs, "lstm");
  REQUIRE(outs.status().ToString() == "OK");
  ValueId loss = kNoValue;
  for (int o = 0; o < 3; ++o) {
    const std::string w = "w" + std::to_string(o);
    feeds[w] = weights[static_cast<size_t>(o)];
    const ValueId term = b.Add1("ReduceSum", {b.Add1("Mul", {(*outs)[o], b.Input(w, graph.type((*outs)[o]))}, {}, "")
                                                  .value()},
                                {}, "")
                             .value();
    loss = loss == kNoValue ? term : b.Add1("Add", {loss, term}, {}, "").value();
  }
  auto grads = BuildGradients(&graph, loss, ins);
  REQUIRE(grads.status().ToString() == "OK");
  for (int o = 0; o < 3; ++o) graph.outputs()["out" + std::to_string(o)] = (*outs)[o];
  for (size_t i = 0; i < ins.size(); ++i) graph.outputs()[std::string("d_") + names[i]] = grads->at(ins[i]);
  auto exec = Executor::Create(graph);
  REQUIRE(exec.status().ToString() == "OK");
  auto r = (*exec)->Run(feeds);
  REQUIRE(r.status().ToString() == "OK");
  return *r;
}

// Horizontal fusion claims each replica computes exactly what it would
// alone: the fused op's outputs and gradients, replica by replica, are the
// unfused op's bits, in f32 and f64, with enough rows that the per-step
// passes split over the pool, and with an empty sequence. The kernel steps
// its replicas in groups whose step operands fit in 2 MiB together
// (ReplicasPerPass): hidden size 64 steps all 3 replicas at once, 160 in
// f64 two and then one, 256 one at a time.
TEST_CASE("a fused LSTM gives each replica the unfused op's bits") {
  const int64_t R = 3, I = 24;
  Rng rng(5);
  auto uniform = [&](const Shape& s, DType dtype, double scale) {
    std::vector<double> v(static_cast<size_t>(s.numel()));
    for (double& x : v) x = rng.Uniform(-scale, scale);
    return Tensor::FromVector<double>(s, v).Cast(dtype).value();
  };
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (const auto& [H, N, T] : std::vector<std::array<int64_t, 3>>{{64, 40, 5}, {64, 40, 0}, {160, 8, 4},
                                                                     {256, 8, 3}}) {
      INFO(DTypeName(dtype) << ", hidden size " << H << ", batch " << N << ", T = " << T);
      const std::vector<Shape> shapes = {{R, T, N, I}, {R, N, H},     {R, N, H}, {R, 4 * H, I},
                                         {R, 4 * H, H}, {R, 4 * H}, {R, 4 * H}};
      std::vector<Tensor> inputs;
      for (const Shape& s : shapes) inputs.push_back(uniform(s, dtype, 0.5));
      const std::vector<Tensor> weights = {uniform({R, T, N, H}, dtype, 1), uniform({R, N, H}, dtype, 1),
                                           uniform({R, N, H}, dtype, 1)};
      std::map<std::string, Tensor> fused = RunLstmStep({{"replicas", R}}, inputs, weights);
      for (int64_t r = 0; r < R; ++r) {
        std::vector<Tensor> in_r, w_r;
        for (const Tensor& t : inputs) in_r.push_back(t.Row(r).value());
        for (const Tensor& t : weights) w_r.push_back(t.Row(r).value());
        const std::map<std::string, Tensor> alone = RunLstmStep({}, in_r, w_r);
        for (const auto& [name, value] : alone)
          CheckBitwiseEqual(name + " of replica " + std::to_string(r), value, fused.at(name).Row(r).value());
      }
    }
  }
}

// Type inference rejects bad inputs with messages that name them.
TEST_CASE("lstm type inference errors") {
  const OpDef* op = OpRegistry::Global().FindOp("LSTM");
  REQUIRE(op != nullptr);
  const DType f = DType::kF32;
  std::vector<TensorType> in = {{{5, 2, 3}, f}, {{2, 4}, f},  {{2, 4}, f}, {{16, 3}, f},
                                {{16, 4}, f},   {{16}, f},    {{16}, f}};
  auto ok = op->InferTypes({}, in);
  REQUIRE(ok.ok());
  REQUIRE(ok->size() == 5);
  CHECK(ok->at(0).shape == Shape({5, 2, 4}));
  CHECK(ok->at(1).shape == Shape({2, 4}));
  CHECK(ok->at(3).shape == Shape({5, 2, 16}));
  CHECK(ok->at(4).shape == Shape({5, 2, 4}));

  auto error = [&](int index, TensorType t) {
    std::vector<TensorType> bad = in;
    bad[index] = std::move(t);
    auto r = op->InferTypes({}, bad);
    return r.ok() ? std::string("OK") : r.status().message();
  };
  CHECK_THAT(error(0, {{5, 3}, f}), Catch::Contains("x [T, N, I] must have rank 3"));
  CHECK_THAT(error(0, {{5, 2, 3}, DType::kI64}), Catch::Contains("x must be f32 or f64"));
  CHECK_THAT(error(1, {{3, 4}, f}), Catch::Contains("h0 [3, 4] must be [N, Hd] with N = 2"));
  CHECK_THAT(error(2, {{2, 5}, f}), Catch::Contains("c0 [N, Hd] must be [2, 4], got [2, 5]"));
  CHECK_THAT(error(3, {{16, 4}, f}), Catch::Contains("w_ih [4*Hd, I] must be [16, 3], got [16, 4]"));
  CHECK_THAT(error(4, {{12, 4}, f}), Catch::Contains("w_hh [4*Hd, Hd] must be [16, 4], got [12, 4]"));
  CHECK_THAT(error(5, {{16}, DType::kF64}), Catch::Contains("b_ih [4*Hd] must be f32 like x, got f64"));
  CHECK_THAT(error(6, {{4}, f}), Catch::Contains("b_hh [4*Hd] must be [16], got [4]"));
  in.pop_back();
  auto r = op->InferTypes({}, in);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("takes (x, h0, c0, w_ih, w_hh, b_ih, b_hh), got 6 inputs"));
}

// A fused LSTM: every input [R, ...], the replica count checked.
TEST_CASE("fused lstm type inference and errors") {
  const OpDef* op = OpRegistry::Global().FindOp("LSTM");
  REQUIRE(op != nullptr);
  const DType f = DType::kF32;
  const AttrMap fused{{"replicas", int64_t{4}}};
  std::vector<TensorType> in = {{{4, 5, 2, 3}, f}, {{4, 2, 4}, f}, {{4, 2, 4}, f}, {{4, 16, 3}, f},
                                {{4, 16, 4}, f},   {{4, 16}, f},   {{4, 16}, f}};
  auto ok = op->InferTypes(fused, in);
  REQUIRE(ok.status().ToString() == "OK");
  CHECK(ok->at(0).shape == Shape({4, 5, 2, 4}));
  CHECK(ok->at(1).shape == Shape({4, 2, 4}));
  CHECK(ok->at(3).shape == Shape({4, 5, 2, 16}));
  auto error = [&](const AttrMap& attrs, int index, TensorType t) {
    std::vector<TensorType> bad = in;
    bad[index] = std::move(t);
    return InferError("LSTM", attrs, bad);
  };
  CHECK_THAT(error(fused, 0, {{5, 2, 3}, f}), Catch::Contains("LSTM x [R, T, N, I] must have rank 4"));
  CHECK_THAT(error(fused, 0, {{3, 5, 2, 3}, f}), Catch::Contains("replicas = 4 needs x [4, T, N, I], got [3, 5, 2, 3]"));
  CHECK_THAT(error(fused, 2, {{3, 2, 4}, f}), Catch::Contains("c0 [R, N, Hd] must be [4, 2, 4], got [3, 2, 4]"));
  CHECK_THAT(error(fused, 3, {{16, 3}, f}), Catch::Contains("w_ih [R, 4*Hd, I] must be [4, 16, 3], got [16, 3]"));
  CHECK_THAT(error(fused, 6, {{16}, f}), Catch::Contains("b_hh [R, 4*Hd] must be [4, 16], got [16]"));
  CHECK_THAT(error({{"replicas", int64_t{-1}}}, 0, in[0]), Catch::Contains("replicas must be >= 1"));
  // The backward op checks the same.
  const OpDef* backward = OpRegistry::Global().FindOp("LSTMBackward");
  REQUIRE(backward != nullptr);
  std::vector<TensorType> bin(in.begin(), in.begin() + 5);
  for (const Shape& s : {Shape({4, 5, 2, 4}), Shape({4, 5, 2, 16}), Shape({4, 5, 2, 4}), Shape({4, 5, 2, 4}),
                         Shape({4, 2, 4}), Shape({4, 2, 4})})
    bin.push_back({s, f});
  auto grads = backward->InferTypes(fused, bin);
  REQUIRE(grads.status().ToString() == "OK");
  CHECK(grads->at(5).shape == Shape({4, 16}));
  bin[8] = {{5, 2, 4}, f};
  CHECK_THAT(InferError("LSTMBackward", fused, bin),
             Catch::Contains("dy [R, T, N, Hd] must be [4, 5, 2, 4], got [5, 2, 4]"));
  // R replicas cost R times one.
  const std::vector<TensorType> one = {{{5, 2, 3}, f}, {{2, 4}, f},  {{2, 4}, f}, {{16, 3}, f},
                                       {{16, 4}, f},   {{16}, f},    {{16}, f}};
  CHECK(op->Cost(fused, in, *ok).flops == Approx(4 * op->Cost({}, one, *op->InferTypes({}, one)).flops));
}

// FLOPs: the input and recurrent GEMMs dominate; the element-wise part is
// 4 + 5 * 4 + 4 per hidden unit and step.
TEST_CASE("lstm cost") {
  const OpDef* op = OpRegistry::Global().FindOp("LSTM");
  REQUIRE(op != nullptr);
  const DType f = DType::kF32;
  std::vector<TensorType> in = {{{5, 2, 3}, f}, {{2, 4}, f}, {{2, 4}, f}, {{16, 3}, f},
                                {{16, 4}, f},   {{16}, f},   {{16}, f}};
  auto out = op->InferTypes({}, in);
  REQUIRE(out.ok());
  const double steps_rows = 5 * 2;
  CHECK(op->Cost({}, in, *out).flops == Approx(2 * steps_rows * 16 * (3 + 4) + steps_rows * 4 * 28));
}

}  // namespace
}  // namespace loom::testing
