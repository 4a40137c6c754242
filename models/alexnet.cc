#include "models/alexnet.h"

#include <optional>

#include "models/width.h"

namespace loom::models {

// Parameter count at 1000 classes (a conv has out*in*k*k weights + out
// biases, a Linear in*out + out):
//   features/0  64*3*11*11 + 64     =     23,296
//   features/3  192*64*5*5 + 192    =    307,392
//   features/6  384*192*3*3 + 384   =    663,936
//   features/8  256*384*3*3 + 256   =    884,992
//   features/10 256*256*3*3 + 256   =    590,080   features: 2,469,696
//   classifier/1 9216*4096 + 4096   = 37,752,832   (9216 = 256*6*6)
//   classifier/4 4096*4096 + 4096   = 16,781,312
//   classifier/6 4096*1000 + 1000   =  4,097,000   classifier: 58,631,144
//   total 61,100,840 (torchvision's alexnet).
// models/classic_test.cc checks it against the built graph.

namespace {

// torchvision's AlexNet keeps PyTorch's default initialisation, which is
// what Model::conv2d and Model::linear use.
Sym Conv(Model& m, Sym x, int64_t out, int64_t k, int64_t stride, int64_t pad, const std::string& name) {
  Conv2dOptions c;
  c.stride = {stride, stride};
  c.padding = {pad, pad};
  return m.conv2d(x, out, {k, k}, c, name);
}

// A ReLU under its torchvision index (Model::relu names it "relu").
Sym Relu(Model& m, Sym x, const std::string& name) {
  return m.op1("ReLU", {x}, {}, name);
}

Sym MaxPool(Model& m, Sym x, const std::string& name) {
  Pool2dOptions pool;
  pool.stride = {2, 2};
  return m.max_pool2d(x, {3, 3}, pool, name);
}

}  // namespace

Sym AlexNet(Model& m, Sym x, const AlexNetOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  auto c = [&](int64_t channels) { return ScaledChannels(channels, o.width_mult); };
  Sym h = x;
  {
    auto features = m.scope("features");
    h = MaxPool(m, Relu(m, Conv(m, h, c(64), 11, 4, 2, "0"), "1"), "2");
    h = MaxPool(m, Relu(m, Conv(m, h, c(192), 5, 1, 2, "3"), "4"), "5");
    h = Relu(m, Conv(m, h, c(384), 3, 1, 1, "6"), "7");
    h = Relu(m, Conv(m, h, c(256), 3, 1, 1, "8"), "9");
    h = MaxPool(m, Relu(m, Conv(m, h, c(256), 3, 1, 1, "10"), "11"), "12");
  }
  h = m.flatten(m.adaptive_avg_pool2d(h, {6, 6}, "avgpool"), 1);
  auto classifier = m.scope("classifier");
  h = Relu(m, m.linear(m.dropout(h, o.dropout, "0"), o.hidden, {}, "1"), "2");
  h = Relu(m, m.linear(m.dropout(h, o.dropout, "3"), o.hidden, {}, "4"), "5");
  return m.linear(h, o.num_classes, {}, "6");
}

}  // namespace loom::models
