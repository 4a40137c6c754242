// Everything a training run records per report, in one call: a line in
// <dir>/metrics.jsonl (all replicas) and the record's scalars in the
// TensorBoard event file of its replica: <dir> itself for a single replica,
// <dir>/replica_<r>/ for several, so TensorBoard draws one curve per replica.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/metrics/event_writer.h"
#include "runtime/metrics/metrics_jsonl.h"

namespace loom::metrics {

inline constexpr char kMetricsFileName[] = "metrics.jsonl";

struct RunLoggerOptions {
  int64_t replicas = 1;
  bool resume = false;      // append to an existing metrics.jsonl instead of starting it afresh
  bool tensorboard = true;  // write event files
};

class RunLogger {
 public:
  static StatusOr<RunLogger> Create(const std::string& dir, const RunLoggerOptions& options = {});

  // The record's replica selects the event file; the TensorBoard step is
  // record.step and the tags are RecordScalars(record).
  Status Log(const MetricsRecord& record);

  const std::string& metrics_path() const { return metrics_.path(); }
  // Empty when TensorBoard output is off.
  std::vector<std::string> event_paths() const;
  int64_t replicas() const { return replicas_; }

 private:
  RunLogger(int64_t replicas, MetricsWriter metrics, std::vector<EventWriter> events)
      : replicas_(replicas), metrics_(std::move(metrics)), events_(std::move(events)) {}

  int64_t replicas_;
  MetricsWriter metrics_;
  std::vector<EventWriter> events_;  // one per replica, or none
};

}  // namespace loom::metrics
