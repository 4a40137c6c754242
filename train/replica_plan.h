// How many fused replicas of a config's model fit in a memory size, from the
// graph and the static memory plan (runtime/step_memory.h), not by running
// steps. `loom plan` prints it; `loom sweep` sizes its arrays with it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/device.h"
#include "core/status.h"
#include "runtime/step_memory.h"
#include "train/config/train_config.pb.h"

namespace loom::train {

struct ReplicaPlanRow {
  int64_t replicas = 0;
  StepMemory memory;      // the fused training step
  size_t eval_bytes = 0;  // with_eval: the evaluation executor's state, arena and batch
  bool fits = false;
  size_t total() const { return memory.total() + eval_bytes; }
};

struct ReplicaPlan {
  std::map<int64_t, ReplicaPlanRow> rows;  // every R estimated
  int64_t largest_fitting = 0;             // 0: not even one replica fits
  bool limited_by_max_replicas = false;    // max_replicas fits: more may
};

// For R = 1, 2, 4, ... the fused training step is built as `loom bench
// fusion` builds it (the config's model, batch and optimizer, its
// fusion.unfused_layers) and its peak estimated with `accounting`'s rules
// (host copies count on the CPU, not on a GPU); between the last power of
// two that fits in `memory_bytes` and the first that does not, a binary
// search finds the largest R that fits. `with_eval` also counts the
// evaluation executor that the training loop keeps.
// "16GiB", "80GB", "512MiB", "1.5TiB", "1e9", "4096" (bytes); the unit may
// follow a space and is case-insensitive; K/M/G/T alone are binary. `what`
// names the value in errors ("--memory", "sweep.pbtxt:9: field memory").
StatusOr<uint64_t> ParseMemorySize(const std::string& text, const std::string& what);
// This machine's physical memory in bytes; 0 when it cannot be read.
uint64_t PhysicalMemory();

StatusOr<ReplicaPlan> PlanReplicas(const proto::TrainConfig& config, uint64_t memory_bytes, const Device& accounting,
                                   int64_t max_replicas, bool with_eval);

}  // namespace loom::train
