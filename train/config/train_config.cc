#include "train/config/train_config.h"

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "core/text_proto.h"
#include "graph/training.h"
#include "train/config/replicas.h"
#include "train/optim/schedule.h"

namespace loom {

namespace {

namespace pb = google::protobuf;

// Pixels of data.augment.random_crop_padding on each side, at most: recipes
// pad by 2 to 4; a padding the size of the image crops mostly zeros.
constexpr int64_t kMaxCropPadding = 64;
// Pixels of data.augment.crop_size, at most: GAN recipes crop 32 to 128; the
// loader allocates crop_size^2 pixels per example.
constexpr int64_t kMaxCropSize = 1024;

using FieldFn = std::function<std::string(const std::string&)>;

// Collects the first failed check as "WHERE: field NAME: message", NAME being
// how `name` shows the dotted field path.
class Checker {
 public:
  Checker(const FieldFn& where, std::string origin, const FieldFn& name)
      : where_(where), name_(name), origin_(std::move(origin)) {}

  bool Present(const std::string& field) const { return !where_(field).empty(); }

  // `block`: where to point when the file does not set `field` (the block
  // that lacks it), if anywhere.
  void Require(bool ok, const std::string& field, const std::string& message, const std::string& block = "") {
    if (ok || !status_.ok()) return;
    std::string at = where_(field);
    if (at.empty() && !block.empty()) at = where_(block);
    status_ = InvalidArgument(at.empty() ? origin_ : at, ": field ", name_ ? name_(field) : field, ": ", message);
  }
  // A count that is "unset" at 0 but, when written in the file, must be >= min.
  void AtLeast(int64_t value, int64_t min, const std::string& field) {
    bool unset = value == 0 && !Present(field);
    Require(unset || value >= min, field, StrCat("must be >= ", min, ", got ", value));
  }
  void OneOf(const std::string& value, const std::set<std::string>& allowed, const std::string& field) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    Require(allowed.count(value) != 0, field,
            StrCat("unknown value '", Excerpt(value), "' (expected one of: ", list, ")"));
  }
  void InRange(double value, double lo, double hi, bool hi_open, const std::string& field) {
    bool ok = value >= lo && (hi_open ? value < hi : value <= hi);
    Require(ok, field, StrCat("must be in [", lo, ", ", hi, hi_open ? ")" : "]", ", got ", value));
  }
  const Status& status() const { return status_; }

 private:
  const FieldFn& where_;
  const FieldFn& name_;
  std::string origin_;
  Status status_;
};

// A sweep value for field `f` (null: unknown field, checked elsewhere).
void CheckSweepValue(Checker& k, const pb::FieldDescriptor* f, double v, const std::string& field) {
  k.Require(std::isfinite(v), field, StrCat("must be a finite number, got ", v));
  if (!f || !IsIntegerField(f)) return;
  constexpr double kLimit = 9007199254740992.0;  // 2^53: integers a double holds exactly
  k.Require(std::fabs(v) <= kLimit, field,
            StrCat("must be within +-2^53 for the integer field ", f->name(), ", got ", v));
  if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT64 || f->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT32)
    k.Require(v >= 0, field, StrCat("must be >= 0 for ", f->name(), ", got ", v));
}

// The replicas, sweep and fusion blocks (the replicas' own values are checked
// when they are expanded, train/config/replicas.cc).
void ValidateFusion(const proto::TrainConfig& c, Checker& k) {
  std::string allowed;
  for (const auto& f : SweepableFields()) allowed += (allowed.empty() ? "" : ", ") + f;

  k.Require(c.replicas_size() == 0 || !c.has_sweep(), "sweep",
            "cannot be combined with replicas (list the replicas or sweep, not both)");
  k.Require(c.replicas_size() <= kMaxReplicas, "replicas",
            StrCat("lists ", c.replicas_size(), " replicas, more than the limit of ", kMaxReplicas));
  const std::string base_type = c.optimizer().type().empty() ? "sgd" : c.optimizer().type();
  std::map<std::string, int> names;
  for (int i = 0; i < c.replicas_size(); ++i) {
    const proto::ReplicaConfig& r = c.replicas(i);
    const std::string at = StrCat("replicas[", i, "]");
    const std::string name = r.name().empty() ? StrCat("r", i) : r.name();
    auto [it, fresh] = names.emplace(name, i);
    k.Require(fresh, at + ".name", StrCat("'", Excerpt(name), "' is also the name of replicas[", it->second, "]"));
    const std::string& type = r.optimizer().type();
    k.Require(type.empty() || type == base_type, at + ".optimizer.type",
              StrCat("must be the base optimizer's '", base_type,
                     "' (the replicas share one fused optimizer), got '", Excerpt(type), "'"));
    // Flags that select the optimizer's algorithm are shared the same way.
    const pb::Descriptor* od = proto::OptimizerConfig::descriptor();
    const pb::Reflection* refl = proto::OptimizerConfig::GetReflection();
    for (int f = 0; f < od->field_count(); ++f) {
      const pb::FieldDescriptor* field = od->field(f);
      if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_BOOL || !refl->HasField(r.optimizer(), field)) continue;
      const bool mine = refl->GetBool(r.optimizer(), field), base = refl->GetBool(c.optimizer(), field);
      k.Require(mine == base, StrCat(at, ".optimizer.", field->name()),
                StrCat("must be the same for every replica (the replicas share one fused optimizer): the base has ",
                       base ? "true" : "false"));
    }
  }

  if (c.has_sweep()) {
    const proto::SweepConfig& sw = c.sweep();
    k.Require(!sw.method().empty(), "sweep.method", "is required: grid or random", "sweep");
    if (!sw.method().empty()) k.OneOf(sw.method(), {"grid", "random"}, "sweep.method");
    const bool grid = sw.method() == "grid", random = sw.method() == "random";
    k.Require(sw.param_size() > 0, "sweep.param", "needs at least one param (a field and its values or range)",
              "sweep");
    std::map<std::string, int> swept;
    double replicas = 1;
    for (int j = 0; j < sw.param_size(); ++j) {
      const proto::SweepParam& p = sw.param(j);
      const std::string at = StrCat("sweep.param[", j, "]");
      const pb::FieldDescriptor* f = SweepableField(p.field());
      if (p.field().empty()) {
        k.Require(false, at + ".field", StrCat("is required (one of: ", allowed, ")"), at);
      } else {
        k.Require(f != nullptr, at + ".field",
                  StrCat("'", Excerpt(p.field()), "' is not a per-replica field (allowed: ", allowed, ")"));
        auto [it, fresh] = swept.emplace(p.field(), j);
        k.Require(fresh, at + ".field",
                  StrCat("'", Excerpt(p.field()), "' is already swept by sweep.param[", it->second, "]"));
      }
      for (double v : p.values()) CheckSweepValue(k, f, v, at + ".values");
      replicas *= std::max(1, p.values_size());
      if (grid) {
        k.Require(p.values_size() > 0, at + ".values", "is required: a grid param needs values", at);
        k.Require(!p.has_min(), at + ".min", "is for random sweeps (a grid param takes values)");
        k.Require(!p.has_max(), at + ".max", "is for random sweeps (a grid param takes values)");
        k.Require(p.distribution().empty(), at + ".distribution", "is for random sweeps (a grid param takes values)");
      } else if (random) {
        const std::string dist =
            !p.distribution().empty() ? p.distribution() : p.values_size() > 0 ? "choice" : "uniform";
        k.OneOf(dist, {"choice", "log_uniform", "uniform"}, at + ".distribution");
        if (dist == "choice") {
          k.Require(p.values_size() > 0, at + ".values", "is required: a choice param needs values", at);
          k.Require(!p.has_min(), at + ".min", "is for uniform and log_uniform (choice takes values)");
          k.Require(!p.has_max(), at + ".max", "is for uniform and log_uniform (choice takes values)");
        } else if (dist == "uniform" || dist == "log_uniform") {
          k.Require(p.values_size() == 0, at + ".values", StrCat("are for choice (", dist, " takes min and max)"));
          k.Require(p.has_min(), at + ".min", StrCat("is required for ", dist, " (the range [min, max))"), at);
          k.Require(p.has_max(), at + ".max", StrCat("is required for ", dist, " (the range [min, max))"), at);
          if (p.has_min()) CheckSweepValue(k, f, p.min(), at + ".min");
          if (p.has_max()) CheckSweepValue(k, f, p.max(), at + ".max");
          if (p.has_min() && p.has_max())
            k.Require(p.min() < p.max(), at + ".max", StrCat("must be > min (", p.min(), "), got ", p.max()));
          if (dist == "log_uniform" && p.has_min())
            k.Require(p.min() > 0, at + ".min", StrCat("must be > 0 for log_uniform, got ", p.min()));
        }
      }
    }
    if (grid) {
      k.Require(sw.count() == 0, "sweep.count",
                "is for random sweeps (a grid has one replica per combination of the params' values)");
      k.Require(replicas <= kMaxReplicas, "sweep",
                StrCat("gives ", replicas,
                       " replicas (the product of the params' value counts), more than the limit of ", kMaxReplicas));
    }
    if (random) {
      k.Require(sw.count() >= 1, "sweep.count", StrCat("must be >= 1 for a random sweep, got ", sw.count()), "sweep");
      k.Require(sw.count() <= kMaxReplicas, "sweep.count",
                StrCat("must be <= ", kMaxReplicas, " (the replica limit), got ", sw.count()));
    }
  }

  const proto::FusionConfig& fu = c.fusion();
  std::map<std::string, int> layers;
  for (int i = 0; i < fu.unfused_layers_size(); ++i) {
    const std::string at = StrCat("fusion.unfused_layers[", i, "]");
    const std::string& layer = fu.unfused_layers(i);
    // (A list written as [a, b] has one location, its first element's.)
    k.Require(!layer.empty(), at, "must name a layer (a node-name prefix such as \"fc1\"), got \"\"",
              "fusion.unfused_layers");
    auto [it, fresh] = layers.emplace(layer, i);
    k.Require(fresh, at, StrCat("'", Excerpt(layer), "' is already listed as fusion.unfused_layers[", it->second, "]"),
              "fusion.unfused_layers");
  }
  if (fu.has_early_stop()) {
    const proto::EarlyStopConfig& e = fu.early_stop();
    k.Require(e.after_epochs() >= 1, "fusion.early_stop.after_epochs", StrCat("must be >= 1, got ", e.after_epochs()),
              "fusion.early_stop");
    k.AtLeast(e.every_epochs(), 1, "fusion.early_stop.every_epochs");
    const double keep = e.keep_fraction();
    k.Require((keep == 0 && !k.Present("fusion.early_stop.keep_fraction")) || (keep > 0 && keep < 1),
              "fusion.early_stop.keep_fraction", StrCat("must be in (0, 1), got ", keep));
    if (!e.metric().empty())
      k.OneOf(e.metric(), {"test_accuracy", "test_loss", "train_loss"}, "fusion.early_stop.metric");
    const std::string metric = e.metric().empty() ? "test_accuracy" : e.metric();
    const int64_t eval = c.eval_every_epochs() > 0 ? c.eval_every_epochs() : 1;
    if (metric.rfind("test_", 0) == 0 && eval > 1) {
      // Decisions use the test metric, so they fall on evaluation epochs.
      k.Require(e.after_epochs() % eval == 0, "fusion.early_stop.after_epochs",
                StrCat("must be a multiple of eval_every_epochs (", eval, ") for the metric ", metric, ", got ",
                       e.after_epochs()));
      const int64_t every = e.every_epochs() > 0 ? e.every_epochs() : 1;
      k.Require(
          every % eval == 0, "fusion.early_stop.every_epochs",
          StrCat("must be a multiple of eval_every_epochs (", eval, ") for the metric ", metric, ", got ", every));
    }
  }
}

}  // namespace

Status ValidateTrainConfig(const proto::TrainConfig& c, const std::function<std::string(const std::string&)>& where) {
  return ValidateTrainConfig(c, where, nullptr);
}

Status ValidateTrainConfig(const proto::TrainConfig& c, const std::function<std::string(const std::string&)>& where,
                           const std::function<std::string(const std::string&)>& name) {
  Checker k(where, "config", name);
  k.Require(!c.model().name().empty(), "model.name", "is required (a model of the zoo, e.g. \"mlp\")");

  const proto::DataConfig& d = c.data();
  k.OneOf(d.dataset(), {"fashion_mnist", "mnist", "cifar10", "synthetic", "text", "text_classes", "point_clouds"}, "data.dataset");
  k.AtLeast(d.batch_size(), 1, "data.batch_size");
  k.AtLeast(d.eval_batch_size(), 1, "data.eval_batch_size");
  k.Require(d.prefetch() >= 0, "data.prefetch", StrCat("must be >= 0, got ", d.prefetch()));
  k.Require(d.train_limit() >= 0, "data.train_limit", StrCat("must be >= 0, got ", d.train_limit()));
  k.Require(d.test_limit() >= 0, "data.test_limit", StrCat("must be >= 0, got ", d.test_limit()));
  k.Require(d.normalize().mean_size() == d.normalize().std_size(), "data.normalize.std",
            StrCat("has ", d.normalize().std_size(), " values but mean has ", d.normalize().mean_size()));
  for (double s : d.normalize().std()) k.Require(s > 0, "data.normalize.std", StrCat("must be > 0, got ", s));
  const int64_t padding = d.augment().random_crop_padding();
  k.Require(padding >= 0 && padding <= kMaxCropPadding, "data.augment.random_crop_padding",
            StrCat("must be in [0, ", kMaxCropPadding, "] (pixels on each side), got ", padding));
  if (d.dataset() == "synthetic" && d.sequence_length() != 0) {  // token examples
    k.AtLeast(d.sequence_length(), 1, "data.sequence_length");
    k.Require(d.input_shape_size() == 0, "data.input_shape",
              "is for image-like examples; synthetic tokens are data.sequence_length long");
    if (!d.text_target().empty()) k.OneOf(d.text_target(), {"next", "class"}, "data.text_target");
  } else if (d.dataset() == "synthetic") {
    k.Require(d.input_shape_size() > 0, "data.input_shape",
              "is required for the synthetic dataset (or data.sequence_length for tokens)");
    for (int64_t e : d.input_shape()) k.Require(e >= 1, "data.input_shape", StrCat("extents must be >= 1, got ", e));
    k.AtLeast(d.num_classes(), 2, "data.num_classes");
    k.AtLeast(d.num_examples(), 1, "data.num_examples");
  }
  k.Require(d.augment().crop_size() >= 0 && d.augment().crop_size() <= kMaxCropSize, "data.augment.crop_size",
            StrCat("must be in [0, ", kMaxCropSize, "] (pixels), got ", d.augment().crop_size()));
  if (d.dataset() == "point_clouds") {
    k.Require(d.num_points() >= 0, "data.num_points", StrCat("must be >= 1, got ", d.num_points()));
    k.Require(d.num_examples() >= 0, "data.num_examples", StrCat("must be >= 1, got ", d.num_examples()));
  }
  if (d.dataset() == "text_classes") {
    k.Require(d.class_files_size() >= 2, "data.class_files", "needs one text file per class, at least 2");
    k.Require(d.path().empty(), "data.path", "is for the text dataset; text_classes reads data.class_files");
  }
  if (d.dataset() == "text" || d.dataset() == "text_classes") {
    if (d.dataset() == "text") k.Require(!d.path().empty(), "data.path", "is required for the text dataset (a text file)");
    k.AtLeast(d.sequence_length(), 1, "data.sequence_length");
    if (!d.text_level().empty()) k.OneOf(d.text_level(), {"char", "byte"}, "data.text_level");
    if (!d.text_target().empty()) k.OneOf(d.text_target(), {"next", "masked", "reversed"}, "data.text_target");
    if (d.has_test_fraction())
      k.Require(d.test_fraction() > 0 && d.test_fraction() < 1, "data.test_fraction",
                StrCat("must be in (0, 1), got ", d.test_fraction()));
  }

  const proto::OptimizerConfig& o = c.optimizer();
  const std::string type = o.type().empty() ? "sgd" : o.type();
  k.OneOf(type, {"sgd", "adam", "adamw", "adadelta", "rmsprop"}, "optimizer.type");
  k.Require(o.lr() > 0 || (o.lr() == 0 && !o.has_lr() && !k.Present("optimizer.lr")), "optimizer.lr",
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
  const Status threads = CheckThreadCount(c.threads());
  k.Require(threads.ok(), "threads", threads.message());
  if (!c.device().empty()) {
    const StatusOr<Device> device = ParseDevice(c.device());
    k.Require(device.ok(), "device", device.status().message());
  }
  if (!c.devices().empty()) {
    const StatusOr<std::vector<Device>> devices = RunDevices(c);
    k.Require(devices.ok(), "devices", devices.status().message());
  }
  k.Require(c.strategy().empty() || !c.devices().empty(), "strategy", "needs devices (e.g. devices: \"cpu:2\")");
  if (!c.precision().empty()) k.OneOf(c.precision(), {"f32", "bf16", "fp16"}, "precision");
  if (c.has_loss_scale()) {
    k.Require(c.precision() == "fp16", "loss_scale", "is for precision: fp16 only (bf16 and f32 need no loss scaling)");
    // Unset fields take valid defaults, so a problem is in a field the file sets.
    if (auto problem = LossScalingProblem(RunLossScaling(c)))
      k.Require(false, "loss_scale." + problem->first, problem->second);
  }
  k.AtLeast(c.eval_every_epochs(), 1, "eval_every_epochs");
  k.AtLeast(c.log_every_steps(), 1, "log_every_steps");
  k.Require(c.checkpoint_every_steps() >= 0, "checkpoint_every_steps",
            StrCat("must be >= 0, got ", c.checkpoint_every_steps()));
  k.AtLeast(c.keep_checkpoints(), 1, "keep_checkpoints");
  ValidateFusion(c, k);
  return k.status();
}

void FillDefaults(proto::TrainConfig* c) {
  proto::DataConfig* d = c->mutable_data();
  if (d->batch_size() == 0) d->set_batch_size(128);
  if (d->eval_batch_size() == 0) d->set_eval_batch_size(d->batch_size());
  if (!d->has_shuffle()) d->set_shuffle(true);
  if (!d->has_drop_last()) d->set_drop_last(true);
  if (!d->has_prefetch()) d->set_prefetch(2);
  if (d->dataset() == "point_clouds") {
    if (d->num_points() == 0) d->set_num_points(1024);
    if (d->num_examples() == 0) d->set_num_examples(10000);
  }
  if (d->dataset() == "text" || d->dataset() == "text_classes") {
    if (d->text_level().empty()) d->set_text_level("char");
    if (d->text_target().empty()) d->set_text_target("next");
    if (!d->has_test_fraction()) d->set_test_fraction(0.1);
  }
  // torch.optim's defaults, in one place (graph/training.h); the type was checked.
  if (auto o = OptimizerWithDefaults(c->optimizer()); o.ok()) *c->mutable_optimizer() = *o;
  // The schedule's defaults, in one place (train/optim/schedule.h).
  *c->mutable_schedule() = ScheduleWithDefaults(c->schedule());
  if (c->epochs() == 0) c->set_epochs(1);
  if (c->eval_every_epochs() == 0) c->set_eval_every_epochs(1);
  if (c->log_every_steps() == 0) c->set_log_every_steps(50);
  if (c->keep_checkpoints() == 0) c->set_keep_checkpoints(3);
  if (!c->has_tensorboard()) c->set_tensorboard(true);
  if (c->has_fusion() || IsFused(*c)) {
    proto::FusionConfig* f = c->mutable_fusion();
    if (!f->has_isolate_divergence()) f->set_isolate_divergence(true);
    if (f->has_early_stop()) {
      proto::EarlyStopConfig* e = f->mutable_early_stop();
      if (e->every_epochs() == 0) e->set_every_epochs(1);
      if (e->keep_fraction() == 0) e->set_keep_fraction(0.5);
      if (e->metric().empty()) e->set_metric("test_accuracy");
    }
  }
}

StatusOr<proto::TrainConfig> ParseTrainConfig(const std::string& text, const std::string& origin) {
  proto::TrainConfig config;
  LOOM_ASSIGN_OR_RETURN(const TextLocations locations, ParseTextProto(text, origin, &config));
  auto where = [&](const std::string& path) { return locations.Where(path); };
  Status s = ValidateTrainConfig(config, where);
  // A fused config's replicas must each be a valid config too.
  if (s.ok() && IsFused(config)) s = ExpandReplicas(config, where).status();
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
  LOOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "config file"));
  return ParseTrainConfig(text, path);
}

StatusOr<std::vector<Device>> RunDevices(const proto::TrainConfig& c) {
  if (c.devices().empty()) return std::vector<Device>();
  return ParseDevices(c.devices());
}

StatusOr<Device> RunDevice(const proto::TrainConfig& c) {
  if (!c.device().empty()) return ParseDevice(c.device());
  LOOM_ASSIGN_OR_RETURN(const std::vector<Device> devices, RunDevices(c));
  if (!devices.empty() && devices[0].is_cuda()) return devices[0];
  return Device::Cpu();
}

DType RunPrecision(const proto::TrainConfig& c) {
  if (c.precision() == "bf16") return DType::kBF16;
  if (c.precision() == "fp16") return DType::kF16;
  return DType::kF32;
}

LossScaling RunLossScaling(const proto::TrainConfig& c) {
  LossScaling s;
  const proto::LossScaleConfig& ls = c.loss_scale();
  if (ls.has_init_scale()) s.init_scale = ls.init_scale();
  if (ls.has_growth_factor()) s.growth_factor = ls.growth_factor();
  if (ls.has_backoff_factor()) s.backoff_factor = ls.backoff_factor();
  if (ls.has_growth_interval()) s.growth_interval = ls.growth_interval();
  return s;
}

Status CheckThreadCount(int64_t threads) {
  if (threads < 0) return InvalidArgument("must be >= 0, got ", threads);
  if (threads > kMaxThreads)
    return InvalidArgument("must be <= ", kMaxThreads, " (this machine has ", std::thread::hardware_concurrency(),
                           " hardware threads), got ", threads);
  return Status::Ok();
}

std::string TrainConfigToText(const proto::TrainConfig& config) {
  std::string text;
  pb::TextFormat::Printer printer;
  printer.PrintToString(config, &text);
  return text;
}

namespace {

// What a resume may change: the folder's path (a run can be moved or named
// by another path), the run's length (to extend it), the thread count
// (results do not depend on it), the device, devices and strategy
// (checkpoints are whole host tensors). Every other field defines the run.
const char* const kResumableFields[] = {"out_dir", "epochs", "max_steps", "threads", "device", "devices", "strategy"};

}  // namespace

std::string RunDifferences(const proto::TrainConfig& run, const proto::TrainConfig& given) {
  pb::util::MessageDifferencer differ;
  for (const char* name : kResumableFields) differ.IgnoreField(proto::TrainConfig::descriptor()->FindFieldByName(name));
  std::string report;
  differ.set_report_ignores(false);
  differ.ReportDifferencesToString(&report);
  if (differ.Compare(run, given)) return "";
  std::string out;
  size_t start = 0;
  while (start < report.size()) {
    size_t end = report.find('\n', start);
    if (end == std::string::npos) end = report.size();
    std::string line = report.substr(start, end - start);
    start = end + 1;
    if (line.rfind("modified: ", 0) == 0) {
      line = line.substr(std::strlen("modified: "));
    } else if (line.rfind("added: ", 0) == 0) {  // "field: value", set only in `given`
      line = line.substr(std::strlen("added: "));
      if (size_t colon = line.find(": "); colon != std::string::npos) line.insert(colon + 2, "unset -> ");
    } else if (line.rfind("deleted: ", 0) == 0) {
      line = line.substr(std::strlen("deleted: ")) + " -> unset";
    }
    if (line.empty()) continue;
    if (!out.empty()) out += "; ";
    out += line;
  }
  return out;
}

}  // namespace loom
