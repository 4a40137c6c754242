// PointNet classification (Qi et al. 2017) as fxia22/pointnet.pytorch builds
// it (PointNetCls with feature_transform=True): the same layers, layer names
// and parameter shapes, so the parameter count matches (3,471,473 at 40
// classes).
//
//   Model m;
//   Sym points = m.input("image", {8, 3, 1024});  // [B, 3, N]
//   PointNetResult r = PointNetCls(m, points, PointNetOptions{});
//   loss = cross_entropy(r.logits, labels) + r.regularizer
//
// Layers (fxia22's module names): feat/stn (STN3d: conv1..3 + bn1..3, max
// over points, fc1-bn4, fc2-bn5, fc3 -> 3x3 + identity), feat/conv1-bn1,
// feat/fstn (STNkd, k=64, the same with fc3 -> 64x64), feat/conv2-bn2,
// feat/conv3-bn3 (no ReLU), max over points; fc1-bn1-ReLU,
// fc2-dropout-bn2-ReLU, fc3. Convolutions are 1-wide Conv1d with bias.
// fxia22 ends with log_softmax; the logits here are fc3's output (the
// cross-entropy of either is the same).
#pragma once

#include <cstdint>
#include <string>

#include "graph/model.h"

namespace loom::models {

struct PointNetOptions {
  int64_t num_classes = 40;
  double dropout = 0.3;                    // before the second classifier BatchNorm
  bool feature_transform = true;           // the 64x64 STNkd and its regularizer
  double regularizer_weight = 0.001;       // fxia22's train_classification.py
};

struct PointNetResult {
  Sym logits;       // [B, num_classes]
  // weight * mean over the batch of ||I - A A^T||_F^2 for the 64x64 feature
  // transform A (fxia22's feature_transform_regularizer); invalid without
  // feature_transform.
  Sym regularizer;
};

// x [B, 3, N] points. `name` (optional) scopes every layer.
PointNetResult PointNetCls(Model& m, Sym x, const PointNetOptions& o = {}, const std::string& name = "");

}  // namespace loom::models
