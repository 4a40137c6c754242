// What runs one step of a graph: an Executor on one device, or a
// TaskRuntime over several (runtime/task_runtime.h). Trainers and
// checkpoints hold this interface, so a run does not depend on where or how
// its steps are split: a checkpoint saved under one strategy resumes under
// another.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/ir.h"

namespace loom {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const Graph& graph() const = 0;
  // Fills every Parameter and Buffer from its initializer (Executor's rules).
  virtual Status InitializeState(uint64_t seed) = 0;
  // The Parameter and Buffer names, sorted.
  virtual std::vector<std::string> StateNames() const = 0;
  // A state tensor, whole (on the runner's device for an Executor).
  virtual StatusOr<Tensor> GetState(const std::string& name) const = 0;
  virtual Status SetState(const std::string& name, const Tensor& value) = 0;
  // One step: feeds by Input name; the graph's named outputs.
  virtual StatusOr<std::map<std::string, Tensor>> Run(const std::map<std::string, Tensor>& feeds) = 0;
  // The step counter keys the random streams; a resumed run sets it back.
  virtual int64_t step() const = 0;
  virtual void SetStep(int64_t step) = 0;
};

}  // namespace loom
