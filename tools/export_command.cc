// `loom export --checkpoint FILE --replica R --out FILE`: one replica of a
// fused run's checkpoint as an ordinary single-model checkpoint.
//
// A fused run's checkpoint (train/training_run.cc, Trainer::SaveCheckpoint)
// holds the replica array: tensors named as the single model's state but
// shaped [R_running, ...], row i being the i-th replica (in config order)
// whose string value "replica_<r>/status" is "running"; and, for replicas
// that left the array (diverged or stopped), their final tensors as
// "retired/<r>/<name>" in the single model's shape. Its config_text is the
// fused run's resolved config; ExpandReplicas gives each replica's own.
//
// The export holds replica r's tensors (a row of the array, or its retired
// tensors), the same position and values (less the replica_* ones),
// seeds["seed"] = the replica's own seed (what a single run of its config
// records), config_text = the replica's own config, and no model
// fingerprint (RestoreExecutorState then skips that check and compares the
// tensors themselves). docs/fusion_tools.md.
#include <cstdio>
#include <filesystem>
#include <cstring>

#include "train/checkpoint/checkpoint.h"
#include "train/config/replicas.h"
#include "train/config/train_config.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace loom::tools {
namespace {

constexpr char kRetiredPrefix[] = "retired/";

std::string ReplicaKey(size_t r) { return "replica_" + std::to_string(r); }
bool IsReplicaValue(const std::string& key) { return key.rfind("replica_", 0) == 0; }

Status Export(const Flags& flags) {
  if (!flags.Has("checkpoint")) return InvalidArgument("loom export needs --checkpoint FILE (a fused run's checkpoint)");
  if (!flags.Has("replica")) return InvalidArgument("loom export needs --replica R (0-based, in config order)");
  if (!flags.Has("out")) return InvalidArgument("loom export needs --out FILE");
  const std::string path = flags.Str("checkpoint", ""), out_path = flags.Str("out", "");
  LOOM_ASSIGN_OR_RETURN(int64_t replica, flags.Int("replica", 0));
  std::error_code ec;
  if (std::filesystem::exists(out_path, ec)) {
    if (std::filesystem::equivalent(out_path, path, ec))
      return InvalidArgument("--out ", out_path, " is the --checkpoint being exported; choose another file");
    if (!StartsLikeCheckpoint(out_path))
      return FailedPrecondition(out_path, " exists and is not a loom checkpoint: not overwriting it (remove it or ",
                                "choose another --out)");
  }

  LOOM_ASSIGN_OR_RETURN(Checkpoint in, LoadCheckpoint(path));
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
    return OutOfRange("--replica ", replica, ": ", path, " holds replicas 0 to ", specs.size() - 1, ":", list);
  }
  const size_t r = static_cast<size_t>(replica);

  Checkpoint out;
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
  LOOM_RETURN_IF_ERROR(SaveCheckpoint(out_path, out));

  size_t bytes = 0;
  for (const auto& [name, t] : out.tensors) bytes += t.nbytes();
  std::printf("wrote %s: replica %zu (%s), %s, %zu tensors (%.2f MiB), step %lld\n", out_path.c_str(), r,
              specs[r].label.c_str(),
              row[r] >= 0 ? StrCat("running, row ", row[r], " of ", running).c_str() : status[r].c_str(),
              out.tensors.size(), bytes / 1048576.0, static_cast<long long>(out.position.global_step));
  return Status::Ok();
}

}  // namespace

Status ExportCommand(const std::vector<std::string>& args) {
  Flags flags({{"checkpoint", "a fused run's checkpoint (runs/<run>/ckpt-<step>.loom)"},
               {"replica", "which replica, 0-based in config order (loom export lists them on a bad value)"},
               {"out", "the single-model checkpoint to write"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom export --checkpoint FILE --replica R --out FILE\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  return Export(flags);
}

}  // namespace loom::tools
