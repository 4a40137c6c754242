// ResNet (He et al. 2015) exactly as torchvision.models builds it: the same
// layers, layer names, parameter shapes and initialisation, so parameter
// counts and checkpoint layouts match torchvision's resnet18/resnet101.
//
//   Model m;
//   Sym x = m.input("image", {8, 3, 224, 224});
//   Sym logits = ResNet(m, x, ResNet101Options(/*num_classes=*/1000));
//
// Layers: conv1, bn1, [maxpool], layer1..layer4 (blocks "layer<i>/<j>" with
// conv1/bn1, conv2/bn2[, conv3/bn3] and, where the shape changes,
// downsample/0 (1x1 conv) and downsample/1 (BatchNorm)), avgpool, fc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/model.h"

namespace loom::models {

enum class ResNetBlock {
  kBasic,       // two 3x3 convs (resnet18/34), expansion 1
  kBottleneck,  // 1x1, 3x3 (carries the stride, "ResNet v1.5"), 1x1; expansion 4
};

enum class ResNetStem {
  kImageNet,  // conv 7x7 stride 2 pad 3, BN, ReLU, max-pool 3x3 stride 2 pad 1
  kCifar,     // conv 3x3 stride 1 pad 1, BN, ReLU (no max-pool), for 28-32 px images
};

struct ResNetOptions {
  ResNetBlock block = ResNetBlock::kBasic;
  std::vector<int64_t> layers = {2, 2, 2, 2};  // blocks per stage
  // Base width: stage i has width * 2^i planes (torchvision: 64). Not
  // torchvision's width_per_group; this scales every layer.
  int64_t width = 64;
  ResNetStem stem = ResNetStem::kImageNet;
  int64_t num_classes = 1000;
};

ResNetOptions ResNet18Options(int64_t num_classes = 1000);   // BasicBlock, 2,2,2,2
ResNetOptions ResNet101Options(int64_t num_classes = 1000);  // Bottleneck, 3,4,23,3

// "imagenet" | "cifar"; anything else is an InvalidArgument naming the choices.
StatusOr<ResNetStem> ParseResNetStem(const std::string& stem);

// x [B, C, H, W] -> logits [B, num_classes]. `name` (optional) scopes every
// layer ("<name>/conv1", ...).
Sym ResNet(Model& m, Sym x, const ResNetOptions& o, const std::string& name = "");

}  // namespace loom::models
