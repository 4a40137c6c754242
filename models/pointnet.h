// PointNet (Qi et al. 2017) as fxia22/pointnet.pytorch builds it, with
// feature_transform=True: the classifier PointNetCls and the per-point
// segmenter PointNetDenseCls, both on one encoder PointNetfeat. The same
// layers, layer names and parameter shapes as pointnet/model.py, so the
// parameter counts match: PointNetCls(k=40) 3,471,473; PointNetDenseCls
// 3,527,629 at k = 4 parts and 3,533,563 at k = 50 (ShapeNet-part's part
// total), counted by the PyTorch rebuild in bench/reference_models.py
// (`python3 bench/reference_models.py pointnet_seg`).
//
//   Model m;
//   Sym points = m.input("input", {8, 3, 1024});  // [B, 3, N]
//   PointNetResult r = PointNetCls(m, points, PointNetOptions{});
//   loss = cross_entropy(r.logits, labels) + r.regularizer
//
// Encoder (fxia22's PointNetfeat, module "feat"): stn (STN3d: conv1..3 +
// bn1..3, max over points, fc1-bn4, fc2-bn5, fc3 -> 3x3 + identity),
// conv1-bn1, fstn (STNkd, k=64, the same with fc3 -> 64x64), conv2-bn2,
// conv3-bn3 (no ReLU), max over points: the 1024 global features; for
// segmentation those repeated at every point and followed by the 64 point
// features after fstn (1088 per point).
// PointNetCls: fc1-bn1-ReLU, fc2-dropout-bn2-ReLU, fc3.
// PointNetDenseCls: conv1..3 (1088 -> 512 -> 256 -> 128) each with BN and
// ReLU, conv4 -> k, per point.
// Convolutions are 1-wide Conv1d with bias. fxia22 ends with log_softmax;
// the logits here are the last layer's output (the cross-entropy of either
// is the same).
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

struct PointNetSegOptions {
  int64_t num_parts = 4;                   // fxia22's default category, Chair, has 4
  bool feature_transform = true;           // the 64x64 STNkd and its regularizer
  double regularizer_weight = 0.001;       // fxia22's train_segmentation.py
};

struct PointNetResult {
  Sym logits;       // PointNetCls [B, num_classes]; PointNetDenseCls [B, N, num_parts]
  // weight * mean over the batch of ||I - A A^T||_F^2 for the 64x64 feature
  // transform A (fxia22's feature_transform_regularizer); invalid without
  // feature_transform.
  Sym regularizer;
};

// The encoder's outputs.
struct PointNetFeatures {
  Sym global;       // [B, 1024]: conv3-bn3 maxed over the points
  Sym per_point;    // [B, 1088, N]: global repeated, then the 64 point features; only when asked for
  Sym regularizer;  // as in PointNetResult
};

// fxia22's PointNetfeat under the scope "feat": x [B, 3, N] points.
// per_point = global_feat=False.
PointNetFeatures PointNetFeat(Model& m, Sym x, bool feature_transform, double regularizer_weight, bool per_point);

// x [B, 3, N] points. `name` (optional) scopes every layer.
PointNetResult PointNetCls(Model& m, Sym x, const PointNetOptions& o = {}, const std::string& name = "");
PointNetResult PointNetDenseCls(Model& m, Sym x, const PointNetSegOptions& o = {}, const std::string& name = "");

}  // namespace loom::models
