#include "tools/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace loom::tools {

namespace {

// `text` as an int64; the message (without the flag's name) says why not.
StatusOr<int64_t> CheckedInt(const std::string& text) {
  int64_t v = 0;
  switch (ParseInt64(text, &v)) {
    case IntParse::kOk: return v;
    case IntParse::kNotInteger: return InvalidArgument("'", text, "' is not an integer");
    case IntParse::kOutOfRange: break;
  }
  return InvalidArgument("'", text, "' is out of range (at ", v < 0 ? "least " : "most ", v, ")");
}

}  // namespace

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
  StatusOr<int64_t> v = CheckedInt(it->second);
  if (!v.ok()) return v.status().WithContext("flag --" + name);
  return v;
}

StatusOr<uint64_t> Flags::Unsigned(const std::string& name, uint64_t def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  const std::string& text = it->second;
  if (text.find('-') != std::string::npos) {  // strtoull would read "-1" as 2^64 - 1
    StatusOr<int64_t> v = CheckedInt(text);
    if (v.ok() && *v < 0) return InvalidArgument("flag --", name, ": must be >= 0, got ", *v);
    return InvalidArgument("flag --", name, ": '", text, "' is not a non-negative integer");
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') return InvalidArgument("flag --", name, ": '", text, "' is not a non-negative integer");
  if (errno == ERANGE)
    return InvalidArgument("flag --", name, ": '", text, "' is out of range (at most ",
                           std::numeric_limits<uint64_t>::max(), ")");
  return static_cast<uint64_t>(v);
}

StatusOr<std::vector<Device>> Flags::Devices(const std::string& name, int64_t default_count) const {
  const std::string text = Str(name, "");
  if (text.find(':') != std::string::npos) {
    StatusOr<std::vector<Device>> list = ParseDevices(text);
    if (!list.ok()) return list.status().WithContext("--" + name);
    return list;
  }
  LOOM_ASSIGN_OR_RETURN(const int64_t count, Int(name, default_count));
  if (count < 1) return InvalidArgument("--", name, " must be >= 1, got ", count);
  return std::vector<Device>(static_cast<size_t>(count), Device::Cpu());
}

StatusOr<double> Flags::Seconds(const std::string& name, const std::string& def) const {
  const std::string text = Str(name, def);
  std::string number = text;
  double scale = 1;
  auto strip = [&](const std::string& suffix, double unit) {
    if (number.size() <= suffix.size() || number.compare(number.size() - suffix.size(), suffix.size(), suffix) != 0)
      return false;
    number.resize(number.size() - suffix.size());
    scale = unit;
    return true;
  };
  strip("ms", 1e-3) || strip("s", 1) || strip("m", 60) || strip("h", 3600);
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (number.empty() || *end != '\0' || !(value > 0) || !std::isfinite(value))
    return InvalidArgument("--", name, " '", text, "': expected a positive time such as 30s, 2m, 2h or 500ms");
  return value * scale;
}

StatusOr<double> Flags::Float(const std::string& name, double def) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') return InvalidArgument("flag --", name, ": '", it->second, "' is not a number");
  // strtod reads "inf", "nan" and 1e999 (as inf); no flag takes those.
  if (!std::isfinite(v)) return InvalidArgument("flag --", name, ": '", it->second, "' is not a finite number");
  if (errno == ERANGE) return InvalidArgument("flag --", name, ": '", it->second, "' is out of a double's range");
  return v;
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
    StatusOr<int64_t> v = CheckedInt(item);
    if (!v.ok()) return bad(v.status().message());
    if (*v < 1) return bad("items must be >= 1, got " + item);
    out.push_back(*v);
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
