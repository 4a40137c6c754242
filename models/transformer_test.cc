// transformer_lm and bert_medium: the parameter counts of their PyTorch
// references (built, not run), the logits' shape through the executor, the
// language model's causal masking, and one SGD step lowering each one's loss.
#include "models/transformer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "core/rng.h"
#include "graph/training.h"
#include "models/model_test_util.h"
#include "models/zoo.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::ParameterCount;
using testing::LossAcrossOneStep;
using testing::ParameterNames;
using testing::RandomTokens;

Shape StateShape(const Graph& g, const std::string& name) {
  auto id = g.FindNode(name);
  REQUIRE(id.has_value());
  return g.type(g.node(*id).outputs[0]).shape;
}

TEST_CASE("transformer_lm has the parameter count of PyTorch's TransformerModel") {
  Model m;
  auto logits = TransformerLm(m, m.input("input", {2, 32}, DType::kI64), {});
  if (!logits.ok()) FAIL(logits.status().ToString());
  CHECK(m.shape(*logits) == Shape({2, 32, 10000}));
  // bench/reference_models.py transformer_lm: nn.Embedding(10000, 128),
  // nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 2, 128, 0.2), 2),
  // nn.Linear(128, 10000): sum(p.numel() for p in model.parameters()).
  CHECK(ParameterCount(m.graph()) == 2769168);
  const auto names = ParameterNames(m.graph());
  // Per layer: q/k/v/out projections (in_proj split in three), linear1,
  // linear2, norm1, norm2, each weight and bias; plus encoder and decoder.
  CHECK(names.size() == 2 * 16 + 3);
  for (const char* n : {"encoder/weight", "transformer_encoder/layers/0/self_attn/q_proj/weight",
                        "transformer_encoder/layers/0/self_attn/out_proj/bias", "transformer_encoder/layers/1/linear1/weight",
                        "transformer_encoder/layers/1/norm2/bias", "decoder/weight", "decoder/bias"})
    CHECK(names.count(n) == 1);
  // The position table is a Buffer, not trained and not counted.
  CHECK(names.count("pos_encoder/pe") == 0);
  CHECK(StateShape(m.graph(), "pos_encoder/pe") == Shape({5000, 128}));
  CHECK(StateShape(m.graph(), "transformer_encoder/layers/0/linear1/weight") == Shape({128, 128}));
}

TEST_CASE("bert_medium has the parameter count of BertForMaskedLM, the decoder tied to the word embeddings") {
  Model m;
  auto logits = BertForMaskedLm(m, m.input("input", {2, 16}, DType::kI64), {});
  if (!logits.ok()) FAIL(logits.status().ToString());
  CHECK(m.shape(*logits) == Shape({2, 16, 30522}));
  // bench/reference_models.py bert_medium: BertForMaskedLM's modules at
  // hidden 512, 8 layers, 8 heads, intermediate 2048, 512 positions, vocab
  // 30522; the decoder weight is the word embedding Parameter (counted once).
  CHECK(ParameterCount(m.graph()) == 41404730);
  const auto names = ParameterNames(m.graph());
  // 5 embedding tensors, 16 per layer, 5 in the head (transform dense and
  // LayerNorm, the decoder bias): no decoder weight of its own.
  CHECK(names.size() == 5 + 8 * 16 + 5);
  for (const char* n : {"bert/embeddings/word_embeddings/weight", "bert/embeddings/position_embeddings/weight",
                        "bert/embeddings/token_type_embeddings/weight", "bert/embeddings/LayerNorm/bias",
                        "bert/encoder/layer/0/attention/self/query/weight",
                        "bert/encoder/layer/7/attention/output/LayerNorm/weight",
                        "bert/encoder/layer/3/intermediate/dense/weight", "bert/encoder/layer/3/output/dense/bias",
                        "cls/predictions/transform/dense/weight", "cls/predictions/transform/LayerNorm/bias",
                        "cls/predictions/bias"})
    CHECK(names.count(n) == 1);
  CHECK(StateShape(m.graph(), "bert/encoder/layer/3/intermediate/dense/weight") == Shape({2048, 512}));
  // The decoder (Linear) reads the word-embedding Parameter.
  auto decoder = m.graph().FindNode("cls/predictions/decoder");
  REQUIRE(decoder.has_value());
  auto table = m.graph().FindNode("bert/embeddings/word_embeddings/weight");
  REQUIRE(table.has_value());
  CHECK(m.graph().node(*decoder).inputs[1] == m.graph().node(*table).outputs[0]);
}

TEST_CASE("the zoo's transformer models give [B, T, vocab] logits through the executor") {
  const std::map<std::string, std::map<std::string, std::string>> models = {
      {"transformer_lm", {{"width", "8"}, {"heads", "2"}, {"layers", "2"}, {"feedforward", "12"}}},
      {"bert_medium", {{"hidden", "8"}, {"heads", "2"}, {"layers", "2"}, {"intermediate", "12"}, {"max_positions", "10"}}},
  };
  for (const auto& [name, args] : models) {
    for (bool training : {false, true}) {
      INFO(name << " training " << training);
      Model m;
      m.set_training(training);  // with dropout: the attention weights' dropout path
      const Status built = BuildSupervised(m, name, args, DataSpec{Shape{6}, DType::kI64, Shape{6}, 11}, 3);
      INFO(built.ToString());
      REQUIRE(built.ok());
      auto exec = Executor::Create(m.graph());
      REQUIRE(exec.ok());
      REQUIRE((*exec)->InitializeState(0).ok());
      auto out = (*exec)->Run({{"input", RandomTokens({3, 6}, 11, 1)}, {"target", RandomTokens({3, 6}, 11, 2)}});
      if (!out.ok()) FAIL(out.status().ToString());
      CHECK(out->at("logits").shape() == Shape({3, 6, 11}));
      for (double v : out->at("logits").ToDoubleVector()) CHECK(std::isfinite(v));
      CHECK(std::isfinite(out->at("loss").ScalarAt(0)));
    }
  }
}

// Logits [1, T, vocab] of a small f64 model (no dropout) for each of two
// token windows differing at position `changed` only.
std::pair<std::vector<double>, std::vector<double>> LogitsBeforeAfterChange(const std::string& name,
                                                                              const std::map<std::string, std::string>& args,
                                                                              int64_t t, int64_t vocab, int64_t changed) {
  Model m(DType::kF64);
  const Status built = BuildSupervised(m, name, args, DataSpec{Shape{t}, DType::kI64, Shape{t}, vocab}, 1);
  INFO(built.ToString());
  REQUIRE(built.ok());
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(3).ok());
  Tensor tokens = RandomTokens({1, t}, vocab, 4);
  Tensor target = Tensor::Zeros({1, t}, DType::kI64);
  auto a = (*exec)->Run({{"input", tokens}, {"target", target}});
  REQUIRE(a.ok());
  tokens.data<int64_t>()[changed] = (tokens.data<int64_t>()[changed] + 1) % vocab;
  auto b = (*exec)->Run({{"input", tokens}, {"target", target}});
  REQUIRE(b.ok());
  return {a->at("logits").ToDoubleVector(), b->at("logits").ToDoubleVector()};
}

TEST_CASE("transformer_lm is causal: changing token t+1 leaves the logits at 0..t alone") {
  const int64_t t = 7, vocab = 9, changed = 4;
  auto [before, after] = LogitsBeforeAfterChange(
      "transformer_lm", {{"width", "8"}, {"heads", "2"}, {"layers", "2"}, {"feedforward", "16"}, {"dropout", "0"}}, t,
      vocab, changed);
  for (int64_t pos = 0; pos < t; ++pos) {
    double diff = 0;
    for (int64_t c = 0; c < vocab; ++c) diff = std::max(diff, std::abs(before[pos * vocab + c] - after[pos * vocab + c]));
    INFO("position " << pos << " max change " << diff);
    if (pos < changed) CHECK(diff == 0.0);
    else CHECK(diff > 1e-6);  // the changed token and every later position see it
  }
}

TEST_CASE("bert_medium attends both ways: changing token t+1 changes the logits at t") {
  const int64_t t = 7, vocab = 9, changed = 4;
  auto [before, after] = LogitsBeforeAfterChange(
      "bert_medium",
      {{"hidden", "8"}, {"heads", "2"}, {"layers", "1"}, {"intermediate", "16"}, {"max_positions", "8"}, {"dropout", "0"}},
      t, vocab, changed);
  for (int64_t pos = 0; pos < t; ++pos) {
    double diff = 0;
    for (int64_t c = 0; c < vocab; ++c) diff = std::max(diff, std::abs(before[pos * vocab + c] - after[pos * vocab + c]));
    INFO("position " << pos << " max change " << diff);
    CHECK(diff > 1e-9);
  }
}

TEST_CASE("one SGD step lowers each transformer model's loss on a fixed batch") {
  struct Case {
    std::string name;
    std::map<std::string, std::string> args;
  };
  const std::vector<Case> cases = {
      {"transformer_lm", {{"width", "16"}, {"heads", "2"}, {"layers", "2"}, {"feedforward", "32"}, {"dropout", "0"}}},
      {"bert_medium",
       {{"hidden", "16"}, {"heads", "2"}, {"layers", "2"}, {"intermediate", "32"}, {"max_positions", "8"}, {"dropout", "0"}}},
  };
  const int64_t batch = 4, t = 8, vocab = 13;
  for (const Case& c : cases) {
    INFO(c.name);
    Model m;
    const Status built = BuildSupervised(m, c.name, c.args, DataSpec{Shape{t}, DType::kI64, Shape{t}, vocab}, batch);
    INFO(built.ToString());
    REQUIRE(built.ok());
    Tensor target = RandomTokens({batch, t}, vocab, 6);
    // The masked-LM data scores masked positions only: every other one here.
    if (c.name == "bert_medium")
      for (int64_t i = 0; i < target.numel(); i += 2) target.data<int64_t>()[i] = kIgnoreTarget;
    auto change =
        LossAcrossOneStep(m.graph(), {{"input", RandomTokens({batch, t}, vocab, 5)}, {"target", target}}, 0.05);
    if (!change.ok()) FAIL(change.status().ToString());
    INFO("loss " << change->before << " -> " << change->after);
    CHECK(std::isfinite(change->before));
    CHECK(change->after < change->before);
  }
}

TEST_CASE("the transformer models reject bad sizes and too-long windows, naming the argument") {
  auto error = [](const std::string& name, const std::map<std::string, std::string>& args, int64_t t) {
    Model m;
    return BuildSupervised(m, name, args, DataSpec{Shape{t}, DType::kI64, Shape{t}, 10}, 2).ToString();
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(error("bert_medium", {{"hidden", "8"}, {"heads", "2"}, {"max_positions", "4"}}, 5),
             Contains("sequence length 5 must be in [1, max_positions=4]"));
  CHECK_THAT(error("transformer_lm", {{"max_len", "4"}}, 6), Contains("sequence length 6 must be in [1, max_len=4]"));
  CHECK_THAT(error("transformer_lm", {{"width", "10"}, {"heads", "3"}}, 4),
             Contains("argument heads: width=10 is not divisible by heads=3"));
  CHECK_THAT(error("bert_medium", {{"layers", "0"}}, 4), Contains("argument layers: must be >= 1, got 0"));
  CHECK_THAT(error("transformer_lm", {{"dropout", "1"}}, 4), Contains("argument dropout: must be in [0, 1), got 1"));
}

}  // namespace
}  // namespace loom::models
