#include "runtime/fold_activations.h"

#include <map>
#include <set>
#include <vector>

#include "ops/op.h"

namespace loom {

namespace {

// The BatchNorm whose y is `v`, or whose y `v` is a view of through views
// that only the next one reads, where `v` has one reader (the ReLU) and no
// value on the way is kept; else -1.
NodeId FoldableBatchNorm(const Graph& g, ValueId v, const std::map<ValueId, std::vector<NodeId>>& readers,
                         const std::set<ValueId>& keep) {
  const OpRegistry& registry = OpRegistry::Global();
  while (true) {
    if (keep.count(v)) return -1;
    auto r = readers.find(v);
    if (r == readers.end() || r->second.size() != 1) return -1;
    const NodeId producer = g.value(v).producer;
    if (producer < 0) return -1;
    const Node& n = g.node(producer);
    if (n.op == "BatchNorm")
      return n.outputs[0] == v && n.attrs.Str("activation", "none") == "none" ? producer : -1;
    const OpDef* def = registry.FindOp(n.op);
    if (!def || !def->IsView() || n.inputs.empty() || n.outputs.size() != 1) return -1;
    v = n.inputs[0];
  }
}

}  // namespace

int FoldReluIntoBatchNorm(Graph* graph) {
  std::set<ValueId> keep;
  for (const auto& [name, v] : graph->outputs()) keep.insert(v);
  for (const StateUpdate& u : graph->state_updates()) keep.insert(u.new_value);
  for (const auto& [parameter, gradient] : graph->gradients()) keep.insert(gradient);
  const std::map<ValueId, std::vector<NodeId>> readers = graph->Consumers();
  std::map<ValueId, ValueId> replaced;  // a folded ReLU's output -> its input
  std::vector<NodeId> folded;
  for (const Node& relu : graph->nodes()) {
    if (relu.op != "ReLU" || relu.inputs.size() != 1 || keep.count(relu.outputs[0])) continue;
    const NodeId bn = FoldableBatchNorm(*graph, relu.inputs[0], readers, keep);
    if (bn < 0) continue;
    graph->mutable_node(bn).attrs.Set("activation", "relu");
    replaced[relu.outputs[0]] = relu.inputs[0];
    folded.push_back(relu.id);
  }
  if (folded.empty()) return 0;
  for (const Node& n : graph->nodes())
    for (ValueId& v : graph->mutable_node(n.id).inputs)
      if (auto it = replaced.find(v); it != replaced.end()) v = it->second;
  graph->RemoveNodes(folded);
  return static_cast<int>(folded.size());
}

}  // namespace loom
