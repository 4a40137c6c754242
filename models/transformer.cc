#include "models/transformer.h"

#include <cmath>
#include <string>
#include <vector>

namespace loom::models {
namespace {

// A Linear layer "<name>/weight" [out, in], "<name>/bias" [out] with the
// reference's initializers (m.linear has PyTorch's Linear default only).
Sym Dense(Model& m, Sym x, int64_t out, const AttrMap& weight_init, const AttrMap& bias_init,
          const std::string& name) {
  if (!m.status().ok()) return {};
  const int64_t in = m.shape(x).dim(-1);
  Sym w = m.parameter(name + "/weight", {out, in}, weight_init);
  Sym b = m.parameter(name + "/bias", {out}, bias_init);
  return m.op1("Linear", {x, w, b}, {}, name);
}

// Rows of `table` [N, dim] picked by ids [B, T] -> [B, T, dim].
Sym Lookup(Model& m, Sym ids, Sym table, const std::string& name) {
  return m.op1("Embedding", {ids, table}, AttrMap{{"padding_idx", int64_t{-1}}}, name);
}

struct AttentionLayout {
  std::string query, key, value;  // the projections' layer names
  AttrMap weight_init, bias_init;
};

// The heads' attention context for x [B, T, E], merged back to [B, T, E],
// before the output projection (which the callers name). Dropout on the
// attention weights when training, as nn.MultiheadAttention and HF's
// BertSelfAttention do: the op's second output holds the weights, so the
// context is then recomputed as dropout(P) V.
Sym AttentionContext(Model& m, Sym x, int64_t heads, bool causal, double dropout, const AttentionLayout& l) {
  if (!m.status().ok()) return {};
  const Shape s = m.shape(x);
  const int64_t b = s[0], t = s[1], e = s[2], d = e / heads;
  // [B, T, E] -> [B, H, T, D]
  auto split = [&](Sym y) { return m.transpose(m.reshape(y, {b, t, heads, d}), {0, 2, 1, 3}); };
  Sym q = split(Dense(m, x, e, l.weight_init, l.bias_init, l.query));
  Sym k = split(Dense(m, x, e, l.weight_init, l.bias_init, l.key));
  Sym v = split(Dense(m, x, e, l.weight_init, l.bias_init, l.value));
  std::vector<Sym> attn = m.op("ScaledDotProductAttention", {q, k, v}, AttrMap{{"causal", causal}}, "sdpa");
  if (attn.size() < 2) return {};
  Sym context = attn[0];
  if (m.training() && dropout > 0) context = m.op1("BatchMatMul", {m.dropout(attn[1], dropout, "dropout"), v});
  return m.reshape(m.transpose(context, {0, 2, 1, 3}), {b, t, e});
}

// Post-norm residual: LayerNorm(x + dropout(y)).
Sym AddNorm(Model& m, Sym x, Sym y, double dropout, double eps, const std::string& dropout_name,
            const std::string& norm_name) {
  if (!m.status().ok()) return {};
  return m.layer_norm(m.add(x, m.dropout(y, dropout, dropout_name)), {m.shape(x).dim(-1)}, eps, norm_name);
}

// tokens must be [B, T] i64 with 1 <= T <= max_len.
Status CheckTokens(const Model& m, Sym tokens, int64_t max_len, const char* max_len_name) {
  LOOM_RETURN_IF_ERROR(m.status());
  if (!tokens.valid()) return InvalidArgument("the tokens are an invalid tensor");
  const TensorType& t = m.graph().type(tokens.id);
  if (t.shape.rank() != 2 || t.dtype != DType::kI64)
    return InvalidArgument("needs token ids [batch, length] i64, got ", t.shape.ToString(), " ", DTypeName(t.dtype));
  if (t.shape[1] < 1 || t.shape[1] > max_len)
    return InvalidArgument("sequence length ", t.shape[1], " must be in [1, ", max_len_name, "=", max_len, "]");
  return Status::Ok();
}

Status CheckSizes(const std::vector<std::pair<const char*, int64_t>>& sizes, double dropout) {
  for (const auto& [name, value] : sizes)
    if (value < 1) return InvalidArgument("argument ", name, ": must be >= 1, got ", value);
  if (dropout < 0 || dropout >= 1) return InvalidArgument("argument dropout: must be in [0, 1), got ", dropout);
  return Status::Ok();
}

Status CheckHeads(int64_t width, const char* width_name, int64_t heads) {
  if (width % heads != 0)
    return InvalidArgument("argument heads: ", width_name, "=", width, " is not divisible by heads=", heads);
  return Status::Ok();
}

}  // namespace

StatusOr<Sym> TransformerLm(Model& m, Sym tokens, const TransformerLmOptions& o) {
  LOOM_RETURN_IF_ERROR(CheckSizes({{"vocab_size", o.vocab_size},
                                   {"width", o.width},
                                   {"heads", o.heads},
                                   {"layers", o.layers},
                                   {"feedforward", o.feedforward},
                                   {"max_len", o.max_len}},
                                  o.dropout));
  LOOM_RETURN_IF_ERROR(CheckHeads(o.width, "width", o.heads));
  LOOM_RETURN_IF_ERROR(CheckTokens(m, tokens, o.max_len, "max_len"));
  const int64_t t = m.shape(tokens)[1], e = o.width;
  const std::string dtype(DTypeName(m.dtype()));

  // word_language_model's init_weights: U(-0.1, 0.1) embedding and decoder
  // weight, zero decoder bias.
  Sym table = m.parameter("encoder/weight", {o.vocab_size, e}, InitUniform(-0.1, 0.1));
  Sym x = m.scale(Lookup(m, tokens, table, "encoder"), std::sqrt(static_cast<double>(e)));
  {
    auto s = m.scope("pos_encoder");
    // A Buffer: a constant the optimizer never sees, shared by fused replicas.
    AttrMap pe_attrs = InitSinusoidalPositions();
    pe_attrs.Set("shape", std::vector<int64_t>{o.max_len, e});
    pe_attrs.Set("dtype", dtype);
    Sym pe = m.op1(kBufferOp, {}, pe_attrs, "pe");
    x = m.dropout(m.add(x, m.reshape(m.slice(pe, 0, 0, t), {1, t, e})), o.dropout, "dropout");
  }
  {
    auto s = m.scope("transformer_encoder");
    for (int64_t i = 0; i < o.layers; ++i) {
      auto layer = m.scope("layers/" + std::to_string(i));
      Sym attended;
      {
        // nn.MultiheadAttention: xavier_uniform over in_proj [3E, E] (so the
        // bound of fan_in + fan_out = 4E for each third), zero biases, the
        // out_proj weight Linear's default.
        auto a = m.scope("self_attn");
        const double bound = std::sqrt(6.0 / (4.0 * static_cast<double>(e)));
        AttentionLayout l{"q_proj", "k_proj", "v_proj", InitUniform(-bound, bound), InitZeros()};
        Sym context = AttentionContext(m, x, o.heads, /*causal=*/true, o.dropout, l);
        const double out_bound = 1.0 / std::sqrt(static_cast<double>(e));
        attended = Dense(m, context, e, InitUniform(-out_bound, out_bound), InitZeros(), "out_proj");
      }
      x = AddNorm(m, x, attended, o.dropout, 1e-5, "dropout1", "norm1");
      Sym inner = m.dropout(m.relu(m.linear(x, o.feedforward, {}, "linear1")), o.dropout, "dropout");
      Sym h = m.linear(inner, e, {}, "linear2");
      x = AddNorm(m, x, h, o.dropout, 1e-5, "dropout2", "norm2");
    }
  }
  Sym logits = Dense(m, x, o.vocab_size, InitUniform(-0.1, 0.1), InitZeros(), "decoder");
  LOOM_RETURN_IF_ERROR(m.status());
  return logits;
}

StatusOr<Sym> BertForMaskedLm(Model& m, Sym tokens, const BertOptions& o) {
  LOOM_RETURN_IF_ERROR(CheckSizes({{"vocab_size", o.vocab_size},
                                   {"layers", o.layers},
                                   {"hidden", o.hidden},
                                   {"heads", o.heads},
                                   {"intermediate", o.intermediate},
                                   {"max_positions", o.max_positions}},
                                  o.dropout));
  LOOM_RETURN_IF_ERROR(CheckHeads(o.hidden, "hidden", o.heads));
  LOOM_RETURN_IF_ERROR(CheckTokens(m, tokens, o.max_positions, "max_positions"));
  const int64_t t = m.shape(tokens)[1], h = o.hidden;
  constexpr double kEps = 1e-12;
  // HF's _init_weights (initializer_range 0.02).
  const AttrMap weights = InitNormal(0.0, 0.02), zeros = InitZeros();

  Sym word_table, x;
  {
    auto s = m.scope("bert");
    {
      auto emb = m.scope("embeddings");
      word_table = m.parameter("word_embeddings/weight", {o.vocab_size, h}, weights);
      Sym positions = m.parameter("position_embeddings/weight", {o.max_positions, h}, weights);
      Sym types = m.parameter("token_type_embeddings/weight", {2, h}, weights);
      x = Lookup(m, tokens, word_table, "word_embeddings");
      // Positions 0..T-1 are the first T rows; every token is of type 0.
      x = m.add(x, m.reshape(m.slice(positions, 0, 0, t), {1, t, h}));
      x = m.add(x, m.reshape(m.slice(types, 0, 0, 1), {1, 1, h}));
      x = m.dropout(m.layer_norm(x, {h}, kEps, "LayerNorm"), o.dropout, "dropout");
    }
    auto enc = m.scope("encoder");
    for (int64_t i = 0; i < o.layers; ++i) {
      auto layer = m.scope("layer/" + std::to_string(i));
      {
        auto a = m.scope("attention");
        Sym context;
        {
          auto self = m.scope("self");
          context = AttentionContext(m, x, o.heads, /*causal=*/false, o.dropout,
                                     AttentionLayout{"query", "key", "value", weights, zeros});
        }
        auto out = m.scope("output");
        x = AddNorm(m, x, Dense(m, context, h, weights, zeros, "dense"), o.dropout, kEps, "dropout", "LayerNorm");
      }
      Sym inner;
      {
        auto s2 = m.scope("intermediate");
        inner = m.gelu(Dense(m, x, o.intermediate, weights, zeros, "dense"));
      }
      auto out = m.scope("output");
      x = AddNorm(m, x, Dense(m, inner, h, weights, zeros, "dense"), o.dropout, kEps, "dropout", "LayerNorm");
    }
  }
  auto head = m.scope("cls");
  auto pred = m.scope("predictions");
  {
    auto s = m.scope("transform");
    x = m.layer_norm(m.gelu(Dense(m, x, h, weights, zeros, "dense")), {h}, kEps, "LayerNorm");
  }
  // The decoder's weight is the word embedding table [vocab, hidden] itself
  // (Linear computes x W^T): tied, one Parameter.
  Sym bias = m.parameter("bias", {o.vocab_size}, zeros);
  Sym logits = m.op1("Linear", {x, word_table, bias}, {}, "decoder");
  LOOM_RETURN_IF_ERROR(m.status());
  return logits;
}

}  // namespace loom::models
