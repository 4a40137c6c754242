// The seconds a compute task takes on its device: what the simulator takes
// as a parameter (docs/simulator.md). The analytical model here needs no
// device; measured profiles and test fakes implement the same interface.
#pragma once

#include <optional>

#include "graph/task_graph.h"
#include "simulator/machine.h"

namespace loom {

class CostModel {
 public:
  virtual ~CostModel() = default;
  // `task` is a compute task of `graph`.
  virtual double ComputeSeconds(const TaskGraph& graph, const Task& task) const = 0;
  // A measured time for a transfer or all-reduce `task`, when the model has
  // one (a profile of this machine's own runtime); else the simulator times
  // it on the machine's links. It still occupies the links' resources.
  virtual std::optional<double> CommunicationSeconds(const TaskGraph&, const Task&) const { return std::nullopt; }
};

// The roofline of the machine's device: its launch overhead plus the larger
// of FLOPs at the peak rate of the task's element type and bytes at the
// memory bandwidth (OpDef::Cost of the part's shapes, in the task). An
// upper bound on speed: real kernels reach a fraction of the roof that
// depends on the op and the shapes (to be calibrated from measured
// profiles).
class AnalyticalCostModel final : public CostModel {
 public:
  explicit AnalyticalCostModel(const Machine& machine) : machine_(machine) {}
  double ComputeSeconds(const TaskGraph& graph, const Task& task) const override;

 private:
  const Machine& machine_;
};

}  // namespace loom
