#include "runtime/config/train_config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <fstream>

#include "graph/training.h"
#include <set>
#include <sstream>

namespace loom {

namespace {

namespace pb = google::protobuf;

class CollectErrors : public pb::io::ErrorCollector {
 public:
  explicit CollectErrors(std::string origin) : origin_(std::move(origin)) {}
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = StrCat(origin_, ":", line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string origin_;
  std::string first_;
};

// "FILE:LINE" of a dotted field path, or "" when the file does not set it.
std::string Locate(const pb::TextFormat::ParseInfoTree& root, const pb::Descriptor* type, const std::string& origin,
                   const std::string& path) {
  const pb::TextFormat::ParseInfoTree* tree = &root;
  std::stringstream parts(path);
  std::string part;
  std::vector<std::string> names;
  while (std::getline(parts, part, '.')) names.push_back(part);
  for (size_t i = 0; i < names.size(); ++i) {
    const pb::FieldDescriptor* field = type->FindFieldByName(names[i]);
    if (!field) return "";
    const int index = field->is_repeated() ? 0 : -1;
    if (i + 1 == names.size()) {
      pb::TextFormat::ParseLocation loc = tree->GetLocation(field, index);
      return loc.line < 0 ? "" : StrCat(origin, ":", loc.line + 1);
    }
    tree = tree->GetTreeForNested(field, index);
    if (!tree || !field->message_type()) return "";
    type = field->message_type();
  }
  return "";
}

// Collects the first failed check as "WHERE: field PATH: message".
class Checker {
 public:
  Checker(const std::function<std::string(const std::string&)>& where, std::string origin)
      : where_(where), origin_(std::move(origin)) {}

  bool Present(const std::string& field) const { return !where_(field).empty(); }

  void Require(bool ok, const std::string& field, const std::string& message) {
    if (ok || !status_.ok()) return;
    std::string at = where_(field);
    status_ = InvalidArgument(at.empty() ? origin_ : at, ": field ", field, ": ", message);
  }
  // A count that is "unset" at 0 but, when written in the file, must be >= min.
  void AtLeast(int64_t value, int64_t min, const std::string& field) {
    bool unset = value == 0 && !Present(field);
    Require(unset || value >= min, field, StrCat("must be >= ", min, ", got ", value));
  }
  void OneOf(const std::string& value, const std::set<std::string>& allowed, const std::string& field) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    Require(allowed.count(value) != 0, field, StrCat("unknown value '", value, "' (expected one of: ", list, ")"));
  }
  void InRange(double value, double lo, double hi, bool hi_open, const std::string& field) {
    bool ok = value >= lo && (hi_open ? value < hi : value <= hi);
    Require(ok, field, StrCat("must be in [", lo, ", ", hi, hi_open ? ")" : "]", ", got ", value));
  }
  const Status& status() const { return status_; }

 private:
  const std::function<std::string(const std::string&)>& where_;
  std::string origin_;
  Status status_;
};

}  // namespace

Status ValidateTrainConfig(const proto::TrainConfig& c, const std::function<std::string(const std::string&)>& where) {
  Checker k(where, "config");
  k.Require(!c.model().name().empty(), "model.name", "is required (a model of the zoo, e.g. \"mlp\")");

  const proto::DataConfig& d = c.data();
  k.OneOf(d.dataset(), {"fashion_mnist", "mnist", "cifar10", "synthetic", "text"}, "data.dataset");
  k.AtLeast(d.batch_size(), 1, "data.batch_size");
  k.AtLeast(d.eval_batch_size(), 1, "data.eval_batch_size");
  k.Require(d.prefetch() >= 0, "data.prefetch", StrCat("must be >= 0, got ", d.prefetch()));
  k.Require(d.train_limit() >= 0, "data.train_limit", StrCat("must be >= 0, got ", d.train_limit()));
  k.Require(d.test_limit() >= 0, "data.test_limit", StrCat("must be >= 0, got ", d.test_limit()));
  k.Require(d.normalize().mean_size() == d.normalize().std_size(), "data.normalize.std",
            StrCat("has ", d.normalize().std_size(), " values but mean has ", d.normalize().mean_size()));
  for (double s : d.normalize().std()) k.Require(s > 0, "data.normalize.std", StrCat("must be > 0, got ", s));
  k.Require(d.augment().random_crop_padding() >= 0, "data.augment.random_crop_padding",
            StrCat("must be >= 0, got ", d.augment().random_crop_padding()));
  if (d.dataset() == "synthetic") {
    k.Require(d.input_shape_size() > 0, "data.input_shape", "is required for the synthetic dataset");
    for (int64_t e : d.input_shape()) k.Require(e >= 1, "data.input_shape", StrCat("extents must be >= 1, got ", e));
    k.AtLeast(d.num_classes(), 2, "data.num_classes");
    k.AtLeast(d.num_examples(), 1, "data.num_examples");
  }
  if (d.dataset() == "text") {
    k.Require(!d.path().empty(), "data.path", "is required for the text dataset (a text file)");
    k.AtLeast(d.sequence_length(), 1, "data.sequence_length");
  }

  const proto::OptimizerConfig& o = c.optimizer();
  const std::string type = o.type().empty() ? "sgd" : o.type();
  k.OneOf(type, {"sgd", "adam", "adamw", "adadelta", "rmsprop"}, "optimizer.type");
  k.Require(o.lr() > 0 || (o.lr() == 0 && !k.Present("optimizer.lr")), "optimizer.lr",
            StrCat("must be > 0, got ", o.lr()));
  k.InRange(o.momentum(), 0, 1, true, "optimizer.momentum");
  k.InRange(o.dampening(), 0, 1, false, "optimizer.dampening");
  k.Require(o.weight_decay() >= 0, "optimizer.weight_decay", StrCat("must be >= 0, got ", o.weight_decay()));
  k.Require(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0), "optimizer.nesterov",
            "needs momentum > 0 and dampening 0");
  if (o.has_beta1()) k.InRange(o.beta1(), 0, 1, true, "optimizer.beta1");
  if (o.has_beta2()) k.InRange(o.beta2(), 0, 1, true, "optimizer.beta2");
  if (o.has_eps()) k.Require(o.eps() >= 0, "optimizer.eps", StrCat("must be >= 0, got ", o.eps()));
  if (o.has_rho()) k.InRange(o.rho(), 0, 1, false, "optimizer.rho");
  if (o.has_alpha()) k.InRange(o.alpha(), 0, 1, false, "optimizer.alpha");
  k.Require(o.clip_grad_norm() >= 0, "optimizer.clip_grad_norm", StrCat("must be >= 0, got ", o.clip_grad_norm()));

  const proto::ScheduleConfig& s = c.schedule();
  const std::string stype = s.type().empty() ? "constant" : s.type();
  k.OneOf(stype, {"constant", "step", "multistep", "exponential", "cosine", "warmup"}, "schedule.type");
  if (!s.unit().empty()) k.OneOf(s.unit(), {"epoch", "step"}, "schedule.unit");
  if (stype == "step") k.Require(s.step_size() >= 1, "schedule.step_size", StrCat("must be >= 1, got ", s.step_size()));
  if (stype == "multistep") {
    k.Require(s.milestones_size() > 0, "schedule.milestones", "is required for a multistep schedule");
    for (int i = 1; i < s.milestones_size(); ++i)
      k.Require(s.milestones(i) > s.milestones(i - 1), "schedule.milestones", "must be strictly increasing");
  }
  if (s.has_gamma()) k.Require(s.gamma() > 0, "schedule.gamma", StrCat("must be > 0, got ", s.gamma()));
  k.Require(s.t_max() >= 0, "schedule.t_max", StrCat("must be >= 0, got ", s.t_max()));
  k.Require(s.warmup_steps() >= 0, "schedule.warmup_steps", StrCat("must be >= 0, got ", s.warmup_steps()));
  if (s.has_warmup_start_factor()) k.InRange(s.warmup_start_factor(), 0, 1, false, "schedule.warmup_start_factor");

  k.AtLeast(c.epochs(), 1, "epochs");
  k.Require(c.max_steps() >= 0, "max_steps", StrCat("must be >= 0, got ", c.max_steps()));
  k.Require(c.threads() >= 0, "threads", StrCat("must be >= 0, got ", c.threads()));
  k.AtLeast(c.eval_every_epochs(), 1, "eval_every_epochs");
  k.AtLeast(c.log_every_steps(), 1, "log_every_steps");
  k.Require(c.checkpoint_every_steps() >= 0, "checkpoint_every_steps",
            StrCat("must be >= 0, got ", c.checkpoint_every_steps()));
  k.AtLeast(c.keep_checkpoints(), 1, "keep_checkpoints");
  return k.status();
}

void FillDefaults(proto::TrainConfig* c) {
  proto::DataConfig* d = c->mutable_data();
  if (d->batch_size() == 0) d->set_batch_size(128);
  if (d->eval_batch_size() == 0) d->set_eval_batch_size(d->batch_size());
  if (!d->has_shuffle()) d->set_shuffle(true);
  if (!d->has_drop_last()) d->set_drop_last(true);
  if (!d->has_prefetch()) d->set_prefetch(2);
  proto::OptimizerConfig* o = c->mutable_optimizer();
  if (o->type().empty()) o->set_type("sgd");
  if (o->lr() == 0) o->set_lr(DefaultLearningRate(o->type()).value());  // type was checked
  OptimizerConfig defaults;  // torch.optim's defaults, in one place (graph/training.h)
  defaults.type = o->type();
  if (!o->has_beta1()) o->set_beta1(defaults.beta1);
  if (!o->has_beta2()) o->set_beta2(defaults.beta2);
  if (!o->has_eps()) o->set_eps(defaults.EffectiveEps());
  if (!o->has_weight_decay()) o->set_weight_decay(defaults.EffectiveWeightDecay());
  if (!o->has_rho()) o->set_rho(defaults.rho);
  if (!o->has_alpha()) o->set_alpha(defaults.alpha);
  proto::ScheduleConfig* s = c->mutable_schedule();
  if (s->type().empty()) s->set_type("constant");
  if (s->unit().empty()) s->set_unit("epoch");
  if (!s->has_gamma()) s->set_gamma(0.1);
  if (!s->has_warmup_start_factor()) s->set_warmup_start_factor(1.0 / 3.0);
  if (c->epochs() == 0) c->set_epochs(1);
  if (c->eval_every_epochs() == 0) c->set_eval_every_epochs(1);
  if (c->log_every_steps() == 0) c->set_log_every_steps(50);
  if (c->keep_checkpoints() == 0) c->set_keep_checkpoints(3);
  if (!c->has_tensorboard()) c->set_tensorboard(true);
}

StatusOr<proto::TrainConfig> ParseTrainConfig(const std::string& text, const std::string& origin) {
  proto::TrainConfig config;
  pb::TextFormat::Parser parser;
  CollectErrors errors(origin);
  pb::TextFormat::ParseInfoTree tree;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(text, &config))
    return InvalidArgument(errors.first().empty() ? origin + ": cannot parse the config" : errors.first());
  auto where = [&](const std::string& path) { return Locate(tree, proto::TrainConfig::descriptor(), origin, path); };
  Status s = ValidateTrainConfig(config, where);
  if (!s.ok()) {
    // Messages about a field the file does not set name the file alone.
    std::string m = s.message();
    if (m.rfind("config:", 0) == 0) m = origin + m.substr(6);
    return InvalidArgument(m);
  }
  FillDefaults(&config);
  return config;
}

StatusOr<proto::TrainConfig> LoadTrainConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open the config file");
  std::stringstream text;
  text << in.rdbuf();
  return ParseTrainConfig(text.str(), path);
}

std::string TrainConfigToText(const proto::TrainConfig& config) {
  std::string text;
  pb::TextFormat::Printer printer;
  printer.PrintToString(config, &text);
  return text;
}

}  // namespace loom
