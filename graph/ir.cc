#include "graph/ir.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace loom {

bool IsSourceOp(const std::string& op) { return op == kInputOp || op == kParameterOp || op == kBufferOp; }
bool IsStateOp(const std::string& op) { return op == kParameterOp || op == kBufferOp; }

std::string ReplicaLayout::ToString() const {
  if (!known()) return "unknown";
  if (shared()) return "shared";
  if (dim < 0) return "invalid dim " + std::to_string(dim);
  return (per_replica == 1 ? std::string("R") : "R*" + std::to_string(per_replica)) + "@" + std::to_string(dim);
}

NodeId Graph::AddNode(std::string name, std::string op, AttrMap attrs, std::vector<ValueId> inputs,
                      const std::vector<TensorType>& output_types) {
  LOOM_CHECK(!names_.count(name), "duplicate node name '", name, "'");
  for (ValueId v : inputs) LOOM_CHECK(has_value(v), "node '", name, "' uses unknown value ", v);
  Node node;
  node.id = static_cast<NodeId>(node_slots_.size());
  node.name = std::move(name);
  node.op = std::move(op);
  node.attrs = std::move(attrs);
  node.inputs = std::move(inputs);
  for (size_t i = 0; i < output_types.size(); ++i) {
    Value v;
    v.id = static_cast<ValueId>(values_.size());
    v.name = output_types.size() == 1 ? node.name : node.name + ":" + std::to_string(i);
    v.type = output_types[i];
    v.producer = node.id;
    v.output_index = static_cast<int>(i);
    node.outputs.push_back(v.id);
    values_.push_back(v);
  }
  names_[node.name] = node.id;
  node_slots_.push_back(static_cast<int>(nodes_.size()));
  nodes_.push_back(std::move(node));
  return nodes_.back().id;
}

const Node& Graph::node(NodeId id) const {
  LOOM_CHECK(has_node(id), "no node ", id);
  return nodes_[node_slots_[id]];
}

Node& Graph::mutable_node(NodeId id) {
  LOOM_CHECK(has_node(id), "no node ", id);
  return nodes_[node_slots_[id]];
}

const Value& Graph::value(ValueId id) const {
  LOOM_CHECK(has_value(id), "no value ", id);
  return *values_[id];
}

Value& Graph::mutable_value(ValueId id) {
  LOOM_CHECK(has_value(id), "no value ", id);
  return *values_[id];
}

std::optional<NodeId> Graph::FindNode(const std::string& name) const {
  auto it = names_.find(name);
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

bool Graph::NameInUse(const std::string& name) const {
  if (names_.count(name)) return true;
  const std::string scope = name + "/";
  auto it = names_.lower_bound(scope);
  return it != names_.end() && it->first.compare(0, scope.size(), scope) == 0;
}

std::vector<NodeId> Graph::NodesWithOp(const std::string& op) const {
  std::vector<NodeId> ids;
  for (const Node& n : nodes_)
    if (n.op == op) ids.push_back(n.id);
  return ids;
}

void Graph::RemoveNodes(const std::vector<NodeId>& ids) {
  std::set<NodeId> dead(ids.begin(), ids.end());
  std::vector<Node> kept;
  for (Node& n : nodes_) {
    if (dead.count(n.id)) {
      for (ValueId v : n.outputs) values_[v].reset();
      names_.erase(n.name);
      node_slots_[n.id] = -1;
    } else {
      kept.push_back(std::move(n));
    }
  }
  nodes_ = std::move(kept);
  Reindex();
}

void Graph::SetNodeOrder(const std::vector<NodeId>& order) {
  LOOM_CHECK(order.size() == nodes_.size(), "SetNodeOrder: ", order.size(), " ids for ", nodes_.size(), " nodes");
  std::vector<bool> placed(node_slots_.size());  // each node moves once
  std::vector<Node> reordered;
  reordered.reserve(order.size());
  for (NodeId id : order) {
    LOOM_CHECK(has_node(id) && !placed[static_cast<size_t>(id)], "SetNodeOrder: ", id, " is no node, or repeated");
    placed[static_cast<size_t>(id)] = true;
    reordered.push_back(std::move(nodes_[static_cast<size_t>(node_slots_[id])]));
  }
  nodes_ = std::move(reordered);
  Reindex();
}

void Graph::Reindex() {
  for (size_t i = 0; i < nodes_.size(); ++i) node_slots_[nodes_[i].id] = static_cast<int>(i);
}

std::map<ValueId, std::vector<NodeId>> Graph::Consumers() const {
  std::map<ValueId, std::vector<NodeId>> consumers;
  for (const Node& n : nodes_)
    for (ValueId v : n.inputs) consumers[v].push_back(n.id);
  return consumers;
}

std::string Graph::UniqueName(const std::string& base) const {
  if (!names_.count(base)) return base;
  for (int i = 1;; ++i) {
    std::string name = base + "_" + std::to_string(i);
    if (!names_.count(name)) return name;
  }
}

std::string Graph::ToString() const {
  std::ostringstream os;
  for (const Node& n : nodes_) {
    os << n.name << " = " << n.op << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << value(n.inputs[i]).name;
    os << ")";
    if (!n.attrs.values().empty()) os << " " << n.attrs.ToString();
    os << " -> ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value& v = value(n.outputs[i]);
      os << (i ? ", " : "") << v.type.ToString();
      if (v.replica_layout.known()) os << " " << v.replica_layout.ToString();
    }
    os << "\n";
  }
  if (fused()) os << "replicas " << replicas_ << "\n";
  for (const auto& [name, v] : outputs_) os << "output " << name << " = " << value(v).name << "\n";
  for (const StateUpdate& u : state_updates_) os << "update " << value(u.state).name << " <- " << value(u.new_value).name << "\n";
  for (const auto& [v, g] : gradients_) os << "gradient " << value(v).name << " = " << value(g).name << "\n";
  return os.str();
}

}  // namespace loom
