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

// What the task feeds and how it is scored.
enum class Task { kClassification };

struct ZooEntry {
  std::string name;
  std::string description;
  Task task = Task::kClassification;
  // input [B, ...] -> logits [B, classes]. `num_classes` comes from the data.
  std::function<StatusOr<Sym>(Model&, Sym input, int64_t num_classes, ModelArgs&)> build;
};

const std::vector<ZooEntry>& Zoo();
StatusOr<const ZooEntry*> FindModel(const std::string& name);  // error lists the zoo

// Builds a classifier graph with the inputs "image" [batch, input_shape...]
// and "label" [batch] and the outputs "logits" and "loss" (cross-entropy,
// plus the model's "regularizer" output when its builder sets one, as
// PointNet's feature-transform regularizer).
Status BuildClassifier(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const Shape& input_shape, int64_t batch, int64_t num_classes);

}  // namespace loom::models
