// AlexNet (Krizhevsky 2014, "one weird trick") exactly as torchvision.models
// builds it: the same layers, layer names, parameter shapes and
// initialisation (PyTorch's defaults), so the parameter count (61,100,840 at
// 1000 classes) and checkpoint layout match torchvision's alexnet.
//
//   Model m;
//   Sym x = m.input("image", {8, 3, 224, 224});
//   Sym logits = AlexNet(m, x, AlexNetOptions{/*num_classes=*/1000});
//
// Layers (torchvision's nn.Sequential indices): features/0 conv 64 11x11/4
// pad 2, features/1 ReLU, features/2 max-pool 3x3/2, features/3 conv 192 5x5
// pad 2, features/4 ReLU, features/5 max-pool, features/6 conv 384 3x3 pad 1,
// features/8 conv 256, features/10 conv 256 (each followed by a ReLU),
// features/12 max-pool, avgpool (adaptive 6x6), flatten, classifier/0
// dropout, classifier/1 Linear 9216->4096, classifier/2 ReLU, classifier/3
// dropout, classifier/4 Linear 4096->4096, classifier/5 ReLU, classifier/6
// Linear 4096->num_classes. Convolutions have biases. Inputs must be at
// least 63x63 (the last max-pool needs a 3x3 map). width_mult and hidden
// shrink the model for tests (the layers and their names stay).
#pragma once

#include <cstdint>
#include <string>

#include "graph/model.h"

namespace loom::models {

struct AlexNetOptions {
  int64_t num_classes = 1000;
  double dropout = 0.5;  // both classifier dropouts (torchvision's `dropout`)
  // loom's reductions (torchvision's model at the defaults): every conv's
  // output channels times width_mult (ScaledChannels), and the two hidden
  // Linear layers' width.
  double width_mult = 1.0;
  int64_t hidden = 4096;
};

// x [B, C, H, W] -> logits [B, num_classes]. `name` (optional) scopes every
// layer ("<name>/features/0", ...).
Sym AlexNet(Model& m, Sym x, const AlexNetOptions& o, const std::string& name = "");

}  // namespace loom::models
