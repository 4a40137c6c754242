// TensorBoard event files (tfevents): a sequence of TFRecords, each
//   uint64 length | uint32 masked CRC32C(length) | data | uint32 masked CRC32C(data)
// (little-endian), whose data are serialized tb::Event messages; the first
// event of a file carries file_version "brain.Event:2". TensorBoard shows one
// run per directory, so several replicas get one writer each in
// <dir>/replica_<r>/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "train/metrics/event.pb.h"
#include "train/metrics/file_io.h"

namespace loom::metrics {

inline constexpr char kEventFileVersion[] = "brain.Event:2";

// `data` framed as one TFRecord.
std::string FrameRecord(std::string_view data);

class EventWriter {
 public:
  // Creates `dir` if needed and a new file
  // events.out.tfevents.<unix seconds, 10 digits>.<hostname> in it (".1",
  // ".2" ... appended if that name is taken, so two writers never share a
  // file) and writes the file_version event. Every event is handed to the
  // kernel as it is written.
  static StatusOr<EventWriter> Create(const std::string& dir);

  // One event with one scalar per (tag, value) at `step`; wall time
  // defaults to now. Values are stored as float (TensorBoard's simple_value).
  Status AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                    std::optional<double> wall_time = std::nullopt);
  Status AddScalar(const std::string& tag, int64_t step, double value) { return AddScalars(step, {{tag, value}}); }
  Status Write(const tb::Event& event);

  const std::string& path() const { return file_.path(); }

 private:
  explicit EventWriter(AppendFile file) : file_(std::move(file)) {}
  AppendFile file_;
};

// "<run_dir>/replica_<r>": where replica r of a fused run writes its event
// file, so TensorBoard shows one run (curve) per replica.
std::string ReplicaEventDir(const std::string& run_dir, int64_t replica);

// Every event of a file, after checking both CRCs of every record; errors
// name the file, the record and its byte offset.
StatusOr<std::vector<tb::Event>> ReadEventFile(const std::string& path);

// The event files directly in `dir` (not its subdirectories), sorted by
// name.
StatusOr<std::vector<std::string>> FindEventFiles(const std::string& dir);

// Seconds since the Unix epoch, as Event.wall_time holds them.
double WallTimeNow();

}  // namespace loom::metrics
