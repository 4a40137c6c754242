#include "models/vgg.h"

#include <cmath>
#include <optional>

#include "models/width.h"

namespace loom::models {

// Parameter count of vgg16 at 1000 classes (a conv 3x3 has out*in*9 weights
// + out biases, a Linear in*out + out):
//   3->64 1,792; 64->64 36,928; 64->128 73,856; 128->128 147,584;
//   128->256 295,168; 2 x 256->256 590,080; 256->512 1,180,160;
//   5 x 512->512 2,359,808                       features: 14,714,688
//   classifier/0 25088*4096 + 4096 = 102,764,544  (25088 = 512*7*7)
//   classifier/3 4096*4096 + 4096  =  16,781,312
//   classifier/6 4096*1000 + 1000  =   4,097,000  classifier: 123,642,856
//   total 138,357,544 (torchvision's vgg16).
// models/classic_test.cc checks it against the built graph.

namespace {

// torchvision's VGG initialises convs with kaiming_normal_(mode="fan_out",
// nonlinearity="relu"), N(0, sqrt(2 / (out * 3 * 3))), and zero biases.
Sym Conv(Model& m, Sym x, int64_t out, const std::string& name) {
  if (!m.status().ok() || !x.valid()) return {};
  if (m.shape(x).rank() != 4) {
    // Model::conv2d reports the bad input with the layer's name.
    return m.conv2d(x, out, {3, 3}, {}, name);
  }
  const int64_t in = m.shape(x)[1];
  const double stddev = std::sqrt(2.0 / static_cast<double>(out * 9));
  // The same names as Model::conv2d ("<name>/weight", "<name>/bias" under the current scope).
  Sym w = m.parameter(name + "/weight", {out, in, 3, 3}, InitNormal(0.0, stddev));
  Sym b = m.parameter(name + "/bias", {out}, InitZeros());
  AttrMap a{{"stride", std::vector<int64_t>{1, 1}},
            {"padding", std::vector<int64_t>{1, 1}},
            {"dilation", std::vector<int64_t>{1, 1}},
            {"groups", int64_t{1}}};
  return m.op1("Conv2d", {x, w, b}, a, name);
}

// Linear layers start at N(0, 0.01) with zero biases (torchvision's VGG).
Sym Linear(Model& m, Sym x, int64_t out, const std::string& name) {
  if (!m.status().ok() || !x.valid()) return {};
  const int64_t in = m.shape(x).rank() ? m.shape(x).dim(-1) : 0;
  Sym w = m.parameter(name + "/weight", {out, in}, InitNormal(0.0, 0.01));
  Sym b = m.parameter(name + "/bias", {out}, InitZeros());
  return m.op1("Linear", {x, w, b}, {}, name);
}

// A ReLU under its torchvision index (Model::relu names it "relu").
Sym Relu(Model& m, Sym x, const std::string& name) {
  return m.op1("ReLU", {x}, {}, name);
}

}  // namespace

VggOptions Vgg16Options(int64_t num_classes) {
  VggOptions o;
  const int64_t M = kVggMaxPool;
  o.config = {64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512, 512, 512, M};
  o.num_classes = num_classes;
  return o;
}

Sym Vgg(Model& m, Sym x, const VggOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  Sym h = x;
  {
    auto features = m.scope("features");
    int64_t index = 0;  // torchvision's nn.Sequential index
    for (int64_t c : o.config) {
      if (c == kVggMaxPool) {
        Pool2dOptions pool;
        pool.stride = {2, 2};
        h = m.max_pool2d(h, {2, 2}, pool, std::to_string(index++));
      } else {
        h = Conv(m, h, ScaledChannels(c, o.width_mult), std::to_string(index++));
        h = Relu(m, h, std::to_string(index++));
      }
    }
  }
  h = m.flatten(m.adaptive_avg_pool2d(h, {7, 7}, "avgpool"), 1);
  auto classifier = m.scope("classifier");
  h = m.dropout(Relu(m, Linear(m, h, o.hidden, "0"), "1"), o.dropout, "2");
  h = m.dropout(Relu(m, Linear(m, h, o.hidden, "3"), "4"), o.dropout, "5");
  return Linear(m, h, o.num_classes, "6");
}

}  // namespace loom::models
