// Transformer encoders over token ids [B, T] (i64), both returning one row of
// vocabulary scores per position, [B, T, vocab]:
//
//   TransformerLm: the Transformer language model of PyTorch's
//   examples/word_language_model (TransformerModel) as HFTA benchmarks it
//   (UofT-EcoSystem/hfta examples/transformer: emsize 128, nhid 128, 2
//   layers, 2 heads, dropout 0.2, causal mask). Layers (HFTA's module names):
//   encoder (Embedding, scaled by sqrt(width)), pos_encoder (sinusoidal table
//   "pos_encoder/pe", a Buffer of max_len rows, + dropout),
//   transformer_encoder/layers/<i> (post-norm nn.TransformerEncoderLayer:
//   self_attn, dropout1, norm1; linear1, ReLU, dropout, linear2, dropout2,
//   norm2), decoder (Linear width -> vocab). No final encoder LayerNorm, as
//   nn.TransformerEncoder without norm. 2,769,168 parameters at vocab 10000,
//   as PyTorch's modules with the same sizes (bench/reference_models.py
//   transformer_lm). Initialisation as word_language_model's init_weights
//   (embedding and decoder weight U(-0.1, 0.1), decoder bias 0; HFTA's copy
//   zeroes the decoder weight instead of the bias, then overwrites it, so
//   its bias keeps Linear's default). The current pytorch/examples version
//   subclasses nn.Transformer, whose never-used 6-layer decoder and final
//   norms add parameters; the count here is the encoder-only model HFTA
//   trains.
//
//   BertForMaskedLm: BERT-Medium (google's BERT miniatures: 8 layers, hidden
//   512, 8 heads, intermediate 2048) with the masked-LM head, as HuggingFace's
//   BertForMaskedLM builds it (no pooler). Layers (HF's module names):
//   bert/embeddings/{word_embeddings, position_embeddings (rows 0..T-1),
//   token_type_embeddings (every token type 0), LayerNorm, dropout};
//   bert/encoder/layer/<i>/attention/self/{query, key, value} (attention
//   dropout on the weights), attention/output/{dense, dropout, LayerNorm},
//   intermediate/dense + GELU, output/{dense, dropout, LayerNorm};
//   cls/predictions/transform/{dense, GELU, LayerNorm} and the decoder: the
//   word-embedding Parameter reused (tied, so counted once) plus its own
//   cls/predictions/bias. LayerNorm eps 1e-12; HF's _init_weights: weights
//   and embeddings normal(0, 0.02), biases 0, LayerNorm 1 and 0. 41,404,730
//   parameters at vocab 30522 (the uncased BERT vocabulary), as a PyTorch
//   rebuild of BertForMaskedLM's modules (bench/reference_models.py
//   bert_medium; the tied decoder weight is one Parameter there too). The
//   word embedding has no padding_idx (HF's pad id 0): loom's token ids
//   reserve no padding token.
//
// Attention (both): the projections of nn.MultiheadAttention as separate
// q/k/v Linears (in_proj's [3E, E] weight and [3E] bias split in three: the
// same parameter count), ScaledDotProductAttention, dropout on the attention
// weights when training, an output Linear.
//
//   Model m;
//   Sym tokens = m.input("input", {8, 32}, DType::kI64);
//   StatusOr<Sym> logits = TransformerLm(m, tokens, TransformerLmOptions{});  // [8, 32, 10000]
#pragma once

#include <cstdint>

#include "graph/model.h"

namespace loom::models {

struct TransformerLmOptions {
  int64_t vocab_size = 10000;  // ntoken
  int64_t width = 128;         // ninp (emsize), the model width
  int64_t heads = 2;           // nhead
  int64_t layers = 2;          // nlayers
  int64_t feedforward = 128;   // nhid, the feed-forward width (HFTA's default)
  double dropout = 0.2;        // HFTA's and word_language_model's default
  int64_t max_len = 5000;      // rows of the position table (PositionalEncoding's max_len)
};

// tokens [B, T] i64, T <= max_len -> logits [B, T, vocab_size]; position t
// sees tokens 0..t only. Errors name the option and value.
StatusOr<Sym> TransformerLm(Model& m, Sym tokens, const TransformerLmOptions& o = {});

struct BertOptions {
  int64_t vocab_size = 30522;
  int64_t layers = 8;          // num_hidden_layers
  int64_t hidden = 512;        // hidden_size
  int64_t heads = 8;           // num_attention_heads
  int64_t intermediate = 2048; // intermediate_size
  int64_t max_positions = 512; // max_position_embeddings
  double dropout = 0.1;        // hidden_dropout_prob and attention_probs_dropout_prob
};

// tokens [B, T] i64, T <= max_positions -> masked-LM logits [B, T,
// vocab_size] (every position sees every position).
StatusOr<Sym> BertForMaskedLm(Model& m, Sym tokens, const BertOptions& o = {});

}  // namespace loom::models
