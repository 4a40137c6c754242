#include "tests/fusion_structure.h"

namespace loom::testing {

std::vector<NodeId> PerReplicaNodes(const Graph& fused) {
  std::vector<NodeId> nodes;
  for (const Node& n : fused.nodes())
    for (ValueId v : n.outputs)
      if (!fused.value(v).replica_layout.known()) {
        nodes.push_back(n.id);
        break;
      }
  return nodes;
}

std::string ModelNodeOf(const std::string& fused_name, const Graph& model) {
  for (std::string name = fused_name;;) {
    if (model.FindNode(name)) return name;
    const size_t slash = name.rfind('/');
    if (slash == std::string::npos) return "";
    name.resize(slash);
  }
}

std::map<std::string, int> OpsEmittedFor(const Graph& fused, const Graph& model, const std::string& node) {
  std::map<std::string, int> ops;
  for (const Node& n : fused.nodes())
    if (ModelNodeOf(n.name, model) == node) ++ops[n.op];
  return ops;
}

}  // namespace loom::testing
