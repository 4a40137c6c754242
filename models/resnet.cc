#include "models/resnet.h"

#include <cmath>
#include <optional>

namespace loom::models {

// Parameter counts, derived per block (w = planes of the stage, in = input
// channels; convolutions have no bias, each BatchNorm has 2*C parameters):
//   BasicBlock:  9*in*w + 2w + 9*w*w + 2w  [+ in*w + 2w downsample]
//   Bottleneck:  in*w + 2w + 9*w*w + 2w + w*4w + 8w  [+ in*4w + 8w downsample]
// resnet18 (1000 classes): stem 3*64*49 + 128 = 9,536; layer1 2*(73,728+256)
//   = 147,968; layer2 230,144 + 295,424 = 525,568; layer3 919,040 +
//   1,180,672 = 2,099,712; layer4 3,673,088 + 4,720,640 = 8,393,728;
//   fc 512*1000 + 1000 = 513,000; total 11,689,512 (torchvision's number).
// resnet101 (1000 classes): stem 9,536; layer1 first 75,008 (incl.
//   downsample 64*256 + 512) + 2*70,400 = 215,808; layer2 first 379,392 +
//   3*280,064 = 1,219,584; layer3 first 1,512,448 + 22*1,117,184 =
//   26,090,496; layer4 first 6,039,552 + 2*4,462,592 = 14,964,736;
//   fc 2048*1000 + 1000 = 2,049,000; total 44,549,160 (torchvision's number).
// models/resnet_test.cc checks both against the built graphs.

namespace {

// torchvision initialises every conv with kaiming_normal_(mode="fan_out",
// nonlinearity="relu"): N(0, sqrt(2 / (out * kh * kw))). BatchNorm starts at
// weight 1, bias 0 (the model API's default) and fc keeps nn.Linear's default.
Sym Conv(Model& m, Sym x, int64_t out, int64_t k, int64_t stride, int64_t pad, const std::string& name) {
  if (!m.status().ok() || !x.valid()) return {};
  const int64_t in = m.shape(x)[1];
  const double stddev = std::sqrt(2.0 / static_cast<double>(out * k * k));
  // The same names as Model::conv2d ("<name>/weight" under the current scope).
  Sym w = m.parameter(name + "/weight", {out, in, k, k}, InitNormal(0.0, stddev));
  AttrMap a{{"stride", std::vector<int64_t>{stride, stride}},
            {"padding", std::vector<int64_t>{pad, pad}},
            {"dilation", std::vector<int64_t>{1, 1}},
            {"groups", int64_t{1}}};
  return m.op1("Conv2d", {x, w}, a, name);
}

Sym ConvBn(Model& m, Sym x, int64_t out, int64_t k, int64_t stride, int64_t pad, const std::string& conv,
           const std::string& bn) {
  return m.batch_norm(Conv(m, x, out, k, stride, pad, conv), {}, bn);
}

int64_t Expansion(ResNetBlock b) { return b == ResNetBlock::kBottleneck ? 4 : 1; }

// One block, scoped "<stage>/<index>" by the caller.
Sym Block(Model& m, Sym x, ResNetBlock kind, int64_t planes, int64_t stride) {
  const int64_t in = m.status().ok() && x.valid() ? m.shape(x)[1] : 0;
  const int64_t out = planes * Expansion(kind);
  Sym h;
  if (kind == ResNetBlock::kBasic) {
    h = m.relu(ConvBn(m, x, planes, 3, stride, 1, "conv1", "bn1"));
    h = ConvBn(m, h, planes, 3, 1, 1, "conv2", "bn2");
  } else {
    h = m.relu(ConvBn(m, x, planes, 1, 1, 0, "conv1", "bn1"));
    h = m.relu(ConvBn(m, h, planes, 3, stride, 1, "conv2", "bn2"));  // v1.5: the stride sits on the 3x3
    h = ConvBn(m, h, out, 1, 1, 0, "conv3", "bn3");
  }
  Sym identity = x;
  if (stride != 1 || in != out) {
    auto ds = m.scope("downsample");
    identity = ConvBn(m, x, out, 1, stride, 0, "0", "1");
  }
  return m.relu(m.add(h, identity));
}

}  // namespace

ResNetOptions ResNet18Options(int64_t num_classes) {
  ResNetOptions o;
  o.block = ResNetBlock::kBasic;
  o.layers = {2, 2, 2, 2};
  o.num_classes = num_classes;
  return o;
}

ResNetOptions ResNet101Options(int64_t num_classes) {
  ResNetOptions o;
  o.block = ResNetBlock::kBottleneck;
  o.layers = {3, 4, 23, 3};
  o.num_classes = num_classes;
  return o;
}

StatusOr<ResNetStem> ParseResNetStem(const std::string& stem) {
  if (stem == "imagenet") return ResNetStem::kImageNet;
  if (stem == "cifar") return ResNetStem::kCifar;
  return InvalidArgument("argument stem: '", Excerpt(stem), "' is not a ResNet stem (imagenet, cifar)");
}

Sym ResNet(Model& m, Sym x, const ResNetOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  Sym h;
  if (o.stem == ResNetStem::kImageNet) {
    h = m.relu(ConvBn(m, x, o.width, 7, 2, 3, "conv1", "bn1"));
    Pool2dOptions pool;
    pool.stride = {2, 2};
    pool.padding = {1, 1};
    h = m.max_pool2d(h, {3, 3}, pool, "maxpool");
  } else {
    h = m.relu(ConvBn(m, x, o.width, 3, 1, 1, "conv1", "bn1"));
  }
  for (size_t i = 0; i < o.layers.size(); ++i) {
    auto stage = m.scope("layer" + std::to_string(i + 1));
    const int64_t planes = o.width << i;
    for (int64_t j = 0; j < o.layers[i]; ++j) {
      auto block = m.scope(std::to_string(j));
      h = Block(m, h, o.block, planes, j == 0 && i > 0 ? 2 : 1);
    }
  }
  h = m.flatten(m.adaptive_avg_pool2d(h, {1, 1}, "avgpool"), 1);
  return m.linear(h, o.num_classes, {}, "fc");
}

}  // namespace loom::models
