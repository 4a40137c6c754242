// Multi-layer perceptron for image classification: flatten, then
// Linear + ReLU per hidden width, then a Linear classifier.
#pragma once

#include <vector>

#include "graph/model.h"

namespace loom::models {

struct MlpOptions {
  std::vector<int64_t> hidden = {256, 128};
  int64_t num_classes = 10;
  double dropout = 0.0;  // after each hidden layer, when > 0
};

// images [N, ...] -> logits [N, num_classes]. Layers "fc1", "fc2", ..., "classifier".
Sym Mlp(Model& m, Sym images, const MlpOptions& opts = {});

}  // namespace loom::models
