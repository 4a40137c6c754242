#include "graph/autodiff.h"

#include <set>

#include "graph/builder.h"

namespace loom {

namespace {

// A gradient has its value's type, element for element, so in a fused graph
// it holds the replicas where the value does. A value that already has a
// layout (a gradient passed on unchanged) keeps it.
void InheritReplicaLayout(Graph* graph, ValueId grad, ValueId of) {
  ReplicaLayout& layout = graph->mutable_value(grad).replica_layout;
  if (!layout.known()) layout = graph->value(of).replica_layout;
}

class AutodiffGradBuilder final : public GradBuilder {
 public:
  AutodiffGradBuilder(GraphBuilder* builder, const Node& node, std::map<ValueId, ValueId>* grads,
                      const std::set<ValueId>* requires_grad)
      : builder_(builder), node_(node), grads_(grads), requires_grad_(requires_grad) {}

  const Node& node() const override { return node_; }
  const TensorType& type(ValueId v) const override { return builder_->graph()->type(v); }
  ValueId output_grad(int i) const override {
    auto it = grads_->find(node_.outputs.at(i));
    return it == grads_->end() ? kNoValue : it->second;
  }
  std::vector<ValueId> Emit(const std::string& op, const std::vector<ValueId>& inputs, const AttrMap& attrs) override {
    auto out = builder_->Add(op, inputs, attrs, node_.name + "/grad/" + op);
    LOOM_CHECK(out.ok(), "gradient rule of ", node_.op, " emitted a bad node: ", out.status().ToString());
    return *out;
  }
  bool NeedsInputGrad(int i) const override { return requires_grad_->count(node_.inputs.at(i)) != 0; }
  void SetInputGrad(int i, ValueId grad) override {
    ValueId input = node_.inputs.at(i);
    if (!NeedsInputGrad(i) || grad == kNoValue) return;
    LOOM_CHECK(type(grad) == type(input), "gradient rule of ", node_.op, " (node ", node_.name, ") gave input ", i,
               " a gradient of type ", type(grad).ToString(), ", expected ", type(input).ToString());
    auto it = grads_->find(input);
    if (it == grads_->end()) {
      (*grads_)[input] = grad;
    } else {
      it->second = Emit1("Add", {it->second, grad});
    }
    InheritReplicaLayout(builder_->graph(), (*grads_)[input], input);
  }

 private:
  GraphBuilder* builder_;
  const Node& node_;
  std::map<ValueId, ValueId>* grads_;
  const std::set<ValueId>* requires_grad_;
};

}  // namespace

StatusOr<std::map<ValueId, ValueId>> BuildGradients(Graph* graph, ValueId loss, std::vector<ValueId> wrt) {
  if (!graph->has_value(loss)) return InvalidArgument("loss value ", loss, " is not in the graph");
  const TensorType loss_type = graph->type(loss);
  if (loss_type.shape.numel() != 1 || !IsFloating(loss_type.dtype))
    return InvalidArgument("the loss must be a floating scalar, got ", loss_type.ToString(), " (", graph->value(loss).name,
                           ")");
  if (wrt.empty()) {
    for (NodeId id : graph->NodesWithOp(kParameterOp)) wrt.push_back(graph->node(id).outputs[0]);
  }

  // Forward sweep: which values depend on something in wrt.
  std::set<ValueId> requires_grad(wrt.begin(), wrt.end());
  for (const Node& n : graph->nodes()) {
    bool any = false;
    for (ValueId v : n.inputs) any = any || requires_grad.count(v);
    if (!any) continue;
    for (ValueId v : n.outputs)
      if (IsFloating(graph->type(v).dtype)) requires_grad.insert(v);
  }

  GraphBuilder builder(graph);
  std::map<ValueId, ValueId> grads;
  if (requires_grad.count(loss)) {
    AttrMap one{{"shape", loss_type.shape.dims()}, {"value", 1.0}, {"dtype", std::string(DTypeName(loss_type.dtype))}};
    LOOM_ASSIGN_OR_RETURN(grads[loss], builder.Add1("Fill", {}, one, graph->value(loss).name + "/grad/seed"));
    InheritReplicaLayout(graph, grads[loss], loss);
  }

  // Backward sweep over the forward nodes only (the list grows as we emit).
  std::vector<Node> forward = graph->nodes();
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    const Node& n = *it;
    bool has_output_grad = false;
    for (ValueId v : n.outputs) has_output_grad = has_output_grad || grads.count(v);
    bool needs_input_grad = false;
    for (ValueId v : n.inputs) needs_input_grad = needs_input_grad || requires_grad.count(v);
    if (!has_output_grad || !needs_input_grad) continue;
    const OpDef* def = OpRegistry::Global().FindOp(n.op);
    LOOM_CHECK(def != nullptr, "unknown op ", n.op);
    AutodiffGradBuilder g(&builder, n, &grads, &requires_grad);
    Status s = def->Gradient(g);
    if (!s.ok()) return s.WithContext("autodiff through node '" + n.name + "' (" + n.op + ")");
  }

  std::map<ValueId, ValueId> result;
  for (ValueId v : wrt) {
    auto it = grads.find(v);
    if (it != grads.end()) {
      result[v] = it->second;
    } else {
      const TensorType& t = graph->type(v);
      AttrMap zero{{"shape", t.shape.dims()}, {"value", 0.0}, {"dtype", std::string(DTypeName(t.dtype))}};
      LOOM_ASSIGN_OR_RETURN(result[v], builder.Add1("Fill", {}, zero, graph->value(v).name + "/grad/zero"));
      InheritReplicaLayout(graph, result[v], v);
    }
    graph->gradients()[v] = result[v];
  }
  return result;
}

}  // namespace loom
