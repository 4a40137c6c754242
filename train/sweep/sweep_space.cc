#include "train/sweep/sweep_space.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/rng.h"
#include "core/text_proto.h"
#include "train/config/replicas.h"
#include "train/config/train_config.h"

namespace loom::sweep {

namespace {

namespace pb = google::protobuf;
constexpr char kArgsPrefix[] = "model.args.";

// The scalar field a dotted path names in TrainConfig, with the message
// that holds it, or an error saying why the path names none. "model.args.K"
// is a model argument (a string), reported with field = null.
template <typename M>
StatusOr<std::pair<M*, const pb::FieldDescriptor*>> ResolvePath(M* root, const std::string& path) {
  if (path.rfind(kArgsPrefix, 0) == 0) {
    if (path.size() == sizeof(kArgsPrefix) - 1) return InvalidArgument("'", path, "' names no model argument");
    return std::pair<M*, const pb::FieldDescriptor*>{root, nullptr};
  }
  M* message = root;
  size_t begin = 0;
  for (;;) {
    const size_t dot = path.find('.', begin);
    const std::string name = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    const pb::FieldDescriptor* f = message->GetDescriptor()->FindFieldByName(name);
    if (!f)
      return InvalidArgument("'", Excerpt(path), "' is not a field of the train config (", message->GetDescriptor()->name(),
                             " has no field '", Excerpt(name), "'; train/config/train_config.proto)");
    if (f->is_repeated() || f->is_map())
      return InvalidArgument("'", path, "' is a list; a sweep sets single values (model arguments: model.args.<key>)");
    if (dot == std::string::npos) {
      if (f->message_type()) return InvalidArgument("'", path, "' is a block, not a value");
      return std::pair<M*, const pb::FieldDescriptor*>{message, f};
    }
    if (!f->message_type()) return InvalidArgument("'", path, "': ", name, " is a value, not a block");
    if constexpr (std::is_const_v<M>) {
      message = &message->GetReflection()->GetMessage(*message, f);
    } else {
      message = message->GetReflection()->MutableMessage(message, f);
    }
    begin = dot + 1;
  }
}

std::string Distribution(const proto::SearchParam& p) {
  if (!p.distribution().empty()) return p.distribution();
  return p.values_size() > 0 || p.strings_size() > 0 ? "choice" : "uniform";
}

// A number as a value's text: integers without a fraction, others with %.4g.
std::string NumberText(double v, bool integer) {
  char buf[40];
  if (integer) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(std::llround(v)));
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  }
  return buf;
}

// Sets a field to a drawn value: a number (text empty) or a text.
Status SetValue(proto::TrainConfig* c, const std::string& path, double number, const std::string& text) {
  LOOM_ASSIGN_OR_RETURN(auto resolved, ResolvePath<pb::Message>(c, path));
  auto [m, f] = resolved;
  if (!f) {
    (*c->mutable_model()->mutable_args())[path.substr(sizeof(kArgsPrefix) - 1)] = text;
    return Status::Ok();
  }
  const pb::Reflection* r = m->GetReflection();
  const long long n = std::llround(number);
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, number); break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, static_cast<float>(number)); break;
    case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, static_cast<int32_t>(n)); break;
    case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, n); break;
    case pb::FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, static_cast<uint32_t>(n)); break;
    case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, static_cast<uint64_t>(n)); break;
    case pb::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, text == "true"); break;
    case pb::FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, text); break;
    default: return InvalidArgument("'", path, "' has a type a sweep cannot set");
  }
  return Status::Ok();
}

// Checks one param against the train config's schema; `k` prefixes the
// messages with "WHERE: field param[j].X: ".
Status CheckParam(const proto::SearchParam& p, int j, const std::function<std::string(const std::string&)>& where,
                  const std::string& origin) {
  const std::string at = StrCat("param[", j, "]");
  auto fail = [&](const std::string& field, const std::string& message) {
    std::string place = where(StrCat(at, ".", field));
    if (place.empty()) place = where(at);
    if (place.empty()) place = origin;
    return InvalidArgument(place, ": field ", at, ".", field, ": ", message);
  };
  if (p.field().empty()) return fail("field", "required (a train config field such as optimizer.lr)");
  proto::TrainConfig probe;
  auto resolved = ResolvePath<const pb::Message>(&probe, p.field());
  if (!resolved.ok()) return fail("field", resolved.status().message());
  const pb::FieldDescriptor* f = resolved->second;
  if (p.field() == "out_dir" || p.field() == "device" || p.field() == "devices" || p.field() == "threads")
    return fail("field", StrCat("'", p.field(), "' is where or how trials run, not a hyper-parameter"));
  const std::string dist = Distribution(p);
  const bool is_number = f && IsNumericField(f);
  const bool is_args = !f;
  const std::string type = is_args ? "a model argument (text)" : f->cpp_type_name();
  if (dist == "choice") {
    if (p.values_size() == 0 && p.strings_size() == 0) return fail("values", "a choice needs values or strings");
    if (p.values_size() > 0 && p.strings_size() > 0) return fail("strings", "give values (numbers) or strings, not both");
    if (p.has_min() || p.has_max()) return fail(p.has_min() ? "min" : "max", "a choice takes values, not a range");
    if (p.strings_size() > 0 && is_number)
      return fail("strings", StrCat("'", p.field(), "' is a number (", type, "): choose among values, not strings"));
    if (p.values_size() > 0 && f && !is_number)
      return fail("values", StrCat("'", p.field(), "' is ", type, ": choose among strings, not numbers"));
    if (f && f->cpp_type() == pb::FieldDescriptor::CPPTYPE_BOOL)
      for (const std::string& s : p.strings())
        if (s != "true" && s != "false") return fail("strings", StrCat("'", p.field(), "' is a bool: true or false, got '", Excerpt(s), "'"));
    for (double v : p.values()) {
      if (!std::isfinite(v)) return fail("values", StrCat("must be finite numbers, got ", v));
      if ((is_args || IsIntegerField(f)) && v != std::round(v))
        return fail("values", StrCat("'", p.field(), "' takes integers, got ", v));
    }
    return Status::Ok();
  }
  if (dist != "uniform" && dist != "log_uniform" && dist != "int")
    return fail("distribution", StrCat("unknown value '", Excerpt(dist), "' (expected one of: uniform, log_uniform, int, choice)"));
  if (p.values_size() > 0 || p.strings_size() > 0)
    return fail(p.values_size() > 0 ? "values" : "strings", StrCat("a ", dist, " range takes min and max, not values"));
  if (!p.has_min() || !p.has_max()) return fail(p.has_min() ? "max" : "min", StrCat("a ", dist, " range needs min and max"));
  if (f && !is_number) return fail("distribution", StrCat("'", p.field(), "' is ", type, ": only a choice can set it"));
  if (!std::isfinite(p.min()) || !std::isfinite(p.max())) return fail("min", "min and max must be finite");
  if (dist == "int") {
    if (p.min() != std::round(p.min()) || p.max() != std::round(p.max()))
      return fail("min", StrCat("an int range has integer bounds, got [", p.min(), ", ", p.max(), "]"));
    if (p.min() > p.max()) return fail("max", StrCat("empty range: min ", p.min(), " > max ", p.max()));
    return Status::Ok();
  }
  if (f && IsIntegerField(f))
    return fail("distribution", StrCat("'", p.field(), "' is an integer field: use int (or a choice)"));
  if (is_args) return fail("distribution", StrCat("model arguments are integers or texts: use int or a choice"));
  if (p.min() >= p.max()) return fail("max", StrCat("empty range: [", p.min(), ", ", p.max(), ") holds nothing"));
  if (dist == "log_uniform" && p.min() <= 0)
    return fail("min", StrCat("log_uniform needs min > 0 (the log of a non-positive bound), got ", p.min()));
  return Status::Ok();
}

}  // namespace

std::string ShortFieldName(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

StatusOr<SweepInput> ParseSweep(const std::string& text, const std::string& origin, const std::string& base_dir) {
  SweepInput in;
  in.origin = origin;
  LOOM_ASSIGN_OR_RETURN(const TextLocations locations, ParseTextProto(text, origin, &in.spec));
  auto where = [&](const std::string& path) { return locations.Where(path); };
  proto::SweepSpec& s = in.spec;
  auto fail = [&](const std::string& field, const std::string& message) {
    const std::string place = where(field);
    return InvalidArgument(place.empty() ? origin : place, ": field ", field, ": ", message);
  };

  // The base config: the file it names (its own errors name it) with the
  // `train` block merged over it, checked as one config.
  proto::TrainConfig base;
  if (!s.train_config().empty()) {
    std::filesystem::path p = s.train_config();
    if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
    LOOM_ASSIGN_OR_RETURN(base, LoadTrainConfig(p.string()));
  } else if (!s.has_train()) {
    return fail("train_config", "required: the train config the trials start from (or a train { } block)");
  }
  base.MergeFrom(s.train());
  if (IsFused(base)) return fail("train", "the base config has replicas or a sweep block: the sweep makes the arrays");
  // Messages about fields the train block sets point at its lines.
  if (Status v = ValidateTrainConfig(base, [&](const std::string& path) { return where("train." + path); }); !v.ok()) {
    // A message about a field the file does not set names the file alone.
    std::string m = v.message();
    if (m.rfind("config:", 0) == 0) m = origin + m.substr(6);
    return InvalidArgument(m);
  }
  FillDefaults(&base);
  s.clear_train_config();
  *s.mutable_train() = base;

  if (s.param_size() == 0) return fail("param", "a sweep needs at least one param");
  for (int j = 0; j < s.param_size(); ++j) {
    LOOM_RETURN_IF_ERROR(CheckParam(s.param(j), j, where, origin));
    for (int i = 0; i < j; ++i)
      if (s.param(i).field() == s.param(j).field())
        return fail(StrCat("param[", j, "].field"), StrCat("'", s.param(j).field(), "' is already param[", i, "]"));
    const std::string line = where(StrCat("param[", j, "]"));
    in.param_lines.push_back(line.empty() ? origin : line);
  }
  if (s.algorithm().empty()) return fail("algorithm", "required: random, hyperband or asha");
  if (s.algorithm() != "random" && s.algorithm() != "hyperband" && s.algorithm() != "asha")
    return fail("algorithm", StrCat("unknown value '", Excerpt(s.algorithm()), "' (expected one of: random, hyperband, asha)"));
  if (s.trials() < 0 || s.trials() > 100000) return fail("trials", StrCat("must be in [1, 100000], got ", s.trials()));
  if (s.max_resource() < 0) return fail("max_resource", StrCat("must be >= 1 epoch, got ", s.max_resource()));
  if (s.max_resource() == 0) s.set_max_resource(base.epochs());
  if (s.min_resource() < 0 || s.min_resource() > s.max_resource())
    return fail("min_resource", StrCat("must be in [1, max_resource ", s.max_resource(), "], got ", s.min_resource()));
  if (s.min_resource() == 0) s.set_min_resource(1);
  if (s.eta() == 1 || s.eta() < 0 || s.eta() > 100) return fail("eta", StrCat("must be in [2, 100], got ", s.eta()));
  if (s.eta() == 0) s.set_eta(3);
  if (s.metric().empty()) s.set_metric("test_accuracy");
  if (s.metric() != "test_accuracy" && s.metric() != "test_loss")
    return fail("metric", StrCat("unknown value '", Excerpt(s.metric()), "' (expected one of: test_accuracy, test_loss)"));
  if (s.direction().empty()) s.set_direction(s.metric() == "test_loss" ? "min" : "max");
  if (s.direction() != "max" && s.direction() != "min")
    return fail("direction", StrCat("unknown value '", Excerpt(s.direction()), "' (expected one of: max, min)"));
  if (s.max_array() < 0 || s.max_array() > kMaxReplicas)
    return fail("max_array", StrCat("must be in [1, ", kMaxReplicas, "], got ", s.max_array()));
  if (s.max_array() == 0) s.set_max_array(kMaxReplicas);
  if (s.budget_s() < 0 || !std::isfinite(s.budget_s())) return fail("budget_s", StrCat("must be >= 0, got ", s.budget_s()));
  // Every trial is a valid config (a drawn value the config refuses is an
  // error now, before anything is written): the ranges' ends and each choice.
  for (int j = 0; j < s.param_size(); ++j) {
    const proto::SearchParam& p = s.param(j);
    const std::string dist = Distribution(p);
    std::vector<std::pair<double, std::string>> probes;
    if (dist == "choice") {
      for (double v : p.values()) probes.push_back({v, NumberText(v, true)});
      for (const std::string& t : p.strings()) probes.push_back({0, t});
    } else {
      probes = {{p.min(), NumberText(p.min(), true)}, {p.max(), NumberText(p.max(), true)}};
    }
    for (const auto& [number, text] : probes) {
      proto::TrainConfig c = base;
      LOOM_RETURN_IF_ERROR(SetValue(&c, p.field(), number, text));
      auto at = [&](const std::string&) { return in.param_lines[j]; };
      auto name = [&](const std::string& path) { return StrCat("param[", j, "] (", path, ")"); };
      LOOM_RETURN_IF_ERROR(ValidateTrainConfig(c, at, name));
    }
  }
  return in;
}

StatusOr<SweepInput> LoadSweep(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "sweep file"));
  return ParseSweep(text, path, std::filesystem::path(path).parent_path().string());
}

StatusOr<Trial> DrawTrial(const SweepInput& input, int64_t id) {
  const proto::SweepSpec& s = input.spec;
  Trial t;
  t.id = id;
  t.config = s.train();
  t.config.set_seed(s.train().seed() + static_cast<uint64_t>(id));
  t.label = StrCat("t", id);
  for (int j = 0; j < s.param_size(); ++j) {
    const proto::SearchParam& p = s.param(j);
    Rng rng = Rng::Stream(s.seed(), static_cast<uint64_t>(id), static_cast<uint64_t>(j));
    const std::string dist = Distribution(p);
    proto::TrainConfig probe;
    const pb::FieldDescriptor* f = ResolvePath<const pb::Message>(&probe, p.field())->second;
    const bool integer = !f || IsIntegerField(f);
    double number = 0;
    std::string text;
    if (dist == "choice") {
      const int n = p.values_size() > 0 ? p.values_size() : p.strings_size();
      const int k = static_cast<int>(rng.UniformInt(n));
      if (p.values_size() > 0) {
        number = p.values(k);
        text = NumberText(number, integer);
      } else {
        text = p.strings(k);
      }
    } else if (dist == "int") {
      const int64_t lo = std::llround(p.min()), hi = std::llround(p.max());
      number = static_cast<double>(lo + rng.UniformInt(hi - lo + 1));
      text = NumberText(number, true);
    } else if (dist == "log_uniform") {
      number = std::clamp(std::exp(std::log(p.min()) + (std::log(p.max()) - std::log(p.min())) * rng.Uniform()), p.min(),
                          p.max());
      text = NumberText(number, false);
    } else {
      number = rng.Uniform(p.min(), p.max());
      text = NumberText(number, false);
    }
    LOOM_RETURN_IF_ERROR(SetValue(&t.config, p.field(), number, text));
    t.values.push_back(text);
    t.label += StrCat(" ", ShortFieldName(p.field()), "=", text);
  }
  auto at = [&](const std::string& path) {
    for (int j = 0; j < s.param_size(); ++j)
      if (s.param(j).field() == path) return input.param_lines[j];
    return std::string();
  };
  auto name = [&](const std::string& path) { return StrCat(path, " (trial ", id, ")"); };
  LOOM_RETURN_IF_ERROR(ValidateTrainConfig(t.config, at, name));
  FillDefaults(&t.config);
  // What may differ inside one array: the numbers of the optimizer and the
  // schedule, and the seed (train/config/replicas.h's SweepableFields).
  proto::TrainConfig key = t.config;
  for (const std::string& path : SweepableFields()) {
    auto resolved = ResolvePath<pb::Message>(&key, path);
    if (resolved.ok() && resolved->second) resolved->first->GetReflection()->ClearField(resolved->first, resolved->second);
  }
  t.packing_key = TrainConfigToText(key);
  return t;
}

}  // namespace loom::sweep
