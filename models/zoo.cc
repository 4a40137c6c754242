#include "models/zoo.h"

#include <cstdlib>
#include <optional>
#include <sstream>

#include "models/alexnet.h"
#include "models/cnn.h"
#include "models/mlp.h"
#include "models/mobilenet.h"
#include "models/pointnet.h"
#include "models/resnet.h"
#include "models/vgg.h"

namespace loom::models {

StatusOr<int64_t> ModelArgs::Int(const std::string& key, int64_t def) {
  used_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0') return InvalidArgument("argument ", key, ": '", it->second, "' is not an integer");
  return static_cast<int64_t>(v);
}

std::string ModelArgs::Str(const std::string& key, const std::string& def) {
  used_.insert(key);
  auto it = values_.find(key);
  return it == values_.end() ? def : it->second;
}

StatusOr<double> ModelArgs::Float(const std::string& key, double def) {
  used_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') return InvalidArgument("argument ", key, ": '", it->second, "' is not a number");
  return v;
}

StatusOr<std::vector<int64_t>> ModelArgs::Ints(const std::string& key, const std::vector<int64_t>& def) {
  used_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  std::vector<int64_t> out;
  std::stringstream ss(it->second);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0')
      return InvalidArgument("argument ", key, ": '", it->second, "' is not a comma-separated list of integers");
    out.push_back(v);
  }
  return out;
}

Status ModelArgs::CheckAllUsed(const std::string& model) const {
  for (const auto& [key, value] : values_) {
    if (used_.count(key)) continue;
    std::string known;
    for (const auto& u : used_) known += (known.empty() ? "" : ", ") + u;
    return InvalidArgument("model ", model, " has no argument '", key, "' (its arguments: ", known, ")");
  }
  return Status::Ok();
}

namespace {

StatusOr<Sym> BuildMlp(Model& m, const ModelInputs& in, ModelArgs& args) {
  MlpOptions o;
  LOOM_ASSIGN_OR_RETURN(o.hidden, args.Ints("hidden", o.hidden));
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Float("dropout", o.dropout));
  o.num_classes = in.num_classes;
  for (int64_t h : o.hidden)
    if (h < 1) return InvalidArgument("argument hidden: widths must be >= 1, got ", h);
  if (o.dropout < 0 || o.dropout >= 1) return InvalidArgument("argument dropout: must be in [0, 1), got ", o.dropout);
  return Mlp(m, in.input, o);
}

StatusOr<Sym> BuildCnn(Model& m, const ModelInputs& in, ModelArgs& args) {
  CnnOptions o;
  LOOM_ASSIGN_OR_RETURN(o.channels, args.Ints("channels", o.channels));
  LOOM_ASSIGN_OR_RETURN(o.hidden, args.Int("hidden", o.hidden));
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Float("dropout", o.dropout));
  o.num_classes = in.num_classes;
  if (o.channels.empty()) return InvalidArgument("argument channels: needs at least one stage");
  for (int64_t c : o.channels)
    if (c < 1) return InvalidArgument("argument channels: must be >= 1, got ", c);
  if (o.hidden < 1) return InvalidArgument("argument hidden: must be >= 1, got ", o.hidden);
  if (o.dropout < 0 || o.dropout >= 1) return InvalidArgument("argument dropout: must be in [0, 1), got ", o.dropout);
  return Cnn(m, in.input, o);
}

StatusOr<Sym> BuildResNet(Model& m, const ModelInputs& in, ModelArgs& args, ResNetOptions o) {
  const std::string stem = args.Str("stem", "imagenet");
  LOOM_ASSIGN_OR_RETURN(o.stem, ParseResNetStem(stem));
  LOOM_ASSIGN_OR_RETURN(o.width, args.Int("width", o.width));
  o.num_classes = in.num_classes;
  if (o.width < 1) return InvalidArgument("argument width: must be >= 1, got ", o.width);
  if (m.shape(in.input).rank() != 4)
    return InvalidArgument("resnet needs [batch, channels, height, width] images, got ", m.shape(in.input).ToString());
  return ResNet(m, in.input, o);
}

// MobileNetV2 (v3 = nothing) or V3 of a size: args dropout, width_mult.
StatusOr<Sym> BuildMobileNet(Model& m, const ModelInputs& in, ModelArgs& args,
                             std::optional<MobileNetV3Size> v3) {
  MobileNetOptions o;
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Float("dropout", o.dropout));
  LOOM_ASSIGN_OR_RETURN(o.width_mult, args.Float("width_mult", o.width_mult));
  o.num_classes = in.num_classes;
  if (o.dropout < 0 || o.dropout >= 1) return InvalidArgument("argument dropout: must be in [0, 1), got ", o.dropout);
  if (!(o.width_mult > 0)) return InvalidArgument("argument width_mult: must be > 0, got ", o.width_mult);
  if (m.shape(in.input).rank() != 4)
    return InvalidArgument("mobilenet needs [batch, channels, height, width] images, got ", m.shape(in.input).ToString());
  return v3 ? MobileNetV3(m, in.input, *v3, o) : MobileNetV2(m, in.input, o);
}

StatusOr<Sym> BuildAlexNet(Model& m, const ModelInputs& in, ModelArgs& args) {
  AlexNetOptions o;
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Float("dropout", o.dropout));
  o.num_classes = in.num_classes;
  if (o.dropout < 0 || o.dropout >= 1) return InvalidArgument("argument dropout: must be in [0, 1), got ", o.dropout);
  if (m.shape(in.input).rank() != 4)
    return InvalidArgument("alexnet needs [batch, channels, height, width] images, got ", m.shape(in.input).ToString());
  return AlexNet(m, in.input, o);
}

StatusOr<Sym> BuildVgg(Model& m, const ModelInputs& in, ModelArgs& args, VggOptions o) {
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Float("dropout", o.dropout));
  o.num_classes = in.num_classes;
  if (o.dropout < 0 || o.dropout >= 1) return InvalidArgument("argument dropout: must be in [0, 1), got ", o.dropout);
  if (m.shape(in.input).rank() != 4)
    return InvalidArgument("vgg needs [batch, channels, height, width] images, got ", m.shape(in.input).ToString());
  return Vgg(m, in.input, o);
}

// PointNet: args dropout, feature_transform (0/1), regularizer (its weight).
// The feature-transform regularizer goes out as the graph output
// kAuxLossOutput, which BuildSupervised adds to the loss.
StatusOr<Sym> BuildPointNet(Model& m, const ModelInputs& in, ModelArgs& args) {
  PointNetOptions o;
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Float("dropout", o.dropout));
  LOOM_ASSIGN_OR_RETURN(int64_t ft, args.Int("feature_transform", 1));
  LOOM_ASSIGN_OR_RETURN(o.regularizer_weight, args.Float("regularizer", o.regularizer_weight));
  o.num_classes = in.num_classes;
  o.feature_transform = ft != 0;
  if (o.dropout < 0 || o.dropout >= 1) return InvalidArgument("argument dropout: must be in [0, 1), got ", o.dropout);
  if (ft != 0 && ft != 1) return InvalidArgument("argument feature_transform: must be 0 or 1, got ", ft);
  if (o.regularizer_weight < 0) return InvalidArgument("argument regularizer: must be >= 0, got ", o.regularizer_weight);
  if (m.shape(in.input).rank() != 3 || m.shape(in.input)[1] != 3)
    return InvalidArgument("pointnet_cls needs [batch, 3, points] point clouds, got ", m.shape(in.input).ToString());
  PointNetResult r = PointNetCls(m, in.input, o);
  if (r.regularizer.valid()) m.set_output(kAuxLossOutput, r.regularizer);
  return r.logits;
}

}  // namespace

const std::vector<ZooEntry>& Zoo() {
  static const std::vector<ZooEntry> zoo = {
      {"mlp", "multi-layer perceptron: flatten, Linear+ReLU per width in hidden (default 256,128), classifier",
       InputKind::kFeatures, BuildMlp},
      {"cnn", "small CNN: per stage in channels (default 32,64) conv3x3-BN-ReLU-maxpool2, then Linear(hidden)+ReLU, "
              "dropout, classifier",
       InputKind::kFeatures, BuildCnn},
      {"resnet18", "torchvision's resnet18: BasicBlock stages 2,2,2,2; stem imagenet (7x7/2 conv, 3x3/2 max-pool) or "
                   "cifar (3x3/1 conv, no pool); width: base width (default 64)",
       InputKind::kFeatures,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildResNet(m, in, args, ResNet18Options());
       }},
      {"resnet101", "torchvision's resnet101: Bottleneck (v1.5) stages 3,4,23,3; stem imagenet or cifar; width: base "
                    "width (default 64)",
       InputKind::kFeatures,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildResNet(m, in, args, ResNet101Options());
       }},
      {"alexnet", "torchvision's alexnet: 5 convs (with bias) + ReLU, 3 max-pools, adaptive 6x6 average pool, "
                  "dropout-Linear(4096)-ReLU twice, classifier; inputs >= 63x63; dropout (default 0.5)",
       InputKind::kFeatures, BuildAlexNet},
      {"vgg16", "torchvision's vgg16 (configuration D, no BatchNorm): 13 conv3x3 (with bias) + ReLU, 5 max-pools, "
                "adaptive 7x7 average pool, Linear(4096)-ReLU-dropout twice, classifier; inputs >= 32x32; dropout "
                "(default 0.5)",
       InputKind::kFeatures,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildVgg(m, in, args, Vgg16Options());
       }},
      {"mobilenet_v2", "torchvision's mobilenet_v2: inverted residuals (expand 6, ReLU6), last channel 1280, "
                       "dropout (default 0.2), width_mult (default 1.0)",
       InputKind::kFeatures,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildMobileNet(m, in, args, std::nullopt);
       }},
      {"mobilenet_v3_small", "torchvision's mobilenet_v3_small: squeeze-excite, hardswish, last channel 1024, "
                             "dropout (default 0.2), width_mult (default 1.0)",
       InputKind::kFeatures,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildMobileNet(m, in, args, MobileNetV3Size::kSmall);
       }},
      {"mobilenet_v3_large", "torchvision's mobilenet_v3_large: squeeze-excite, hardswish, last channel 1280, "
                             "dropout (default 0.2), width_mult (default 1.0)",
       InputKind::kFeatures,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildMobileNet(m, in, args, MobileNetV3Size::kLarge);
       }},
      {"pointnet_cls", "PointNet classification as fxia22/pointnet.pytorch's PointNetCls(feature_transform=True) on "
                       "[3, points] inputs: STN3d, conv1d 64, STNkd(64), conv1d 128, 1024, max over points, "
                       "Linear 512-256 with BN, classifier; dropout (default 0.3), feature_transform (default 1), "
                       "regularizer (default 0.001: its weight, added to the loss)",
       InputKind::kFeatures, BuildPointNet},
  };
  return zoo;
}

StatusOr<const ZooEntry*> FindModel(const std::string& name) {
  std::string names;
  for (const ZooEntry& e : Zoo()) {
    if (e.name == name) return &e;
    names += (names.empty() ? "" : ", ") + e.name;
  }
  return NotFound("unknown model '", name, "' (the zoo has: ", names, ")");
}

const char* InputKindName(InputKind kind) {
  return kind == InputKind::kTokens ? "token ids" : "f32 features";
}

Status BuildSupervised(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const DataSpec& data, int64_t batch) {
  LOOM_ASSIGN_OR_RETURN(const ZooEntry* entry, FindModel(name));
  const InputKind given = data.input_dtype == DType::kI64 ? InputKind::kTokens : InputKind::kFeatures;
  if (given != entry->input)
    return InvalidArgument("model ", name, " reads ", InputKindName(entry->input), ", the data gives ",
                           InputKindName(given), " ", data.input.ToString());
  auto batched = [batch](const Shape& s) {
    std::vector<int64_t> dims = {batch};
    dims.insert(dims.end(), s.dims().begin(), s.dims().end());
    return Shape(dims);
  };
  ModelInputs in;
  // Features take the model's float type (f32, or f64 for gradient checks).
  in.input = given == InputKind::kTokens ? m.input("input", batched(data.input), DType::kI64)
                                         : m.input("input", batched(data.input));
  in.target = m.input("target", batched(data.target), DType::kI64);
  in.num_classes = data.num_classes;
  ModelArgs model_args(args);
  LOOM_ASSIGN_OR_RETURN(Sym logits, entry->build(m, in, model_args));
  LOOM_RETURN_IF_ERROR(model_args.CheckAllUsed(name));
  LOOM_RETURN_IF_ERROR(m.status().WithContext("model " + name));
  // One row of class scores per target entry.
  std::vector<int64_t> want = batched(data.target).dims();
  want.push_back(data.num_classes);
  if (m.shape(logits) != Shape(want))
    return InvalidArgument("model ", name, " gives logits ", m.shape(logits).ToString(), ", the data's targets need ",
                           Shape(want).ToString());
  m.set_output("logits", logits);
  CrossEntropyOptions ce;
  ce.ignore_index = kIgnoreTarget;
  const int64_t rows = batch * data.target.numel();
  Sym loss = data.target.rank() == 0
                 ? m.cross_entropy(logits, in.target, ce)
                 : m.cross_entropy(m.reshape(logits, {rows, data.num_classes}), m.reshape(in.target, {rows}), ce);
  auto reg = m.graph().outputs().find(kAuxLossOutput);
  if (reg != m.graph().outputs().end()) loss = m.add(loss, Sym{reg->second});
  m.set_output("loss", loss);
  return m.status().WithContext("model " + name);
}

Status BuildClassifier(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const Shape& input_shape, int64_t batch, int64_t num_classes) {
  return BuildSupervised(m, name, args, DataSpec{input_shape, DType::kF32, Shape{}, num_classes}, batch);
}

}  // namespace loom::models
