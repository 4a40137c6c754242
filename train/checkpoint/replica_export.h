// One replica of a fused run's checkpoint as an ordinary single-model
// checkpoint: what `loom export --replica R` writes (tools/export_command.cc)
// and what loom::Predictor serves for PredictorOptions::replica.
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
// records), config_text = the replica's own config without the fused run's
// out_dir, and no model fingerprint (RestoreExecutorState then skips that
// check and compares the tensors themselves). docs/fusion_tools.md.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "train/checkpoint/checkpoint.h"

namespace loom {

struct ReplicaExport {
  Checkpoint checkpoint;  // the single model's
  std::string label;      // the replica's label (ReplicaSpec::label)
  std::string status;     // "running", or why it left the array
  int64_t row = -1;       // its row of the array while running, else -1
  int64_t running = 0;    // replicas in the array
};

// Replica `replica` (0-based, config order) of `fused`, a checkpoint that
// LoadCheckpoint read (its `source` names it in errors). Errors: no config
// or a config that describes no replicas (FailedPrecondition: "not a fused
// run's checkpoint"), a replica out of range (OutOfRange, listing every
// replica with its status), missing statuses or tensors, a tensor that is
// not [R_running, ...] (DataLoss). `replica_arg` is what errors call the
// replica argument ("--replica" for loom export).
StatusOr<ReplicaExport> ExportReplica(const Checkpoint& fused, int64_t replica,
                                      const std::string& replica_arg = "replica");

}  // namespace loom
