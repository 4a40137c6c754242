#include "graph/verifier.h"

#include <map>
#include <set>
#include <string>

#include "graph/builder.h"
#include "ops/op.h"

namespace loom {
namespace {

std::string Where(const Node& n) { return "node '" + n.name + "' (" + n.op + ")"; }

std::string TypesToString(const Graph& graph, const std::vector<ValueId>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + graph.type(values[i]).ToString();
  return "(" + s + ")";
}

std::string TypesToString(const std::vector<TensorType>& types) {
  std::string s;
  for (size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + types[i].ToString();
  return "(" + s + ")";
}

// "value 7 ('fc1/w')" when it exists, "value 7" otherwise.
std::string DescribeValue(const Graph& graph, ValueId v) {
  if (!graph.has_value(v)) return "value " + std::to_string(v);
  return "value " + std::to_string(v) + " ('" + graph.value(v).name + "')";
}

Status VerifyNode(const Graph& graph, const Node& n, const std::map<ValueId, int>& position, int index) {
  if (OpRegistry::Global().FindOp(n.op) == nullptr) {
    auto def = OpRegistry::Global().GetOp(n.op);  // its message lists close names
    return def.status().WithContext(Where(n));
  }
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    ValueId v = n.inputs[i];
    if (!graph.has_value(v)) return InvalidArgument(Where(n), ": input ", i, " is value ", v, ", which does not exist");
    auto it = position.find(v);
    if (it == position.end() || it->second >= index) {
      const Value& value = graph.value(v);
      std::string producer = graph.has_node(value.producer) ? "'" + graph.node(value.producer).name + "'"
                                                           : "a missing node " + std::to_string(value.producer);
      return InvalidArgument(Where(n), ": input ", i, " '", value.name, "' is produced by ", producer,
                             it == position.end() ? ", which is not in the graph's node list"
                                                  : ", which does not run before it");
    }
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    ValueId v = n.outputs[i];
    if (!graph.has_value(v))
      return InvalidArgument(Where(n), ": output ", i, " is value ", v, ", which does not exist");
    const Value& value = graph.value(v);
    if (value.producer != n.id || value.output_index != static_cast<int>(i))
      return InvalidArgument(Where(n), ": output ", i, " '", value.name, "' records producer node ", value.producer,
                             " output ", value.output_index, ", not this node (id ", n.id, ")");
  }
  auto inferred = InferNodeTypes(graph, n.op, n.attrs, n.inputs, n.name);
  if (!inferred.ok()) return inferred.status();
  bool same = inferred->size() == n.outputs.size();
  for (size_t i = 0; same && i < n.outputs.size(); ++i) same = (*inferred)[i] == graph.type(n.outputs[i]);
  if (!same)
    return InvalidArgument(Where(n), ": stored output types ", TypesToString(graph, n.outputs),
                           " differ from the inferred ", TypesToString(*inferred), " for inputs ",
                           TypesToString(graph, n.inputs), " and attributes ", n.attrs.ToString());
  return Status::Ok();
}

// What is wrong with `layout` on a value of type `t` in a graph of
// `replicas` replicas, or "" when it fits.
std::string LayoutError(const ReplicaLayout& layout, const TensorType& t, int replicas) {
  if (!layout.known() || layout.shared()) return "";
  if (replicas == 0) return "it records replica layout " + layout.ToString() + " in a graph that is not fused";
  if (layout.dim < 0) return "its replica layout has dim " + std::to_string(layout.dim);
  if (layout.dim >= t.shape.rank())
    return StrCat("its replica dim ", layout.dim, " is outside its shape ", t.shape.ToString());
  // Divided rather than multiplied: a loaded layout may hold any int64.
  const int64_t extent = t.shape[layout.dim];
  if (layout.per_replica < 0 || extent % replicas != 0 || extent / replicas != layout.per_replica)
    return StrCat("its replica layout ", layout.ToString(), " needs dim ", layout.dim, " of extent ", replicas, " x ",
                  layout.per_replica, ", its shape is ", t.shape.ToString());
  return "";
}

// A value that holds R replicas stacked on dim 0: a fused graph's state and
// outputs.
std::string StackedError(const Value& v, int replicas) {
  const ReplicaLayout& layout = v.replica_layout;
  if (layout.known() && layout != ReplicaLayout::Axis(0))
    return StrCat("is laid out ", layout.ToString(), ", but must hold the ", replicas, " replicas on dim 0 (R@0)");
  if (v.type.shape.rank() == 0 || v.type.shape[0] != replicas)
    return StrCat("has shape ", v.type.shape.ToString(), ", but must be [", replicas, ", ...] (one per replica)");
  return "";
}

Status VerifyReplicaLayouts(const Graph& graph) {
  const int r = graph.replicas();
  if (r < 0) return InvalidArgument("the graph records ", r, " replicas");
  for (const Node& n : graph.nodes()) {
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value& v = graph.value(n.outputs[i]);
      if (std::string e = LayoutError(v.replica_layout, v.type, r); !e.empty())
        return InvalidArgument(Where(n), ": output ", i, " '", v.name, "' (", v.type.ToString(), "): ", e);
      if (r > 0 && IsStateOp(n.op))
        if (std::string e = StackedError(v, r); !e.empty())
          return InvalidArgument(Where(n), ": the ", n.op, " of a fused graph of ", r, " replicas ", e);
    }
  }
  if (r == 0) return Status::Ok();
  for (const auto& [name, v] : graph.outputs())
    if (std::string e = StackedError(graph.value(v), r); !e.empty())
      return InvalidArgument("graph output '", name, "' ('", graph.value(v).name, "') of a fused graph of ", r,
                             " replicas ", e);
  return Status::Ok();
}

}  // namespace

Status VerifyGraph(const Graph& graph) {
  // Position in execution order of each value's producer.
  std::map<ValueId, int> position;
  std::set<std::string> names;
  const std::vector<Node>& nodes = graph.nodes();
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const Node& n = nodes[i];
    if (n.name.empty()) return InvalidArgument("node ", n.id, " (", n.op, ") at position ", i, " has no name");
    if (!names.insert(n.name).second) return InvalidArgument("node name '", n.name, "' is used by more than one node");
    if (!graph.has_node(n.id) || &graph.node(n.id) != &n)
      return Internal(Where(n), ": id ", n.id, " does not index this node");
    for (ValueId v : n.outputs) position.emplace(v, i);
  }
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i)
    LOOM_RETURN_IF_ERROR(VerifyNode(graph, nodes[i], position, i));

  auto exists = [&](ValueId v) { return graph.has_value(v) && position.count(v) != 0; };
  for (const auto& [name, v] : graph.outputs())
    if (!exists(v))
      return InvalidArgument("graph output '", name, "' refers to ", DescribeValue(graph, v),
                             ", which is not produced by any node");

  std::set<ValueId> updated;
  for (size_t i = 0; i < graph.state_updates().size(); ++i) {
    const StateUpdate& u = graph.state_updates()[i];
    std::string where = "state update " + std::to_string(i);
    if (!exists(u.state))
      return InvalidArgument(where, ": state ", DescribeValue(graph, u.state), " is not produced by any node");
    const Value& state = graph.value(u.state);
    const Node& producer = graph.node(state.producer);
    where += " of '" + state.name + "'";
    if (!IsStateOp(producer.op))
      return InvalidArgument(where, ": the state must be the output of a Parameter or Buffer node, but it is ",
                             "produced by ", Where(producer));
    if (!exists(u.new_value))
      return InvalidArgument(where, ": new value ", DescribeValue(graph, u.new_value), " is not produced by any node");
    const Value& next = graph.value(u.new_value);
    if (next.type != state.type)
      return InvalidArgument(where, ": new value '", next.name, "' has type ", next.type.ToString(), ", the state has ",
                             state.type.ToString());
    if (!updated.insert(u.state).second) return InvalidArgument(where, ": the state is updated more than once");
  }

  for (const auto& [v, grad] : graph.gradients()) {
    if (!exists(v))
      return InvalidArgument("gradient entry for ", DescribeValue(graph, v), ": the value is not produced by any node");
    const Value& value = graph.value(v);
    std::string where = "gradient of '" + value.name + "'";
    if (!exists(grad)) return InvalidArgument(where, ": ", DescribeValue(graph, grad), " is not produced by any node");
    if (graph.type(grad) != value.type)
      return InvalidArgument(where, ": '", graph.value(grad).name, "' has type ", graph.type(grad).ToString(),
                             ", the value has ", value.type.ToString());
  }
  return VerifyReplicaLayouts(graph);
}

}  // namespace loom
