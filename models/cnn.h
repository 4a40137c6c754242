// A small CNN for 28x28 / 32x32 images: per stage conv3x3 (padding 1) ->
// BatchNorm -> ReLU -> 2x2 max-pool, then Linear + ReLU, dropout, and a
// Linear classifier.
#pragma once

#include <vector>

#include "graph/model.h"

namespace loom::models {

struct CnnOptions {
  std::vector<int64_t> channels = {32, 64};
  int64_t hidden = 128;
  double dropout = 0.25;
  int64_t num_classes = 10;
};

// images [N, C, H, W] -> logits [N, num_classes]. Layers "stage<i>/conv",
// "stage<i>/bn", "fc", "classifier".
Sym Cnn(Model& m, Sym images, const CnnOptions& opts = {});

}  // namespace loom::models
