// MobileNetV2 (Sandler et al. 2018) and MobileNetV3-Small/Large (Howard et
// al. 2019) exactly as torchvision.models builds them: the same layers,
// layer names, parameter shapes and initialisation, so parameter counts and
// checkpoint layouts match torchvision's mobilenet_v2 (3,504,872 parameters
// at 1000 classes), mobilenet_v3_small (2,542,856) and mobilenet_v3_large
// (5,483,032).
//
//   Model m;
//   Sym x = m.input("image", {8, 3, 224, 224});
//   Sym logits = MobileNetV3(m, x, MobileNetV3Size::kLarge, MobileNetOptions{});
//
// Layers (torchvision's nn.Sequential indices):
//   V2: features/0/{0 conv,1 bn} (stem, ReLU6); features/1..17 inverted
//       residuals "features/<i>/conv/..." ([0/{0,1} 1x1 expand,] <j>/{0,1}
//       depthwise 3x3, <j+1> 1x1 project conv, <j+2> its BatchNorm);
//       features/18/{0,1} (1x1 conv to the last channel, ReLU6); classifier/0
//       dropout, classifier/1 linear.
//   V3: features/0/{0,1} (stem, Hardswish); features/1..N inverted residuals
//       "features/<i>/block/<k>/..." ([1x1 expand,] depthwise, [SE with fc1,
//       fc2 (1x1 convs with bias),] 1x1 project, each conv-BN "<k>/0",
//       "<k>/1"); the last features/<N+1>/{0,1} (1x1 conv to 6x channels,
//       Hardswish); classifier/0 linear, Hardswish, classifier/2 dropout,
//       classifier/3 linear.
// Convolutions have no bias (except the SE's fc1/fc2). BatchNorm: PyTorch's
// defaults for V2, eps 0.001 and momentum 0.01 for V3.
#pragma once

#include <cstdint>
#include <string>

#include "graph/model.h"

namespace loom::models {

struct MobileNetOptions {
  int64_t num_classes = 1000;
  double dropout = 0.2;     // before the last linear layer
  double width_mult = 1.0;  // scales every channel count (rounded to multiples of 8)
};

enum class MobileNetV3Size { kSmall, kLarge };

// torchvision's _make_divisible: v rounded to the nearest multiple of
// `divisor` (at least `divisor`), never more than 10% below v.
int64_t MakeDivisible(double v, int64_t divisor = 8);

// x [B, C, H, W] -> logits [B, num_classes]. `name` (optional) scopes every
// layer ("<name>/features/0/0", ...).
Sym MobileNetV2(Model& m, Sym x, const MobileNetOptions& o = {}, const std::string& name = "");
Sym MobileNetV3(Model& m, Sym x, MobileNetV3Size size, const MobileNetOptions& o = {}, const std::string& name = "");

}  // namespace loom::models
