// Horizontal fusion, the config side: a TrainConfig with `replicas` or a
// `sweep` describes R replicas of one model, each with its own optimizer,
// schedule and seed (docs/train_config.md, "Replicas and sweeps").
// ExpandReplicas turns it into R complete single-model configs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/config/train_config.pb.h"

namespace loom {

// The most replicas one config may describe.
inline constexpr int64_t kMaxReplicas = 1024;

struct ReplicaSpec {
  proto::TrainConfig config;  // complete, validated, defaults filled; no replicas or sweep
  std::string label;          // the replica's name and what differs, e.g. "r3 lr=0.0316 momentum=0.9"
};

// True when the config describes replicas (explicitly or by a sweep).
bool IsFused(const proto::TrainConfig& c);

// One config per replica, in order. Explicit replicas: the replica's
// optimizer and schedule fields that are set override the base's (a
// protobuf merge; a list such as schedule.milestones replaces the base's),
// seed defaults to the base seed + index. Grid sweeps: every combination of
// the params' values, the first param varying slowest. Random sweeps: `count`
// replicas whose draws are a function of sweep.seed alone. The fusion block
// is kept from the base. Errors name the place ("replicas[2].optimizer.lr",
// "sweep.param[1].field") and the replica.
StatusOr<std::vector<ReplicaSpec>> ExpandReplicas(const proto::TrainConfig& config);
// The same with `where` mapping a dotted field path ("replicas[2].optimizer.lr")
// to "FILE:LINE", as for ValidateTrainConfig (used by the config loader).
StatusOr<std::vector<ReplicaSpec>> ExpandReplicas(const proto::TrainConfig& config,
                                                  const std::function<std::string(const std::string&)>& where);

// Whether a scalar field holds an integer (int32/64, uint32/64), or any
// number (an integer, a float or a double).
bool IsIntegerField(const google::protobuf::FieldDescriptor* f);
bool IsNumericField(const google::protobuf::FieldDescriptor* f);

// The fields a sweep may set: the numeric scalar fields of the optimizer and
// the schedule ("optimizer.lr", ..., "schedule.warmup_steps", ...) and "seed".
const std::vector<std::string>& SweepableFields();
// The descriptor of a sweepable field (a path of SweepableFields()), or null.
const google::protobuf::FieldDescriptor* SweepableField(const std::string& path);

}  // namespace loom
