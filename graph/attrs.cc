#include "graph/attrs.h"

#include <sstream>

namespace loom {

double AttrMap::Float(const std::string& name, double def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  if (const int64_t* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  return Get<double>(name, def);
}

std::string AttrValueToString(const AttrValue& value) {
  std::ostringstream os;
  std::visit(
      [&os](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
          os << "[";
          for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
          os << "]";
        } else if constexpr (std::is_same_v<T, bool>) {
          os << (v ? "true" : "false");
        } else if constexpr (std::is_same_v<T, std::string>) {
          os << '"' << v << '"';
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
