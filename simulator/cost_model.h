// The seconds a compute task takes on its device: what the simulator takes
// as a parameter (docs/simulator.md). The analytical model here needs no
// device; measured profiles and test fakes implement the same interface.
#pragma once

#include "graph/task_graph.h"
#include "simulator/machine.h"

namespace loom {

class CostModel {
 public:
  virtual ~CostModel() = default;
  // `task` is a compute task of `graph`.
  virtual double ComputeSeconds(const TaskGraph& graph, const Task& task) const = 0;
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
