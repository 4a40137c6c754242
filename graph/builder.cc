#include "graph/builder.h"

namespace loom {

StatusOr<std::vector<TensorType>> InferNodeTypes(const Graph& graph, const std::string& op, const AttrMap& attrs,
                                                 const std::vector<ValueId>& inputs, const std::string& node_name,
                                                 AttrMap* canonical_out) {
  std::string where = "node '" + node_name + "' (" + op + ")";
  auto def = OpRegistry::Global().GetOp(op);
  if (!def.ok()) return def.status().WithContext(where);
  std::vector<TensorType> in_types;
  for (ValueId v : inputs) {
    if (!graph.has_value(v)) return InvalidArgument(where, ": input value ", v, " does not exist");
    in_types.push_back(graph.type(v));
  }
  // Inferred from the canonical form, so that a node a pass or test added
  // without its defaults still infers.
  const AttrSchema* schema = (*def)->attr_schema();
  AttrMap canonical = attrs;
  if (schema) {
    Status s = schema->Canonicalize(&canonical);
    if (!s.ok()) return s.WithContext(where);
  }
  AttrTypeErrors attr_errors;
  AttrMissingReads missing_reads;
  auto out = (*def)->InferTypes(canonical, in_types);
  if (out.ok() && !attr_errors.first().empty()) out = InvalidArgument(attr_errors.first());
  // Every declared attribute with a default is present, so a read of an
  // absent one without a default is of an undeclared (or optional,
  // unchecked) attribute: a bug in the op, reported where it can be fixed.
  if (out.ok() && schema && !missing_reads.first().empty())
    return Internal(where, ": type inference read attribute '", missing_reads.first(),
                    "', which is absent and has no default (declared: ", schema->ToString(), ")");
  if (!out.ok()) {
    std::string shapes;
    for (size_t i = 0; i < in_types.size(); ++i) shapes += (i ? ", " : "") + in_types[i].ToString();
    return out.status().WithContext(where + " with inputs (" + shapes + ")");
  }
  if (canonical_out) *canonical_out = std::move(canonical);
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
  // The node holds every declared attribute that has a default.
  AttrMap canonical;
  LOOM_ASSIGN_OR_RETURN(std::vector<TensorType> types,
                        InferNodeTypes(*graph_, op, attrs, inputs, node_name, &canonical));
  NodeId id = graph_->AddNode(node_name, op, std::move(canonical), inputs, types);
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
  LOOM_CHECK_OK(CanonicalizeAttrs(*OpRegistry::Global().GetOp(op).value(), &attrs).WithContext(
      "node '" + node_name + "' (" + op + ")"));
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
