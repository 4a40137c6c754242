#include "search/evaluator.h"

#include <algorithm>

#include "core/hash.h"

namespace loom {
namespace {

constexpr size_t kRememberedCosts = size_t{1} << 18;  // about 20 MB at most

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
      lowering_(step, space.devices(), LoweringFor(machine)),
      delta_(machine, cost, WithoutPeakMemory()) {}

StatusOr<TaskGraph> StrategyEvaluator::Lower(const Choice& choice) const {
  if (choice.size() != space_.layers().size())
    return InvalidArgument("a choice of ", choice.size(), " configurations for ", space_.layers().size(), " layers");
  return BuildTaskGraph(step_, space_.Splits(choice), space_.devices(), LoweringFor(machine_));
}

StatusOr<StrategyCost> StrategyEvaluator::Evaluate(const Choice& choice, bool peak_memory) {
  if (choice.size() != space_.layers().size())
    return InvalidArgument("a choice of ", choice.size(), " configurations for ", space_.layers().size(), " layers");
  ++evaluations_;
  Hash64 key;
  key.AddAll(choice);
  if (!peak_memory) {
    if (auto known = costs_.find(key.value()); known != costs_.end()) {
      ++remembered_;
      return known->second;
    }
  }
  if (splits_choice_.size() != choice.size()) {
    splits_ = space_.Splits(choice);
  } else {
    for (size_t l = 0; l < choice.size(); ++l)
      if (choice[l] != splits_choice_[l])
        splits_[space_.layers()[l].name] = space_.layers()[l].configs[static_cast<size_t>(choice[l])];
  }
  splits_choice_ = choice;
  LOOM_ASSIGN_OR_RETURN(const TaskGraph* tasks, lowering_.Lower(splits_));
  LOOM_ASSIGN_OR_RETURN(const SimulationResult* r, delta_.Simulate(*tasks));
  StrategyCost cost{r->iteration_seconds, r->fits, tasks->TransferBytes(), 0};
  if (costs_.size() >= kRememberedCosts) costs_.clear();
  costs_.emplace(key.value(), cost);
  if (!peak_memory) return cost;
  return CostWithPeak(*tasks);
}

StatusOr<StrategyCost> StrategyEvaluator::CostWithPeak(const TaskGraph& tasks) const {
  LOOM_ASSIGN_OR_RETURN(const SimulationResult r, Simulate(tasks, machine_, cost_));
  const double peak = r.peak_memory_bytes.empty()
                          ? 0
                          : *std::max_element(r.peak_memory_bytes.begin(), r.peak_memory_bytes.end());
  return StrategyCost{r.iteration_seconds, r.fits, tasks.TransferBytes(), peak};
}

StatusOr<StrategyCost> StrategyEvaluator::Report(const Choice& choice) const {
  LOOM_ASSIGN_OR_RETURN(const TaskGraph tasks, Lower(choice));
  return CostWithPeak(tasks);
}

}  // namespace loom
