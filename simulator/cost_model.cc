#include "simulator/cost_model.h"

#include <algorithm>

namespace loom {

double AnalyticalCostModel::ComputeSeconds(const TaskGraph& graph, const Task& task) const {
  const Node& n = graph.graph.node(task.node);
  // The element type of the work: the first float output's (a loss over
  // f32 logits is f32 work; a count of int targets, too).
  DType dtype = DType::kF32;
  for (ValueId v : n.outputs)
    if (IsFloating(graph.graph.type(v).dtype)) {
      dtype = graph.graph.type(v).dtype;
      break;
    }
  const proto::DeviceSpec& d = machine_.device();
  return d.launch_overhead_s() + std::max(task.flops / machine_.PeakFlops(dtype), task.bytes / d.memory_bandwidth());
}

}  // namespace loom
