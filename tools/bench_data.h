// What the benchmarks and profiles feed a config's training step
// (loom bench, loom profile): the config's real first batch and random
// values for the step's other inputs.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"
#include "graph/ir.h"
#include "models/zoo.h"
#include "train/config/train_config.h"

namespace loom::tools {

// Feeds for every Input of `graph`: those in `data` (a real batch) as
// given, the rest random (f32 uniform in [-1, 1], i64 in [0, 10): only the
// kernel benchmarks' own graphs have such inputs); "lr" 1e-3, "step" 1.
std::map<std::string, Tensor> RandomFeeds(const Graph& graph, const std::map<std::string, Tensor>& data = {});

// What a config's model is benchmarked on: the spec of its training data
// (as loom train builds the model) and the first batch of that data, as loom
// train's loader gives it (normalised, augmented; in order, not shuffled),
// fed as "input" and "target" to every timed step. Real data keeps every
// feed valid: token ids below the vocabulary, targets below the classes.
struct BenchData {
  models::DataSpec spec;
  std::map<std::string, Tensor> feeds;  // "input", "target"
};

StatusOr<BenchData> LoadBenchData(const proto::TrainConfig& config);

}  // namespace loom::tools
