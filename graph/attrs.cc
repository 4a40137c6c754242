#include "graph/attrs.h"

#include <charconv>
#include <sstream>

namespace loom {

namespace {
thread_local AttrTypeErrors* active_attr_errors = nullptr;
}  // namespace

AttrTypeErrors::AttrTypeErrors() : outer_(active_attr_errors) { active_attr_errors = this; }
AttrTypeErrors::~AttrTypeErrors() { active_attr_errors = outer_; }

bool AttrTypeErrors::Record(const std::string& message) {
  if (!active_attr_errors) return false;
  if (active_attr_errors->first_.empty()) active_attr_errors->first_ = message;
  return true;
}

double AttrMap::Float(const std::string& name, double def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  if (const int64_t* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  return Get<double>(name, def);
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

}  // namespace loom
