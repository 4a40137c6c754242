// The model zoo: models by name, with string arguments (from config files
// and `--set key=value`), each built with the C++ model API. Unknown names
// and arguments are errors that list what exists.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/model.h"

namespace loom::models {

// A model's arguments: typed reads with defaults, and a check that every
// given argument was read (so a typo is an error, not silently ignored).
// Messages echo values cut to 64 bytes.
class ModelArgs {
 public:
  ModelArgs() = default;
  explicit ModelArgs(std::map<std::string, std::string> values) : values_(std::move(values)) {}

  StatusOr<int64_t> Int(const std::string& key, int64_t def);
  std::string Str(const std::string& key, const std::string& def);
  StatusOr<double> Float(const std::string& key, double def);
  // "256,128": comma-separated integers, each >= min; "none" is the empty
  // list. An empty value or item ("", "128,,64", "128,") is an error.
  StatusOr<std::vector<int64_t>> Ints(const std::string& key, const std::vector<int64_t>& def, int64_t min);
  // The same reads, checked: an Int >= min, a Float >= 0, a probability in
  // [0, 1) (dropout), a flag 0 or 1. Errors name the argument and value.
  StatusOr<int64_t> IntAtLeast(const std::string& key, int64_t def, int64_t min);
  StatusOr<double> NonNegative(const std::string& key, double def);
  StatusOr<double> Probability(const std::string& key, double def);
  StatusOr<bool> Flag(const std::string& key, bool def);
  // Fails naming the first argument no Int/Float/Ints call asked for.
  Status CheckAllUsed(const std::string& model) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> used_;
};

// What a model reads; the data must match (errors say which data fits).
enum class InputKind {
  kFeatures,  // f32 [B, ...]: images [C, H, W], point clouds [3, N]
  kTokens,    // i64 token ids [B, T]
};
const char* InputKindName(InputKind kind);  // "f32 features" | "token ids"

// The data a model is built for, per example (no batch axis).
struct DataSpec {
  Shape input;                      // [1, 28, 28], [3, 1024], [T]
  DType input_dtype = DType::kF32;  // kI64 tokens; anything else: features in the model's float type
  Shape target;                     // [] one class, [T] tokens, [N] a label per point
  int64_t num_classes = 10;         // classes, or the vocabulary size
  // Token inputs: their ids are in [0, vocabulary); 0: not said (language
  // models take num_classes, as their inputs and targets share ids).
  int64_t vocabulary = 0;
};

// A builder may set this scalar output; BuildSupervised adds it to the loss
// (PointNet's feature-transform regularizer, Inception-v3's auxiliary
// classifier loss).
constexpr const char* kAuxLossOutput = "aux_loss";

// What a builder gets: the graph inputs and the number of classes.
struct ModelInputs {
  Sym input;   // [B, input...]
  Sym target;  // [B, target...] i64; read only by models fed their targets (NMT's teacher forcing)
  int64_t num_classes = 0;
  int64_t vocabulary = 0;  // DataSpec::vocabulary
};

// What the logits score.
enum class Prediction {
  kPerExample,   // one class per example: logits [B, classes], targets [B]
  kPerPosition,  // one class per position along the input's last axis (a
                 // token, a point): logits [B, L, classes], targets [B, L]
};

// One of a GAN's two alternating training steps.
enum class GanStep { kDiscriminator, kGenerator };

// The data a model's reference parameter count is stated for
// (docs/model_zoo.md), and so `loom inspect`'s default.
struct ReferenceData {
  Shape input;              // per example: [3, 224, 224] images, [3, 1024] points, [T] tokens
  int64_t num_classes = 0;  // classes, parts or vocabulary; 0 for a GAN
};

struct ZooEntry {
  std::string name;
  std::string description;
  InputKind input = InputKind::kFeatures;
  Prediction prediction = Prediction::kPerExample;
  ReferenceData reference;
  // Returns logits [B, target..., num_classes]: one row of class scores per
  // target entry.
  std::function<StatusOr<Sym>(Model&, const ModelInputs&, ModelArgs&)> build;
  // GANs (dcgan) leave `build` empty and set `gan`: BuildGanStep below.
  std::function<Status(Model&, const Shape& image, int64_t batch, GanStep, ModelArgs&)> gan;
};

const std::vector<ZooEntry>& Zoo();
StatusOr<const ZooEntry*> FindModel(const std::string& name);  // error lists the zoo

// Builds a zoo model for training or evaluation: the graph inputs "input"
// [batch, data.input...] and "target" [batch, data.target...] (i64), the
// outputs "logits" [batch, data.target..., classes] and "loss": the mean
// cross-entropy over the target entries (entries equal to kIgnoreTarget are
// not scored) plus the model's kAuxLossOutput when its builder sets one.
// Errors name the model and say when the data does not fit it.
constexpr int64_t kIgnoreTarget = -100;
Status BuildSupervised(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const DataSpec& data, int64_t batch);

// A network of the caller's own: given the graph inputs, returns the logits
// [B, target..., classes]. BuildSupervised adds the inputs, outputs and loss
// as for a zoo model (the data's kind is the caller's to match).
using NetworkFn = std::function<StatusOr<Sym>(Model& m, const ModelInputs& inputs)>;
Status BuildSupervised(Model& m, const NetworkFn& network, const DataSpec& data, int64_t batch);

// A GAN's networks are scoped "netG" and "netD" (PyTorch's DCGAN names); a
// step trains only its own network's parameters.
constexpr const char* kGeneratorScope = "netG";
constexpr const char* kDiscriminatorScope = "netD";

// Builds the forward graph of one training step of a zoo GAN for images of
// `image` shape [C, H, W] (train/gan_run.h alternates the two):
//  kDiscriminator: inputs "real" [batch, C, H, W] and "noise" [batch, nz];
//    outputs "loss" = BCE(D(real), 1) + BCE(D(G(noise)), 0), "d_real" and
//    "d_fake" (the mean of D's sigmoid output on each batch);
//  kGenerator: input "noise"; outputs "loss" = BCE(D(G(noise)), 1), "d_fake"
//    and "fake" = G(noise) [batch, C, H, W] in [-1, 1].
// Errors name the model; a supervised model is an error here, as a GAN is
// in BuildSupervised.
Status BuildGanStep(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                    const Shape& image, int64_t batch, GanStep step);

// The data spec a model expects for per-example inputs of `input` shape:
// f32 features or i64 tokens, and the targets its prediction needs.
DataSpec ExpectedData(const ZooEntry& entry, const Shape& input, int64_t num_classes);

// BuildSupervised for f32 examples of `input_shape` with one class each.
Status BuildClassifier(Model& m, const std::string& name, const std::map<std::string, std::string>& args,
                       const Shape& input_shape, int64_t batch, int64_t num_classes);

}  // namespace loom::models
