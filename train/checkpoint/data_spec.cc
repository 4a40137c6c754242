#include "train/checkpoint/data_spec.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/parse.h"

namespace loom {

namespace {

constexpr char kInputShape[] = "data/input_shape";
constexpr char kInputDtype[] = "data/input_dtype";
constexpr char kTargetShape[] = "data/target_shape";
constexpr char kNumClasses[] = "data/num_classes";
constexpr char kVocabulary[] = "data/vocabulary";
constexpr char kMean[] = "data/normalize_mean";
constexpr char kStd[] = "data/normalize_std";

std::string JoinDims(const Shape& s) {
  std::string out;
  for (int64_t d : s.dims()) out += (out.empty() ? "" : ",") + std::to_string(d);
  return out;
}

std::string JoinFloats(const std::vector<float>& values) {
  std::string out;
  for (float v : values) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
    out += (out.empty() ? "" : ",") + std::string(buf);
  }
  return out;
}

// "" is the empty list; every item must parse whole.
template <typename T>
StatusOr<std::vector<T>> SplitList(const std::string& text, const std::string& where) {
  std::vector<T> out;
  if (text.empty()) return out;
  for (const std::string& item : SplitCommas(text)) {
    if constexpr (std::is_same_v<T, int64_t>) {
      int64_t v = 0;
      if (ParseInt64(item, &v) != IntParse::kOk || v < 1)
        return DataLoss(where, ": '", text, "' is not a list of sizes >= 1 (item '", item, "')");
      out.push_back(v);
    } else {
      char* end = nullptr;
      errno = 0;
      const float v = std::strtof(item.c_str(), &end);
      if (item.empty() || *end != '\0' || errno != 0 || !std::isfinite(v))
        return DataLoss(where, ": '", text, "' is not a list of finite numbers (item '", item, "')");
      out.push_back(v);
    }
  }
  return out;
}

}  // namespace

void RecordDataSpec(const RecordedData& data, Checkpoint* c) {
  c->string_values[kInputShape] = JoinDims(data.spec.input);
  c->string_values[kInputDtype] = DTypeName(data.spec.input_dtype);
  c->string_values[kTargetShape] = JoinDims(data.spec.target);
  c->int_values[kNumClasses] = data.spec.num_classes;
  c->int_values[kVocabulary] = data.spec.vocabulary;
  c->string_values[kMean] = JoinFloats(data.mean);
  c->string_values[kStd] = JoinFloats(data.std);
}

StatusOr<std::optional<RecordedData>> ReadDataSpec(const Checkpoint& c) {
  const std::string file = c.source.empty() ? std::string("the checkpoint") : c.source;
  const char* const strings[] = {kInputShape, kInputDtype, kTargetShape, kMean, kStd};
  const char* const ints[] = {kNumClasses, kVocabulary};
  int present = 0;
  for (const char* k : strings) present += c.string_values.count(k) > 0;
  for (const char* k : ints) present += c.int_values.count(k) > 0;
  if (present == 0) return std::optional<RecordedData>();
  for (const char* k : strings)
    if (!c.string_values.count(k)) return DataLoss(file, ": records the data spec but not string value '", k, "'");
  for (const char* k : ints)
    if (!c.int_values.count(k)) return DataLoss(file, ": records the data spec but not int value '", k, "'");

  auto where = [&](const char* key) { return StrCat(file, ": ", key); };
  RecordedData d;
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> input, SplitList<int64_t>(c.string_values.at(kInputShape), where(kInputShape)));
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> target,
                        SplitList<int64_t>(c.string_values.at(kTargetShape), where(kTargetShape)));
  if (input.empty()) return DataLoss(where(kInputShape), ": empty (an example needs a shape)");
  d.spec.input = Shape(input);
  d.spec.target = Shape(target);
  const std::string& dtype = c.string_values.at(kInputDtype);
  if (dtype == "f32") {
    d.spec.input_dtype = DType::kF32;
  } else if (dtype == "i64") {
    d.spec.input_dtype = DType::kI64;
  } else {
    return DataLoss(where(kInputDtype), ": '", dtype, "', expected f32 or i64");
  }
  d.spec.num_classes = c.int_values.at(kNumClasses);
  d.spec.vocabulary = c.int_values.at(kVocabulary);
  if (d.spec.num_classes < 1) return DataLoss(where(kNumClasses), ": ", d.spec.num_classes, ", expected >= 1");
  if (d.spec.vocabulary < 0) return DataLoss(where(kVocabulary), ": ", d.spec.vocabulary, ", expected >= 0");
  LOOM_ASSIGN_OR_RETURN(d.mean, SplitList<float>(c.string_values.at(kMean), where(kMean)));
  LOOM_ASSIGN_OR_RETURN(d.std, SplitList<float>(c.string_values.at(kStd), where(kStd)));
  if (d.mean.size() != d.std.size())
    return DataLoss(file, ": ", d.mean.size(), " normalisation means but ", d.std.size(), " standard deviations");
  return std::optional<RecordedData>(std::move(d));
}

}  // namespace loom
