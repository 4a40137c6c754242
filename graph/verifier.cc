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
  return Status::Ok();
}

}  // namespace loom
