// GraphBuilder appends nodes to a graph, inferring their output types with
// the op's definition, under a stack of name scopes ("block1/conv2").
// Errors name the node and the op. This is what the C++ model API, the
// gradient rules and the passes build graphs with.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"
#include "ops/op.h"

namespace loom {

class GraphBuilder {
 public:
  explicit GraphBuilder(Graph* graph) : graph_(graph) {}

  // Adds `op` named `name` (made unique inside the current scope).
  StatusOr<std::vector<ValueId>> Add(const std::string& op, const std::vector<ValueId>& inputs, const AttrMap& attrs,
                                     const std::string& name);
  StatusOr<ValueId> Add1(const std::string& op, const std::vector<ValueId>& inputs, const AttrMap& attrs,
                         const std::string& name);

  ValueId Input(const std::string& name, const TensorType& type);
  // `init` holds the initializer attributes (see ops/source_ops.cc).
  ValueId Parameter(const std::string& name, const TensorType& type, const AttrMap& init);
  ValueId Buffer(const std::string& name, const TensorType& type, const AttrMap& init);

  void PushScope(const std::string& scope) { scopes_.push_back(scope); }
  void PopScope() { scopes_.pop_back(); }
  std::string ScopedName(const std::string& name) const;
  // The current scope path with a trailing '/', or "" at the top.
  std::string ScopePrefix() const;

  Graph* graph() const { return graph_; }

 private:
  ValueId Source(const char* op, const std::string& name, const TensorType& type, AttrMap attrs);
  Graph* graph_;
  std::vector<std::string> scopes_;
};

// Infers a node's output types from the registry, with the node named in the
// error. Used by the builder and the verifier. The attributes are checked
// against the op's schema (undeclared, mistyped, missing required ones are
// errors) and inferred with their defaults filled in; `canonical`, when
// given, receives them so.
StatusOr<std::vector<TensorType>> InferNodeTypes(const Graph& graph, const std::string& op, const AttrMap& attrs,
                                                 const std::vector<ValueId>& inputs, const std::string& node_name,
                                                 AttrMap* canonical = nullptr);

}  // namespace loom
