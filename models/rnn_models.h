// The recurrent models of the FlexFlow paper (Jia et al., "Beyond Data and
// Model Parallelism for Deep Neural Networks", SysML 2019): RNNLM (a 2-layer
// LSTM language model, Zaremba et al. style), RNNTC (text classification:
// 4 LSTM layers, then a classifier) and NMT (an LSTM encoder-decoder with
// attention). All read token ids [B, T] (i64) and run loom's LSTM op
// (PyTorch's gate order and weight layout: weight_ih, weight_hh, bias_ih and
// bias_hh per layer, as torch.nn.LSTM), so the parameter counts are those of
// the PyTorch rebuilds in bench/reference_models.py (`/usr/bin/python3
// bench/reference_models.py rnnlm|rnntc|nmt`, torch 1.13):
//
//   rnnlm at its defaults, vocabulary 10000 (Penn Treebank):   37,283,600
//   rnntc at its defaults (vocab 32000), 2 classes:            66,357,250
//   nmt at its defaults, vocabulary 20480 (FlexFlow's nmt/):  272,717,824
//
// Defaults and where they come from:
//  - nmt: embed = hidden = 2048, 2 LSTM layers in the encoder and 2 in the
//    decoder (the paper's "4 recurrent layers"): flexflow/FlexFlow
//    nmt/nmt.cc (hidden_size = embed_size = 2048, num_layers = 2; its
//    vocab_size = 20 * 1024 and seq_length = 20 are the data's here).
//  - rnnlm, rnntc: embed = hidden = 1024 and rnntc's input vocabulary
//    32000: flexflow/FlexFlow scripts/simulator.cc (EMBEDDING_SIZE =
//    HIDDEN_SIZE = 1024, VOCAB_SIZE = 32000; FlexFlow has no rnnlm/rnntc
//    example of its own). Layers: 2 (rnnlm) and 4 (rnntc), the paper's.
//  - dropout 0.2 for all three: PyTorch examples' word_language_model (whose
//    RNNModel is rnnlm's layer reference) default.
//
// Layers (names as in the references):
//  rnnlm (word_language_model's RNNModel): encoder (Embedding) - drop -
//    rnn (LSTM) - drop - decoder (Linear to the vocabulary, per step).
//  rnntc: embedding - drop - rnn (LSTM) - the last step's output - drop -
//    fc (Linear to the classes).
//  nmt: encoder/embedding - drop - encoder/rnn - drop over the source; the decoder
//    reads the target shifted right (teacher forcing: a start token, id
//    num_classes, then ReLU(target[0 .. T-2]), so decoder/embedding has
//    num_classes + 1 rows and ignored entries, -100, read token 0) - drop -
//    decoder/rnn; Luong "general" attention as OpenNMT-py's
//    GlobalAttention(attn_type="general") computes it: score(h_t, h_s) =
//    linear_in(h_t) . h_s (attn/linear_in, no bias), softmax over the
//    source, context c_t = sum_s a_ts h_s, then tanh(attn/linear_out([h_t;
//    c_t])) (no bias) - drop - generator (Linear to the classes, with bias).
//
// Differences from the references, all without effect on the counts:
//  - loom's LSTM starts from a zero state, so nmt's decoder does too
//    (FlexFlow's nmt/ and GNMT hand the encoder's final state over; Model::lstm
//    takes no initial state); the decoder reaches the source through the
//    attention.
//  - no dropout between stacked LSTM layers (torch.nn.LSTM's dropout=p):
//    Model::lstm stacks its layers without it.
//  - nmt's decoder reads ReLU(target) shifted right: target entries of -100
//    (kIgnoreTarget, as in the padding rows of an evaluation batch) become
//    token 0 before decoder/embedding (ReLU is loom's one element-wise op
//    that takes i64, forward only). Those entries are not scored, and a
//    row's logits depend on that row's ids only, so the other rows' logits
//    are unchanged; a -100 inside a scored row would be read as token 0 at
//    the next step (PyTorch's references never feed -100 to the decoder).
#pragma once

#include <cstdint>
#include <string>

#include "graph/model.h"

namespace loom::models {

struct RnnLmOptions {
  int64_t vocab = 10000;  // the data's vocabulary (Penn Treebank: 10000)
  int64_t embed = 1024;
  int64_t hidden = 1024;
  int64_t layers = 2;
  double dropout = 0.2;  // on the embeddings and the last LSTM layer's output
};

struct RnnTcOptions {
  int64_t vocab = 32000;  // input token ids are in [0, vocab)
  int64_t num_classes = 2;
  int64_t embed = 1024;
  int64_t hidden = 1024;
  int64_t layers = 4;
  double dropout = 0.2;  // on the embeddings and the last step's output
};

struct NmtOptions {
  int64_t vocab = 20480;  // source and target ids; the start token is id vocab
  int64_t embed = 2048;
  int64_t hidden = 2048;
  int64_t layers = 2;  // in the encoder and again in the decoder
  double dropout = 0.2;  // on both embeddings, the encoder's outputs and the attentional state
};

// tokens [B, T] -> logits [B, T, vocab]: the next token's scores per step.
Sym RnnLm(Model& m, Sym tokens, const RnnLmOptions& o = {}, const std::string& name = "");

// tokens [B, T] -> logits [B, num_classes].
Sym RnnTc(Model& m, Sym tokens, const RnnTcOptions& o = {}, const std::string& name = "");

// source [B, S], target [B, T] (both ids in [0, vocab); target entries may
// also be -100, kIgnoreTarget, read as token 0) -> logits [B, T, vocab]; the
// scores at position t read target[0 .. t-1] only.
Sym Nmt(Model& m, Sym source, Sym target, const NmtOptions& o = {}, const std::string& name = "");

}  // namespace loom::models
