#include "train/metrics/event_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <system_error>

#include "train/metrics/masked_crc.h"

namespace loom::metrics {

namespace {

constexpr size_t kHeaderBytes = 12;  // length + its CRC
constexpr size_t kFooterBytes = 4;   // data CRC

void AppendLittleEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t ReadLittleEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string name(buf);
  std::replace(name.begin(), name.end(), '/', '_');  // never a path separator in a file name
  return name;
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

}  // namespace

double WallTimeNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string FrameRecord(std::string_view data) {
  std::string out;
  out.reserve(kHeaderBytes + data.size() + kFooterBytes);
  AppendLittleEndian(data.size(), 8, &out);
  AppendLittleEndian(MaskCrc32c(Crc32c(out.data(), 8)), 4, &out);
  out.append(data);
  AppendLittleEndian(MaskCrc32c(Crc32cOf(data)), 4, &out);
  return out;
}

StatusOr<EventWriter> EventWriter::Create(const std::string& dir) {
  const double now = WallTimeNow();
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%010lld", static_cast<long long>(std::floor(now)));
  const std::string base =
      (std::filesystem::path(dir) / StrCat("events.out.tfevents.", stamp, ".", Hostname())).string();
  for (int suffix = 0;; ++suffix) {
    const std::string path = suffix == 0 ? base : StrCat(base, ".", suffix);
    auto file = AppendFile::Open(path, AppendFile::Mode::kCreateNew);
    if (!file.ok()) {
      std::error_code ec;
      if (std::filesystem::exists(path, ec) && suffix < 1000) continue;  // taken; try the next name
      return file.status().WithContext("creating a TensorBoard event file");
    }
    EventWriter writer(std::move(*file));
    tb::Event first;
    first.set_wall_time(now);
    first.set_file_version(kEventFileVersion);
    if (Status s = writer.Write(first); !s.ok()) {
      std::error_code ec;
      std::filesystem::remove(path, ec);  // no event file without its file_version
      return s;
    }
    return writer;
  }
}

Status EventWriter::AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                               std::optional<double> wall_time) {
  tb::Event event;
  event.set_wall_time(wall_time ? *wall_time : WallTimeNow());
  event.set_step(step);
  tb::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : values) {
    if (tag.empty()) return InvalidArgument(path(), ": a scalar summary needs a non-empty tag");
    tb::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return Write(event);
}

Status EventWriter::Write(const tb::Event& event) {
  std::string data;
  if (!event.SerializeToString(&data)) return Internal(path(), ": cannot serialize an event");
  return file_.Append(FrameRecord(data));
}

std::string ReplicaEventDir(const std::string& run_dir, int64_t replica) {
  return (std::filesystem::path(run_dir) / StrCat("replica_", replica)).string();
}

StatusOr<std::vector<tb::Event>> ReadEventFile(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::string data, ReadWholeFile(path));
  std::vector<tb::Event> events;
  size_t offset = 0;
  for (int64_t record = 0; offset < data.size(); ++record) {
    auto error = [&](const auto&... what) {
      return DataLoss(path, ": record ", record, " at byte ", offset, ": ", what...);
    };
    const size_t left = data.size() - offset;
    if (left < kHeaderBytes) return error("truncated header (", left, " of ", kHeaderBytes, " bytes)");
    const char* p = data.data() + offset;
    const uint64_t length = ReadLittleEndian(p, 8);
    const uint32_t length_crc = static_cast<uint32_t>(ReadLittleEndian(p + 8, 4));
    const uint32_t want_length_crc = MaskCrc32c(Crc32c(p, 8));
    if (length_crc != want_length_crc)
      return error("length CRC mismatch (stored ", Hex32(length_crc), ", computed ", Hex32(want_length_crc), ")");
    const size_t body = left - kHeaderBytes;
    if (body < kFooterBytes || length > body - kFooterBytes)
      return error("truncated: ", length, " data bytes and a CRC promised, ", body, " bytes left");
    if (length > static_cast<uint64_t>(std::numeric_limits<int>::max()))
      return error(length, " data bytes is more than one event can hold");
    const std::string_view payload(p + kHeaderBytes, static_cast<size_t>(length));
    const uint32_t data_crc = static_cast<uint32_t>(ReadLittleEndian(p + kHeaderBytes + length, 4));
    const uint32_t want_data_crc = MaskCrc32c(Crc32cOf(payload));
    if (data_crc != want_data_crc)
      return error("data CRC mismatch (stored ", Hex32(data_crc), ", computed ", Hex32(want_data_crc), ")");
    tb::Event event;
    if (!event.ParseFromArray(payload.data(), static_cast<int>(payload.size())))
      return error("data is not an Event message");
    events.push_back(std::move(event));
    offset += kHeaderBytes + length + kFooterBytes;
  }
  return events;
}

StatusOr<std::vector<std::string>> FindEventFiles(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return FileError("list the directory", dir, ec.value());
  std::vector<std::string> files;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code stat_ec;  // an entry that vanished meanwhile is simply not listed
    if (it->is_regular_file(stat_ec) && it->path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      files.push_back(it->path().string());
  }
  if (ec) return FileError("list the directory", dir, ec.value());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace loom::metrics
