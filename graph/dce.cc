#include "graph/dce.h"

#include <set>
#include <vector>

#include "core/logging.h"

namespace loom {

StatusOr<bool> DeadCodeElimination::Run(Graph* graph) {
  // Every value that the graph's interface names is a root: outputs, both
  // sides of state updates and of gradient entries.
  std::set<ValueId> live;
  for (const auto& [name, v] : graph->outputs()) live.insert(v);
  for (const StateUpdate& u : graph->state_updates()) {
    live.insert(u.state);
    live.insert(u.new_value);
  }
  for (const auto& [v, grad] : graph->gradients()) {
    live.insert(v);
    live.insert(grad);
  }

  // One backward sweep suffices: in execution order every consumer follows
  // its producers, so a node's liveness is known before its inputs are seen.
  std::vector<NodeId> dead;
  const std::vector<Node>& nodes = graph->nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    const Node& n = *it;
    bool needed = !options_.remove_unused_sources && IsSourceOp(n.op);
    for (ValueId v : n.outputs) needed = needed || live.count(v) != 0;
    if (!needed) {
      dead.push_back(n.id);
      continue;
    }
    live.insert(n.inputs.begin(), n.inputs.end());
  }
  if (dead.empty()) return false;
  LOOM_LOG_DEBUG("dce: removing {} of {} nodes", dead.size(), nodes.size());
  graph->RemoveNodes(dead);
  return true;
}

}  // namespace loom
