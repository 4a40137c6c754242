// Loading `loom train` config files (text protobuf, schema in
// train_config.proto, documented in docs/train_config.md). Unknown fields,
// wrong types and out-of-range values are errors of the form
//   FILE:LINE: field data.batch_size: must be >= 1, got 0
// Defaults are filled in after checking, so the resolved config written to a
// run's folder repeats the run exactly.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "core/device.h"
#include "core/status.h"
#include "graph/training.h"
#include "train/config/train_config.pb.h"

namespace loom {

// Parses, checks and fills defaults. `name` (the file's stem) is kept for
// naming the run folder.
StatusOr<proto::TrainConfig> LoadTrainConfig(const std::string& path);
// The same for text already in memory (`origin` names it in errors).
StatusOr<proto::TrainConfig> ParseTrainConfig(const std::string& text, const std::string& origin);

// Checks ranges and names; `where` maps a dotted field path to "FILE:LINE"
// (empty when the field is not in the file: the message then names the file).
// The replicas, sweep and fusion blocks are checked here too; each replica's
// own config is checked when it is expanded (train/config/replicas.h),
// which LoadTrainConfig and ParseTrainConfig do for a fused config.
Status ValidateTrainConfig(const proto::TrainConfig& config,
                           const std::function<std::string(const std::string&)>& where);
// The same, with `name` choosing how a message names a field (a dotted path):
// the expanded replicas of a fused config say "replicas[2].optimizer.lr".
Status ValidateTrainConfig(const proto::TrainConfig& config,
                           const std::function<std::string(const std::string&)>& where,
                           const std::function<std::string(const std::string&)>& name);
// Defaults of a fused config's fusion block (isolate_divergence true; early
// stop every 1 epoch, keep 0.5, metric test_accuracy) are filled here too.
void FillDefaults(proto::TrainConfig* config);

std::string TrainConfigToText(const proto::TrainConfig& config);

// The fields in which `run` and `given` define different runs, as
// "seed: 1 -> 2; optimizer.lr: ..."; empty when they define the same run.
// What a resume may change is ignored: the folder's path (a run can be
// moved or named by another path), the run's length (to extend it), the
// thread count (results do not depend on it) and the device.
std::string RunDifferences(const proto::TrainConfig& run, const proto::TrainConfig& given);

// The CPU threads a config (or `loom train --threads`) may ask for: 0 (all
// cores) up to kMaxThreads (more is a typo, and may not start at all). The
// error's message says what is wrong: "must be <= 1024 (...), got N".
constexpr int64_t kMaxThreads = 1024;
Status CheckThreadCount(int64_t threads);
// The device of the run's steps (config field `device`), and of its
// evaluation in a parallel run: when unset, the first of `devices` if they
// are GPUs, else cpu.
StatusOr<Device> RunDevice(const proto::TrainConfig& c);
// The devices of a parallel run (config field `devices`, core/device.h
// ParseDevices), empty when unset (one device, field `device`).
StatusOr<std::vector<Device>> RunDevices(const proto::TrainConfig& c);
// The low precision of a mixed-precision run (config field `precision`,
// validated): kBF16, kF16, or kF32 when unset or "f32".
DType RunPrecision(const proto::TrainConfig& c);
// fp16's loss scaler: LossScaling's defaults with the fields of
// `loss_scale` that the config sets.
LossScaling RunLossScaling(const proto::TrainConfig& c);
// fp16: a scale backed off this far (80 overflows in a row from 65536)
// leaves no gradient representable: the run (or replica) diverged. The
// scale is checkpointed state, so a resumed run decides the same.
inline constexpr double kMinLossScale = 0x1p-64;


}  // namespace loom
