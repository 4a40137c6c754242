// Small non-zoo networks that tests train, fuse and measure: a transformer
// block over tokens and a stacked-LSTM sequence classifier. Each sets the
// output "loss"; check m.status() afterwards.
#pragma once

#include "graph/model.h"

namespace loom::testing {

// tokens [3, 5] (vocabulary 11) -> embedding 8 -> causal 2-head attention,
// residual + LayerNorm -> GELU feed-forward (16) with dropout, residual +
// LayerNorm -> mean over positions -> 4 classes; labels "target" [3].
inline void TransformerBlock(Model& m) {
  Sym tokens = m.input("tokens", {3, 5}, DType::kI64);
  Sym labels = m.input("target", {3}, DType::kI64);
  Sym x = m.embedding(tokens, 11, 8, -1, "embed");
  Sym a = m.multi_head_attention(x, x, 2, {/*causal=*/true}, {}, "attn");
  Sym h = m.layer_norm(m.add(x, a), {8}, 1e-5, "ln1");
  Sym f = m.linear(m.dropout(m.gelu(m.linear(h, 16, {}, "ffn1")), 0.1, "drop"), 8, {}, "ffn2");
  h = m.layer_norm(m.add(h, f), {8}, 1e-5, "ln2");
  Sym logits = m.linear(m.mean(h, {1}), 4, {}, "head");
  m.set_output("loss", m.cross_entropy(logits, labels));
}

// seq [4, 3, 5] (time-major) -> 2-layer LSTM (6) -> last step -> 4 classes;
// labels "target" [3].
inline void LstmClassifier(Model& m) {
  Sym x = m.input("seq", {4, 3, 5});
  Sym labels = m.input("target", {3}, DType::kI64);
  Sym y = m.lstm(x, 6, {/*num_layers=*/2}, "lstm");
  Sym last = m.reshape(m.slice(y, 0, 3, 4), {3, 6});
  m.set_output("loss", m.cross_entropy(m.linear(last, 4, {}, "head"), labels));
}

}  // namespace loom::testing
