// The checkpoints of one training run, kept in a run directory as
// "ckpt-<global step>.loom". One process writes a run directory at a time;
// the newest checkpoint is the one with the highest step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/checkpoint/checkpoint.h"

namespace loom {

struct CheckpointFile {
  int64_t step = 0;
  std::string path;  // the directory joined with the file name
};

// "ckpt-<step>.loom", no padding.
std::string CheckpointFileName(int64_t step);

// The checkpoints in `dir`, by increasing step. Other files, including the
// temporaries of interrupted saves, are ignored. NotFound if `dir` does not exist.
StatusOr<std::vector<CheckpointFile>> ListCheckpoints(const std::string& dir);

// The checkpoint with the highest step; NotFound (naming the directory) if
// there is none or the directory does not exist.
StatusOr<CheckpointFile> FindLatestCheckpoint(const std::string& dir);

// Saves `checkpoint` as CheckpointFileName(position.global_step) in `dir`
// (created if missing) and then, when keep_last > 0, prunes to the newest
// keep_last. Refuses to save behind a newer checkpoint already in `dir`: a
// run resumed from an older checkpoint is a fork and needs its own
// directory, or "latest" would pick the abandoned branch. Returns the path.
StatusOr<std::string> SaveCheckpointToRunDir(const std::string& dir, const Checkpoint& checkpoint, int keep_last);

// Deletes all but the newest `keep_last` (>= 1) checkpoints of `dir`, and
// the temporaries that interrupted saves left behind.
Status PruneCheckpoints(const std::string& dir, int keep_last);

}  // namespace loom
