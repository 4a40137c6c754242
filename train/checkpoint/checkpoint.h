// Checkpoints: everything needed to continue a training run bit for bit on
// the CPU, in one checksummed file: the state tensors (raw bytes), the
// training position, seeds, the trainer's own values, the resolved config and
// the model fingerprint. The format and how resume works: docs/checkpoints.md.
//
//   LOOM_ASSIGN_OR_RETURN(Checkpoint c, CaptureExecutorState(exec));  // executor_state.h
//   c.position.global_step = step; c.config_text = config; ...
//   LOOM_RETURN_IF_ERROR(SaveCheckpoint("runs/a/ckpt-100.loom", c));
//   LOOM_ASSIGN_OR_RETURN(Checkpoint back, LoadCheckpoint("runs/a/ckpt-100.loom"));
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace loom {

// Bumped whenever the layout changes; LoadCheckpoint refuses other versions.
inline constexpr uint32_t kCheckpointFormatVersion = 1;

struct TrainingPosition {
  int64_t global_step = 0;     // optimizer updates done so far
  int64_t epoch = 0;           // the epoch in progress (0-based)
  int64_t batch_in_epoch = 0;  // batches of that epoch already trained on
  int64_t executor_step = 0;   // Executor::step(): keys the random streams

  bool operator==(const TrainingPosition& o) const {
    return global_step == o.global_step && epoch == o.epoch && batch_in_epoch == o.batch_in_epoch &&
           executor_step == o.executor_step;
  }
};

struct Checkpoint {
  // Every Parameter and Buffer (weights, optimizer slots, BatchNorm running
  // statistics) by node name, any dtype. Saved byte for byte; loaded on the host.
  std::map<std::string, Tensor> tensors;
  TrainingPosition position;
  std::map<std::string, uint64_t> seeds;  // e.g. "init", "executor", "shuffle"
  // Whatever else the trainer restores: schedule position, early-stop state.
  std::map<std::string, int64_t> int_values;
  std::map<std::string, double> float_values;  // stored bit-exactly
  std::map<std::string, std::string> string_values;
  std::string config_text;        // the resolved training config (text proto)
  std::string model_fingerprint;  // ModelFingerprint() of the training graph
  // The file LoadCheckpoint read this from; names it in later errors. Not saved.
  std::string source;
};

// Writes a temporary sibling of `path`, syncs it, renames it over `path` and
// syncs the directory: after a crash `path` holds the old file or the whole
// new one, never a part. Tensors on other devices are copied to the host one
// at a time. Errors name the file (and the tensor).
Status SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint);

// Refuses (DataLoss, naming the file) anything that is not a complete,
// uncorrupted checkpoint of this format version: wrong magic, truncation,
// a checksum mismatch, an inconsistent header.
StatusOr<Checkpoint> LoadCheckpoint(const std::string& path);

// Whether `path` is a file that starts as a checkpoint does (its magic);
// tools check it before they replace a file, so they never overwrite data
// that is not theirs.
bool StartsLikeCheckpoint(const std::string& path);

}  // namespace loom
