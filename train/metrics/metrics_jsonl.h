// metrics.jsonl: one JSON object per line, one line per report of one
// replica on one split, appended and handed to the kernel line by line so a
// killed run keeps every finished line. The format is described in
// docs/metrics.md; the reader is for tests and tools, and accepts exactly
// what the writer produces (flat objects of numbers, strings and null).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "train/metrics/file_io.h"

namespace loom::metrics {

enum class Split { kTrain, kTest };

const char* SplitName(Split split);  // "train", "test"
StatusOr<Split> ParseSplit(std::string_view name);

struct MetricsRecord {
  int64_t replica = 0;
  int64_t epoch = 0;  // 1-based
  int64_t step = 0;   // optimizer steps taken so far
  Split split = Split::kTrain;
  double loss = 0;
  std::optional<double> accuracy;  // unset for tasks without one: the field is omitted
  double samples_per_s = 0;
  double time_s = 0;  // seconds since the run started
  // Further numeric fields ("lr", "perplexity"), written after the fixed ones
  // in this order; names must be unique and differ from the fixed fields'.
  std::vector<std::pair<std::string, double>> extra;

  bool operator==(const MetricsRecord& other) const;
};

// The record's metrics as "<split>/<field>" (train/loss, test/accuracy,
// train/lr ...): loss, accuracy when set, samples_per_s, then the extra
// fields. These are the TensorBoard tags and the summary table's columns.
std::vector<std::pair<std::string, double>> RecordScalars(const MetricsRecord& record);

// One record as one JSON object, without the newline. Numbers are written in
// the shortest form that reads back to the same double; NaN and infinities
// have no JSON form and are written as null (read back as NaN).
StatusOr<std::string> FormatMetricsLine(const MetricsRecord& record);
StatusOr<MetricsRecord> ParseMetricsLine(std::string_view line);

class MetricsWriter {
 public:
  // kAppend continues an existing file (a resumed run); kTruncate starts it afresh.
  static StatusOr<MetricsWriter> Open(const std::string& path, AppendFile::Mode mode = AppendFile::Mode::kAppend);

  Status Write(const MetricsRecord& record);
  const std::string& path() const { return file_.path(); }

 private:
  explicit MetricsWriter(AppendFile file) : file_(std::move(file)) {}
  AppendFile file_;
};

// Every line of a metrics.jsonl file; errors name the file and line. Blank
// lines are skipped.
StatusOr<std::vector<MetricsRecord>> ReadMetricsFile(const std::string& path);

}  // namespace loom::metrics
