// Inception-v3 (Szegedy et al. 2015, "Rethinking the Inception Architecture")
// exactly as torchvision.models.inception_v3 builds it (Inception3 with
// aux_logits=True, transform_input=False): the same modules, layer names,
// parameter shapes and initialisation, so the parameter count at 1000 classes
// is torchvision's 27,161,264 (23,834,568 without the auxiliary head).
//
//   Model m;
//   Sym x = m.input("image", {8, 3, 299, 299});
//   StatusOr<InceptionResult> r = InceptionV3(m, x, InceptionOptions{});
//   loss = cross_entropy(r->logits, labels) + 0.4 * cross_entropy(r->aux_logits, labels)
//
// Layers (torchvision's names; every conv is a BasicConv2d "<name>/conv"
// without bias + "<name>/bn" BatchNorm eps 0.001 + ReLU): Conv2d_1a_3x3 (/2),
// Conv2d_2a_3x3, Conv2d_2b_3x3 (pad 1), maxpool1 (3x3/2), Conv2d_3b_1x1,
// Conv2d_4a_3x3, maxpool2; Mixed_5b..5d (InceptionA: branch1x1, branch5x5_1/2,
// branch3x3dbl_1..3, branch_pool after a 3x3/1 pad-1 average pool that counts
// the padding, F.avg_pool2d's default), Mixed_6a (InceptionB), Mixed_6b..6e
// (InceptionC, channels_7x7 128, 160, 160, 192), AuxLogits (InceptionAux on
// Mixed_6e: 5x5/3 average pool, conv0, conv1, adaptive 1x1 pool, fc),
// Mixed_7a (InceptionD), Mixed_7b, 7c (InceptionE), avgpool (adaptive 1x1),
// dropout, fc.
//
// Initialisation: torchvision draws conv and Linear weights from
// trunc_normal_(std=0.1, a=-2, b=2) (std 0.01 for AuxLogits/conv1, 0.001 for
// AuxLogits/fc). loom has no truncated-normal initializer, so the weights are
// N(0, std), the closest existing one; the bounds +-2 are absolute, 20 or more
// standard deviations, so the truncation practically never applies and the
// distributions agree. BatchNorm starts at weight 1, bias 0; the Linear biases
// keep nn.Linear's default U(-1/sqrt(in), 1/sqrt(in)).
//
// The auxiliary classifier, as in torchvision's forward, runs in training
// mode only (m.training()); in eval mode it is not built, so the eval graph
// has the 23,834,568 parameters of the main network. It needs the 17x17
// Mixed_6e map of inputs >= 299x299 (its 5x5/3 pool and 5x5 conv shrink that
// to 1x1); the main network alone needs >= 75x75, torchvision's minimum.
// Training with the head needs batch >= 2 at 299x299: its last BatchNorm
// would see one value per channel, an error here as in torchvision.
//
// width_mult is loom's own reduction for tests (torchvision has none): every
// convolution's output channels are round(c * width_mult), at least 1.
#pragma once

#include <cstdint>
#include <string>

#include "graph/model.h"

namespace loom::models {

// The smallest input side torchvision accepts, and the smallest with which
// the auxiliary head can run.
constexpr int64_t kInceptionMinSize = 75;
constexpr int64_t kInceptionAuxMinSize = 299;

struct InceptionOptions {
  int64_t num_classes = 1000;
  bool aux_logits = true;   // the auxiliary classifier on Mixed_6e (training mode only)
  double dropout = 0.5;     // before fc
  double width_mult = 1.0;  // loom's reduction: scales every conv's output channels
};

struct InceptionResult {
  Sym logits;      // [B, num_classes]
  Sym aux_logits;  // [B, num_classes] from AuxLogits; invalid when not built (eval mode, aux_logits off)
};

// x [B, C, H, W] -> logits (and aux logits in training mode). Errors (bad
// options, images smaller than 75x75, or than 299x299 when the auxiliary
// head runs) name the argument or the size. `name` (optional) scopes every
// layer.
StatusOr<InceptionResult> InceptionV3(Model& m, Sym x, const InceptionOptions& o = {}, const std::string& name = "");

}  // namespace loom::models
