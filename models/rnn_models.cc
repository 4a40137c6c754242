#include "models/rnn_models.h"

#include <optional>

namespace loom::models {
namespace {

// [B, T, ...] <-> [T, B, ...]: loom's LSTM is time-major, the data batch-major.
// Token ids are swapped before the embedding, so no float tensor is copied
// on the way in.
Sym SwapBatchAndTime(Model& m, Sym x) {
  if (!x.valid()) return {};
  std::vector<int64_t> perm(m.shape(x).rank());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[0], perm[1]);
  return m.transpose(x, perm);
}

// tokens [B, T] -> LSTM outputs [T, B, hidden] of `layers` stacked layers.
Sym EmbedAndRun(Model& m, Sym tokens, int64_t rows, int64_t embed, int64_t hidden, int64_t layers, double dropout,
                const std::string& embedding, const std::string& rnn) {
  Sym x = m.embedding(SwapBatchAndTime(m, tokens), rows, embed, -1, embedding);  // [T, B, E]
  x = m.dropout(x, dropout, "drop");
  return m.lstm(x, hidden, {layers}, rnn);
}

}  // namespace

Sym RnnLm(Model& m, Sym tokens, const RnnLmOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  Sym y = EmbedAndRun(m, tokens, o.vocab, o.embed, o.hidden, o.layers, o.dropout, "encoder", "rnn");
  y = m.dropout(SwapBatchAndTime(m, y), o.dropout, "drop");  // [B, T, H]
  return m.linear(y, o.vocab, {}, "decoder");                // [B, T, vocab]
}

Sym RnnTc(Model& m, Sym tokens, const RnnTcOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  Sym y = EmbedAndRun(m, tokens, o.vocab, o.embed, o.hidden, o.layers, o.dropout, "embedding", "rnn");
  if (!y.valid()) return {};
  const int64_t t = m.shape(y)[0], b = m.shape(y)[1];
  // The whole window's summary: the top layer's output after the last token.
  Sym last = m.reshape(m.slice(y, 0, t - 1, t), {b, o.hidden});
  return m.linear(m.dropout(last, o.dropout, "drop"), o.num_classes, {}, "fc");
}

Sym Nmt(Model& m, Sym source, Sym target, const NmtOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  if (!source.valid() || !target.valid()) return {};
  const int64_t b = m.shape(target)[0], t = m.shape(target)[1];

  Sym memory;  // the encoder's top-layer outputs [B, S, H]
  {
    auto s = m.scope("encoder");
    Sym y = EmbedAndRun(m, source, o.vocab, o.embed, o.hidden, o.layers, o.dropout, "embedding", "rnn");
    memory = m.dropout(SwapBatchAndTime(m, y), o.dropout, "drop");
  }

  Sym state;  // the decoder's top-layer outputs [B, T, H]
  {
    auto s = m.scope("decoder");
    // Teacher forcing: step t reads target[t-1], step 0 the start token (id
    // vocab, the embedding's extra row). Fill, Slice and Concat copy i64 as
    // they copy floats. ReLU (max(id, 0), the one element-wise op that takes
    // i64) turns ignored entries (kIgnoreTarget, -100: a padded evaluation
    // row) into token 0, so the embedding gets a valid id; those positions
    // are not scored, and a row's logits only read that row's ids.
    Sym start = m.op1("Fill", {},
                    {{"shape", std::vector<int64_t>{b, 1}}, {"value", static_cast<double>(o.vocab)}, {"dtype", std::string(DTypeName(DType::kI64))}},
                    "start");
    Sym previous = m.relu(m.slice(target, 1, 0, t - 1));  // [B, T-1], ids >= 0
    Sym shifted = m.concat({start, previous}, 1);           // [B, T]
    Sym y = EmbedAndRun(m, shifted, o.vocab + 1, o.embed, o.hidden, o.layers, o.dropout, "embedding", "rnn");
    state = SwapBatchAndTime(m, y);
  }

  Sym attentional;  // tanh(W_c [h_t; c_t]) [B, T, H]
  {
    auto s = m.scope("attn");
    LinearOptions no_bias{false};
    Sym query = m.linear(state, o.hidden, no_bias, "linear_in");                   // W_a h_t
    Sym scores = m.op1("BatchMatMul", {query, memory}, {{"transpose_b", true}});  // [B, T, S]
    Sym context = m.op1("BatchMatMul", {m.softmax(scores, -1), memory});          // [B, T, H]
    attentional = m.tanh(m.linear(m.concat({state, context}, 2), o.hidden, no_bias, "linear_out"));
  }
  return m.linear(m.dropout(attentional, o.dropout, "drop"), o.vocab, {}, "generator");  // [B, T, vocab]
}

}  // namespace loom::models
