#include "graph/model.h"

#include <cctype>
#include <cmath>

namespace loom {

AttrMap InitZeros() { return AttrMap{{"init", "zeros"}}; }
AttrMap InitOnes() { return AttrMap{{"init", "ones"}}; }
AttrMap InitConstant(double value) { return AttrMap{{"init", "constant"}, {"value", value}}; }
AttrMap InitUniform(double low, double high) { return AttrMap{{"init", "uniform"}, {"low", low}, {"high", high}}; }
AttrMap InitNormal(double mean, double std) { return AttrMap{{"init", "normal"}, {"mean", mean}, {"std", std}}; }
AttrMap InitSinusoidalPositions() { return AttrMap{{"init", "sinusoidal"}}; }

namespace {
std::string Lower(const std::string& s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
// PyTorch's default for Linear and Conv weights and biases:
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5)).
AttrMap FanInUniform(int64_t fan_in) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  return InitUniform(-bound, bound);
}
}  // namespace

Model::Model(DType dtype) : dtype_(dtype) {}

void Model::Fail(const Status& s) {
  if (status_.ok()) status_ = s;
}

bool Model::Check(const std::vector<Sym>& inputs) {
  if (!status_.ok()) return false;
  for (Sym s : inputs) {
    if (!s.valid() || !graph_.has_value(s.id)) {
      Fail(InvalidArgument("a layer was given an invalid tensor (from a failed call)"));
      return false;
    }
  }
  return true;
}

// A layer name unused both as a node name and as a scope (composite layers
// such as attention name only their inner nodes).
std::string Model::LayerName(const std::string& given, const std::string& op) const {
  const std::string base = given.empty() ? Lower(op) : given;
  const std::string prefix = builder_.ScopePrefix();
  auto taken = [&](const std::string& candidate) { return graph_.NameInUse(prefix + candidate); };
  if (!taken(base)) return base;
  for (int i = 1;; ++i) {
    std::string candidate = base + "_" + std::to_string(i);
    if (!taken(candidate)) return candidate;
  }
}

Sym Model::Op(const std::string& op, const std::vector<Sym>& inputs, const AttrMap& attrs, const std::string& name) {
  std::vector<Sym> outs = this->op(op, inputs, attrs, name);
  return outs.empty() ? Sym{} : outs[0];
}

std::vector<Sym> Model::op(const std::string& op, const std::vector<Sym>& inputs, const AttrMap& attrs,
                           const std::string& name) {
  if (!Check(inputs)) return {};
  std::vector<ValueId> ids;
  for (Sym s : inputs) ids.push_back(s.id);
  auto outs = builder_.Add(op, ids, attrs, name.empty() ? LayerName("", op) : name);
  if (!outs.ok()) {
    Fail(outs.status());
    return {};
  }
  std::vector<Sym> syms;
  for (ValueId v : *outs) syms.push_back({v});
  return syms;
}

Sym Model::input(const std::string& name, const Shape& shape) { return input(name, shape, dtype_); }

Sym Model::input(const std::string& name, const Shape& shape, DType dtype) {
  if (!status_.ok()) return {};
  if (graph_.FindNode(builder_.ScopePrefix() + name)) {
    Fail(InvalidArgument("input '", name, "' is defined twice"));
    return {};
  }
  return {builder_.Input(name, {shape, dtype})};
}

Sym Model::parameter(const std::string& name, const Shape& shape, const AttrMap& init) {
  if (!status_.ok()) return {};
  return {builder_.Parameter(LayerName(name, name), {shape, dtype_}, init)};
}

Sym Model::buffer(const std::string& name, const Shape& shape, const AttrMap& init) {
  if (!status_.ok()) return {};
  return {builder_.Buffer(LayerName(name, name), {shape, dtype_}, init)};
}

void Model::update_state(Sym state, Sym new_value) {
  if (!Check({state, new_value})) return;
  graph_.state_updates().push_back({state.id, new_value.id});
}

Sym Model::Param(const std::string& layer, const std::string& name, const Shape& shape, const AttrMap& init) {
  return {builder_.Parameter(layer + "/" + name, {shape, dtype_}, init)};
}

Sym Model::Buffer(const std::string& layer, const std::string& name, const Shape& shape, const AttrMap& init) {
  return {builder_.Buffer(layer + "/" + name, {shape, dtype_}, init)};
}

Sym Model::linear(Sym x, int64_t out_features, const LinearOptions& opts, const std::string& name) {
  if (!Check({x})) return {};
  std::string layer = LayerName(name, "linear");
  int64_t in = shape(x).rank() ? shape(x).dim(-1) : 0;
  std::vector<Sym> ins = {x, Param(layer, "weight", {out_features, in}, FanInUniform(in))};
  if (opts.bias) ins.push_back(Param(layer, "bias", {out_features}, FanInUniform(in)));
  return Op("Linear", ins, {}, layer);
}

Sym Model::conv2d(Sym x, int64_t out_channels, std::vector<int64_t> kernel, const Conv2dOptions& opts,
                  const std::string& name) {
  if (!Check({x})) return {};
  if (kernel.size() == 1) kernel.push_back(kernel[0]);
  std::string layer = LayerName(name, "conv2d");
  if (shape(x).rank() != 4 || kernel.size() != 2 || opts.groups <= 0) {
    Fail(InvalidArgument("layer '", layer, "' (conv2d): needs an [N, C, H, W] input and a 2-D kernel, got input ",
                         shape(x).ToString()));
    return {};
  }
  int64_t in_per_group = shape(x)[1] / opts.groups;
  int64_t fan_in = in_per_group * kernel[0] * kernel[1];
  std::vector<Sym> ins = {x, Param(layer, "weight", {out_channels, in_per_group, kernel[0], kernel[1]}, FanInUniform(fan_in))};
  if (opts.bias) ins.push_back(Param(layer, "bias", {out_channels}, FanInUniform(fan_in)));
  AttrMap a{{"stride", opts.stride}, {"padding", opts.padding}, {"dilation", opts.dilation}, {"groups", opts.groups}};
  return Op("Conv2d", ins, a, layer);
}

Sym Model::conv1d(Sym x, int64_t out_channels, int64_t kernel, const Conv1dOptions& opts, const std::string& name) {
  if (!Check({x})) return {};
  std::string layer = LayerName(name, "conv1d");
  if (shape(x).rank() != 3 || opts.groups <= 0) {
    Fail(InvalidArgument("layer '", layer, "' (conv1d): needs an [N, C, L] input, got ", shape(x).ToString()));
    return {};
  }
  int64_t in_per_group = shape(x)[1] / opts.groups, fan_in = in_per_group * kernel;
  std::vector<Sym> ins = {x, Param(layer, "weight", {out_channels, in_per_group, kernel}, FanInUniform(fan_in))};
  if (opts.bias) ins.push_back(Param(layer, "bias", {out_channels}, FanInUniform(fan_in)));
  AttrMap a{{"stride", std::vector<int64_t>{opts.stride}},
            {"padding", std::vector<int64_t>{opts.padding}},
            {"dilation", std::vector<int64_t>{opts.dilation}},
            {"groups", opts.groups}};
  return Op("Conv1d", ins, a, layer);
}

Sym Model::conv_transpose2d(Sym x, int64_t out_channels, std::vector<int64_t> kernel,
                            const ConvTranspose2dOptions& opts, const std::string& name) {
  if (!Check({x})) return {};
  if (kernel.size() == 1) kernel.push_back(kernel[0]);
  std::string layer = LayerName(name, "conv_transpose2d");
  if (shape(x).rank() != 4 || kernel.size() != 2 || opts.groups <= 0) {
    Fail(InvalidArgument("layer '", layer, "' (conv_transpose2d): needs an [N, C, H, W] input and a 2-D kernel, got ",
                         shape(x).ToString()));
    return {};
  }
  int64_t out_per_group = out_channels / opts.groups;
  // PyTorch computes fan_in from weight.size(1) * kernel area for transposed convs.
  int64_t fan_in = out_per_group * kernel[0] * kernel[1];
  std::vector<Sym> ins = {x, Param(layer, "weight", {shape(x)[1], out_per_group, kernel[0], kernel[1]}, FanInUniform(fan_in))};
  if (opts.bias) ins.push_back(Param(layer, "bias", {out_channels}, FanInUniform(fan_in)));
  AttrMap a{{"stride", opts.stride},
            {"padding", opts.padding},
            {"output_padding", opts.output_padding},
            {"dilation", opts.dilation},
            {"groups", opts.groups}};
  return Op("ConvTranspose2d", ins, a, layer);
}

Sym Model::batch_norm(Sym x, const BatchNormOptions& opts, const std::string& name) {
  if (!Check({x})) return {};
  std::string layer = LayerName(name, "batch_norm");
  if (shape(x).rank() < 2) {
    Fail(InvalidArgument("layer '", layer, "' (batch_norm): needs [N, C, ...], got ", shape(x).ToString()));
    return {};
  }
  int64_t c = shape(x)[1];
  Sym gamma = Param(layer, "weight", {c}, opts.weight_init.Has("init") ? opts.weight_init : InitOnes());
  Sym beta = Param(layer, "bias", {c}, InitZeros());
  Sym mean = Buffer(layer, "running_mean", {c}, InitZeros());
  Sym var = Buffer(layer, "running_var", {c}, InitOnes());
  AttrMap a{{"training", training_}, {"momentum", opts.momentum}, {"eps", opts.eps}};
  std::vector<Sym> outs = op("BatchNorm", {x, gamma, beta, mean, var}, a, layer);
  if (outs.size() < 3) return {};
  if (training_) {
    graph_.state_updates().push_back({mean.id, outs[1].id});
    graph_.state_updates().push_back({var.id, outs[2].id});
  }
  return outs[0];
}

Sym Model::layer_norm(Sym x, std::vector<int64_t> normalized_shape, double eps, const std::string& name) {
  if (!Check({x})) return {};
  std::string layer = LayerName(name, "layer_norm");
  Shape ns(normalized_shape);
  Sym gamma = Param(layer, "weight", ns, InitOnes());
  Sym beta = Param(layer, "bias", ns, InitZeros());
  return Op("LayerNorm", {x, gamma, beta}, AttrMap{{"normalized_shape", normalized_shape}, {"eps", eps}}, layer);
}

Sym Model::embedding(Sym indices, int64_t num_embeddings, int64_t dim, int64_t padding_idx, const std::string& name) {
  if (!Check({indices})) return {};
  std::string layer = LayerName(name, "embedding");
  Sym w = Param(layer, "weight", {num_embeddings, dim}, InitNormal(0.0, 1.0));
  return Op("Embedding", {indices, w}, AttrMap{{"padding_idx", padding_idx}}, layer);
}

Sym Model::dropout(Sym x, double p, const std::string& name) {
  if (!Check({x})) return {};
  return Op("Dropout", {x}, AttrMap{{"p", p}, {"training", training_}}, LayerName(name, "dropout"));
}

namespace {
AttrMap PoolAttrs(const std::vector<int64_t>& kernel, const Pool2dOptions& o) {
  std::vector<int64_t> k = kernel.size() == 1 ? std::vector<int64_t>{kernel[0], kernel[0]} : kernel;
  std::vector<int64_t> s = o.stride.empty() ? k : (o.stride.size() == 1 ? std::vector<int64_t>{o.stride[0], o.stride[0]} : o.stride);
  return AttrMap{{"kernel", k}, {"stride", s}, {"padding", o.padding}, {"ceil_mode", o.ceil_mode}};
}
}  // namespace

Sym Model::max_pool2d(Sym x, std::vector<int64_t> kernel, const Pool2dOptions& opts, const std::string& name) {
  return Op("MaxPool2d", {x}, PoolAttrs(kernel, opts), LayerName(name, "max_pool2d"));
}

Sym Model::avg_pool2d(Sym x, std::vector<int64_t> kernel, const Pool2dOptions& opts, const std::string& name) {
  AttrMap a = PoolAttrs(kernel, opts);
  a.Set("count_include_pad", opts.count_include_pad);
  return Op("AvgPool2d", {x}, a, LayerName(name, "avg_pool2d"));
}

Sym Model::adaptive_avg_pool2d(Sym x, std::vector<int64_t> output_size, const std::string& name) {
  if (output_size.size() == 1) output_size.push_back(output_size[0]);
  return Op("AdaptiveAvgPool2d", {x}, AttrMap{{"output_size", output_size}}, LayerName(name, "adaptive_avg_pool2d"));
}

Sym Model::leaky_relu(Sym x, double slope) { return Op("LeakyReLU", {x}, AttrMap{{"negative_slope", slope}}); }

Sym Model::flatten(Sym x, int64_t start_dim, int64_t end_dim) {
  return Op("Flatten", {x}, AttrMap{{"start_dim", start_dim}, {"end_dim", end_dim}});
}

Sym Model::concat(const std::vector<Sym>& xs, int64_t axis) { return Op("Concat", xs, AttrMap{{"axis", axis}}); }

Sym Model::slice(Sym x, int64_t axis, int64_t start, int64_t end) {
  return Op("Slice", {x}, AttrMap{{"axis", axis}, {"start", start}, {"end", end}});
}

Sym Model::sum(Sym x, std::vector<int64_t> axes, bool keepdims) {
  return Op("ReduceSum", {x}, AttrMap{{"axes", axes}, {"keepdims", keepdims}});
}

Sym Model::mean(Sym x, std::vector<int64_t> axes, bool keepdims) {
  return Op("ReduceMean", {x}, AttrMap{{"axes", axes}, {"keepdims", keepdims}});
}

Sym Model::cross_entropy(Sym logits, Sym targets, const CrossEntropyOptions& opts) {
  return Op("CrossEntropy", {logits, targets},
            AttrMap{{"label_smoothing", opts.label_smoothing},
                    {"ignore_index", opts.ignore_index},
                    {"reduction", opts.reduction}});
}

Sym Model::multi_head_attention(Sym q, Sym kv, int64_t num_heads, const AttentionOptions& opts, Sym key_padding_mask,
                                const std::string& name) {
  if (!Check({q, kv})) return {};
  std::string layer = LayerName(name, "attention");
  const Shape qs = shape(q), ks = shape(kv);
  if (qs.rank() != 3 || ks.rank() != 3 || qs[2] != ks[2] || num_heads <= 0 || qs[2] % num_heads != 0) {
    Fail(InvalidArgument("layer '", layer, "' (multi_head_attention): needs q [B, Tq, E] and kv [B, Tk, E] with E ",
                         "divisible by num_heads=", num_heads, ", got ", qs.ToString(), " and ", ks.ToString()));
    return {};
  }
  const int64_t b = qs[0], tq = qs[1], tk = ks[1], e = qs[2], d = e / num_heads;
  auto scope = this->scope(layer);
  LinearOptions lo{opts.bias};
  // [B, T, E] -> [B, H, T, D]
  auto heads = [&](Sym x, int64_t t) { return transpose(reshape(x, {b, t, num_heads, d}), {0, 2, 1, 3}); };
  Sym qh = heads(linear(q, e, lo, "q_proj"), tq);
  Sym kh = heads(linear(kv, e, lo, "k_proj"), tk);
  Sym vh = heads(linear(kv, e, lo, "v_proj"), tk);
  std::vector<Sym> ins = {qh, kh, vh};
  if (key_padding_mask.valid()) ins.push_back(key_padding_mask);
  Sym attn = Op("ScaledDotProductAttention", ins, AttrMap{{"causal", opts.causal}}, "sdpa");
  Sym merged = reshape(transpose(attn, {0, 2, 1, 3}), {b, tq, e});
  return linear(merged, e, lo, "out_proj");
}

Sym Model::lstm(Sym x, int64_t hidden, const LstmOptions& opts, const std::string& name) {
  if (!Check({x})) return {};
  std::string layer = LayerName(name, "lstm");
  if (shape(x).rank() != 3 || opts.num_layers < 1) {
    Fail(InvalidArgument("layer '", layer, "' (lstm): needs x [T, N, I] and num_layers >= 1, got ", shape(x).ToString()));
    return {};
  }
  const int64_t n = shape(x)[1];
  AttrMap init = FanInUniform(hidden);  // PyTorch: U(-1/sqrt(hidden), 1/sqrt(hidden)) for all LSTM weights
  auto scope = this->scope(layer);
  Sym y = x;
  for (int64_t l = 0; l < opts.num_layers; ++l) {
    std::string ln = "l" + std::to_string(l);
    int64_t in = shape(y)[2];
    AttrMap zeros{{"shape", std::vector<int64_t>{n, hidden}}, {"value", 0.0}, {"dtype", std::string(DTypeName(dtype_))}};
    Sym h0 = Op("Fill", {}, zeros, ln + "/h0");
    Sym c0 = Op("Fill", {}, zeros, ln + "/c0");
    std::vector<Sym> ins = {y, h0, c0, Param(ln, "weight_ih", {4 * hidden, in}, init),
                            Param(ln, "weight_hh", {4 * hidden, hidden}, init), Param(ln, "bias_ih", {4 * hidden}, init),
                            Param(ln, "bias_hh", {4 * hidden}, init)};
    y = Op("LSTM", ins, {}, ln);
  }
  return y;
}

Model::Scope Model::scope(const std::string& name) {
  builder_.PushScope(name);
  return Scope(this);
}

void Model::set_output(const std::string& name, Sym value) {
  if (!Check({value})) return;
  graph_.outputs()[name] = value.id;
}

}  // namespace loom
