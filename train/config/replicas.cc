#include "train/config/replicas.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <type_traits>

#include "core/rng.h"
#include "train/config/train_config.h"

namespace loom {

namespace {

namespace pb = google::protobuf;
using FieldFn = std::function<std::string(const std::string&)>;

// The per-replica sections of a TrainConfig.
const char* const kSections[] = {"optimizer", "schedule"};

// The message holding a per-replica field ("optimizer.lr", "seed") and the
// field, or {nullptr, nullptr}.
template <typename M>
std::pair<M*, const pb::FieldDescriptor*> Resolve(M* root, const std::string& path) {
  const size_t dot = path.find('.');
  if (dot == std::string::npos) {
    const pb::FieldDescriptor* f = root->GetDescriptor()->FindFieldByName(path);
    return {f ? root : nullptr, f};
  }
  const pb::FieldDescriptor* section = root->GetDescriptor()->FindFieldByName(path.substr(0, dot));
  if (!section || !section->message_type() || section->is_repeated()) return {nullptr, nullptr};
  M* message;
  if constexpr (std::is_const_v<M>) {
    message = &root->GetReflection()->GetMessage(*root, section);
  } else {
    message = root->GetReflection()->MutableMessage(root, section);
  }
  const pb::FieldDescriptor* f = message->GetDescriptor()->FindFieldByName(path.substr(dot + 1));
  return {f ? message : nullptr, f};
}

// Sets a sweepable field to v (rounded for an integer field; the loader has
// checked that v fits).
void SetField(proto::TrainConfig* c, const std::string& path, double v) {
  auto [m, f] = Resolve<pb::Message>(c, path);
  const pb::Reflection* r = m->GetReflection();
  const long long n = std::llround(v);
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(m, f, v);
      break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      r->SetFloat(m, f, static_cast<float>(v));
      break;
    case pb::FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(m, f, static_cast<int32_t>(n));
      break;
    case pb::FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(m, f, n);
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      r->SetUInt32(m, f, static_cast<uint32_t>(n));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(m, f, static_cast<uint64_t>(n));
      break;
    default:
      break;
  }
}

std::string FormatDouble(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// A field's value for a label: "0.0316", "5", "true", "cosine", "3,6".
std::string FormatField(const pb::Message& m, const pb::FieldDescriptor* f) {
  const pb::Reflection* r = m.GetReflection();
  auto one = [&](int i) -> std::string {
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        return FormatDouble(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        return FormatDouble(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
      case pb::FieldDescriptor::CPPTYPE_INT32:
        return StrCat(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
      case pb::FieldDescriptor::CPPTYPE_INT64:
        return StrCat(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        return StrCat(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        return StrCat(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f));
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        return (rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f)) ? "true" : "false";
      case pb::FieldDescriptor::CPPTYPE_STRING:
        return rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
      default:
        return "?";
    }
  };
  if (!f->is_repeated()) return one(0);
  std::string out;
  for (int i = 0; i < r->FieldSize(m, f); ++i) out += (i ? "," : "") + one(i);
  return out;
}

// How a label names a per-replica field: its own name ("lr", "warmup_steps",
// "seed") unless both sections have a field of that name ("schedule.type").
std::string ShortName(const std::string& path) {
  const size_t dot = path.find('.');
  if (dot == std::string::npos) return path;
  const std::string name = path.substr(dot + 1);
  int sections = 0;
  for (const char* s : kSections) {
    const pb::FieldDescriptor* section = proto::TrainConfig::descriptor()->FindFieldByName(s);
    if (section->message_type()->FindFieldByName(name)) ++sections;
  }
  return sections > 1 ? path : name;
}

// Overrides the fields `over` sets (a merge, except that a list replaces the
// base's list rather than extending it).
void Override(const pb::Message& over, pb::Message* base) {
  std::vector<const pb::FieldDescriptor*> set;
  over.GetReflection()->ListFields(over, &set);
  for (const pb::FieldDescriptor* f : set)
    if (f->is_repeated()) base->GetReflection()->ClearField(base, f);
  base->MergeFrom(over);
}

// One replica before validation.
struct Draft {
  proto::TrainConfig config;
  std::string name;
  // Per-replica field path -> the place in the config that set it for this
  // replica ("replicas[2].optimizer.lr", "sweep.param[0]").
  std::map<std::string, std::string> set_at;
};

// Every combination of the params' values, the first param varying slowest.
std::vector<std::vector<double>> GridValues(const proto::SweepConfig& sw) {
  int64_t total = 1;
  for (const auto& p : sw.param()) total *= p.values_size();
  std::vector<std::vector<double>> out(total, std::vector<double>(sw.param_size()));
  for (int64_t k = 0; k < total; ++k) {
    int64_t rest = k;
    for (int j = sw.param_size() - 1; j >= 0; --j) {
      const int n = sw.param(j).values_size();
      out[k][j] = sw.param(j).values(static_cast<int>(rest % n));
      rest /= n;
    }
  }
  return out;
}

// `count` draws per param; the draw of replica k, param j comes from its own
// stream of sweep.seed, so it depends on nothing else.
std::vector<std::vector<double>> RandomValues(const proto::SweepConfig& sw) {
  std::vector<std::vector<double>> out(sw.count(), std::vector<double>(sw.param_size()));
  for (int64_t k = 0; k < sw.count(); ++k) {
    for (int j = 0; j < sw.param_size(); ++j) {
      const proto::SweepParam& p = sw.param(j);
      Rng rng = Rng::Stream(sw.seed(), static_cast<uint64_t>(k), static_cast<uint64_t>(j));
      const std::string dist = !p.distribution().empty() ? p.distribution()
                               : p.values_size() > 0     ? "choice"
                                                         : "uniform";
      double v;
      if (dist == "choice") {
        v = p.values(static_cast<int>(rng.UniformInt(p.values_size())));
      } else if (dist == "log_uniform") {
        v = std::exp(std::log(p.min()) + (std::log(p.max()) - std::log(p.min())) * rng.Uniform());
        v = std::clamp(v, p.min(), p.max());
      } else {
        v = rng.Uniform(p.min(), p.max());
      }
      out[k][j] = v;
    }
  }
  return out;
}

}  // namespace

bool IsIntegerField(const pb::FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_INT64:
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return true;
    default:
      return false;
  }
}

bool IsNumericField(const pb::FieldDescriptor* f) {
  return IsIntegerField(f) || f->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE ||
         f->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT;
}

const std::vector<std::string>& SweepableFields() {
  static const std::vector<std::string> fields = [] {
    std::vector<std::string> out;
    for (const char* s : kSections) {
      const pb::Descriptor* d = proto::TrainConfig::descriptor()->FindFieldByName(s)->message_type();
      for (int i = 0; i < d->field_count(); ++i)
        if (!d->field(i)->is_repeated() && IsNumericField(d->field(i))) out.push_back(StrCat(s, ".", d->field(i)->name()));
    }
    out.push_back("seed");
    return out;
  }();
  return fields;
}

const pb::FieldDescriptor* SweepableField(const std::string& path) {
  const auto& fields = SweepableFields();
  if (std::find(fields.begin(), fields.end(), path) == fields.end()) return nullptr;
  proto::TrainConfig probe;
  return Resolve<const pb::Message>(&probe, path).second;
}

bool IsFused(const proto::TrainConfig& c) { return c.replicas_size() > 0 || c.has_sweep(); }

StatusOr<std::vector<ReplicaSpec>> ExpandReplicas(const proto::TrainConfig& config) {
  return ExpandReplicas(config, [](const std::string&) { return std::string(); });
}

StatusOr<std::vector<ReplicaSpec>> ExpandReplicas(const proto::TrainConfig& config, const FieldFn& where) {
  // The base is a config of its own (and the replicas and sweep blocks are
  // well formed) before anything is expanded.
  LOOM_RETURN_IF_ERROR(ValidateTrainConfig(config, where));
  proto::TrainConfig base = config;
  base.clear_replicas();
  base.clear_sweep();

  std::vector<Draft> drafts;
  std::vector<std::string> candidates;  // the fields a label may show, in order
  if (config.replicas_size() > 0) {
    std::set<std::string> seen;
    for (int i = 0; i < config.replicas_size(); ++i) {
      const proto::ReplicaConfig& r = config.replicas(i);
      Draft d;
      d.config = base;
      d.name = r.name().empty() ? StrCat("r", i) : r.name();
      Override(r.optimizer(), d.config.mutable_optimizer());
      Override(r.schedule(), d.config.mutable_schedule());
      d.config.set_seed(r.has_seed() ? r.seed() : base.seed() + static_cast<uint64_t>(i));
      for (const char* s : kSections) {
        const pb::Message& m = s == std::string("optimizer") ? static_cast<const pb::Message&>(r.optimizer())
                                                             : static_cast<const pb::Message&>(r.schedule());
        std::vector<const pb::FieldDescriptor*> set;
        m.GetReflection()->ListFields(m, &set);
        for (const pb::FieldDescriptor* f : set) {
          const std::string path = StrCat(s, ".", f->name());
          d.set_at[path] = StrCat("replicas[", i, "].", path);
          seen.insert(path);
        }
      }
      if (r.has_seed()) {
        d.set_at["seed"] = StrCat("replicas[", i, "].seed");
        seen.insert("seed");
      }
      drafts.push_back(std::move(d));
    }
    // Candidates in schema order: the optimizer's fields, the schedule's, seed.
    for (const char* s : kSections) {
      const pb::Descriptor* d = proto::TrainConfig::descriptor()->FindFieldByName(s)->message_type();
      for (int i = 0; i < d->field_count(); ++i) {
        const std::string path = StrCat(s, ".", d->field(i)->name());
        if (seen.count(path)) candidates.push_back(path);
      }
    }
    if (seen.count("seed")) candidates.push_back("seed");
  } else if (config.has_sweep()) {
    const proto::SweepConfig& sw = config.sweep();
    const auto values = sw.method() == "grid" ? GridValues(sw) : RandomValues(sw);
    for (const auto& p : sw.param()) candidates.push_back(p.field());
    for (size_t k = 0; k < values.size(); ++k) {
      Draft d;
      d.config = base;
      d.name = StrCat("r", k);
      d.config.set_seed(base.seed() + k);
      for (int j = 0; j < sw.param_size(); ++j) {
        SetField(&d.config, sw.param(j).field(), values[k][j]);
        d.set_at[sw.param(j).field()] = StrCat("sweep.param[", j, "]");
      }
      drafts.push_back(std::move(d));
    }
  } else {
    // A single model is one replica.
    Draft d;
    d.config = base;
    d.name = "r0";
    drafts.push_back(std::move(d));
  }

  // Each replica passes the checks of a single config; messages point at the
  // line that set the offending value and name the replica.
  for (size_t i = 0; i < drafts.size(); ++i) {
    const Draft& d = drafts[i];
    const std::string replica =
        d.name == StrCat("r", i) ? StrCat("replica ", i) : StrCat("replica ", i, " '", Excerpt(d.name), "'");
    auto at = [&](const std::string& path) {
      auto it = d.set_at.find(path);
      return where(it == d.set_at.end() ? path : it->second);
    };
    auto name = [&](const std::string& path) {
      auto it = d.set_at.find(path);
      if (it == d.set_at.end()) return IsFused(config) ? StrCat(path, " (", replica, ")") : path;
      if (it->second.rfind("replicas[", 0) == 0) return it->second;
      return StrCat(it->second, " (", path, " of ", replica, ")");
    };
    LOOM_RETURN_IF_ERROR(ValidateTrainConfig(d.config, at, name));
  }

  std::vector<ReplicaSpec> out(drafts.size());
  for (size_t i = 0; i < drafts.size(); ++i) {
    out[i].config = std::move(drafts[i].config);
    FillDefaults(&out[i].config);
  }
  // Labels show the candidate fields whose resolved values differ between
  // the replicas (all candidates for a single replica).
  std::vector<std::string> shown;
  for (const std::string& path : candidates) {
    std::set<std::string> distinct;
    for (const ReplicaSpec& r : out) {
      auto [m, f] = Resolve<const pb::Message>(&r.config, path);
      distinct.insert(FormatField(*m, f));
    }
    if (distinct.size() > 1 || out.size() == 1) shown.push_back(path);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].label = drafts[i].name;
    for (const std::string& path : shown) {
      auto [m, f] = Resolve<const pb::Message>(&out[i].config, path);
      out[i].label += StrCat(" ", ShortName(path), "=", FormatField(*m, f));
    }
  }
  return out;
}

}  // namespace loom
