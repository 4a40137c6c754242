// Node attributes: a small typed map (ints, floats, bools, strings, int and
// float lists), and the schema an op declares them with (AttrSchema): name,
// type, default or required, a line of documentation. Nodes built by the
// GraphBuilder or loaded from a file hold every declared attribute that has
// a default, so read sites read without one; op shape inference validates
// the values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
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

// While one of these lives on a thread, reading an absent attribute without
// a default records it. The builder and the verifier run type inference of
// an op with a schema under one: its nodes hold every declared attribute
// with a default, so such a read is of an attribute the op never declared.
class AttrMissingReads {
 public:
  AttrMissingReads();
  ~AttrMissingReads();
  AttrMissingReads(const AttrMissingReads&) = delete;
  AttrMissingReads& operator=(const AttrMissingReads&) = delete;
  // The first absent attribute read without a default in this scope, or "".
  const std::string& first() const { return first_; }
  static void Record(const std::string& name);

 private:
  AttrMissingReads* outer_;
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
  // (the builder and the deserializer both check types first). Node
  // attributes are read without a default: the op's schema holds it, and
  // canonical nodes hold every defaulted attribute. An absent one reads as
  // zero/empty (and is recorded under AttrMissingReads). The overloads with
  // a default are for maps that no schema describes (initializers, flags).
  int64_t Int(const std::string& name) const { return Get<int64_t>(name, 0, /*strict=*/true); }
  int64_t Int(const std::string& name, int64_t def) const { return Get<int64_t>(name, def); }
  double Float(const std::string& name) const { return FloatOr(name, 0, /*strict=*/true); }  // an int attribute too
  double Float(const std::string& name, double def) const { return FloatOr(name, def, false); }
  bool Bool(const std::string& name) const { return Get<bool>(name, false, /*strict=*/true); }
  bool Bool(const std::string& name, bool def) const { return Get<bool>(name, def); }
  std::string Str(const std::string& name) const { return Get<std::string>(name, "", /*strict=*/true); }
  std::string Str(const std::string& name, const std::string& def) const { return Get<std::string>(name, def); }
  std::vector<int64_t> Ints(const std::string& name) const { return Get<std::vector<int64_t>>(name, {}, true); }
  std::vector<int64_t> Ints(const std::string& name, const std::vector<int64_t>& def) const {
    return Get<std::vector<int64_t>>(name, def);
  }
  std::vector<double> Floats(const std::string& name) const { return Get<std::vector<double>>(name, {}, true); }
  std::vector<double> Floats(const std::string& name, const std::vector<double>& def) const {
    return Get<std::vector<double>>(name, def);
  }

  const std::map<std::string, AttrValue>& values() const { return values_; }
  std::string ToString() const;  // "{kernel=[3, 3], stride=[1, 1]}"
  bool operator==(const AttrMap& o) const { return values_ == o.values_; }

 private:
  double FloatOr(const std::string& name, double def, bool strict) const;
  template <typename T>
  T Get(const std::string& name, const T& def, bool strict = false) const {
    auto it = values_.find(name);
    if (it == values_.end()) {
      if (strict) AttrMissingReads::Record(name);
      return def;
    }
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

// ---- Schemas ----

// What an attribute may hold. The "or" types take one value for every
// element or a list (stride 2 or [2, 1]; a per-replica list of rates).
enum class AttrType { kInt, kFloat, kBool, kString, kInts, kFloats, kIntOrInts, kFloatOrFloats };
const char* AttrTypeName(AttrType type);  // "int", "float", ..., "int or int list"
// Whether `value` is of `type`; an int is a float too (eps=1 is 1.0).
bool AttrTypeAccepts(AttrType type, const AttrValue& value);

struct AttrDecl {
  std::string name;
  AttrType type = AttrType::kInt;
  // Filled in when absent. Without one, the attribute is required or, when
  // `required` is false, optional (the op reads it only where Has() says so).
  std::optional<AttrValue> default_value;
  bool required = false;
  std::string doc;
};

// An op's attributes, declared once in its constructor:
//   DeclareAttrs().Default("groups", int64_t{1}, "channel groups")
//                 .Required("normalized_shape", AttrType::kInts, "trailing dims");
class AttrSchema {
 public:
  AttrSchema& Default(const std::string& name, AttrType type, AttrValue def, const std::string& doc);
  // The type follows the default's C++ type (int64_t, double, bool, ...).
  AttrSchema& Default(const std::string& name, AttrValue def, const std::string& doc);
  // One overload per scalar type, as for AttrMap::Set (a double or bool
  // default would otherwise convert to int).
  AttrSchema& Default(const std::string& name, int def, const std::string& doc) {
    return Default(name, AttrValue(static_cast<int64_t>(def)), doc);
  }
  AttrSchema& Default(const std::string& name, int64_t def, const std::string& doc) {
    return Default(name, AttrValue(def), doc);
  }
  AttrSchema& Default(const std::string& name, double def, const std::string& doc) {
    return Default(name, AttrValue(def), doc);
  }
  AttrSchema& Default(const std::string& name, bool def, const std::string& doc) {
    return Default(name, AttrValue(def), doc);
  }
  AttrSchema& Default(const std::string& name, const char* def, const std::string& doc) {
    return Default(name, AttrValue(std::string(def)), doc);
  }
  AttrSchema& Required(const std::string& name, AttrType type, const std::string& doc);
  AttrSchema& Optional(const std::string& name, AttrType type, const std::string& doc);

  const AttrDecl* Find(const std::string& name) const;
  const std::vector<AttrDecl>& decls() const { return decls_; }
  // Every attribute declared, of its type, and every required one present;
  // errors name the attribute and list the declared ones (the caller names
  // the node and op).
  Status Check(const AttrMap& attrs) const;
  // Check, then fill in every absent attribute that has a default.
  Status Canonicalize(AttrMap* attrs) const;
  // "groups: int = 1, stride: int or int list = 1" ("none" when empty).
  std::string ToString() const;

 private:
  AttrSchema& Add(AttrDecl decl);
  std::vector<AttrDecl> decls_;
};

}  // namespace loom
