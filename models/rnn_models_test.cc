// rnnlm, rnntc and nmt: parameter counts at the defaults against the PyTorch
// rebuilds in bench/reference_models.py (built, not run), logits shapes,
// nmt's teacher forcing (the scores at position t do not see target[t] or
// later) and its padded evaluation rows (targets of -100), one SGD step
// lowering each model's loss on a fixed batch, and 2 fused replicas
// (graph/fusion.h) computing 2 separate models' logits.
#include "models/rnn_models.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "core/rng.h"
#include "graph/fusion.h"
#include "graph/training.h"
#include "models/model_test_util.h"
#include "models/zoo.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::ParameterCount;
using testing::FusedMismatch;
using testing::LossAcrossOneStep;
using testing::Near;
using testing::ParameterNames;
using testing::ParameterShapes;
using testing::RandomTokens;
using testing::RunFusedAndSeparate;

TEST_CASE("rnnlm has word_language_model's parameter count at the defaults") {
  Model m;
  Sym logits = RnnLm(m, m.input("input", {2, 20}, DType::kI64), {});
  INFO(m.status().ToString());
  REQUIRE(m.status().ok());
  CHECK(m.shape(logits) == Shape({2, 20, 10000}));
  // /usr/bin/python3 bench/reference_models.py rnnlm (torch 1.13):
  // RNNModel('LSTM', 10000, 1024, 1024, 2), untied.
  CHECK(ParameterCount(m.graph()) == 37283600);
  CHECK(ParameterNames(m.graph()) ==
        std::set<std::string>{"encoder/weight", "rnn/l0/weight_ih", "rnn/l0/weight_hh", "rnn/l0/bias_ih",
                              "rnn/l0/bias_hh", "rnn/l1/weight_ih", "rnn/l1/weight_hh", "rnn/l1/bias_ih",
                              "rnn/l1/bias_hh", "decoder/weight", "decoder/bias"});
  CHECK(ParameterShapes(m.graph()).at("rnn/l1/weight_ih") == Shape({4 * 1024, 1024}));
}

TEST_CASE("rnntc has the reference's parameter count at the defaults") {
  Model m;
  Sym logits = RnnTc(m, m.input("input", {2, 20}, DType::kI64), {});
  INFO(m.status().ToString());
  REQUIRE(m.status().ok());
  CHECK(m.shape(logits) == Shape({2, 2}));
  // bench/reference_models.py rnntc: vocab 32000, 4 layers of 1024, 2 classes.
  CHECK(ParameterCount(m.graph()) == 66357250);
  const auto names = ParameterNames(m.graph());
  CHECK(names.size() == 1 + 4 * 4 + 2);
  for (const char* n : {"embedding/weight", "rnn/l3/bias_hh", "fc/weight", "fc/bias"}) CHECK(names.count(n) == 1);
}

TEST_CASE("nmt has the reference's parameter count at the defaults") {
  Model m;
  Sym logits = Nmt(m, m.input("input", {2, 20}, DType::kI64), m.input("target", {2, 20}, DType::kI64), {});
  INFO(m.status().ToString());
  REQUIRE(m.status().ok());
  CHECK(m.shape(logits) == Shape({2, 20, 20480}));
  // bench/reference_models.py nmt: vocab 20480, embed = hidden = 2048, 2+2
  // layers, GlobalAttention("general"), generator.
  CHECK(ParameterCount(m.graph()) == 272717824);
  CHECK(ParameterShapes(m.graph()).at("encoder/embedding/weight") == Shape({20480, 2048}));
  CHECK(ParameterShapes(m.graph()).at("decoder/embedding/weight") == Shape({20481, 2048}));  // + the start token
  CHECK(ParameterShapes(m.graph()).at("attn/linear_in/weight") == Shape({2048, 2048}));
  CHECK(ParameterShapes(m.graph()).at("attn/linear_out/weight") == Shape({2048, 4096}));
  CHECK(ParameterShapes(m.graph()).at("generator/bias") == Shape({20480}));
  const auto names = ParameterNames(m.graph());
  CHECK(names.count("attn/linear_in/bias") == 0);
  CHECK(names.count("decoder/rnn/l1/weight_hh") == 1);
}

// A small model of each kind on batch 2: builder(m, input, target) -> logits.
struct Small {
  std::string name;
  Shape input, target;
  int64_t input_vocab;  // ids of "input" are below this
  Shape logits;
  std::function<Sym(Model&, Sym, Sym)> build;
};

std::vector<Small> SmallModels() {
  RnnLmOptions lm;
  lm.vocab = 7, lm.embed = 5, lm.hidden = 6, lm.dropout = 0;
  RnnTcOptions tc;
  tc.vocab = 9, tc.num_classes = 3, tc.embed = 5, tc.hidden = 6, tc.layers = 3, tc.dropout = 0;
  NmtOptions mt;
  mt.vocab = 7, mt.embed = 5, mt.hidden = 6, mt.dropout = 0;
  return {
      {"rnnlm", {2, 6}, {2, 6}, 7, {2, 6, 7}, [lm](Model& m, Sym x, Sym) { return RnnLm(m, x, lm); }},
      {"rnntc", {2, 6}, {2}, 9, {2, 3}, [tc](Model& m, Sym x, Sym) { return RnnTc(m, x, tc); }},
      // Source and target lengths differ: the attention spans the source.
      {"nmt", {2, 5}, {2, 6}, 7, {2, 6, 7}, [mt](Model& m, Sym x, Sym y) { return Nmt(m, x, y, mt); }},
  };
}

// Sets "logits" and "loss" (mean cross-entropy over the target entries).
void BuildWithLoss(Model& m, const Small& s) {
  Sym x = m.input("input", s.input, DType::kI64);
  Sym y = m.input("target", s.target, DType::kI64);
  Sym logits = s.build(m, x, y);
  if (!logits.valid()) return;
  m.set_output("logits", logits);
  const int64_t classes = m.shape(logits).dim(-1), rows = s.target.numel();
  m.set_output("loss", m.cross_entropy(m.reshape(logits, {rows, classes}), m.reshape(y, {rows})));
}

std::map<std::string, Tensor> FixedBatch(const Small& s) {
  return {{"input", RandomTokens(s.input, s.input_vocab, 1)},
          {"target", RandomTokens(s.target, s.logits.dim(-1), 2)}};
}

TEST_CASE("the recurrent models run forward at small sizes") {
  for (const Small& s : SmallModels()) {
    INFO(s.name);
    Model m;
    BuildWithLoss(m, s);
    INFO(m.status().ToString());
    REQUIRE(m.status().ok());
    CHECK(m.shape(Sym{m.graph().outputs().at("logits")}) == s.logits);
    auto e = Executor::Create(m.graph());
    REQUIRE(e.ok());
    REQUIRE((*e)->InitializeState(0).ok());
    auto out = (*e)->Run(FixedBatch(s));
    if (!out.ok()) FAIL(out.status().ToString());
    CHECK(out->at("logits").shape() == s.logits);
    bool differ = false;  // the logits depend on the tokens, not constants
    const std::vector<double> v = out->at("logits").ToDoubleVector();
    for (double x : v) {
      CHECK(std::isfinite(x));
      differ = differ || x != v[0];
    }
    CHECK(differ);
  }
}

TEST_CASE("nmt's decoder reads the target shifted right") {
  const Small s = SmallModels()[2];
  Model m(DType::kF64);
  BuildWithLoss(m, s);
  REQUIRE(m.status().ok());
  auto e = Executor::Create(m.graph());
  REQUIRE(e.ok());
  REQUIRE((*e)->InitializeState(3).ok());
  auto feeds = FixedBatch(s);
  auto base = (*e)->Run(feeds);
  REQUIRE(base.ok());
  const std::vector<double> before = base->at("logits").ToDoubleVector();  // [2, 6, 7]
  const int64_t t_len = 6, classes = 7;
  for (int64_t t = 0; t < t_len; ++t) {
    INFO("changed target[1][" << t << "]");
    auto changed = feeds;
    changed["target"] = Tensor::Zeros(s.target, DType::kI64);  // tensors share storage when copied
    REQUIRE(changed["target"].CopyFrom(feeds["target"]).ok());
    int64_t& id = changed["target"].data<int64_t>()[t_len + t];
    id = (id + 1) % classes;
    auto out = (*e)->Run(changed);
    REQUIRE(out.ok());
    const std::vector<double> after = out->at("logits").ToDoubleVector();
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t p = 0; p < t_len; ++p) {
        double diff = 0;
        for (int64_t c = 0; c < classes; ++c) {
          const size_t i = static_cast<size_t>((b * t_len + p) * classes + c);
          diff = std::max(diff, std::abs(after[i] - before[i]));
        }
        INFO("row " << b << " position " << p << " max change " << diff);
        // Only row 1 from position t+1 on sees the change (the last target
        // entry is never read).
        if (b == 1 && p == t + 1) CHECK(diff > 1e-6);
        else if (b == 0 || p <= t) CHECK(diff == 0.0);
      }
  }
}

// A padded evaluation batch: the padding row's targets are all -100
// (kIgnoreTarget). The decoder reads them through ReLU as token 0, so the
// batch runs, the other row's logits are those of the unpadded batch, the
// padding row's are those of all-zero targets, and the loss (which ignores
// -100) only scores row 0. Fused replicas run the same batch.
TEST_CASE("nmt runs a batch whose padding row's targets are all -100") {
  const Small s = SmallModels()[2];
  Model m(DType::kF64);
  BuildWithLoss(m, s);
  REQUIRE(m.status().ok());
  auto e = Executor::Create(m.graph());
  REQUIRE(e.ok());
  REQUIRE((*e)->InitializeState(3).ok());
  const auto feeds = FixedBatch(s);
  const int64_t t_len = 6, classes = 7, row = t_len * classes;
  // feeds with row 1 of the target set to `value` (tensors share storage
  // when copied, so each gets its own).
  auto with_row1 = [&](int64_t value) {
    auto changed = feeds;
    changed["target"] = Tensor::Zeros(s.target, DType::kI64);
    REQUIRE(changed["target"].CopyFrom(feeds.at("target")).ok());
    for (int64_t t = 0; t < t_len; ++t) changed["target"].data<int64_t>()[t_len + t] = value;
    return changed;
  };
  auto base = (*e)->Run(feeds);
  REQUIRE(base.ok());
  auto padded = (*e)->Run(with_row1(kIgnoreTarget));
  if (!padded.ok()) FAIL(padded.status().ToString());
  auto zeros = (*e)->Run(with_row1(0));
  REQUIRE(zeros.ok());
  const std::vector<double> before = base->at("logits").ToDoubleVector(), after = padded->at("logits").ToDoubleVector(),
                            zero = zeros->at("logits").ToDoubleVector();
  REQUIRE(after.size() == static_cast<size_t>(2 * row));
  for (int64_t i = 0; i < row; ++i) {
    INFO("row 0 logit " << i);
    CHECK(after[i] == before[i]);
  }
  for (int64_t i = row; i < 2 * row; ++i) {
    INFO("row 1 logit " << i - row);
    CHECK(std::isfinite(after[i]));
    CHECK(after[i] == zero[i]);
  }

  // The loss scores row 0 only: the mean cross-entropy over its 6 targets.
  double want = 0;
  const int64_t* target = feeds.at("target").data<int64_t>();
  for (int64_t p = 0; p < t_len; ++p) {
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, before[p * classes + c]);
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(before[p * classes + c] - mx);
    want += mx + std::log(sum) - before[p * classes + target[p]];
  }
  want /= t_len;
  const double loss = padded->at("loss").ScalarAt(0);
  CHECK(std::abs(loss - want) <= 1e-9 * std::max(1.0, std::abs(want)));

  // 2 fused replicas on the padded batch: each replica's row 0 is its own
  // model's on the unpadded batch.
  const std::vector<uint64_t> seeds = {7, 8};
  auto run = RunFusedAndSeparate(m.graph(), seeds, with_row1(kIgnoreTarget), feeds, "logits");
  if (!run.ok()) FAIL(run.status().ToString());
  REQUIRE(run->fused.size() == static_cast<size_t>(4 * row));  // [2, 2, 6, 7]
  for (int r = 0; r < 2; ++r)
    for (int64_t i = 0; i < row; ++i) {
      INFO("replica " << r << " row 0 logit " << i);
      CHECK(Near(run->fused[r * 2 * row + i], run->separate[r][i]));
    }
}

TEST_CASE("one SGD step lowers each recurrent model's loss on a fixed batch") {
  for (const Small& s : SmallModels()) {
    INFO(s.name);
    Model m;
    BuildWithLoss(m, s);
    REQUIRE(m.status().ok());
    auto change = LossAcrossOneStep(m.graph(), FixedBatch(s), 0.1);
    if (!change.ok()) FAIL(change.status().ToString());
    INFO("loss " << change->before << " -> " << change->after);
    CHECK(std::isfinite(change->before));
    CHECK(change->after < change->before);
  }
}

TEST_CASE("the zoo's recurrent models check their arguments") {
  const DataSpec windows{Shape{6}, DType::kI64, Shape{6}, 7};
  const DataSpec classes{Shape{6}, DType::kI64, Shape{}, 3};
  struct Bad {
    std::string model, key, value, error;
  };
  for (const Bad& b : std::vector<Bad>{
           {"rnnlm", "embed", "0", "argument embed: must be >= 1, got 0"},
           {"rnnlm", "hidden", "-2", "argument hidden: must be >= 1, got -2"},
           {"rnnlm", "layers", "0", "argument layers: must be >= 1, got 0"},
           {"rnnlm", "dropout", "1", "argument dropout: must be in [0, 1), got 1"},
           {"rnntc", "vocab", "0", "argument vocab: must be >= 1, got 0"},
           {"rnntc", "layers", "x", "argument layers: 'x' is not an integer"},
           {"nmt", "dropout", "-0.5", "argument dropout: must be in [0, 1), got -0.5"},
           {"nmt", "vocab", "9", "model nmt has no argument 'vocab'"},
       }) {
    INFO(b.model << " " << b.key << "=" << b.value);
    Model m;
    const Status s = BuildSupervised(m, b.model, {{b.key, b.value}}, b.model == "rnntc" ? classes : windows, 2);
    REQUIRE(!s.ok());
    CHECK_THAT(s.ToString(), Catch::Contains(b.error));
  }
  for (const char* name : {"rnnlm", "rnntc", "nmt"}) {
    INFO(name);
    Model m;
    const bool per_example = std::string(name) == "rnntc";
    const Status s = BuildSupervised(m, name, {{"embed", "4"}, {"hidden", "4"}}, per_example ? classes : windows, 2);
    INFO(s.ToString());
    CHECK(s.ok());
    Model wrong;  // the other kind of target
    CHECK(!BuildSupervised(wrong, name, {{"embed", "4"}, {"hidden", "4"}}, per_example ? windows : classes, 2).ok());
  }
}

TEST_CASE("each recurrent model fused as 2 replicas computes 2 separate models' logits") {
  const std::vector<uint64_t> seeds = {7, 8};
  for (const Small& s : SmallModels()) {
    INFO(s.name);
    Model m(DType::kF64);
    BuildWithLoss(m, s);
    REQUIRE(m.status().ok());
    const auto feeds = FixedBatch(s);
    auto run = RunFusedAndSeparate(m.graph(), seeds, feeds, feeds, "logits");
    if (!run.ok()) FAIL(run.status().ToString());
    CHECK(FusedMismatch(*run) == "");
  }
}

}  // namespace
}  // namespace loom::models
