#include "models/zoo.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "core/parse.h"
#include "models/alexnet.h"
#include "models/cnn.h"
#include "models/dcgan.h"
#include "models/inception.h"
#include "models/mlp.h"
#include "models/mobilenet.h"
#include "models/pointnet.h"
#include "models/resnet.h"
#include "models/transformer.h"
#include "models/rnn_models.h"
#include "models/vgg.h"

namespace loom::models {

namespace {

// An integer of argument `key`: its value `text`, or an item of its value
// `list`. Errors name the argument and the value.
StatusOr<int64_t> ParseInt(const std::string& key, const std::string& text, const std::string* list = nullptr) {
  const std::string value = Excerpt(list ? *list : text);
  int64_t v = 0;
  switch (ParseInt64(text, &v)) {
    case IntParse::kOk: return v;
    case IntParse::kNotInteger:
      return InvalidArgument("argument ", key, ": '", value, "' is not ",
                             list ? "a comma-separated list of integers" : "an integer");
    case IntParse::kOutOfRange: break;
  }
  return InvalidArgument("argument ", key, ": '", value, "'", list ? ": " + Excerpt(text) : "",
                         " is out of range (at ", v < 0 ? "least " : "most ", v, ")");
}

}  // namespace

StatusOr<int64_t> ModelArgs::Int(const std::string& key, int64_t def) {
  used_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  return ParseInt(key, it->second);
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
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0')
    return InvalidArgument("argument ", key, ": '", Excerpt(it->second), "' is not a number");
  // No model argument takes inf or NaN (strtod reads "inf", "nan", and 1e999 as inf).
  if (!std::isfinite(v) || errno == ERANGE)
    return InvalidArgument("argument ", key, ": '", Excerpt(it->second), "' is not a finite number in double's range");
  return v;
}

StatusOr<std::vector<int64_t>> ModelArgs::Ints(const std::string& key, const std::vector<int64_t>& def, int64_t min) {
  used_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  const std::string& text = it->second;
  if (text == "none") return std::vector<int64_t>{};
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("argument ", key, ": '", Excerpt(text), "' ", why,
                           " (expected comma-separated integers such as 256,128, or none)");
  };
  if (text.empty()) return bad("is empty");
  std::vector<int64_t> out;
  for (const std::string& item : SplitCommas(text)) {
    if (item.empty()) return bad("has an empty item");
    LOOM_ASSIGN_OR_RETURN(int64_t v, ParseInt(key, item, &text));
    if (v < min) return InvalidArgument("argument ", key, ": '", Excerpt(text), "': items must be >= ", min, ", got ", v);
    out.push_back(v);
  }
  return out;
}

StatusOr<int64_t> ModelArgs::IntAtLeast(const std::string& key, int64_t def, int64_t min) {
  LOOM_ASSIGN_OR_RETURN(int64_t v, Int(key, def));
  if (v < min) return InvalidArgument("argument ", key, ": must be >= ", min, ", got ", v);
  return v;
}

StatusOr<double> ModelArgs::NonNegative(const std::string& key, double def) {
  LOOM_ASSIGN_OR_RETURN(double v, Float(key, def));
  if (!(v >= 0)) return InvalidArgument("argument ", key, ": must be >= 0, got ", v);
  return v;
}

StatusOr<double> ModelArgs::Probability(const std::string& key, double def) {
  LOOM_ASSIGN_OR_RETURN(double v, Float(key, def));
  if (!(v >= 0 && v < 1)) return InvalidArgument("argument ", key, ": must be in [0, 1), got ", v);
  return v;
}

StatusOr<bool> ModelArgs::Flag(const std::string& key, bool def) {
  LOOM_ASSIGN_OR_RETURN(int64_t v, Int(key, def ? 1 : 0));
  if (v != 0 && v != 1) return InvalidArgument("argument ", key, ": must be 0 or 1, got ", v);
  return v == 1;
}

Status ModelArgs::CheckAllUsed(const std::string& model) const {
  for (const auto& [key, value] : values_) {
    if (used_.count(key)) continue;
    std::string known;
    for (const auto& u : used_) known += (known.empty() ? "" : ", ") + u;
    return InvalidArgument("model ", model, " has no argument '", Excerpt(key), "' (its arguments: ", known, ")");
  }
  return Status::Ok();
}

namespace {

StatusOr<Sym> BuildMlp(Model& m, const ModelInputs& in, ModelArgs& args) {
  MlpOptions o;
  LOOM_ASSIGN_OR_RETURN(o.hidden, args.Ints("hidden", o.hidden, /*min=*/1));  // none: a linear classifier
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
  o.num_classes = in.num_classes;
  return Mlp(m, in.input, o);
}

StatusOr<Sym> BuildCnn(Model& m, const ModelInputs& in, ModelArgs& args) {
  CnnOptions o;
  LOOM_ASSIGN_OR_RETURN(o.channels, args.Ints("channels", o.channels, /*min=*/1));
  LOOM_ASSIGN_OR_RETURN(o.hidden, args.IntAtLeast("hidden", o.hidden, 1));
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
  o.num_classes = in.num_classes;
  if (o.channels.empty()) return InvalidArgument("argument channels: needs at least one stage");
  return Cnn(m, in.input, o);
}

StatusOr<Sym> BuildResNet(Model& m, const ModelInputs& in, ModelArgs& args, ResNetOptions o) {
  const std::string stem = args.Str("stem", "imagenet");
  LOOM_ASSIGN_OR_RETURN(o.stem, ParseResNetStem(stem));
  LOOM_ASSIGN_OR_RETURN(o.width, args.IntAtLeast("width", o.width, 1));
  o.num_classes = in.num_classes;
  if (m.shape(in.input).rank() != 4)
    return InvalidArgument("resnet needs [batch, channels, height, width] images, got ", m.shape(in.input).ToString());
  return ResNet(m, in.input, o);
}

// A positive width_mult (NaN refused).
StatusOr<double> WidthMult(ModelArgs& args, double def) {
  LOOM_ASSIGN_OR_RETURN(const double w, args.Float("width_mult", def));
  if (!(w > 0)) return InvalidArgument("argument width_mult: must be > 0, got ", w);
  return w;
}

// MobileNetV2 (v3 = nothing) or V3 of a size: args dropout, width_mult.
StatusOr<Sym> BuildMobileNet(Model& m, const ModelInputs& in, ModelArgs& args,
                             std::optional<MobileNetV3Size> v3) {
  MobileNetOptions o;
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
  LOOM_ASSIGN_OR_RETURN(o.width_mult, WidthMult(args, o.width_mult));
  o.num_classes = in.num_classes;
  if (m.shape(in.input).rank() != 4)
    return InvalidArgument("mobilenet needs [batch, channels, height, width] images, got ", m.shape(in.input).ToString());
  return v3 ? MobileNetV3(m, in.input, *v3, o) : MobileNetV2(m, in.input, o);
}

StatusOr<Sym> BuildAlexNet(Model& m, const ModelInputs& in, ModelArgs& args) {
  AlexNetOptions o;
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
  LOOM_ASSIGN_OR_RETURN(o.width_mult, WidthMult(args, o.width_mult));
  LOOM_ASSIGN_OR_RETURN(o.hidden, args.IntAtLeast("hidden", o.hidden, 1));
  o.num_classes = in.num_classes;
  if (m.shape(in.input).rank() != 4)
    return InvalidArgument("alexnet needs [batch, channels, height, width] images, got ", m.shape(in.input).ToString());
  return AlexNet(m, in.input, o);
}

StatusOr<Sym> BuildVgg(Model& m, const ModelInputs& in, ModelArgs& args, VggOptions o) {
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
  LOOM_ASSIGN_OR_RETURN(o.width_mult, WidthMult(args, o.width_mult));
  LOOM_ASSIGN_OR_RETURN(o.hidden, args.IntAtLeast("hidden", o.hidden, 1));
  o.num_classes = in.num_classes;
  if (m.shape(in.input).rank() != 4)
    return InvalidArgument("vgg needs [batch, channels, height, width] images, got ", m.shape(in.input).ToString());
  return Vgg(m, in.input, o);
}

// PointNet classification (args dropout, feature_transform, regularizer) or
// segmentation (logits [B, N, parts] for a part label per point; args
// feature_transform, regularizer). The feature-transform regularizer, times
// its weight, goes out as kAuxLossOutput, which BuildSupervised adds to the loss.
StatusOr<Sym> BuildPointNet(Model& m, const ModelInputs& in, ModelArgs& args, bool segmentation) {
  LOOM_ASSIGN_OR_RETURN(bool feature_transform, args.Flag("feature_transform", true));
  LOOM_ASSIGN_OR_RETURN(double regularizer, args.NonNegative("regularizer", PointNetOptions{}.regularizer_weight));
  if (m.shape(in.input).rank() != 3 || m.shape(in.input)[1] != 3)
    return InvalidArgument(segmentation ? "pointnet_seg" : "pointnet_cls",
                           " needs [batch, 3, points] point clouds, got ", m.shape(in.input).ToString());
  PointNetResult r;
  if (segmentation) {
    PointNetSegOptions o;
    o.num_parts = in.num_classes;
    o.feature_transform = feature_transform;
    o.regularizer_weight = regularizer;
    r = PointNetDenseCls(m, in.input, o);
  } else {
    PointNetOptions o;
    LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
    o.num_classes = in.num_classes;
    o.feature_transform = feature_transform;
    o.regularizer_weight = regularizer;
    r = PointNetCls(m, in.input, o);
  }
  if (r.regularizer.valid()) m.set_output(kAuxLossOutput, r.regularizer);
  return r.logits;
}

// Inception-v3: args aux_logits (0/1), aux_weight, dropout, width_mult. In
// training mode the auxiliary classifier's weighted cross-entropy goes out
// as kAuxLossOutput, which BuildSupervised adds to the loss.
StatusOr<Sym> BuildInceptionV3(Model& m, const ModelInputs& in, ModelArgs& args) {
  InceptionOptions o;
  LOOM_ASSIGN_OR_RETURN(o.aux_logits, args.Flag("aux_logits", true));
  LOOM_ASSIGN_OR_RETURN(double aux_weight, args.NonNegative("aux_weight", 0.4));
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
  LOOM_ASSIGN_OR_RETURN(o.width_mult, args.Float("width_mult", o.width_mult));
  o.num_classes = in.num_classes;
  LOOM_ASSIGN_OR_RETURN(InceptionResult r, InceptionV3(m, in.input, o));
  if (r.aux_logits.valid()) {
    // torchvision's reference recipe: loss = CE(logits) + 0.4 * CE(aux_logits).
    CrossEntropyOptions ce;
    ce.ignore_index = kIgnoreTarget;
    m.set_output(kAuxLossOutput, m.scale(m.cross_entropy(r.aux_logits, in.target, ce), aux_weight));
  }
  return r.logits;
}

// The recurrent models read token windows [B, T]; args embed, hidden,
// layers, dropout (rnntc also vocab: its input ids' range, since its classes
// are not tokens).
template <typename Options>
Status ReadRnnArgs(ModelArgs& args, Options* o) {
  LOOM_ASSIGN_OR_RETURN(o->embed, args.IntAtLeast("embed", o->embed, 1));
  LOOM_ASSIGN_OR_RETURN(o->hidden, args.IntAtLeast("hidden", o->hidden, 1));
  LOOM_ASSIGN_OR_RETURN(o->layers, args.IntAtLeast("layers", o->layers, 1));
  LOOM_ASSIGN_OR_RETURN(o->dropout, args.Probability("dropout", o->dropout));
  return Status::Ok();
}

Status CheckTokenWindows(const std::string& model, Model& m, Sym tokens) {
  if (m.shape(tokens).rank() != 2 || m.shape(tokens)[1] < 1)
    return InvalidArgument(model, " needs token windows [batch, length >= 1], got ", m.shape(tokens).ToString());
  return Status::Ok();
}

StatusOr<Sym> BuildRnnLm(Model& m, const ModelInputs& in, ModelArgs& args) {
  RnnLmOptions o;
  LOOM_RETURN_IF_ERROR(ReadRnnArgs(args, &o));
  o.vocab = in.num_classes;
  LOOM_RETURN_IF_ERROR(CheckTokenWindows("rnnlm", m, in.input));
  return RnnLm(m, in.input, o);
}

StatusOr<Sym> BuildRnnTc(Model& m, const ModelInputs& in, ModelArgs& args) {
  RnnTcOptions o;
  // By default the data's vocabulary, when it says (loom train does).
  LOOM_ASSIGN_OR_RETURN(o.vocab, args.IntAtLeast("vocab", in.vocabulary > 0 ? in.vocabulary : o.vocab, 1));
  LOOM_RETURN_IF_ERROR(ReadRnnArgs(args, &o));
  o.num_classes = in.num_classes;
  if (o.vocab < in.vocabulary)
    return InvalidArgument("argument vocab: ", o.vocab, " is smaller than the data's vocabulary of ", in.vocabulary);
  LOOM_RETURN_IF_ERROR(CheckTokenWindows("rnntc", m, in.input));
  return RnnTc(m, in.input, o);
}

StatusOr<Sym> BuildNmt(Model& m, const ModelInputs& in, ModelArgs& args) {
  NmtOptions o;
  LOOM_RETURN_IF_ERROR(ReadRnnArgs(args, &o));
  o.vocab = in.num_classes;
  LOOM_RETURN_IF_ERROR(CheckTokenWindows("nmt", m, in.input));
  if (m.shape(in.target).rank() != 2 || m.shape(in.target)[1] < 1)
    return InvalidArgument("nmt needs target token windows [batch, length >= 1], got ", m.shape(in.target).ToString());
  return Nmt(m, in.input, in.target, o);
}

// The Transformer LM: args width, heads, layers, feedforward, dropout,
// max_len; the vocabulary is the classes (next-token targets).
StatusOr<Sym> BuildTransformerLm(Model& m, const ModelInputs& in, ModelArgs& args) {
  TransformerLmOptions o;
  LOOM_ASSIGN_OR_RETURN(o.width, args.Int("width", o.width));
  LOOM_ASSIGN_OR_RETURN(o.heads, args.Int("heads", o.heads));
  LOOM_ASSIGN_OR_RETURN(o.layers, args.Int("layers", o.layers));
  LOOM_ASSIGN_OR_RETURN(o.feedforward, args.Int("feedforward", o.feedforward));
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
  LOOM_ASSIGN_OR_RETURN(o.max_len, args.Int("max_len", o.max_len));
  o.vocab_size = in.num_classes;
  return TransformerLm(m, in.input, o);
}

// BERT-Medium with the masked-LM head: args layers, hidden, heads,
// intermediate, max_positions, dropout; the vocabulary is the classes (the
// masked-text data's mask token included).
StatusOr<Sym> BuildBertMedium(Model& m, const ModelInputs& in, ModelArgs& args) {
  BertOptions o;
  LOOM_ASSIGN_OR_RETURN(o.layers, args.Int("layers", o.layers));
  LOOM_ASSIGN_OR_RETURN(o.hidden, args.Int("hidden", o.hidden));
  LOOM_ASSIGN_OR_RETURN(o.heads, args.Int("heads", o.heads));
  LOOM_ASSIGN_OR_RETURN(o.intermediate, args.Int("intermediate", o.intermediate));
  LOOM_ASSIGN_OR_RETURN(o.max_positions, args.Int("max_positions", o.max_positions));
  LOOM_ASSIGN_OR_RETURN(o.dropout, args.Probability("dropout", o.dropout));
  o.vocab_size = in.num_classes;
  return BertForMaskedLm(m, in.input, o);
}

// DCGAN: args nz, ngf, ndf; channels and image size come from the data.
Status BuildDcgan(Model& m, const Shape& image, int64_t batch, GanStep step, ModelArgs& args) {
  DcganOptions o;
  LOOM_ASSIGN_OR_RETURN(o.nz, args.Int("nz", o.nz));
  LOOM_ASSIGN_OR_RETURN(o.ngf, args.Int("ngf", o.ngf));
  LOOM_ASSIGN_OR_RETURN(o.ndf, args.Int("ndf", o.ndf));
  if (image.rank() != 3 || image[1] != image[2])
    return InvalidArgument("dcgan needs square [channels, size, size] images, got ", image.ToString());
  o.channels = image[0];
  o.image_size = image[1];
  LOOM_RETURN_IF_ERROR(CheckDcganOptions(o));
  const std::string dt(DTypeName(m.dtype()));
  auto constant = [&](double value, const std::string& name) {
    return m.op1("Fill", {}, {{"shape", std::vector<int64_t>{batch}}, {"value", value}, {"dtype", dt}}, name);
  };
  // The mean of D's sigmoid output: the example's D(x) and D(G(z)).
  auto mean_probability = [&](Sym logits) { return m.mean(m.sigmoid(logits)); };
  Sym noise = m.input("noise", {batch, o.nz});
  Sym fake = DcganGenerator(m, noise, o, kGeneratorScope);
  if (step == GanStep::kDiscriminator) {
    Sym real = m.input("real", Shape({batch, image[0], image[1], image[2]}));
    DcganDiscriminator netD(m, o, kDiscriminatorScope);
    Sym d_real = netD(real);
    Sym d_fake = netD(fake);
    netD.Finish();
    m.set_output("loss", m.add(m.bce_with_logits(d_real, constant(1, "real_label")),
                               m.bce_with_logits(d_fake, constant(0, "fake_label"))));
    m.set_output("d_real", mean_probability(d_real));
    m.set_output("d_fake", mean_probability(d_fake));
  } else {
    DcganDiscriminator netD(m, o, kDiscriminatorScope);
    Sym d_fake = netD(fake);
    netD.Finish();
    m.set_output("loss", m.bce_with_logits(d_fake, constant(1, "real_label")));
    m.set_output("d_fake", mean_probability(d_fake));
    m.set_output("fake", fake);
  }
  return m.status();
}

}  // namespace

const std::vector<ZooEntry>& Zoo() {
  // The data of each model's reference count (docs/model_zoo.md). The token
  // models' counts do not depend on the sequence length: 64 ids.
  const ReferenceData fashion_mnist{{1, 28, 28}, 10};
  const ReferenceData imagenet{{3, 224, 224}, 1000};      // torchvision's classifiers
  const ReferenceData imagenet_299{{3, 299, 299}, 1000};  // Inception-v3's input size
  const ReferenceData modelnet40{{3, 1024}, 40};          // fxia22's classification
  const ReferenceData shapenet_part{{3, 1024}, 50};       // all 50 ShapeNet-part labels
  const ReferenceData dcgan_images{{3, 64, 64}, 0};       // examples/dcgan's image size
  const auto tokens = [](int64_t classes) { return ReferenceData{{64}, classes}; };
  static const std::vector<ZooEntry> zoo = {
      {"mlp", "multi-layer perceptron: flatten, Linear+ReLU per width in hidden (default 256,128; none for no "
              "hidden layer), classifier",
       InputKind::kFeatures, Prediction::kPerExample, fashion_mnist, BuildMlp},
      {"cnn", "small CNN: per stage in channels (default 32,64) conv3x3-BN-ReLU-maxpool2, then Linear(hidden)+ReLU, "
              "dropout, classifier",
       InputKind::kFeatures, Prediction::kPerExample, fashion_mnist, BuildCnn},
      {"resnet18", "torchvision's resnet18: BasicBlock stages 2,2,2,2; stem imagenet (7x7/2 conv, 3x3/2 max-pool) or "
                   "cifar (3x3/1 conv, no pool); width: base width (default 64)",
       InputKind::kFeatures, Prediction::kPerExample, imagenet,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildResNet(m, in, args, ResNet18Options());
       }},
      {"resnet101", "torchvision's resnet101: Bottleneck (v1.5) stages 3,4,23,3; stem imagenet or cifar; width: base "
                    "width (default 64)",
       InputKind::kFeatures, Prediction::kPerExample, imagenet,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildResNet(m, in, args, ResNet101Options());
       }},
      {"alexnet", "torchvision's alexnet: 5 convs (with bias) + ReLU, 3 max-pools, adaptive 6x6 average pool, "
                  "dropout-Linear(4096)-ReLU twice, classifier; inputs >= 63x63; dropout (default 0.5), "
                  "width_mult (default 1.0), hidden (default 4096)",
       InputKind::kFeatures, Prediction::kPerExample, imagenet, BuildAlexNet},
      {"vgg16", "torchvision's vgg16 (configuration D, no BatchNorm): 13 conv3x3 (with bias) + ReLU, 5 max-pools, "
                "adaptive 7x7 average pool, Linear(4096)-ReLU-dropout twice, classifier; inputs >= 32x32; dropout "
                "(default 0.5), width_mult (default 1.0), hidden (default 4096)",
       InputKind::kFeatures, Prediction::kPerExample, imagenet,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildVgg(m, in, args, Vgg16Options());
       }},
      {"mobilenet_v2", "torchvision's mobilenet_v2: inverted residuals (expand 6, ReLU6), last channel 1280, "
                       "dropout (default 0.2), width_mult (default 1.0)",
       InputKind::kFeatures, Prediction::kPerExample, imagenet,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildMobileNet(m, in, args, std::nullopt);
       }},
      {"mobilenet_v3_small", "torchvision's mobilenet_v3_small: squeeze-excite, hardswish, last channel 1024, "
                             "dropout (default 0.2), width_mult (default 1.0)",
       InputKind::kFeatures, Prediction::kPerExample, imagenet,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildMobileNet(m, in, args, MobileNetV3Size::kSmall);
       }},
      {"mobilenet_v3_large", "torchvision's mobilenet_v3_large: squeeze-excite, hardswish, last channel 1280, "
                             "dropout (default 0.2), width_mult (default 1.0)",
       InputKind::kFeatures, Prediction::kPerExample, imagenet,
       [](Model& m, const ModelInputs& in, ModelArgs& args) {
         return BuildMobileNet(m, in, args, MobileNetV3Size::kLarge);
       }},
      {"pointnet_cls", "PointNet classification as fxia22/pointnet.pytorch's PointNetCls(feature_transform=True) on "
                       "[3, points] inputs: STN3d, conv1d 64, STNkd(64), conv1d 128, 1024, max over points, "
                       "Linear 512-256 with BN, classifier; dropout (default 0.3), feature_transform (default 1), "
                       "regularizer (default 0.001: its weight, added to the loss)",
       InputKind::kFeatures, Prediction::kPerExample, modelnet40,
       [](Model& m, const ModelInputs& in, ModelArgs& args) { return BuildPointNet(m, in, args, false); }},
      {"inception_v3", "torchvision's inception_v3 (Inception3, transform_input=False): BasicConv2d stem, Mixed_5b-5d, "
                       "6a-6e, 7a-7c, average pool, dropout, fc; inputs >= 75x75; in training mode the AuxLogits "
                       "head on Mixed_6e (inputs >= 299x299) adds aux_weight (default 0.4) times its cross-entropy "
                       "to the loss; aux_logits (default 1), dropout (default 0.5), width_mult (default 1.0, loom's "
                       "reduction: scales every conv's channels)",
       InputKind::kFeatures, Prediction::kPerExample, imagenet_299, BuildInceptionV3},
      {"pointnet_seg", "PointNet part segmentation as fxia22/pointnet.pytorch's PointNetDenseCls(feature_transform=True) "
                       "on [3, points] inputs with a part label per point: the pointnet_cls encoder, its 1024 global "
                       "features repeated at every point beside the 64 point features, conv1d 512-256-128 with BN, "
                       "per-point classifier; feature_transform (default 1), regularizer (default 0.001)",
       InputKind::kFeatures, Prediction::kPerPosition, shapenet_part,
       [](Model& m, const ModelInputs& in, ModelArgs& args) { return BuildPointNet(m, in, args, true); }},
      {"rnnlm", "FlexFlow's RNNLM as PyTorch's word_language_model RNNModel: Embedding, dropout, LSTM, dropout, "
                "Linear to the vocabulary at every position (next-token targets); embed, hidden (default 1024), "
                "layers (default 2), dropout (default 0.2)",
       InputKind::kTokens, Prediction::kPerPosition, tokens(10000), BuildRnnLm},
      {"rnntc", "FlexFlow's RNNTC text classifier: Embedding of ids below vocab (default 32000), dropout, LSTM, "
                "the last position's output, dropout, Linear to the classes; embed, hidden (default 1024), layers "
                "(default 4), dropout (default 0.2)",
       InputKind::kTokens, Prediction::kPerExample, tokens(2), BuildRnnTc},
      {"nmt", "FlexFlow's NMT: LSTM encoder over the input, LSTM decoder over the target shifted right (teacher "
              "forcing, start token id = classes), Luong general attention (OpenNMT-py GlobalAttention), "
              "tanh(Linear), Linear to the classes at every target position; embed, hidden (default 2048), layers "
              "(default 2 per side), dropout (default 0.2)",
       InputKind::kTokens, Prediction::kPerPosition, tokens(20480), BuildNmt},
      {"transformer_lm", "PyTorch word_language_model's TransformerModel as HFTA benchmarks it: Embedding * "
                         "sqrt(width), sinusoidal positions, dropout, post-norm TransformerEncoderLayers (ReLU) "
                         "with a causal mask, Linear to the vocabulary at every position (next-token targets); "
                         "width (default 128), heads (2), layers (2), feedforward (128), dropout (0.2), max_len "
                         "(5000)",
       InputKind::kTokens, Prediction::kPerPosition, tokens(10000), BuildTransformerLm},
      {"bert_medium", "BERT-Medium as HuggingFace's BertForMaskedLM (no pooler): word, position and token-type "
                      "embeddings, LayerNorm, post-norm layers (GELU), MLM head with the decoder tied to the word "
                      "embeddings (masked-token targets); layers (default 8), hidden (512), heads (8), "
                      "intermediate (2048), max_positions (512), dropout (0.1)",
       InputKind::kTokens, Prediction::kPerPosition, tokens(30522), BuildBertMedium},
      {"dcgan", "PyTorch's examples/dcgan: a generator of stride-2 ConvTranspose2d-BN-ReLU layers from a latent "
                "vector to the image (Tanh) and a mirrored Conv2d-BN-LeakyReLU discriminator, trained in alternating "
                "steps; images of size 4 * 2^k; nz (default 100), ngf (64), ndf (64)",
       InputKind::kFeatures, Prediction::kPerExample, dcgan_images, nullptr, BuildDcgan},
  };
  return zoo;
}

StatusOr<const ZooEntry*> FindModel(const std::string& name) {
  std::string names;
  for (const ZooEntry& e : Zoo()) {
    if (e.name == name) return &e;
    names += (names.empty() ? "" : ", ") + e.name;
  }
  return NotFound("unknown model '", Excerpt(name), "' (the zoo has: ", names, ")");
}

const char* InputKindName(InputKind kind) {
  return kind == InputKind::kTokens ? "token ids" : "f32 features";
}

namespace {

// The graph inputs, `network`'s logits checked against the targets, and the
// loss; `name` names the model in errors.
Status BuildWithLoss(Model& m, const std::string& name, const NetworkFn& network, const DataSpec& data,
                     int64_t batch) {
  auto batched = [batch](const Shape& s) {
    std::vector<int64_t> dims = {batch};
    dims.insert(dims.end(), s.dims().begin(), s.dims().end());
    return Shape(dims);
  };
  ModelInputs in;
  // Features take the model's float type (f32, or f64 for gradient checks).
  in.input = data.input_dtype == DType::kI64 ? m.input("input", batched(data.input), DType::kI64)
                                             : m.input("input", batched(data.input));
  in.target = m.input("target", batched(data.target), DType::kI64);
  in.num_classes = data.num_classes;
  in.vocabulary = data.vocabulary;
  LOOM_ASSIGN_OR_RETURN(Sym logits, network(m, in));
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

}  // namespace

Status BuildSupervised(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const DataSpec& data, int64_t batch) {
  LOOM_ASSIGN_OR_RETURN(const ZooEntry* entry, FindModel(name));
  if (!entry->build)
    return InvalidArgument("model ", name, " is a GAN: it trains with alternating generator and discriminator steps "
                           "(loom train does that for it), not with a supervised loss");
  const InputKind given = data.input_dtype == DType::kI64 ? InputKind::kTokens : InputKind::kFeatures;
  if (given != entry->input)
    return InvalidArgument("model ", name, " reads ", InputKindName(entry->input), ", the data gives ",
                           InputKindName(given), " ", data.input.ToString());
  const DataSpec want_data = ExpectedData(*entry, data.input, data.num_classes);
  if (data.target != want_data.target)
    return InvalidArgument("model ", name, " predicts ",
                           entry->prediction == Prediction::kPerExample ? "one class per example"
                                                                        : "one class per position of the input",
                           " (targets ", want_data.target.ToString(), " per example), the data's targets are ",
                           data.target.ToString());
  ModelArgs model_args(args);
  return BuildWithLoss(
      m, name,
      [&](Model& model, const ModelInputs& in) -> StatusOr<Sym> {
        LOOM_ASSIGN_OR_RETURN(Sym logits, entry->build(model, in, model_args));
        LOOM_RETURN_IF_ERROR(model_args.CheckAllUsed(name));
        return logits;
      },
      data, batch);
}

Status BuildSupervised(Model& m, const NetworkFn& network, const DataSpec& data, int64_t batch) {
  if (!network) return InvalidArgument("BuildSupervised: no network given");
  return BuildWithLoss(m, "(custom network)", network, data, batch);
}

Status BuildGanStep(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                    const Shape& image, int64_t batch, GanStep step) {
  LOOM_ASSIGN_OR_RETURN(const ZooEntry* entry, FindModel(name));
  if (!entry->gan) return InvalidArgument("model ", name, " is not a GAN");
  ModelArgs model_args(args);
  LOOM_RETURN_IF_ERROR(entry->gan(m, image, batch, step, model_args));
  LOOM_RETURN_IF_ERROR(model_args.CheckAllUsed(name));
  return m.status().WithContext("model " + name);
}

DataSpec ExpectedData(const ZooEntry& entry, const Shape& input, int64_t num_classes) {
  DataSpec d;
  d.input = input;
  d.input_dtype = entry.input == InputKind::kTokens ? DType::kI64 : DType::kF32;
  if (entry.prediction == Prediction::kPerPosition && input.rank() > 0) d.target = Shape{input.dims().back()};
  d.num_classes = num_classes;
  return d;
}

Status BuildClassifier(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const Shape& input_shape, int64_t batch, int64_t num_classes) {
  return BuildSupervised(m, name, args, DataSpec{input_shape, DType::kF32, Shape{}, num_classes}, batch);
}

}  // namespace loom::models
