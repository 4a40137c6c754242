// The C++ model API: build a model layer by layer, Keras-functional or
// FlexFlow-FFModel style. Each call adds named nodes (and the layer's
// parameters, "<layer>/weight", "<layer>/bias") to the model's graph and
// returns a symbolic tensor.
//
//   Model m;
//   Sym x = m.input("image", {64, 1, 28, 28});
//   Sym labels = m.input("label", {64}, DType::kI64);
//   Sym h = m.relu(m.linear(m.flatten(x), /*out_features=*/128, {}, "fc1"));
//   Sym loss = m.cross_entropy(m.linear(h, 10, {}, "fc2"), labels);
//   if (!m.status().ok()) ...  // the first error, naming the layer
//
// Errors are sticky: after a bad call (e.g. a shape mismatch) every later
// call returns an invalid Sym and m.status() reports the first problem, with
// the layer name and shapes. Blocks are name scopes: `auto s =
// m.scope("block1");` prefixes the names of the layers made while s lives.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/ir.h"

namespace loom {

class Model;

// A symbolic tensor: a value of the model's graph.
struct Sym {
  ValueId id = kNoValue;
  bool valid() const { return id != kNoValue; }
};

struct LinearOptions {
  bool bias = true;
};

struct Conv2dOptions {
  std::vector<int64_t> stride = {1, 1};
  std::vector<int64_t> padding = {0, 0};
  std::vector<int64_t> dilation = {1, 1};
  int64_t groups = 1;
  bool bias = true;
};

struct Conv1dOptions {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
  bool bias = true;
};

struct ConvTranspose2dOptions {
  std::vector<int64_t> stride = {1, 1};
  std::vector<int64_t> padding = {0, 0};
  std::vector<int64_t> output_padding = {0, 0};
  std::vector<int64_t> dilation = {1, 1};
  int64_t groups = 1;
  bool bias = true;
};

struct Pool2dOptions {
  std::vector<int64_t> stride;  // empty: the kernel size
  std::vector<int64_t> padding = {0, 0};
  bool ceil_mode = false;
  bool count_include_pad = true;  // average pooling only
};

struct BatchNormOptions {
  double momentum = 0.1;
  double eps = 1e-5;
  AttrMap weight_init;  // the scale's initializer (InitNormal, ...); none set: ones
};

struct CrossEntropyOptions {
  double label_smoothing = 0.0;
  int64_t ignore_index = -100;
  std::string reduction = "mean";
};

struct AttentionOptions {
  bool causal = false;
  bool bias = true;
};

struct LstmOptions {
  int64_t num_layers = 1;
};

class Model {
 public:
  // `dtype` is the element type of parameters and float inputs.
  explicit Model(DType dtype = DType::kF32);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Training mode decides how BatchNorm and Dropout are built.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }

  // --- inputs and parameters
  Sym input(const std::string& name, const Shape& shape);
  Sym input(const std::string& name, const Shape& shape, DType dtype);
  Sym parameter(const std::string& name, const Shape& shape, const AttrMap& init);
  // State that is not trained (running statistics), and the value it takes
  // after each training step (BatchNorm registers its own).
  Sym buffer(const std::string& name, const Shape& shape, const AttrMap& init);
  void update_state(Sym state, Sym new_value);

  // --- layers (name: the layer name; empty = the op's name, made unique)
  Sym linear(Sym x, int64_t out_features, const LinearOptions& opts = {}, const std::string& name = "");
  Sym conv1d(Sym x, int64_t out_channels, int64_t kernel, const Conv1dOptions& opts = {}, const std::string& name = "");
  Sym conv2d(Sym x, int64_t out_channels, std::vector<int64_t> kernel, const Conv2dOptions& opts = {},
             const std::string& name = "");
  Sym conv_transpose2d(Sym x, int64_t out_channels, std::vector<int64_t> kernel, const ConvTranspose2dOptions& opts = {},
                       const std::string& name = "");
  Sym batch_norm(Sym x, const BatchNormOptions& opts = {}, const std::string& name = "");
  Sym layer_norm(Sym x, std::vector<int64_t> normalized_shape, double eps = 1e-5, const std::string& name = "");
  Sym embedding(Sym indices, int64_t num_embeddings, int64_t dim, int64_t padding_idx = -1,
                const std::string& name = "");
  Sym dropout(Sym x, double p, const std::string& name = "");
  Sym max_pool2d(Sym x, std::vector<int64_t> kernel, const Pool2dOptions& opts = {}, const std::string& name = "");
  Sym avg_pool2d(Sym x, std::vector<int64_t> kernel, const Pool2dOptions& opts = {}, const std::string& name = "");
  Sym adaptive_avg_pool2d(Sym x, std::vector<int64_t> output_size, const std::string& name = "");
  // Multi-head self/cross attention with input and output projections.
  // q [B, Tq, E], kv [B, Tk, E] -> [B, Tq, E]. key_padding_mask [B, Tk] or invalid.
  Sym multi_head_attention(Sym q, Sym kv, int64_t num_heads, const AttentionOptions& opts = {},
                           Sym key_padding_mask = {}, const std::string& name = "");
  // Stacked LSTM over x [T, N, I]; returns y [T, N, hidden] (zero initial state).
  Sym lstm(Sym x, int64_t hidden, const LstmOptions& opts = {}, const std::string& name = "");

  // --- activations and element-wise
  Sym relu(Sym x) { return Unary("ReLU", x); }
  Sym relu6(Sym x) { return Unary("ReLU6", x); }
  Sym leaky_relu(Sym x, double slope = 0.01);
  Sym gelu(Sym x) { return Unary("GELU", x); }
  Sym sigmoid(Sym x) { return Unary("Sigmoid", x); }
  Sym tanh(Sym x) { return Unary("Tanh", x); }
  Sym hardswish(Sym x) { return Unary("Hardswish", x); }
  Sym hardsigmoid(Sym x) { return Unary("Hardsigmoid", x); }
  Sym silu(Sym x) { return Unary("SiLU", x); }
  Sym add(Sym a, Sym b) { return Op("Add", {a, b}); }
  Sym sub(Sym a, Sym b) { return Op("Sub", {a, b}); }
  Sym mul(Sym a, Sym b) { return Op("Mul", {a, b}); }
  Sym div(Sym a, Sym b) { return Op("Div", {a, b}); }
  Sym scale(Sym x, double factor) { return Op("MulScalar", {x}, AttrMap{{"value", factor}}); }

  // --- shapes and reductions
  Sym reshape(Sym x, std::vector<int64_t> shape) { return Op("Reshape", {x}, AttrMap{{"shape", shape}}); }
  Sym flatten(Sym x, int64_t start_dim = 1, int64_t end_dim = -1);
  Sym transpose(Sym x, std::vector<int64_t> perm) { return Op("Transpose", {x}, AttrMap{{"perm", perm}}); }
  Sym concat(const std::vector<Sym>& xs, int64_t axis);
  Sym slice(Sym x, int64_t axis, int64_t start, int64_t end);
  Sym sum(Sym x, std::vector<int64_t> axes = {}, bool keepdims = false);
  Sym mean(Sym x, std::vector<int64_t> axes = {}, bool keepdims = false);
  Sym softmax(Sym x, int64_t axis = -1) { return Op("Softmax", {x}, AttrMap{{"axis", axis}}); }
  Sym log_softmax(Sym x, int64_t axis = -1) { return Op("LogSoftmax", {x}, AttrMap{{"axis", axis}}); }

  // --- losses (scalar results)
  Sym cross_entropy(Sym logits, Sym targets, const CrossEntropyOptions& opts = {});
  Sym mse(Sym prediction, Sym target) { return Op("MSE", {prediction, target}); }
  Sym bce_with_logits(Sym logits, Sym targets) { return Op("BCEWithLogits", {logits, targets}); }

  // Any registered op; returns all of its outputs.
  std::vector<Sym> op(const std::string& op, const std::vector<Sym>& inputs, const AttrMap& attrs = {},
                      const std::string& name = "");
  // Its first output (most ops have one); invalid after an error.
  Sym op1(const std::string& op, const std::vector<Sym>& inputs, const AttrMap& attrs = {},
          const std::string& name = "") {
    return Op(op, inputs, attrs, name);
  }

  // --- blocks: name scopes for groups of layers
  class Scope {
   public:
    Scope(Scope&& o) noexcept : model_(o.model_) { o.model_ = nullptr; }
    ~Scope() {
      if (model_) model_->builder_.PopScope();
    }

   private:
    friend class Model;
    explicit Scope(Model* m) : model_(m) {}
    Model* model_;
  };
  [[nodiscard]] Scope scope(const std::string& name);

  // Marks a named result (e.g. "loss", "logits").
  void set_output(const std::string& name, Sym value);

  const Shape& shape(Sym s) const { return graph_.type(s.id).shape; }
  DType dtype() const { return dtype_; }
  const Status& status() const { return status_; }
  const Graph& graph() const { return graph_; }
  Graph* mutable_graph() { return &graph_; }

 private:
  Sym Unary(const std::string& op, Sym x) { return Op(op, {x}); }
  Sym Op(const std::string& op, const std::vector<Sym>& inputs, const AttrMap& attrs = {}, const std::string& name = "");
  // Runs `build` inside a scope named after the layer; records failures.
  std::string LayerName(const std::string& given, const std::string& op) const;
  bool Check(const std::vector<Sym>& inputs);
  void Fail(const Status& s);
  Sym Param(const std::string& layer, const std::string& name, const Shape& shape, const AttrMap& init);
  Sym Buffer(const std::string& layer, const std::string& name, const Shape& shape, const AttrMap& init);

  DType dtype_;
  bool training_ = true;
  Graph graph_;
  GraphBuilder builder_{&graph_};
  Status status_;
};

// Initializer attributes for Parameter/Buffer nodes (see the executor).
AttrMap InitZeros();
AttrMap InitOnes();
AttrMap InitConstant(double value);
AttrMap InitUniform(double low, double high);
AttrMap InitNormal(double mean, double std);
// For a [max_len, dim] Buffer: the sinusoidal position encoding of
// "Attention Is All You Need" as PyTorch's word_language_model builds it, row
// pos, columns 2i and 2i+1: sin and cos of pos * exp(-2i * ln(10000) / dim).
// A constant (the same for every seed), not a trained parameter.
AttrMap InitSinusoidalPositions();

}  // namespace loom
