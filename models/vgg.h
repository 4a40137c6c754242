// VGG (Simonyan & Zisserman 2014) exactly as torchvision.models builds it,
// without BatchNorm: the same layers, layer names, parameter shapes and
// initialisation, so vgg16's parameter count (138,357,544 at 1000 classes)
// and checkpoint layout match torchvision's vgg16.
//
//   Model m;
//   Sym x = m.input("image", {8, 3, 224, 224});
//   Sym logits = Vgg(m, x, Vgg16Options(/*num_classes=*/1000));
//
// Layers (torchvision's nn.Sequential indices): features/<i>, one index per
// conv 3x3 pad 1 (with bias), per ReLU and per max-pool 2x2/2 of the
// configuration (vgg16's convs: features/0, 2, 5, 7, 10, 12, 14, 17, 19, 21,
// 24, 26, 28; max-pools 4, 9, 16, 23, 30), avgpool (adaptive 7x7), flatten,
// classifier/0 Linear 25088->4096, classifier/1 ReLU, classifier/2 dropout,
// classifier/3 Linear 4096->4096, classifier/4 ReLU, classifier/5 dropout,
// classifier/6 Linear 4096->num_classes. Inputs must be at least 32x32 (five
// 2x2 max-pools); below 224 the adaptive pool repeats the last map up to 7x7.
// width_mult and hidden shrink the model for tests (the layers and their
// names stay).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/model.h"

namespace loom::models {

// In VggOptions::config: a 2x2 stride-2 max-pool (torchvision's "M").
inline constexpr int64_t kVggMaxPool = 0;

struct VggOptions {
  // Conv widths in order, kVggMaxPool for a max-pool (torchvision's cfgs).
  std::vector<int64_t> config;
  int64_t num_classes = 1000;
  double dropout = 0.5;  // both classifier dropouts (torchvision's `dropout`)
  // loom's reductions (torchvision's model at the defaults): every conv's
  // width times width_mult (ScaledChannels), and the two hidden Linear
  // layers' width.
  double width_mult = 1.0;
  int64_t hidden = 4096;
};

// Configuration "D": 64,64,M,128,128,M,256,256,256,M,512,512,512,M,512,512,512,M.
VggOptions Vgg16Options(int64_t num_classes = 1000);

// x [B, C, H, W] -> logits [B, num_classes]. `name` (optional) scopes every
// layer ("<name>/features/0", ...).
Sym Vgg(Model& m, Sym x, const VggOptions& o, const std::string& name = "");

}  // namespace loom::models
