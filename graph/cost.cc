#include "graph/cost.h"

namespace loom {

OpCost NodeCost(const Graph& graph, const Node& node) {
  const OpDef* def = OpRegistry::Global().FindOp(node.op);
  LOOM_CHECK(def != nullptr, "unknown op ", node.op);
  std::vector<TensorType> ins, outs;
  for (ValueId v : node.inputs) ins.push_back(graph.type(v));
  for (ValueId v : node.outputs) outs.push_back(graph.type(v));
  return def->Cost(node.attrs, ins, outs);
}

OpCost GraphCost(const Graph& graph) {
  OpCost total;
  for (const Node& n : graph.nodes()) {
    OpCost c = NodeCost(graph, n);
    total.flops += c.flops;
    total.bytes_read += c.bytes_read;
    total.bytes_written += c.bytes_written;
  }
  return total;
}

}  // namespace loom
