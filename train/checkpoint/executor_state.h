// Moving a step runner's (an Executor's or a TaskRuntime's) state in and out of a Checkpoint, and the model
// fingerprint that keeps a checkpoint from being loaded into another model.
//
// Resume: build the same training graph, create an Executor with the seed
// stored in the checkpoint, then
//   LOOM_ASSIGN_OR_RETURN(Checkpoint c, LoadCheckpoint(path));
//   LOOM_RETURN_IF_ERROR(RestoreExecutorState(c, executor.get()));
// and feed the steps from c.position on (see docs/checkpoints.md).
#pragma once

#include <string>

#include "graph/ir.h"
#include "train/checkpoint/checkpoint.h"
#include "runtime/step_runner.h"

namespace loom {

// One line "<name>\t<dtype> <shape>" (e.g. "fc1/weight\tf32 [16, 6]") per
// Parameter and Buffer of `graph`, sorted by name: what a checkpoint must
// hold to fit the graph. Optimizer slots are Buffers, so changing the
// optimizer changes the fingerprint.
std::string ModelFingerprint(const Graph& graph);

// A host copy of every state tensor, position.executor_step and the model
// fingerprint. The caller fills in the rest of the position, the seeds, the
// config and its own values.
StatusOr<Checkpoint> CaptureExecutorState(const StepRunner& executor);

// Checks the checkpoint against the executor, then copies every tensor into
// the executor's state and sets its step counter to
// position.executor_step. The check covers the model fingerprint (when the
// checkpoint has one) and then the tensors themselves; the first difference
// in name order is reported: a tensor missing from the checkpoint, an extra
// one, or another dtype or shape. On a failed check the executor is unchanged.
Status RestoreExecutorState(const Checkpoint& checkpoint, StepRunner* executor);

}  // namespace loom
