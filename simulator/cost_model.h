// The seconds a compute task takes on its device: what the simulator takes
// as a parameter (docs/simulator.md). The analytical model here needs no
// device; measured profiles and test fakes implement the same interface.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// What a compute task's roofline needs: its FLOPs and bytes (OpDef::Cost of
// the part's shapes) and the element type of its work, all carried by the
// task.
struct TaskWork {
  double flops = 0, bytes = 0;
  DType dtype = DType::kF32;
};
inline TaskWork WorkOf(const Task& task) { return {task.flops, task.bytes, task.dtype}; }
// The larger of the FLOPs at the device's peak for the type and the bytes at
// its memory bandwidth (no launch overhead).
double RooflineSeconds(const Machine& machine, const TaskWork& work);

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

// Measured kernel times with the work they did: what calibrates the
// roofline (CalibratedCostModel in simulator/profile.h).
struct WorkSample {
  std::string op;
  TaskWork work;
  double seconds = 0;
};

// The roofline scaled by the efficiency (the fraction of the roof reached)
// that measured kernels of the same op reached, as a function of size (the
// roofline time): interpolated in log size between the op's samples, held
// beyond them; an op without samples takes the median efficiency of all.
// It covers the tasks a profile lacks (the search proposes splits whose
// shapes were never run) and devices measured elsewhere.
class CalibratedCostModel final : public CostModel {
 public:
  CalibratedCostModel(const Machine& machine, const std::vector<WorkSample>& samples);
  double ComputeSeconds(const TaskGraph& graph, const Task& task) const override;
  // The efficiency it uses for `op` at roofline time `roof_seconds`.
  double Efficiency(const std::string& op, double roof_seconds) const;

 private:
  const Machine& machine_;
  std::map<std::string, std::vector<std::pair<double, double>>> curves_;  // op -> (log roofline s, efficiency)
  double typical_ = 1;
};

}  // namespace loom
