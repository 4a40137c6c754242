#include "train/checkpoint/run_dir.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>
#include <system_error>

namespace loom {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".loom";
// SaveCheckpoint's temporaries are "<final name>.tmp-<pid>-<n>".
constexpr const char* kTempMarker = ".tmp-";

// The step of "ckpt-<step>.loom"; nullopt for any other name, including
// zero-padded steps, so that each step has exactly one file name.
std::optional<int64_t> ParseStep(const std::string& name) {
  const std::string prefix = kPrefix, suffix = kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size() - suffix.size();
  if (!std::all_of(first, last, [](char ch) { return ch >= '0' && ch <= '9'; })) return std::nullopt;
  if (*first == '0' && last - first > 1) return std::nullopt;
  int64_t step = 0;
  auto [end, err] = std::from_chars(first, last, step);
  if (err != std::errc() || end != last) return std::nullopt;
  return step;
}

bool IsCheckpointTemporary(const std::string& name) {
  size_t marker = name.rfind(kTempMarker);
  return marker != std::string::npos && ParseStep(name.substr(0, marker)).has_value();
}

// What a run directory holds: checkpoints by increasing step, and the
// temporaries of interrupted saves.
struct DirScan {
  std::vector<CheckpointFile> checkpoints;
  std::vector<std::string> temporaries;
};

StatusOr<DirScan> Scan(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return NotFound("run directory '", dir, "' does not exist");
  if (!fs::is_directory(dir, ec)) return FailedPrecondition("run directory '", dir, "' is not a directory");
  DirScan scan;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    const std::string name = it->path().filename().string();
    if (std::optional<int64_t> step = ParseStep(name)) {
      scan.checkpoints.push_back({*step, it->path().string()});
    } else if (IsCheckpointTemporary(name)) {
      scan.temporaries.push_back(it->path().string());
    }
  }
  if (ec) return FailedPrecondition("cannot list run directory '", dir, "': ", ec.message());
  std::sort(scan.checkpoints.begin(), scan.checkpoints.end(),
            [](const CheckpointFile& a, const CheckpointFile& b) { return a.step < b.step; });
  return scan;
}

}  // namespace

std::string CheckpointFileName(int64_t step) { return StrCat(kPrefix, step, kSuffix); }

StatusOr<std::vector<CheckpointFile>> ListCheckpoints(const std::string& dir) {
  LOOM_ASSIGN_OR_RETURN(DirScan scan, Scan(dir));
  return scan.checkpoints;
}

StatusOr<CheckpointFile> FindLatestCheckpoint(const std::string& dir) {
  LOOM_ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpoints(dir));
  if (files.empty()) return NotFound("run directory '", dir, "' holds no checkpoint (", kPrefix, "<step>", kSuffix, ")");
  return files.back();
}

StatusOr<std::string> SaveCheckpointToRunDir(const std::string& dir, const Checkpoint& checkpoint, int keep_last) {
  const int64_t step = checkpoint.position.global_step;
  if (step < 0) return InvalidArgument("cannot save a checkpoint of negative global step ", step, " in '", dir, "'");
  if (keep_last < 0) return InvalidArgument("keep_last must be 0 (keep all) or positive, got ", keep_last);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FailedPrecondition("cannot create run directory '", dir, "': ", ec.message());
  LOOM_ASSIGN_OR_RETURN(std::vector<CheckpointFile> existing, ListCheckpoints(dir));
  if (!existing.empty() && existing.back().step > step)
    return FailedPrecondition("cannot save step ", step, " in run directory '", dir, "': it already holds the newer '",
                              existing.back().path,
                              "'; a run resumed from an older checkpoint needs a new run directory");
  const std::string path = (fs::path(dir) / CheckpointFileName(step)).string();
  LOOM_RETURN_IF_ERROR(SaveCheckpoint(path, checkpoint));
  // Only now that the new checkpoint is in place may older ones go.
  if (keep_last > 0) LOOM_RETURN_IF_ERROR(PruneCheckpoints(dir, keep_last));
  return path;
}

Status PruneCheckpoints(const std::string& dir, int keep_last) {
  if (keep_last < 1) return InvalidArgument("keep_last must be at least 1 when pruning '", dir, "', got ", keep_last);
  LOOM_ASSIGN_OR_RETURN(DirScan scan, Scan(dir));
  std::vector<std::string> doomed = scan.temporaries;
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < scan.checkpoints.size(); ++i) doomed.push_back(scan.checkpoints[i].path);
  for (const std::string& path : doomed) {
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) return FailedPrecondition("cannot delete old checkpoint file '", path, "': ", ec.message());
  }
  return Status::Ok();
}

}  // namespace loom
