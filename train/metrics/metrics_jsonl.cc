#include "train/metrics/metrics_jsonl.h"

#include "core/utf8.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <set>

namespace loom::metrics {

namespace {

constexpr const char* kFixedFields[] = {"replica", "epoch",    "step",          "split",
                                        "loss",    "accuracy", "samples_per_s", "time_s"};

bool IsFixedField(std::string_view name) {
  for (const char* f : kFixedFields)
    if (name == f) return true;
  return false;
}

// ---- writing ----

// JSON's two-character escapes: the character and the letter after the
// backslash. (Readers also accept "\/" for '/', which needs no escape.)
constexpr std::pair<char, char> kShortEscapes[] = {{'"', '"'},  {'\\', '\\'}, {'\n', 'n'}, {'\r', 'r'},
                                                   {'\t', 't'}, {'\b', 'b'},  {'\f', 'f'}};

void AppendJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (const char c : s) {
    const auto* escape =
        std::find_if(std::begin(kShortEscapes), std::end(kShortEscapes), [c](const auto& e) { return e.first == c; });
    if (escape != std::end(kShortEscapes)) {
      out->push_back('\\');
      out->push_back(escape->second);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      *out += buf;
    } else {
      out->push_back(c);  // bytes >= 0x80 pass through: names are UTF-8
    }
  }
  out->push_back('"');
}

void AppendJsonNumber(double v, std::string* out) {
  if (!std::isfinite(v)) {
    *out += "null";
    return;
  }
  // Shortest round-trip form; its syntax ("-1.5e-07", "42") is also JSON's.
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  LOOM_CHECK(ec == std::errc(), "to_chars(double) needs at most 24 characters");
  out->append(buf, end);
}

void AppendJsonInt(int64_t v, std::string* out) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  LOOM_CHECK(ec == std::errc());
  out->append(buf, end);
}

void AppendKey(std::string_view key, std::string* out) {
  if (out->size() > 1) out->push_back(',');
  AppendJsonString(key, out);
  out->push_back(':');
}

// ---- reading: flat JSON objects whose values are numbers, strings or null ----

struct JsonScalar {
  enum class Kind { kNumber, kString, kNull } kind = Kind::kNull;
  std::string text;  // the number's token, or the decoded string
};

class FlatObjectParser {
 public:
  explicit FlatObjectParser(std::string_view s) : s_(s) {}

  StatusOr<std::vector<std::pair<std::string, JsonScalar>>> Parse() {
    std::vector<std::pair<std::string, JsonScalar>> fields;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{'");
    SkipSpace();
    if (!Consume('}')) {
      for (;;) {
        SkipSpace();
        std::string key;
        LOOM_RETURN_IF_ERROR(ParseString(&key));
        SkipSpace();
        if (!Consume(':')) return Error("expected ':' after key \"", key, "\"");
        SkipSpace();
        JsonScalar value;
        LOOM_RETURN_IF_ERROR(ParseValue(key, &value));
        fields.emplace_back(std::move(key), std::move(value));
        SkipSpace();
        if (Consume('}')) break;
        if (!Consume(',')) return Error("expected ',' or '}'");
      }
    }
    SkipSpace();
    if (pos_ != s_.size()) return Error("unexpected text after the object");
    return fields;
  }

 private:
  template <typename... Args>
  Status Error(const Args&... args) const {
    return DataLoss("column ", pos_ + 1, ": ", args...);
  }

  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r' || s_[pos_] == '\n')) ++pos_;
  }
  bool Consume(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  Status ParseValue(const std::string& key, JsonScalar* value) {
    if (pos_ >= s_.size()) return Error("missing value for \"", key, "\"");
    const char c = s_[pos_];
    if (c == '"') {
      value->kind = JsonScalar::Kind::kString;
      return ParseString(&value->text);
    }
    if (s_.substr(pos_, 4) == "null") {
      pos_ += 4;
      value->kind = JsonScalar::Kind::kNull;
      return Status::Ok();
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      value->kind = JsonScalar::Kind::kNumber;
      return ParseNumberToken(&value->text);
    }
    return Error("value of \"", key, "\" is not a number, string or null");
  }

  // JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  Status ParseNumberToken(std::string* token) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    Consume('-');
    if (Consume('0')) {
      if (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') return Error("number with a leading zero");
    } else if (digits() == 0) {
      return Error("malformed number");
    }
    if (Consume('.') && digits() == 0) return Error("malformed number: no digits after '.'");
    if (Consume('e') || Consume('E')) {
      if (!Consume('+')) Consume('-');
      if (digits() == 0) return Error("malformed number: no digits in the exponent");
    }
    *token = std::string(s_.substr(start, pos_ - start));
    return Status::Ok();
  }

  Status ParseString(std::string* out) {
    if (!Consume('"')) return Error("expected '\"'");
    out->clear();
    for (;;) {
      if (pos_ >= s_.size()) return Error("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return Status::Ok();
      if (static_cast<unsigned char>(c) < 0x20) return Error("unescaped control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return Error("unterminated escape");
      const char e = s_[pos_++];
      if (e == 'u') {
        LOOM_RETURN_IF_ERROR(ParseUnicodeEscape(out));
        continue;
      }
      if (e == '/') {
        out->push_back('/');
        continue;
      }
      const auto* escape = std::find_if(std::begin(kShortEscapes), std::end(kShortEscapes),
                                        [e](const auto& x) { return x.second == e; });
      if (escape == std::end(kShortEscapes)) return Error("unknown escape '\\", e, "'");
      out->push_back(escape->first);
    }
  }

  Status ParseHex4(uint32_t* v) {
    if (pos_ + 4 > s_.size()) return Error("truncated \\u escape");
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      uint32_t d = 0;
      if (h >= '0' && h <= '9')
        d = h - '0';
      else if (h >= 'a' && h <= 'f')
        d = h - 'a' + 10;
      else if (h >= 'A' && h <= 'F')
        d = h - 'A' + 10;
      else
        return Error("bad hex digit in a \\u escape");
      *v = *v * 16 + d;
    }
    return Status::Ok();
  }

  // \uXXXX (after the "\u"), with surrogate pairs, appended as UTF-8.
  Status ParseUnicodeEscape(std::string* out) {
    uint32_t cp = 0;
    LOOM_RETURN_IF_ERROR(ParseHex4(&cp));
    if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("unpaired low surrogate in a \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (s_.substr(pos_, 2) != "\\u") return Error("unpaired high surrogate in a \\u escape");
      pos_ += 2;
      uint32_t low = 0;
      LOOM_RETURN_IF_ERROR(ParseHex4(&low));
      if (low < 0xDC00 || low > 0xDFFF) return Error("high surrogate not followed by a low one");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    AppendUtf8(static_cast<char32_t>(cp), out);
    return Status::Ok();
  }

  std::string_view s_;
  size_t pos_ = 0;
};

StatusOr<double> ToDouble(const std::string& key, const JsonScalar& v) {
  if (v.kind == JsonScalar::Kind::kNull) return std::numeric_limits<double>::quiet_NaN();
  if (v.kind != JsonScalar::Kind::kNumber) return DataLoss("\"", key, "\" must be a number, got a string");
  double d = 0;
  const auto [end, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), d);
  // Out of double's range: JSON allows it, but the writer never produces it.
  if (ec != std::errc() || end != v.text.data() + v.text.size())
    return DataLoss("\"", key, "\" = ", v.text, " is out of range for a double");
  return d;
}

StatusOr<int64_t> ToInt(const std::string& key, const JsonScalar& v) {
  if (v.kind != JsonScalar::Kind::kNumber) return DataLoss("\"", key, "\" must be an integer");
  int64_t i = 0;
  const auto [end, ec] = std::from_chars(v.text.data(), v.text.data() + v.text.size(), i);
  if (ec == std::errc::result_out_of_range) return DataLoss("\"", key, "\" = ", v.text, " does not fit in 64 bits");
  if (ec != std::errc() || end != v.text.data() + v.text.size())
    return DataLoss("\"", key, "\" must be an integer, got ", v.text);
  return i;
}

}  // namespace

const char* SplitName(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kTest:
      return "test";
  }
  LOOM_CHECK(false, "unknown Split ", static_cast<int>(split));
  return "";
}

StatusOr<Split> ParseSplit(std::string_view name) {
  for (Split s : {Split::kTrain, Split::kTest})
    if (name == SplitName(s)) return s;
  return InvalidArgument("unknown split \"", name, "\" (expected \"train\" or \"test\")");
}

bool MetricsRecord::operator==(const MetricsRecord& o) const {
  return replica == o.replica && epoch == o.epoch && step == o.step && split == o.split && loss == o.loss &&
         accuracy == o.accuracy && samples_per_s == o.samples_per_s && time_s == o.time_s && extra == o.extra;
}

std::vector<std::pair<std::string, double>> RecordScalars(const MetricsRecord& r) {
  const std::string prefix = StrCat(SplitName(r.split), "/");
  std::vector<std::pair<std::string, double>> scalars = {{prefix + "loss", r.loss}};
  if (r.accuracy) scalars.emplace_back(prefix + "accuracy", *r.accuracy);
  scalars.emplace_back(prefix + "samples_per_s", r.samples_per_s);
  for (const auto& [name, value] : r.extra) scalars.emplace_back(prefix + name, value);
  return scalars;
}

StatusOr<std::string> FormatMetricsLine(const MetricsRecord& r) {
  std::set<std::string_view> seen;
  for (const auto& [name, value] : r.extra) {
    if (name.empty()) return InvalidArgument("metrics record: an extra field has an empty name");
    if (IsFixedField(name))
      return InvalidArgument("metrics record: extra field \"", name, "\" clashes with a fixed field");
    if (!seen.insert(name).second) return InvalidArgument("metrics record: extra field \"", name, "\" appears twice");
  }
  std::string out = "{";
  AppendKey("replica", &out);
  AppendJsonInt(r.replica, &out);
  AppendKey("epoch", &out);
  AppendJsonInt(r.epoch, &out);
  AppendKey("step", &out);
  AppendJsonInt(r.step, &out);
  AppendKey("split", &out);
  AppendJsonString(SplitName(r.split), &out);
  AppendKey("loss", &out);
  AppendJsonNumber(r.loss, &out);
  if (r.accuracy) {
    AppendKey("accuracy", &out);
    AppendJsonNumber(*r.accuracy, &out);
  }
  AppendKey("samples_per_s", &out);
  AppendJsonNumber(r.samples_per_s, &out);
  AppendKey("time_s", &out);
  AppendJsonNumber(r.time_s, &out);
  for (const auto& [name, value] : r.extra) {
    AppendKey(name, &out);
    AppendJsonNumber(value, &out);
  }
  out.push_back('}');
  return out;
}

StatusOr<MetricsRecord> ParseMetricsLine(std::string_view line) {
  LOOM_ASSIGN_OR_RETURN(auto fields, FlatObjectParser(line).Parse());
  MetricsRecord r;
  std::set<std::string> seen;
  for (const auto& [key, value] : fields) {
    if (!seen.insert(key).second) return DataLoss("field \"", key, "\" appears twice");
    if (key == "replica") {
      LOOM_ASSIGN_OR_RETURN(r.replica, ToInt(key, value));
    } else if (key == "epoch") {
      LOOM_ASSIGN_OR_RETURN(r.epoch, ToInt(key, value));
    } else if (key == "step") {
      LOOM_ASSIGN_OR_RETURN(r.step, ToInt(key, value));
    } else if (key == "split") {
      if (value.kind != JsonScalar::Kind::kString) return DataLoss("\"split\" must be a string");
      auto split = ParseSplit(value.text);
      if (!split.ok()) return DataLoss(split.status().message());
      r.split = *split;
    } else if (key == "loss") {
      LOOM_ASSIGN_OR_RETURN(r.loss, ToDouble(key, value));
    } else if (key == "accuracy") {
      LOOM_ASSIGN_OR_RETURN(r.accuracy, ToDouble(key, value));
    } else if (key == "samples_per_s") {
      LOOM_ASSIGN_OR_RETURN(r.samples_per_s, ToDouble(key, value));
    } else if (key == "time_s") {
      LOOM_ASSIGN_OR_RETURN(r.time_s, ToDouble(key, value));
    } else {
      LOOM_ASSIGN_OR_RETURN(double v, ToDouble(key, value));
      r.extra.emplace_back(key, v);
    }
  }
  for (const char* required : {"replica", "epoch", "step", "split", "loss", "samples_per_s", "time_s"})
    if (!seen.count(required)) return DataLoss("missing field \"", required, "\"");
  return r;
}

StatusOr<MetricsWriter> MetricsWriter::Open(const std::string& path, AppendFile::Mode mode) {
  LOOM_ASSIGN_OR_RETURN(AppendFile file, AppendFile::Open(path, mode));
  return MetricsWriter(std::move(file));
}

Status MetricsWriter::Write(const MetricsRecord& record) {
  auto line = FormatMetricsLine(record);
  if (!line.ok()) return line.status().WithContext(path());
  // One write(2) per line: a reader never sees half a line from a live writer.
  return file_.Append(*line + "\n");
}

StatusOr<std::vector<MetricsRecord>> ReadMetricsFile(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::string data, ReadWholeFile(path));
  std::vector<MetricsRecord> records;
  size_t start = 0;
  for (int64_t line_no = 1; start < data.size(); ++line_no) {
    size_t end = data.find('\n', start);
    if (end == std::string::npos) end = data.size();
    const std::string_view line(data.data() + start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto record = ParseMetricsLine(line);
    if (!record.ok()) return record.status().WithContext(StrCat(path, ":", line_no));
    records.push_back(std::move(*record));
  }
  return records;
}

}  // namespace loom::metrics
