#include "models/mobilenet.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace loom::models {

// Parameter counts (1000 classes), as torchvision reports them; convolutions
// have no bias (except the SE's fc1/fc2), each BatchNorm has 2*C parameters
// and its running statistics are buffers, not parameters:
//   mobilenet_v2        3,504,872
//   mobilenet_v3_small  2,542,856
//   mobilenet_v3_large  5,483,032
// models/mobilenet_test.cc checks all three against the built graphs.

namespace {

enum class Act { kNone, kReLU, kReLU6, kHardswish };

Sym Activate(Model& m, Sym x, Act a) {
  switch (a) {
    case Act::kNone: return x;
    case Act::kReLU: return m.relu(x);
    case Act::kReLU6: return m.relu6(x);
    case Act::kHardswish: return m.hardswish(x);
  }
  return x;
}

// torchvision initialises every conv with kaiming_normal_(mode="fan_out"):
// N(0, sqrt(2 / (out * kh * kw))) (fan_out ignores groups), conv biases with
// zeros; BatchNorm starts at weight 1, bias 0 (the model API's default).
Sym Conv(Model& m, Sym x, int64_t out, int64_t k, int64_t stride, int64_t groups, bool bias, const std::string& name) {
  if (!m.status().ok() || !x.valid()) return {};
  const int64_t in = m.shape(x)[1];
  const int64_t pad = (k - 1) / 2;
  const double stddev = std::sqrt(2.0 / static_cast<double>(out * k * k));
  // The same names as Model::conv2d ("<name>/weight" under the current scope).
  std::vector<Sym> ins = {x, m.parameter(name + "/weight", {out, in / groups, k, k}, InitNormal(0.0, stddev))};
  if (bias) ins.push_back(m.parameter(name + "/bias", {out}, InitZeros()));
  AttrMap a{{"stride", std::vector<int64_t>{stride, stride}},
            {"padding", std::vector<int64_t>{pad, pad}},
            {"dilation", std::vector<int64_t>{1, 1}},
            {"groups", groups}};
  return m.op1("Conv2d", ins, a, name);
}

// torchvision initialises the classifier's linears with N(0, 0.01), bias 0.
Sym Linear(Model& m, Sym x, int64_t out, const std::string& name) {
  if (!m.status().ok() || !x.valid()) return {};
  const int64_t in = m.shape(x).dim(-1);
  Sym w = m.parameter(name + "/weight", {out, in}, InitNormal(0.0, 0.01));
  Sym b = m.parameter(name + "/bias", {out}, InitZeros());
  return m.op1("Linear", {x, w, b}, {}, name);
}

// torchvision's Conv2dNormActivation, scoped `name`: conv "0", BatchNorm "1",
// then the activation (padding (k - 1) / 2).
Sym ConvBnAct(Model& m, Sym x, int64_t out, int64_t k, int64_t stride, int64_t groups, Act act,
              const BatchNormOptions& bn, const std::string& name) {
  auto s = m.scope(name);
  Sym h = m.batch_norm(Conv(m, x, out, k, stride, groups, /*bias=*/false, "0"), bn, "1");
  return Activate(m, h, act);
}

int64_t Channels(const Model& m, Sym x) { return m.status().ok() && x.valid() ? m.shape(x)[1] : 0; }

// MobileNetV2's InvertedResidual, scoped "features/<i>" by the caller.
Sym InvertedResidualV2(Model& m, Sym x, int64_t out, int64_t stride, int64_t expand_ratio) {
  const int64_t in = Channels(m, x);
  const int64_t hidden = static_cast<int64_t>(std::lround(static_cast<double>(in * expand_ratio)));
  const bool residual = stride == 1 && in == out;
  const BatchNormOptions bn;  // PyTorch's defaults
  auto s = m.scope("conv");
  Sym h = x;
  int index = 0;
  if (expand_ratio != 1) h = ConvBnAct(m, h, hidden, 1, 1, 1, Act::kReLU6, bn, std::to_string(index++));
  h = ConvBnAct(m, h, hidden, 3, stride, hidden, Act::kReLU6, bn, std::to_string(index++));
  h = Conv(m, h, out, 1, 1, 1, /*bias=*/false, std::to_string(index++));
  h = m.batch_norm(h, bn, std::to_string(index++));
  return residual ? m.add(x, h) : h;
}

// torchvision's SqueezeExcitation (scale_activation Hardsigmoid), scoped by
// the caller: avgpool, fc1 (1x1 conv with bias), ReLU, fc2, Hardsigmoid,
// times the input.
Sym SqueezeExcitation(Model& m, Sym x, int64_t squeeze) {
  const int64_t c = Channels(m, x);
  Sym s = m.adaptive_avg_pool2d(x, {1, 1}, "avgpool");
  s = m.relu(Conv(m, s, squeeze, 1, 1, 1, /*bias=*/true, "fc1"));
  s = m.hardsigmoid(Conv(m, s, c, 1, 1, 1, /*bias=*/true, "fc2"));
  return m.mul(s, x);
}

// One row of torchvision's InvertedResidualConfig (channels before width_mult).
struct BlockConfig {
  int64_t in, kernel, expanded, out;
  bool se;
  bool hardswish;  // "HS", else "RE"
  int64_t stride;
};

// MobileNetV3's InvertedResidual (channels already scaled), scoped
// "features/<i>" by the caller.
Sym InvertedResidualV3(Model& m, Sym x, const BlockConfig& c) {
  const BatchNormOptions bn{/*momentum=*/0.01, /*eps=*/0.001};
  const Act act = c.hardswish ? Act::kHardswish : Act::kReLU;
  const bool residual = c.stride == 1 && c.in == c.out;
  auto s = m.scope("block");
  Sym h = x;
  int index = 0;
  if (c.expanded != c.in) h = ConvBnAct(m, h, c.expanded, 1, 1, 1, act, bn, std::to_string(index++));
  h = ConvBnAct(m, h, c.expanded, c.kernel, c.stride, c.expanded, act, bn, std::to_string(index++));
  if (c.se) {
    auto se = m.scope(std::to_string(index++));
    h = SqueezeExcitation(m, h, MakeDivisible(static_cast<double>(c.expanded / 4), 8));
  }
  h = ConvBnAct(m, h, c.out, 1, 1, 1, Act::kNone, bn, std::to_string(index++));
  return residual ? m.add(h, x) : h;
}

// torchvision's _mobilenet_v3_conf tables (no dilation, no reduced tail).
std::vector<BlockConfig> V3Config(MobileNetV3Size size) {
  constexpr bool RE = false, HS = true;
  if (size == MobileNetV3Size::kLarge) {
    return {
        {16, 3, 16, 16, false, RE, 1},    {16, 3, 64, 24, false, RE, 2},    {24, 3, 72, 24, false, RE, 1},
        {24, 5, 72, 40, true, RE, 2},     {40, 5, 120, 40, true, RE, 1},    {40, 5, 120, 40, true, RE, 1},
        {40, 3, 240, 80, false, HS, 2},   {80, 3, 200, 80, false, HS, 1},   {80, 3, 184, 80, false, HS, 1},
        {80, 3, 184, 80, false, HS, 1},   {80, 3, 480, 112, true, HS, 1},   {112, 3, 672, 112, true, HS, 1},
        {112, 5, 672, 160, true, HS, 2},  {160, 5, 960, 160, true, HS, 1},  {160, 5, 960, 160, true, HS, 1},
    };
  }
  return {
      {16, 3, 16, 16, true, RE, 2},   {16, 3, 72, 24, false, RE, 2},  {24, 3, 88, 24, false, RE, 1},
      {24, 5, 96, 40, true, HS, 2},   {40, 5, 240, 40, true, HS, 1},  {40, 5, 240, 40, true, HS, 1},
      {40, 5, 120, 48, true, HS, 1},  {48, 5, 144, 48, true, HS, 1},  {48, 5, 288, 96, true, HS, 2},
      {96, 5, 576, 96, true, HS, 1},  {96, 5, 576, 96, true, HS, 1},
  };
}

}  // namespace

int64_t MakeDivisible(double v, int64_t divisor) {
  const double d = static_cast<double>(divisor);
  int64_t rounded = std::max(divisor, static_cast<int64_t>(v + d / 2) / divisor * divisor);
  if (static_cast<double>(rounded) < 0.9 * v) rounded += divisor;  // never round down by more than 10%
  return rounded;
}

Sym MobileNetV2(Model& m, Sym x, const MobileNetOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  // t (expand ratio), c (channels), n (blocks), s (stride of the first block)
  struct Stage {
    int64_t t, c, n, s;
  };
  const std::vector<Stage> stages = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                     {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  const BatchNormOptions bn;
  const int64_t last_channel = MakeDivisible(1280 * std::max(1.0, o.width_mult));
  Sym h;
  {
    auto features = m.scope("features");
    h = ConvBnAct(m, x, MakeDivisible(32 * o.width_mult), 3, 2, 1, Act::kReLU6, bn, "0");
    int index = 1;
    for (const Stage& st : stages) {
      const int64_t out = MakeDivisible(static_cast<double>(st.c) * o.width_mult);
      for (int64_t i = 0; i < st.n; ++i) {
        auto block = m.scope(std::to_string(index++));
        h = InvertedResidualV2(m, h, out, i == 0 ? st.s : 1, st.t);
      }
    }
    h = ConvBnAct(m, h, last_channel, 1, 1, 1, Act::kReLU6, bn, std::to_string(index));
  }
  h = m.flatten(m.adaptive_avg_pool2d(h, {1, 1}, "avgpool"), 1);
  auto classifier = m.scope("classifier");
  h = m.dropout(h, o.dropout, "0");
  return Linear(m, h, o.num_classes, "1");
}

Sym MobileNetV3(Model& m, Sym x, MobileNetV3Size size, const MobileNetOptions& o, const std::string& name) {
  std::optional<Model::Scope> outer;
  if (!name.empty()) outer.emplace(m.scope(name));
  const BatchNormOptions bn{/*momentum=*/0.01, /*eps=*/0.001};
  auto adjust = [&](int64_t c) { return MakeDivisible(static_cast<double>(c) * o.width_mult); };
  std::vector<BlockConfig> config = V3Config(size);
  for (BlockConfig& c : config) {
    c.in = adjust(c.in);
    c.expanded = adjust(c.expanded);
    c.out = adjust(c.out);
  }
  const int64_t last_channel = adjust(size == MobileNetV3Size::kLarge ? 1280 : 1024);
  const int64_t lastconv = 6 * config.back().out;
  Sym h;
  {
    auto features = m.scope("features");
    h = ConvBnAct(m, x, config.front().in, 3, 2, 1, Act::kHardswish, bn, "0");
    int index = 1;
    for (const BlockConfig& c : config) {
      auto block = m.scope(std::to_string(index++));
      h = InvertedResidualV3(m, h, c);
    }
    h = ConvBnAct(m, h, lastconv, 1, 1, 1, Act::kHardswish, bn, std::to_string(index));
  }
  h = m.flatten(m.adaptive_avg_pool2d(h, {1, 1}, "avgpool"), 1);
  auto classifier = m.scope("classifier");
  h = m.hardswish(Linear(m, h, last_channel, "0"));
  h = m.dropout(h, o.dropout, "2");
  return Linear(m, h, o.num_classes, "3");
}

}  // namespace loom::models
