// Node attributes: a small typed map (ints, floats, bools, strings, int and
// float lists). Getters take a default, so an absent attribute is the op's
// documented default; op shape inference validates the values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"

namespace loom {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>>;

std::string AttrValueToString(const AttrValue& value);

// While one of these lives on a thread, reading an attribute as the wrong
// type records an error (and yields the default) instead of aborting. Type
// inference runs under one, so a mistyped attribute in a graph file or a
// hand-built node is reported as an error naming the node, not a crash;
// kernels only run on nodes whose inference passed.
class AttrTypeErrors {
 public:
  AttrTypeErrors();
  ~AttrTypeErrors();
  AttrTypeErrors(const AttrTypeErrors&) = delete;
  AttrTypeErrors& operator=(const AttrTypeErrors&) = delete;
  // The first wrong-type read in this scope, or "".
  const std::string& first() const { return first_; }
  // Called by AttrMap; false when no scope is active (the caller aborts).
  static bool Record(const std::string& message);

 private:
  AttrTypeErrors* outer_;
  std::string first_;
};

class AttrMap {
 public:
  AttrMap() = default;
  AttrMap(std::initializer_list<std::pair<const std::string, AttrValue>> init) : values_(init) {}

  AttrMap& Set(const std::string& name, AttrValue value) {
    values_[name] = std::move(value);
    return *this;
  }
  // One overload per scalar type, so that a bool or double is never
  // narrowed through a neighbouring overload (Set(n, 0.3) stays a double).
  AttrMap& Set(const std::string& name, int value) { return Set(name, AttrValue(static_cast<int64_t>(value))); }
  AttrMap& Set(const std::string& name, int64_t value) { return Set(name, AttrValue(value)); }
  AttrMap& Set(const std::string& name, bool value) { return Set(name, AttrValue(value)); }
  AttrMap& Set(const std::string& name, double value) { return Set(name, AttrValue(value)); }
  AttrMap& Set(const std::string& name, const char* value) { return Set(name, AttrValue(std::string(value))); }
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  void Erase(const std::string& name) { values_.erase(name); }

  // Typed reads; a present attribute of the wrong type is an internal error
  // (the builder and the deserializer both check types first).
  int64_t Int(const std::string& name, int64_t def = 0) const { return Get<int64_t>(name, def); }
  double Float(const std::string& name, double def = 0) const;  // accepts an int attribute too
  bool Bool(const std::string& name, bool def = false) const { return Get<bool>(name, def); }
  std::string Str(const std::string& name, const std::string& def = "") const { return Get<std::string>(name, def); }
  std::vector<int64_t> Ints(const std::string& name, const std::vector<int64_t>& def = {}) const {
    return Get<std::vector<int64_t>>(name, def);
  }
  std::vector<double> Floats(const std::string& name, const std::vector<double>& def = {}) const {
    return Get<std::vector<double>>(name, def);
  }

  const std::map<std::string, AttrValue>& values() const { return values_; }
  std::string ToString() const;  // "{kernel=[3, 3], stride=[1, 1]}"
  bool operator==(const AttrMap& o) const { return values_ == o.values_; }

 private:
  template <typename T>
  T Get(const std::string& name, const T& def) const {
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    const T* v = std::get_if<T>(&it->second);
    if (v == nullptr) {
      std::string message = "attribute '" + name + "' is " + AttrValueToString(it->second) + ", of the wrong type";
      LOOM_CHECK(AttrTypeErrors::Record(message), "", message);
      return def;
    }
    return *v;
  }
  std::map<std::string, AttrValue> values_;
};



}  // namespace loom
