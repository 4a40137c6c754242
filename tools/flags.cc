#include "tools/flags.h"

#include <cstdlib>

namespace loom::tools {

Status Flags::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      return Status::Ok();
    }
    if (a == "-v" || a == "-vv" || a == "-vvv") {
      verbosity_ += static_cast<int>(a.size()) - 1;
      continue;
    }
    if (a.rfind("--", 0) != 0) return InvalidArgument("unexpected argument '", a, "'");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (spec_.count(name + "?")) {
      if (has_value) return InvalidArgument("flag --", name, " takes no value");
      values_[name] = "true";
      continue;
    }
    if (!spec_.count(name)) return InvalidArgument("unknown flag --", name, "\n", Help());
    if (!has_value) {
      if (i + 1 >= args.size()) return InvalidArgument("flag --", name, " needs a value");
      value = args[++i];
    }
    values_[name] = value;
  }
  return Status::Ok();
}

std::string Flags::Str(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second;
}

StatusOr<int64_t> Flags::Int(const std::string& name, int64_t def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0') return InvalidArgument("flag --", name, ": '", it->second, "' is not an integer");
  return static_cast<int64_t>(v);
}

StatusOr<double> Flags::Float(const std::string& name, double def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') return InvalidArgument("flag --", name, ": '", it->second, "' is not a number");
  return v;
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

StatusOr<std::vector<int64_t>> Flags::PositiveInts(const std::string& name, const std::vector<int64_t>& def) const {
  if (!Has(name)) return def;
  const std::string text = Str(name, "");
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("--", name, " '", text, "': ", why,
                           " (expected positive integers separated by commas, e.g. 1,28,28)");
  };
  std::vector<int64_t> out;
  for (const std::string& item : SplitCommas(text)) {
    if (item.empty()) return bad("empty item");
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0') return bad("'" + item + "' is not an integer");
    if (v < 1) return bad("items must be >= 1, got " + item);
    out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

std::vector<std::string> Flags::List(const std::string& name, const std::vector<std::string>& def) const {
  if (!Has(name)) return def;
  std::vector<std::string> out;
  for (std::string& item : SplitCommas(Str(name, "")))
    if (!item.empty()) out.push_back(std::move(item));
  return out;
}

std::string Flags::Help() const {
  std::string h = "flags:\n";
  for (const auto& [name, text] : spec_) {
    bool boolean = !name.empty() && name.back() == '?';
    h += "  --" + (boolean ? name.substr(0, name.size() - 1) : name + " V") + "\t" + text + "\n";
  }
  return h + "  -v, -vv\tmore logging\n";
}

}  // namespace loom::tools
