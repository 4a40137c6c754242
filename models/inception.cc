#include "models/inception.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "models/width.h"

namespace loom::models {

// Parameter counts at 1000 classes and 3 input channels (a BasicConv2d with
// in -> out channels and a kh x kw kernel has in*out*kh*kw + 2*out; the
// BatchNorm running statistics are buffers, not parameters):
//   stem (Conv2d_1a_3x3 .. Conv2d_4a_3x3)   172,672
//   Mixed_5b, 5c, 5d (InceptionA)          255,904 + 277,472 + 285,152
//   Mixed_6a (InceptionB)                1,153,280
//   Mixed_6b, 6c, 6d, 6e (InceptionC)    1,297,408 + 1,691,008 * 2 + 2,141,952
//   AuxLogits (conv0, conv1, fc)         3,326,696 (fc: 768*1000 + 1000)
//   Mixed_7a (InceptionD)                1,698,304
//   Mixed_7b, 7c (InceptionE)            5,044,608 + 6,076,800
//   fc                                   2,049,000
//   total 27,161,264 (23,834,568 without AuxLogits): torchvision's numbers,
//   checked in models/inception_test.cc against the built graphs.

namespace {

// torchvision initialises every conv and linear weight with
// trunc_normal_(std, a=-2, b=2); see the header for why N(0, std) matches.
constexpr double kStddev = 0.1;

// BasicConv2d scoped `name`: "conv" (no bias), "bn" (eps 0.001), ReLU.
Sym BasicConv2d(Model& m, Sym x, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                std::vector<int64_t> padding, const std::string& name, double stddev = kStddev) {
  if (!m.status().ok() || !x.valid()) return {};
  auto s = m.scope(name);
  const int64_t in = m.shape(x)[1];
  Sym w = m.parameter("conv/weight", {out, in, kernel[0], kernel[1]}, InitNormal(0.0, stddev));
  AttrMap a{{"stride", stride}, {"padding", padding}, {"dilation", std::vector<int64_t>{1, 1}}, {"groups", int64_t{1}}};
  std::vector<Sym> conv = m.op("Conv2d", {x, w}, a, "conv");
  if (conv.empty()) return {};
  BatchNormOptions bn;
  bn.eps = 0.001;
  return m.relu(m.batch_norm(conv[0], bn, "bn"));
}

// Square kernel k, stride and padding the same in both directions.
Sym BasicConv2d(Model& m, Sym x, int64_t out, int64_t k, int64_t stride, int64_t pad, const std::string& name,
                double stddev = kStddev) {
  return BasicConv2d(m, x, out, {k, k}, {stride, stride}, {pad, pad}, name, stddev);
}

// nn.Linear with the weight drawn N(0, stddev) and PyTorch's default bias.
Sym Linear(Model& m, Sym x, int64_t out, double stddev, const std::string& name) {
  if (!m.status().ok() || !x.valid()) return {};
  const int64_t in = m.shape(x).dim(-1);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  Sym w = m.parameter(name + "/weight", {out, in}, InitNormal(0.0, stddev));
  Sym b = m.parameter(name + "/bias", {out}, InitUniform(-bound, bound));
  return m.op1("Linear", {x, w, b}, {}, name);
}

// F.avg_pool2d(x, 3, stride=1, padding=1), count_include_pad=True (its default).
Sym AvgPool3x3(Model& m, Sym x) {
  Pool2dOptions p;
  p.stride = {1, 1};
  p.padding = {1, 1};
  p.count_include_pad = true;
  return m.avg_pool2d(x, {3, 3}, p);
}

// F.max_pool2d(x, 3, stride=2) / nn.MaxPool2d(3, stride=2).
Sym MaxPool3x3s2(Model& m, Sym x, const std::string& name = "") {
  Pool2dOptions p;
  p.stride = {2, 2};
  return m.max_pool2d(x, {3, 3}, p, name);
}

// The block builders below follow torchvision's InceptionA..E and
// InceptionAux; `c` scales a channel count by width_mult.
class Blocks {
 public:
  Blocks(Model& m, double width_mult) : m_(m), width_mult_(width_mult) {}

  int64_t c(int64_t channels) const { return ScaledChannels(channels, width_mult_); }

  Sym A(Sym x, int64_t pool_features, const std::string& name) {
    auto s = m_.scope(name);
    Sym b1 = BasicConv2d(m_, x, c(64), 1, 1, 0, "branch1x1");
    Sym b5 = BasicConv2d(m_, x, c(48), 1, 1, 0, "branch5x5_1");
    b5 = BasicConv2d(m_, b5, c(64), 5, 1, 2, "branch5x5_2");
    Sym b3 = BasicConv2d(m_, x, c(64), 1, 1, 0, "branch3x3dbl_1");
    b3 = BasicConv2d(m_, b3, c(96), 3, 1, 1, "branch3x3dbl_2");
    b3 = BasicConv2d(m_, b3, c(96), 3, 1, 1, "branch3x3dbl_3");
    Sym bp = BasicConv2d(m_, AvgPool3x3(m_, x), c(pool_features), 1, 1, 0, "branch_pool");
    return m_.concat({b1, b5, b3, bp}, 1);
  }

  Sym B(Sym x, const std::string& name) {
    auto s = m_.scope(name);
    Sym b3 = BasicConv2d(m_, x, c(384), 3, 2, 0, "branch3x3");
    Sym bd = BasicConv2d(m_, x, c(64), 1, 1, 0, "branch3x3dbl_1");
    bd = BasicConv2d(m_, bd, c(96), 3, 1, 1, "branch3x3dbl_2");
    bd = BasicConv2d(m_, bd, c(96), 3, 2, 0, "branch3x3dbl_3");
    return m_.concat({b3, bd, MaxPool3x3s2(m_, x)}, 1);
  }

  Sym C(Sym x, int64_t channels_7x7, const std::string& name) {
    auto s = m_.scope(name);
    const int64_t c7 = c(channels_7x7);
    Sym b1 = BasicConv2d(m_, x, c(192), 1, 1, 0, "branch1x1");
    Sym b7 = BasicConv2d(m_, x, c7, 1, 1, 0, "branch7x7_1");
    b7 = BasicConv2d(m_, b7, c7, {1, 7}, {1, 1}, {0, 3}, "branch7x7_2");
    b7 = BasicConv2d(m_, b7, c(192), {7, 1}, {1, 1}, {3, 0}, "branch7x7_3");
    Sym bd = BasicConv2d(m_, x, c7, 1, 1, 0, "branch7x7dbl_1");
    bd = BasicConv2d(m_, bd, c7, {7, 1}, {1, 1}, {3, 0}, "branch7x7dbl_2");
    bd = BasicConv2d(m_, bd, c7, {1, 7}, {1, 1}, {0, 3}, "branch7x7dbl_3");
    bd = BasicConv2d(m_, bd, c7, {7, 1}, {1, 1}, {3, 0}, "branch7x7dbl_4");
    bd = BasicConv2d(m_, bd, c(192), {1, 7}, {1, 1}, {0, 3}, "branch7x7dbl_5");
    Sym bp = BasicConv2d(m_, AvgPool3x3(m_, x), c(192), 1, 1, 0, "branch_pool");
    return m_.concat({b1, b7, bd, bp}, 1);
  }

  Sym D(Sym x, const std::string& name) {
    auto s = m_.scope(name);
    Sym b3 = BasicConv2d(m_, x, c(192), 1, 1, 0, "branch3x3_1");
    b3 = BasicConv2d(m_, b3, c(320), 3, 2, 0, "branch3x3_2");
    Sym b7 = BasicConv2d(m_, x, c(192), 1, 1, 0, "branch7x7x3_1");
    b7 = BasicConv2d(m_, b7, c(192), {1, 7}, {1, 1}, {0, 3}, "branch7x7x3_2");
    b7 = BasicConv2d(m_, b7, c(192), {7, 1}, {1, 1}, {3, 0}, "branch7x7x3_3");
    b7 = BasicConv2d(m_, b7, c(192), 3, 2, 0, "branch7x7x3_4");
    return m_.concat({b3, b7, MaxPool3x3s2(m_, x)}, 1);
  }

  Sym E(Sym x, const std::string& name) {
    auto s = m_.scope(name);
    Sym b1 = BasicConv2d(m_, x, c(320), 1, 1, 0, "branch1x1");
    Sym b3 = BasicConv2d(m_, x, c(384), 1, 1, 0, "branch3x3_1");
    b3 = m_.concat({BasicConv2d(m_, b3, c(384), {1, 3}, {1, 1}, {0, 1}, "branch3x3_2a"),
                    BasicConv2d(m_, b3, c(384), {3, 1}, {1, 1}, {1, 0}, "branch3x3_2b")},
                   1);
    Sym bd = BasicConv2d(m_, x, c(448), 1, 1, 0, "branch3x3dbl_1");
    bd = BasicConv2d(m_, bd, c(384), 3, 1, 1, "branch3x3dbl_2");
    bd = m_.concat({BasicConv2d(m_, bd, c(384), {1, 3}, {1, 1}, {0, 1}, "branch3x3dbl_3a"),
                    BasicConv2d(m_, bd, c(384), {3, 1}, {1, 1}, {1, 0}, "branch3x3dbl_3b")},
                   1);
    Sym bp = BasicConv2d(m_, AvgPool3x3(m_, x), c(192), 1, 1, 0, "branch_pool");
    return m_.concat({b1, b3, bd, bp}, 1);
  }

  // InceptionAux on Mixed_6e's [B, 768, 17, 17]: 5x5/3 average pool to
  // 5x5, conv0 1x1, conv1 5x5 (std 0.01) to 1x1, fc (std 0.001).
  Sym Aux(Sym x, int64_t num_classes, const std::string& name) {
    auto s = m_.scope(name);
    Pool2dOptions p;
    p.stride = {3, 3};
    Sym h = m_.avg_pool2d(x, {5, 5}, p);
    // At batch 1 and 299x299, conv1's training-mode BatchNorm sees one value
    // per channel and fails, naming the layer (torchvision raises too).
    h = BasicConv2d(m_, h, c(128), 1, 1, 0, "conv0");
    h = BasicConv2d(m_, h, c(768), 5, 1, 0, "conv1", /*stddev=*/0.01);
    h = m_.flatten(m_.adaptive_avg_pool2d(h, {1, 1}), 1);
    return Linear(m_, h, num_classes, /*stddev=*/0.001, "fc");
  }

 private:
  Model& m_;
  double width_mult_;
};

}  // namespace

StatusOr<InceptionResult> InceptionV3(Model& m, Sym x, const InceptionOptions& o, const std::string& name) {
  if (!(o.width_mult > 0)) return InvalidArgument("argument width_mult: must be > 0, got ", o.width_mult);
  if (!(o.dropout >= 0 && o.dropout < 1))  // NaN included
    return InvalidArgument("argument dropout: must be in [0, 1), got ", o.dropout);
  if (o.num_classes < 1) return InvalidArgument("inception_v3 needs at least 1 class, got ", o.num_classes);
  LOOM_RETURN_IF_ERROR(m.status());
  if (!x.valid()) return InvalidArgument("inception_v3 was given an invalid input tensor");
  const Shape& in = m.shape(x);
  if (in.rank() != 4)
    return InvalidArgument("inception_v3 needs [batch, channels, height, width] images, got ", in.ToString());
  const int64_t height = in[2], width = in[3];
  const std::string size = std::to_string(height) + "x" + std::to_string(width);
  if (height < kInceptionMinSize || width < kInceptionMinSize)
    return InvalidArgument("inception_v3 needs images of at least ", kInceptionMinSize, "x", kInceptionMinSize,
                           " (torchvision's minimum), got ", size);
  const bool aux = o.aux_logits && m.training();
  if (aux && (height < kInceptionAuxMinSize || width < kInceptionAuxMinSize))
    return InvalidArgument("inception_v3's auxiliary classifier (aux_logits=1, training mode) needs images of at least ",
                           kInceptionAuxMinSize, "x", kInceptionAuxMinSize, " (a 17x17 Mixed_6e output), got ", size,
                           "; set aux_logits=0 for smaller images");

  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  Blocks b(m, o.width_mult);
  Sym h = BasicConv2d(m, x, b.c(32), 3, 2, 0, "Conv2d_1a_3x3");
  h = BasicConv2d(m, h, b.c(32), 3, 1, 0, "Conv2d_2a_3x3");
  h = BasicConv2d(m, h, b.c(64), 3, 1, 1, "Conv2d_2b_3x3");
  h = MaxPool3x3s2(m, h, "maxpool1");
  h = BasicConv2d(m, h, b.c(80), 1, 1, 0, "Conv2d_3b_1x1");
  h = BasicConv2d(m, h, b.c(192), 3, 1, 0, "Conv2d_4a_3x3");
  h = MaxPool3x3s2(m, h, "maxpool2");
  h = b.A(h, 32, "Mixed_5b");
  h = b.A(h, 64, "Mixed_5c");
  h = b.A(h, 64, "Mixed_5d");
  h = b.B(h, "Mixed_6a");
  h = b.C(h, 128, "Mixed_6b");
  h = b.C(h, 160, "Mixed_6c");
  h = b.C(h, 160, "Mixed_6d");
  h = b.C(h, 192, "Mixed_6e");
  InceptionResult r;
  if (aux) r.aux_logits = b.Aux(h, o.num_classes, "AuxLogits");
  h = b.D(h, "Mixed_7a");
  h = b.E(h, "Mixed_7b");
  h = b.E(h, "Mixed_7c");
  h = m.adaptive_avg_pool2d(h, {1, 1}, "avgpool");
  h = m.flatten(m.dropout(h, o.dropout, "dropout"), 1);
  r.logits = Linear(m, h, o.num_classes, kStddev, "fc");
  LOOM_RETURN_IF_ERROR(m.status().WithContext("inception_v3"));
  return r;
}

}  // namespace loom::models
