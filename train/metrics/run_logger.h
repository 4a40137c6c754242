// Everything a training run records per report, in one call: a line in
// <dir>/metrics.jsonl (all replicas) and the record's scalars in the
// TensorBoard event file of its replica: <dir> itself for a single replica,
// <dir>/replica_<r>/ for several, so TensorBoard draws one curve per replica.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/metrics/event_writer.h"
#include "train/metrics/metrics_jsonl.h"

namespace loom::metrics {

inline constexpr char kMetricsFileName[] = "metrics.jsonl";

struct RunLoggerOptions {
  int64_t replicas = 1;
  // Set when a run resumes from its checkpoint at this step: metrics.jsonl
  // keeps the records up to that step and drops the later ones (written
  // after the checkpoint, so the resumed run logs them again) and an
  // unfinished last line. Unset: a fresh run starts the file afresh.
  std::optional<int64_t> resume_step;
  bool tensorboard = true;  // write event files
};

class RunLogger {
 public:
  static StatusOr<RunLogger> Create(const std::string& dir, const RunLoggerOptions& options = {});

  // The record's replica selects the event file; the TensorBoard step is
  // record.step and the tags are RecordScalars(record). A replica's event
  // file is created with its first record, so a resume that logs nothing
  // adds no file.
  Status Log(const MetricsRecord& record);

  const std::string& metrics_path() const { return metrics_.path(); }
  // The event files written so far; empty when TensorBoard output is off.
  std::vector<std::string> event_paths() const;
  int64_t replicas() const { return replicas_; }
  // What a resume removed from metrics.jsonl ("" when nothing), for the console.
  const std::string& resume_note() const { return resume_note_; }

 private:
  RunLogger(std::string dir, int64_t replicas, bool tensorboard, MetricsWriter metrics)
      : dir_(std::move(dir)), replicas_(replicas), tensorboard_(tensorboard), metrics_(std::move(metrics)),
        events_(static_cast<size_t>(replicas)) {}

  std::string dir_;
  int64_t replicas_;
  bool tensorboard_;
  MetricsWriter metrics_;
  std::vector<std::optional<EventWriter>> events_;  // one per replica, created on first use
  std::string resume_note_;
};

// Rewrites the metrics file at `path` (if it exists) to the complete records
// with step <= `step`, in order. Returns what was removed ("" when nothing).
StatusOr<std::string> TruncateMetricsAfter(const std::string& path, int64_t step);

}  // namespace loom::metrics
