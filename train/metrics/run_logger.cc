#include "train/metrics/run_logger.h"

#include <filesystem>

#include "core/file_util.h"

namespace loom::metrics {

namespace fs = std::filesystem;

StatusOr<std::string> TruncateMetricsAfter(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::string();
  LOOM_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  std::string kept;
  int64_t later = 0, unreadable = 0;
  size_t start = 0;
  bool unfinished = false;
  while (start < text.size()) {
    const size_t newline = text.find('\n', start);
    if (newline == std::string::npos) {  // a write cut short by a kill
      unfinished = true;
      break;
    }
    const std::string_view line(text.data() + start, newline - start);
    start = newline + 1;
    if (line.empty()) continue;
    StatusOr<MetricsRecord> r = ParseMetricsLine(line);
    if (!r.ok()) ++unreadable;
    else if (r->step > step) ++later;
    else kept.append(line).push_back('\n');
  }
  if (kept.size() == text.size()) return std::string();
  LOOM_RETURN_IF_ERROR(WriteFileAtomically(path, kept));
  std::string note = StrCat(path, ": resuming from step ", step);
  if (later > 0) note += StrCat(", dropped ", later, " record(s) of later steps (they are logged again)");
  if (unreadable > 0) note += StrCat(", dropped ", unreadable, " unreadable line(s)");
  if (unfinished) note += ", dropped an unfinished last line";
  return note;
}

StatusOr<RunLogger> RunLogger::Create(const std::string& dir, const RunLoggerOptions& options) {
  if (options.replicas < 1) return InvalidArgument("run logger for ", options.replicas, " replicas: need at least one");
  const std::string path = (fs::path(dir) / kMetricsFileName).string();
  std::string note;
  if (options.resume_step) {
    LOOM_ASSIGN_OR_RETURN(note, TruncateMetricsAfter(path, *options.resume_step));
  }
  LOOM_ASSIGN_OR_RETURN(MetricsWriter metrics,
                        MetricsWriter::Open(path, options.resume_step ? AppendFile::Mode::kAppend
                                                                      : AppendFile::Mode::kTruncate));
  RunLogger logger(dir, options.replicas, options.tensorboard, std::move(metrics));
  logger.resume_note_ = std::move(note);
  return logger;
}

Status RunLogger::Log(const MetricsRecord& record) {
  if (record.replica < 0 || record.replica >= replicas_)
    return InvalidArgument(metrics_path(), ": record for replica ", record.replica, ", but the run has ", replicas_,
                           " replica(s)");
  LOOM_RETURN_IF_ERROR(metrics_.Write(record));
  if (!tensorboard_) return Status::Ok();
  std::optional<EventWriter>& events = events_[static_cast<size_t>(record.replica)];
  if (!events) {
    LOOM_ASSIGN_OR_RETURN(EventWriter w,
                          EventWriter::Create(replicas_ == 1 ? dir_ : ReplicaEventDir(dir_, record.replica)));
    events = std::move(w);
  }
  return events->AddScalars(record.step, RecordScalars(record));
}

std::vector<std::string> RunLogger::event_paths() const {
  std::vector<std::string> paths;
  for (const std::optional<EventWriter>& w : events_)
    if (w) paths.push_back(w->path());
  return paths;
}

}  // namespace loom::metrics
