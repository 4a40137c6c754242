// The graph IR: nodes (an op with attributes) consume and produce values
// (typed tensors). Nodes are kept in execution order; ids of nodes and values
// are stable for the life of the graph, so passes and callers can hold them.
//
// Sources are nodes too: "Input" (fed each step), "Parameter" (trained
// state) and "Buffer" (untrained state such as BatchNorm running stats).
// State changes are functional: a step computes new values and the graph's
// state_updates say which state each one replaces after the step.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "graph/attrs.h"

namespace loom {

using ValueId = int;
using NodeId = int;
constexpr ValueId kNoValue = -1;

struct TensorType {
  Shape shape;
  DType dtype = DType::kF32;
  std::string ToString() const { return shape.ToString() + " " + DTypeName(dtype); }
  bool operator==(const TensorType& o) const { return shape == o.shape && dtype == o.dtype; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};

// Where a value of a fused graph (graph/fusion.h: R stacked replicas) holds
// its replicas, so that later passes can split along the replica axis
// without re-deriving it. Dimension `dim` has extent R * per_replica,
// replica-major: replica r owns elements [r * per_replica, (r + 1) *
// per_replica) of it. A plain replica axis ([R, C, H, W], [N, R, C]) has
// per_replica 1; replicas merged into channels, as for a grouped
// convolution's input [N, R*C, H, W], have dim 1 and per_replica C.
// Shared values (the data batch, anything computed from it alone) hold
// what every replica sees. Unknown is the default: values of unfused
// graphs, one replica's slice in a per-replica fallback, and values whose
// producer did not say (optimizer steps).
struct ReplicaLayout {
  static constexpr int kUnknownDim = -2;
  static constexpr int kSharedDim = -1;
  int dim = kUnknownDim;
  int64_t per_replica = 1;

  static ReplicaLayout Unknown() { return {}; }
  static ReplicaLayout Shared() { return {kSharedDim, 1}; }
  // Dimension `d` is the replica axis: extent R.
  static ReplicaLayout Axis(int d) { return {d, 1}; }
  // Dimension `d` is R blocks of `per_replica` elements, one per replica.
  static ReplicaLayout Merged(int d, int64_t per_replica) { return {d, per_replica}; }

  bool known() const { return dim != kUnknownDim; }
  bool shared() const { return dim == kSharedDim; }
  bool replicated() const { return dim >= 0; }
  bool operator==(const ReplicaLayout& o) const {
    return dim == o.dim && (!replicated() || per_replica == o.per_replica);
  }
  bool operator!=(const ReplicaLayout& o) const { return !(*this == o); }
  // "unknown", "shared", "R@1" (replica axis 1), "R*16@1" (merged into dim 1).
  std::string ToString() const;
};

struct Value {
  ValueId id = kNoValue;
  std::string name;  // "<node>:<output index>" unless set otherwise
  TensorType type;
  NodeId producer = -1;
  int output_index = 0;
  ReplicaLayout replica_layout;
};

struct Node {
  NodeId id = -1;
  std::string name;  // unique in the graph, e.g. "block1/conv2"
  std::string op;
  AttrMap attrs;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
};

// The op names of source nodes.
inline constexpr const char* kInputOp = "Input";
inline constexpr const char* kParameterOp = "Parameter";
inline constexpr const char* kBufferOp = "Buffer";
bool IsSourceOp(const std::string& op);
bool IsStateOp(const std::string& op);  // Parameter or Buffer

struct StateUpdate {
  ValueId state;      // output of a Parameter or Buffer node
  ValueId new_value;  // what it becomes after the step
};

class Graph {
 public:
  // Appends a node whose output types are already known (the builder infers
  // them). Returns the node id; outputs are node(id).outputs.
  NodeId AddNode(std::string name, std::string op, AttrMap attrs, std::vector<ValueId> inputs,
                 const std::vector<TensorType>& output_types);

  // Node references are invalidated by AddNode, RemoveNodes and
  // SetNodeOrder; value references stay valid until the value is removed.
  const Node& node(NodeId id) const;
  Node& mutable_node(NodeId id);
  const Value& value(ValueId id) const;
  Value& mutable_value(ValueId id);
  bool has_node(NodeId id) const { return id >= 0 && id < static_cast<int>(node_slots_.size()) && node_slots_[id] >= 0; }
  bool has_value(ValueId id) const { return id >= 0 && id < static_cast<int>(values_.size()) && values_[id].has_value(); }
  const TensorType& type(ValueId id) const { return value(id).type; }

  // Nodes in execution order.
  const std::vector<Node>& nodes() const { return nodes_; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  std::optional<NodeId> FindNode(const std::string& name) const;
  // Whether a node is named `name` or "`name`/..." (a scope in use).
  bool NameInUse(const std::string& name) const;
  std::vector<NodeId> NodesWithOp(const std::string& op) const;

  // Removes nodes (and their output values). Callers make sure no remaining
  // node or graph output uses them (the verifier checks).
  void RemoveNodes(const std::vector<NodeId>& ids);
  // Reorders nodes; `order` must be a permutation of the current node ids.
  void SetNodeOrder(const std::vector<NodeId>& order);

  // Named results (e.g. "loss", "logits") and state updates.
  std::map<std::string, ValueId>& outputs() { return outputs_; }
  const std::map<std::string, ValueId>& outputs() const { return outputs_; }
  std::vector<StateUpdate>& state_updates() { return state_updates_; }
  const std::vector<StateUpdate>& state_updates() const { return state_updates_; }
  // Parameter value -> its gradient, filled by autodiff.
  std::map<ValueId, ValueId>& gradients() { return gradients_; }
  const std::map<ValueId, ValueId>& gradients() const { return gradients_; }
  // How many replicas a fused graph stacks (graph/fusion.h); 0 for a graph
  // that is not fused. Passes that derive a graph from a fused one keep it.
  int replicas() const { return replicas_; }
  bool fused() const { return replicas_ > 0; }
  void set_replicas(int replicas) { replicas_ = replicas; }

  // Consumers of each value, computed on demand.
  std::map<ValueId, std::vector<NodeId>> Consumers() const;
  std::string UniqueName(const std::string& base) const;
  std::string ToString() const;  // one line per node, for dumps and tests

 private:
  void Reindex();
  std::vector<Node> nodes_;
  std::vector<int> node_slots_;  // node id -> index in nodes_, -1 if removed
  // A deque, so that references to values (and their types) stay valid
  // while nodes are appended: gradient rules hold types across Emit calls.
  std::deque<std::optional<Value>> values_;
  std::map<std::string, NodeId> names_;
  std::map<std::string, ValueId> outputs_;
  std::vector<StateUpdate> state_updates_;
  std::map<ValueId, ValueId> gradients_;
  int replicas_ = 0;
};

}  // namespace loom
