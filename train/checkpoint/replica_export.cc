#include "train/checkpoint/replica_export.h"

#include <cstring>
#include <vector>

#include "train/config/replicas.h"
#include "train/config/train_config.h"

namespace loom {

namespace {

constexpr char kRetiredPrefix[] = "retired/";

std::string ReplicaKey(size_t r) { return "replica_" + std::to_string(r); }
bool IsReplicaValue(const std::string& key) { return key.rfind("replica_", 0) == 0; }

}  // namespace

StatusOr<ReplicaExport> ExportReplica(const Checkpoint& in, int64_t replica, const std::string& replica_arg) {
  const std::string path = in.source.empty() ? std::string("the checkpoint") : in.source;
  if (in.config_text.empty()) return FailedPrecondition(path, " holds no config, so not a fused run's checkpoint");
  auto config = ParseTrainConfig(in.config_text, path + " (its config)");
  if (!config.ok()) return config.status().WithContext("reading the config stored in " + path);
  if (!IsFused(*config) || !in.string_values.count(ReplicaKey(0) + "/status"))
    return FailedPrecondition(path, " is not a fused run's checkpoint (its config has no replicas or sweep",
                              IsFused(*config) ? ", and it records no replica statuses" : "",
                              "); it already is a single model's");
  LOOM_ASSIGN_OR_RETURN(std::vector<ReplicaSpec> specs, ExpandReplicas(*config));

  // Each replica's status, and the array row of those running.
  std::vector<std::string> status(specs.size());
  std::vector<int64_t> row(specs.size(), -1);
  int64_t running = 0;
  for (size_t r = 0; r < specs.size(); ++r) {
    auto it = in.string_values.find(ReplicaKey(r) + "/status");
    if (it == in.string_values.end())
      return DataLoss(path, ": no status for replica ", r, " (", specs[r].label, ") of the ", specs.size(),
                      " its config describes");
    status[r] = it->second;
    if (status[r] == "running") row[r] = running++;
  }
  if (replica < 0 || replica >= static_cast<int64_t>(specs.size())) {
    std::string list;
    for (size_t r = 0; r < specs.size(); ++r) list += StrCat("\n  ", r, "  ", specs[r].label, ": ", status[r]);
    return OutOfRange(replica_arg, " ", replica, ": ", path, " holds replicas 0 to ", specs.size() - 1, ":", list);
  }
  const size_t r = static_cast<size_t>(replica);

  ReplicaExport result;
  result.label = specs[r].label;
  result.status = status[r];
  result.row = row[r];
  result.running = running;
  Checkpoint& out = result.checkpoint;
  const std::string retired = kRetiredPrefix + std::to_string(r) + "/";
  for (const auto& [name, t] : in.tensors) {
    if (name.rfind(kRetiredPrefix, 0) == 0) {
      if (row[r] < 0 && name.rfind(retired, 0) == 0) out.tensors[name.substr(retired.size())] = t;
      continue;
    }
    if (row[r] < 0) continue;
    if (t.shape().rank() < 1 || t.shape()[0] != running)
      return DataLoss(path, ": tensor '", name, "' is ", t.shape().ToString(), ", not [", running,
                      ", ...] for the ", running, " running replicas");
    const std::vector<int64_t>& dims = t.shape().dims();
    Tensor slice = Tensor::Zeros(Shape(std::vector<int64_t>(dims.begin() + 1, dims.end())), t.dtype());
    std::memcpy(slice.raw_data(), static_cast<const char*>(t.raw_data()) + static_cast<size_t>(row[r]) * slice.nbytes(),
                slice.nbytes());
    out.tensors[name] = slice;
  }
  if (out.tensors.empty())
    return DataLoss(path, ": no tensors for replica ", r, " (", specs[r].label, ", ", status[r], ")",
                    row[r] < 0 ? StrCat(": expected them as ", retired, "<name>") : std::string());

  out.position = in.position;
  out.seeds = in.seeds;
  out.seeds["seed"] = specs[r].config.seed();
  for (const auto& [k, v] : in.int_values)
    if (!IsReplicaValue(k)) out.int_values[k] = v;
  for (const auto& [k, v] : in.float_values)
    if (!IsReplicaValue(k)) out.float_values[k] = v;
  for (const auto& [k, v] : in.string_values)
    if (!IsReplicaValue(k)) out.string_values[k] = v;
  // The replica's own config, minus the fused run's folder: training from
  // it must not write into that run.
  proto::TrainConfig replica_config = specs[r].config;
  replica_config.clear_out_dir();
  out.config_text = TrainConfigToText(replica_config);
  out.source = StrCat(path, " (replica ", r, ")");
  return result;
}

}  // namespace loom
