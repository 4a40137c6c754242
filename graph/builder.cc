#include "graph/builder.h"

namespace loom {

StatusOr<std::vector<TensorType>> InferNodeTypes(const Graph& graph, const std::string& op, const AttrMap& attrs,
                                                 const std::vector<ValueId>& inputs, const std::string& node_name) {
  std::string where = "node '" + node_name + "' (" + op + ")";
  auto def = OpRegistry::Global().GetOp(op);
  if (!def.ok()) return def.status().WithContext(where);
  std::vector<TensorType> in_types;
  for (ValueId v : inputs) {
    if (!graph.has_value(v)) return InvalidArgument(where, ": input value ", v, " does not exist");
    in_types.push_back(graph.type(v));
  }
  AttrTypeErrors attr_errors;
  auto out = (*def)->InferTypes(attrs, in_types);
  if (out.ok() && !attr_errors.first().empty()) out = InvalidArgument(attr_errors.first());
  if (!out.ok()) {
    std::string shapes;
    for (size_t i = 0; i < in_types.size(); ++i) shapes += (i ? ", " : "") + in_types[i].ToString();
    return out.status().WithContext(where + " with inputs (" + shapes + ")");
  }
  return out;
}

std::string GraphBuilder::ScopePrefix() const {
  std::string prefix;
  for (const auto& s : scopes_) prefix += s + "/";
  return prefix;
}

std::string GraphBuilder::ScopedName(const std::string& name) const { return graph_->UniqueName(ScopePrefix() + name); }

StatusOr<std::vector<ValueId>> GraphBuilder::Add(const std::string& op, const std::vector<ValueId>& inputs,
                                                 const AttrMap& attrs, const std::string& name) {
  std::string node_name = ScopedName(name.empty() ? op : name);
  LOOM_ASSIGN_OR_RETURN(std::vector<TensorType> types, InferNodeTypes(*graph_, op, attrs, inputs, node_name));
  NodeId id = graph_->AddNode(node_name, op, attrs, inputs, types);
  return graph_->node(id).outputs;
}

StatusOr<ValueId> GraphBuilder::Add1(const std::string& op, const std::vector<ValueId>& inputs, const AttrMap& attrs,
                                     const std::string& name) {
  LOOM_ASSIGN_OR_RETURN(std::vector<ValueId> outs, Add(op, inputs, attrs, name));
  if (outs.empty()) return Internal("op ", op, " has no outputs");
  return outs[0];
}

ValueId GraphBuilder::Source(const char* op, const std::string& name, const TensorType& type, AttrMap attrs) {
  attrs.Set("shape", type.shape.dims());
  attrs.Set("dtype", std::string(DTypeName(type.dtype)));
  std::string node_name = ScopedName(name);
  NodeId id = graph_->AddNode(node_name, op, attrs, {}, {type});
  return graph_->node(id).outputs[0];
}

ValueId GraphBuilder::Input(const std::string& name, const TensorType& type) { return Source(kInputOp, name, type, {}); }

ValueId GraphBuilder::Parameter(const std::string& name, const TensorType& type, const AttrMap& init) {
  return Source(kParameterOp, name, type, init);
}

ValueId GraphBuilder::Buffer(const std::string& name, const TensorType& type, const AttrMap& init) {
  return Source(kBufferOp, name, type, init);
}

}  // namespace loom
