// The model zoo: models by name, with string arguments (from config files
// and `--set key=value`), each built with the C++ model API. Unknown names
// and arguments are errors that list what exists.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/model.h"

namespace loom::models {

// A model's arguments: typed reads with defaults, and a check that every
// given argument was read (so a typo is an error, not silently ignored).
class ModelArgs {
 public:
  ModelArgs() = default;
  explicit ModelArgs(std::map<std::string, std::string> values) : values_(std::move(values)) {}

  StatusOr<int64_t> Int(const std::string& key, int64_t def);
  std::string Str(const std::string& key, const std::string& def);
  StatusOr<double> Float(const std::string& key, double def);
  StatusOr<std::vector<int64_t>> Ints(const std::string& key, const std::vector<int64_t>& def);  // "256,128"
  // Fails naming the first argument no Int/Float/Ints call asked for.
  Status CheckAllUsed(const std::string& model) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> used_;
};

// What a model reads; the data must match (errors say which data fits).
enum class InputKind {
  kFeatures,  // f32 [B, ...]: images [C, H, W], point clouds [3, N]
  kTokens,    // i64 token ids [B, T]
};
const char* InputKindName(InputKind kind);  // "f32 features" | "token ids"

// The data a model is built for, per example (no batch axis).
struct DataSpec {
  Shape input;                      // [1, 28, 28], [3, 1024], [T]
  DType input_dtype = DType::kF32;  // kI64 tokens; anything else: features in the model's float type
  Shape target;                     // [] one class, [T] tokens, [N] a label per point
  int64_t num_classes = 10;         // classes, or the vocabulary size
};

// A builder may set this scalar output; BuildSupervised adds it to the loss
// (PointNet's feature-transform regularizer, Inception-v3's auxiliary
// classifier loss).
constexpr const char* kAuxLossOutput = "aux_loss";

// What a builder gets: the graph inputs and the number of classes.
struct ModelInputs {
  Sym input;   // [B, input...]
  Sym target;  // [B, target...] i64; read only by models fed their targets (NMT's teacher forcing)
  int64_t num_classes = 0;
};

struct ZooEntry {
  std::string name;
  std::string description;
  InputKind input = InputKind::kFeatures;
  // Returns logits [B, target..., num_classes]: one row of class scores per
  // target entry.
  std::function<StatusOr<Sym>(Model&, const ModelInputs&, ModelArgs&)> build;
};

const std::vector<ZooEntry>& Zoo();
StatusOr<const ZooEntry*> FindModel(const std::string& name);  // error lists the zoo

// Builds a zoo model for training or evaluation: the graph inputs "input"
// [batch, data.input...] and "target" [batch, data.target...] (i64), the
// outputs "logits" [batch, data.target..., classes] and "loss": the mean
// cross-entropy over the target entries (entries equal to kIgnoreTarget are
// not scored) plus the model's kAuxLossOutput when its builder sets one.
// Errors name the model and say when the data does not fit it.
constexpr int64_t kIgnoreTarget = -100;
Status BuildSupervised(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const DataSpec& data, int64_t batch);

// BuildSupervised for f32 examples of `input_shape` with one class each.
Status BuildClassifier(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const Shape& input_shape, int64_t batch, int64_t num_classes);

}  // namespace loom::models
