#include "search/evaluator.h"

#include <algorithm>

namespace loom {
namespace {

SimulateOptions WithoutPeakMemory() {
  SimulateOptions o;
  o.peak_memory = false;
  return o;
}

}  // namespace

StrategyEvaluator::StrategyEvaluator(const Graph& step, const SearchSpace& space, const Machine& machine,
                                     const CostModel& cost)
    : step_(step),
      space_(space),
      machine_(machine),
      cost_(cost),
      lowering_(step, space.devices()),
      delta_(machine, cost, WithoutPeakMemory()) {}

StatusOr<TaskGraph> StrategyEvaluator::Lower(const Choice& choice) const {
  if (choice.size() != space_.layers().size())
    return InvalidArgument("a choice of ", choice.size(), " configurations for ", space_.layers().size(), " layers");
  return BuildTaskGraph(step_, space_.Splits(choice), space_.devices());
}

StatusOr<StrategyCost> StrategyEvaluator::Evaluate(const Choice& choice) {
  if (choice.size() != space_.layers().size())
    return InvalidArgument("a choice of ", choice.size(), " configurations for ", space_.layers().size(), " layers");
  LOOM_ASSIGN_OR_RETURN(const TaskGraph* tasks, lowering_.Lower(space_.Splits(choice)));
  LOOM_ASSIGN_OR_RETURN(const SimulationResult r, delta_.Simulate(*tasks));
  ++evaluations_;
  return StrategyCost{r.iteration_seconds, r.fits, tasks->TransferBytes(), 0};
}

StatusOr<StrategyCost> StrategyEvaluator::Report(const Choice& choice) const {
  LOOM_ASSIGN_OR_RETURN(const TaskGraph tasks, Lower(choice));
  LOOM_ASSIGN_OR_RETURN(const SimulationResult r, Simulate(tasks, machine_, cost_));
  const double peak = r.peak_memory_bytes.empty()
                          ? 0
                          : *std::max_element(r.peak_memory_bytes.begin(), r.peak_memory_bytes.end());
  return StrategyCost{r.iteration_seconds, r.fits, tasks.TransferBytes(), peak};
}

}  // namespace loom
