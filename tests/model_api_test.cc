// The model API's composite layers: parameter counts equal torch.nn's for the
// same configuration, and end-to-end gradients (through every op a layer
// emits) match finite differences in f64.
#include <catch2/catch.hpp>

#include "core/rng.h"
#include "graph/model.h"
#include "tests/op_harness.h"

namespace loom {
namespace {

int64_t ParameterCount(const Graph& g) {
  int64_t n = 0;
  for (NodeId id : g.NodesWithOp(kParameterOp)) n += g.type(g.node(id).outputs[0]).shape.numel();
  return n;
}

Tensor RandomF64(const Shape& s, uint64_t seed) {
  Rng rng(seed);
  Tensor t = Tensor::Zeros(s, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.Uniform(-1, 1);
  return t;
}

// loss = sum(y * w) for a fixed random w.
ValueId WeightedSum(Model& m, Sym y, std::map<std::string, Tensor>* feeds) {
  Sym w = m.input("loss_weight", m.shape(y));
  (*feeds)["loss_weight"] = RandomF64(m.shape(y), 99);
  return m.op("SumToShape", {m.mul(y, w)}, AttrMap{{"shape", std::vector<int64_t>{}}})[0].id;
}

TEST_CASE("multi-head attention: torch's parameter count, gradients through projections and masks") {
  Model m(DType::kF64);
  Sym q = m.input("q", {2, 3, 8});
  Sym kv = m.input("kv", {2, 4, 8});
  Sym mask = m.input("mask", {2, 4}, DType::kI64);
  Sym y = m.multi_head_attention(q, kv, /*num_heads=*/2, {/*causal=*/false, /*bias=*/true}, mask, "attn");
  REQUIRE(m.status().ToString() == "OK");
  CHECK(m.shape(y) == Shape({2, 3, 8}));
  // torch.nn.MultiheadAttention(8, 2): in_proj 3*8*8 + 3*8, out_proj 8*8 + 8.
  CHECK(ParameterCount(m.graph()) == 288);
  std::map<std::string, Tensor> feeds = {{"q", RandomF64({2, 3, 8}, 1)}, {"kv", RandomF64({2, 4, 8}, 2)},
                                         {"mask", Tensor::FromVector<int64_t>({2, 4}, {0, 0, 0, 1, 0, 1, 1, 0})}};
  ValueId loss = WeightedSum(m, y, &feeds);
  testing::CheckGraphGradients(m.graph(), loss, feeds, {"q", "kv", "attn/q_proj/weight", "attn/v_proj/bias", "attn/out_proj/weight"},
                               1e-5, 1, "multi_head_attention");
}

TEST_CASE("causal self-attention through the model API") {
  Model m(DType::kF64);
  Sym x = m.input("x", {1, 4, 6});
  Sym y = m.multi_head_attention(x, x, 3, {/*causal=*/true, /*bias=*/false}, {}, "self");
  REQUIRE(m.status().ToString() == "OK");
  CHECK(ParameterCount(m.graph()) == 4 * 6 * 6);
  std::map<std::string, Tensor> feeds = {{"x", RandomF64({1, 4, 6}, 3)}};
  ValueId loss = WeightedSum(m, y, &feeds);
  testing::CheckGraphGradients(m.graph(), loss, feeds, {"x", "self/k_proj/weight"}, 1e-5, 2, "causal attention");
}

TEST_CASE("stacked LSTM: torch's parameter count and gradients through both layers") {
  Model m(DType::kF64);
  Sym x = m.input("x", {3, 2, 4});
  Sym y = m.lstm(x, /*hidden=*/5, {/*num_layers=*/2}, "lstm");
  REQUIRE(m.status().ToString() == "OK");
  CHECK(m.shape(y) == Shape({3, 2, 5}));
  CHECK(ParameterCount(m.graph()) == 460);  // torch.nn.LSTM(4, 5, num_layers=2)
  std::map<std::string, Tensor> feeds = {{"x", RandomF64({3, 2, 4}, 4)}};
  ValueId loss = WeightedSum(m, y, &feeds);
  testing::CheckGraphGradients(m.graph(), loss, feeds, {"x", "lstm/l0/weight_ih", "lstm/l1/weight_hh", "lstm/l1/bias_ih"},
                               1e-5, 3, "lstm");
}

TEST_CASE("embedding, layer norm, conv-transpose and pooling layers: counts and gradients") {
  Model m(DType::kF64);
  Sym tokens = m.input("tokens", {2, 3}, DType::kI64);
  Sym e = m.layer_norm(m.embedding(tokens, 7, 4, -1, "emb"), {4}, 1e-5, "ln");
  Sym img = m.input("img", {1, 3, 4, 4});
  ConvTranspose2dOptions ct;
  ct.stride = {2, 2};
  ct.groups = 3;
  Sym up = m.conv_transpose2d(img, 6, {3, 3}, ct, "up");
  Sym pooled = m.flatten(m.adaptive_avg_pool2d(m.max_pool2d(up, {2, 2}), {2, 2}));
  REQUIRE(m.status().ToString() == "OK");
  CHECK(m.shape(up) == Shape({1, 6, 9, 9}));
  // Embedding(7, 4) 28 + LayerNorm(4) 8 + ConvTranspose2d(3, 6, 3, groups=3) 54 + 6.
  CHECK(ParameterCount(m.graph()) == 28 + 8 + 60);
  Sym both = m.concat({m.flatten(e, 0), m.flatten(pooled, 0)}, 0);
  std::map<std::string, Tensor> feeds = {{"tokens", Tensor::FromVector<int64_t>({2, 3}, {0, 6, 2, 2, 5, 1})},
                                         {"img", RandomF64({1, 3, 4, 4}, 5)}};
  ValueId loss = WeightedSum(m, both, &feeds);
  testing::CheckGraphGradients(m.graph(), loss, feeds, {"emb/weight", "ln/weight", "img", "up/weight", "up/bias"}, 1e-5,
                               4, "embedding + conv_transpose");
}

TEST_CASE("batch norm registers its running statistics as state updates only in training") {
  for (bool training : {true, false}) {
    Model m;
    m.set_training(training);
    Sym x = m.input("x", {4, 3, 2, 2});
    m.set_output("y", m.batch_norm(x, {}, "bn"));
    REQUIRE(m.status().ok());
    CHECK(m.graph().state_updates().size() == (training ? 2u : 0u));
    CHECK(ParameterCount(m.graph()) == 6);
  }
}

}  // namespace
}  // namespace loom
