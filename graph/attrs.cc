#include "graph/attrs.h"

#include <charconv>
#include <sstream>

namespace loom {

namespace {
thread_local AttrTypeErrors* active_attr_errors = nullptr;
thread_local AttrMissingReads* active_missing_reads = nullptr;
}  // namespace

AttrMissingReads::AttrMissingReads() : outer_(active_missing_reads) { active_missing_reads = this; }
AttrMissingReads::~AttrMissingReads() { active_missing_reads = outer_; }

void AttrMissingReads::Record(const std::string& name) {
  if (active_missing_reads && active_missing_reads->first_.empty()) active_missing_reads->first_ = name;
}

AttrTypeErrors::AttrTypeErrors() : outer_(active_attr_errors) { active_attr_errors = this; }
AttrTypeErrors::~AttrTypeErrors() { active_attr_errors = outer_; }

bool AttrTypeErrors::Record(const std::string& message) {
  if (!active_attr_errors) return false;
  if (active_attr_errors->first_.empty()) active_attr_errors->first_ = message;
  return true;
}

double AttrMap::FloatOr(const std::string& name, double def, bool strict) const {
  auto it = values_.find(name);
  if (it != values_.end())
    if (const int64_t* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  return Get<double>(name, def, strict);
}

namespace {
// The shortest text that reads back as the same double, so dumps of graphs
// that differ in any bit of an attribute differ too.
std::string ShortestDouble(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}
}  // namespace

std::string AttrValueToString(const AttrValue& value) {
  std::ostringstream os;
  std::visit(
      [&os](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
          os << "[";
          for (size_t i = 0; i < v.size(); ++i) {
            os << (i ? ", " : "");
            if constexpr (std::is_same_v<T, std::vector<double>>) os << ShortestDouble(v[i]);
            else os << v[i];
          }
          os << "]";
        } else if constexpr (std::is_same_v<T, bool>) {
          os << (v ? "true" : "false");
        } else if constexpr (std::is_same_v<T, std::string>) {
          os << '"' << v << '"';
        } else if constexpr (std::is_same_v<T, double>) {
          os << ShortestDouble(v);
        } else {
          os << v;
        }
      },
      value);
  return os.str();
}

std::string AttrMap::ToString() const {
  std::string s = "{";
  bool first = true;
  for (const auto& [k, v] : values_) {
    s += (first ? "" : ", ") + k + "=" + AttrValueToString(v);
    first = false;
  }
  return s + "}";
}

const char* AttrTypeName(AttrType type) {
  switch (type) {
    case AttrType::kInt: return "int";
    case AttrType::kFloat: return "float";
    case AttrType::kBool: return "bool";
    case AttrType::kString: return "string";
    case AttrType::kInts: return "int list";
    case AttrType::kFloats: return "float list";
    case AttrType::kIntOrInts: return "int or int list";
    case AttrType::kFloatOrFloats: return "float or float list";
  }
  return "?";
}

bool AttrTypeAccepts(AttrType type, const AttrValue& v) {
  const bool is_int = std::holds_alternative<int64_t>(v), is_ints = std::holds_alternative<std::vector<int64_t>>(v);
  const bool is_float = is_int || std::holds_alternative<double>(v);
  // An empty list parses as an int list; it is an empty float list too.
  const bool is_floats =
      std::holds_alternative<std::vector<double>>(v) || (is_ints && std::get<std::vector<int64_t>>(v).empty());
  switch (type) {
    case AttrType::kInt: return is_int;
    case AttrType::kFloat: return is_float;
    case AttrType::kBool: return std::holds_alternative<bool>(v);
    case AttrType::kString: return std::holds_alternative<std::string>(v);
    case AttrType::kInts: return is_ints;
    case AttrType::kFloats: return is_floats;
    case AttrType::kIntOrInts: return is_int || is_ints;
    case AttrType::kFloatOrFloats: return is_float || is_floats;
  }
  return false;
}

namespace {
AttrType TypeOfValue(const AttrValue& v) {
  static constexpr AttrType kByIndex[] = {AttrType::kInt,    AttrType::kFloat, AttrType::kBool,
                                          AttrType::kString, AttrType::kInts,  AttrType::kFloats};
  return kByIndex[v.index()];
}
}  // namespace

AttrSchema& AttrSchema::Add(AttrDecl decl) {
  LOOM_CHECK(Find(decl.name) == nullptr, "", "attribute '", decl.name, "' declared twice");
  LOOM_CHECK(!decl.default_value || AttrTypeAccepts(decl.type, *decl.default_value), "", "attribute '", decl.name,
             "': default ", AttrValueToString(*decl.default_value), " is not a ", AttrTypeName(decl.type));
  decls_.push_back(std::move(decl));
  return *this;
}

AttrSchema& AttrSchema::Default(const std::string& name, AttrType type, AttrValue def, const std::string& doc) {
  return Add({name, type, std::move(def), false, doc});
}
AttrSchema& AttrSchema::Default(const std::string& name, AttrValue def, const std::string& doc) {
  const AttrType type = TypeOfValue(def);
  return Add({name, type, std::move(def), false, doc});
}
AttrSchema& AttrSchema::Required(const std::string& name, AttrType type, const std::string& doc) {
  return Add({name, type, std::nullopt, true, doc});
}
AttrSchema& AttrSchema::Optional(const std::string& name, AttrType type, const std::string& doc) {
  return Add({name, type, std::nullopt, false, doc});
}

const AttrDecl* AttrSchema::Find(const std::string& name) const {
  for (const AttrDecl& d : decls_)
    if (d.name == name) return &d;
  return nullptr;
}

Status AttrSchema::Check(const AttrMap& attrs) const {
  for (const auto& [name, value] : attrs.values()) {
    const AttrDecl* d = Find(name);
    if (d == nullptr)
      return InvalidArgument("unknown attribute '", name, "' (declared: ", ToString(), ")");
    if (!AttrTypeAccepts(d->type, value))
      return InvalidArgument("attribute '", name, "' must be of type ", AttrTypeName(d->type), ", got ",
                             AttrValueToString(value), " (declared: ", ToString(), ")");
  }
  for (const AttrDecl& d : decls_)
    if (d.required && !attrs.Has(d.name))
      return InvalidArgument("missing required attribute '", d.name, "' (", AttrTypeName(d.type), ": ", d.doc, ")");
  return Status::Ok();
}

Status AttrSchema::Canonicalize(AttrMap* attrs) const {
  LOOM_RETURN_IF_ERROR(Check(*attrs));
  for (const AttrDecl& d : decls_)
    if (d.default_value && !attrs->Has(d.name)) attrs->Set(d.name, *d.default_value);
  return Status::Ok();
}

std::string AttrSchema::ToString() const {
  if (decls_.empty()) return "none";
  std::string s;
  for (const AttrDecl& d : decls_) {
    s += (s.empty() ? "" : ", ") + d.name + ": " + AttrTypeName(d.type);
    if (d.default_value) s += " = " + AttrValueToString(*d.default_value);
    else if (d.required) s += " (required)";
  }
  return s;
}

}  // namespace loom
