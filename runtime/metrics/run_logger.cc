#include "runtime/metrics/run_logger.h"

#include <filesystem>

namespace loom::metrics {

StatusOr<RunLogger> RunLogger::Create(const std::string& dir, const RunLoggerOptions& options) {
  if (options.replicas < 1) return InvalidArgument("run logger for ", options.replicas, " replicas: need at least one");
  LOOM_ASSIGN_OR_RETURN(MetricsWriter metrics,
                        MetricsWriter::Open((std::filesystem::path(dir) / kMetricsFileName).string(),
                                            options.resume ? AppendFile::Mode::kAppend : AppendFile::Mode::kTruncate));
  std::vector<EventWriter> events;
  if (options.tensorboard && options.replicas == 1) {
    LOOM_ASSIGN_OR_RETURN(EventWriter w, EventWriter::Create(dir));
    events.push_back(std::move(w));
  } else if (options.tensorboard) {
    LOOM_ASSIGN_OR_RETURN(events, CreateReplicaEventWriters(dir, options.replicas));
  }
  return RunLogger(options.replicas, std::move(metrics), std::move(events));
}

Status RunLogger::Log(const MetricsRecord& record) {
  if (record.replica < 0 || record.replica >= replicas_)
    return InvalidArgument(metrics_path(), ": record for replica ", record.replica, ", but the run has ", replicas_,
                           " replica(s)");
  LOOM_RETURN_IF_ERROR(metrics_.Write(record));
  if (events_.empty()) return Status::Ok();
  return events_[static_cast<size_t>(record.replica)].AddScalars(record.step, RecordScalars(record));
}

std::vector<std::string> RunLogger::event_paths() const {
  std::vector<std::string> paths;
  for (const EventWriter& w : events_) paths.push_back(w.path());
  return paths;
}

}  // namespace loom::metrics
