// What a strategy search minimises: a choice of a SearchSpace lowered with
// the training step (graph/task_graph.h) and simulated on a machine
// (simulator/simulator.h). Consecutive evaluations share what they can: the
// lowering is incremental (a proposal that changes one layer plans that
// layer's nodes and their neighbours') and so is the simulation (it
// reschedules from the first task that differs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "core/status.h"
#include "graph/ir.h"
#include "graph/task_graph.h"
#include "search/space.h"
#include "simulator/cost_model.h"
#include "simulator/machine.h"
#include "simulator/simulator.h"

namespace loom {

struct StrategyCost {
  double seconds = 0;            // the simulated training step
  bool fits = true;              // every device's peak memory within its memory
  double bytes_moved = 0;        // by transfers and all-reduces (TaskGraph::TransferBytes)
  double peak_memory_bytes = 0;  // the fullest device's peak (from Report; 0 from Evaluate)
};

class StrategyEvaluator {
 public:
  // `step` is the training step of `space`'s forward graph; all four must
  // outlive the evaluator.
  StrategyEvaluator(const Graph& step, const SearchSpace& space, const Machine& machine, const CostModel& cost);

  // The predicted step of `choice`; the peak memory only when asked for
  // (`fits` is exact without it). Without it, a choice evaluated before is
  // answered from memory: its cost is a function of the choice alone.
  StatusOr<StrategyCost> Evaluate(const Choice& choice, bool peak_memory = false);
  // The same with the peak memory, lowered from scratch (for reports).
  StatusOr<StrategyCost> Report(const Choice& choice) const;
  StatusOr<TaskGraph> Lower(const Choice& choice) const;

  int64_t evaluations() const { return evaluations_; }
  // Of those, the ones answered from memory (lowered and simulated before).
  int64_t remembered() const { return remembered_; }

 private:
  // A full simulation of `tasks` with the peak memory.
  StatusOr<StrategyCost> CostWithPeak(const TaskGraph& tasks) const;

  const Graph& step_;
  const SearchSpace& space_;
  const Machine& machine_;
  const CostModel& cost_;
  IncrementalLowering lowering_;
  // The last evaluated choice's splits by layer name: a proposal rewrites
  // the layers it changes.
  std::map<std::string, LayerSplit> splits_;
  Choice splits_choice_;
  DeltaSimulator delta_;
  // Costs by a 64-bit hash of the choice (the odds a task fingerprint
  // takes, graph/task_graph.h). A chain at a point no neighbour improves
  // proposes the same neighbours again and again, and returning to a point
  // is a proposal too.
  std::unordered_map<uint64_t, StrategyCost> costs_;
  int64_t evaluations_ = 0, remembered_ = 0;
};

}  // namespace loom
