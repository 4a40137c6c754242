#include "graph/mixed_precision.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/logging.h"
#include "graph/verifier.h"
#include "ops/op.h"

namespace loom {

const std::vector<std::string>& LowPrecisionOps() {
  static const auto* ops = new std::vector<std::string>{
      "MatMul", "BatchMatMul", "Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
  };
  return *ops;
}

namespace {

AttrMap CastTo(DType dtype) { return AttrMap{{"to", std::string(DTypeName(dtype))}}; }

// Whether the node runs in `low`: every float input is f32 (or already
// `low`), and at least one is f32.
bool IsTarget(const Graph& graph, const Node& node, DType low) {
  bool any_f32 = false;
  for (ValueId v : node.inputs) {
    const DType d = graph.type(v).dtype;
    if (!IsFloating(d)) continue;
    if (d != DType::kF32 && d != low) return false;
    any_f32 = any_f32 || d == DType::kF32;
  }
  return any_f32;
}

TensorType WithDType(TensorType t, DType dtype) {
  t.dtype = dtype;
  return t;
}

// The node's outputs as its op infers them on low-precision inputs must be
// the f32 outputs it has now, in `low`.
Status CheckRunsInLow(const Graph& graph, const Node& node, DType low) {
  LOOM_ASSIGN_OR_RETURN(const OpDef* op, OpRegistry::Global().GetOp(node.op));
  std::vector<TensorType> inputs;
  for (ValueId v : node.inputs) {
    const TensorType& t = graph.type(v);
    inputs.push_back(t.dtype == DType::kF32 ? WithDType(t, low) : t);
  }
  StatusOr<std::vector<TensorType>> outputs = InferOpTypes(*op, node.attrs, inputs);
  if (!outputs.ok())
    return InvalidArgument("mixed precision: node '", node.name, "' (", node.op, ") does not take ", DTypeName(low),
                           " inputs: ", outputs.status().message());
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    const TensorType& now = graph.type(node.outputs[j]);
    const TensorType want = now.dtype == DType::kF32 ? WithDType(now, low) : now;
    if (j >= outputs->size() || (*outputs)[j] != want)
      return InvalidArgument("mixed precision: node '", node.name, "' (", node.op, ") on ", DTypeName(low),
                             " inputs gives output ", j, " as ",
                             j < outputs->size() ? (*outputs)[j].ToString() : std::string("nothing"), ", expected ",
                             want.ToString());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<bool> MixedPrecisionPass::Run(Graph* graph) {
  if (precision_ == DType::kF32) return false;
  if (precision_ != DType::kBF16 && precision_ != DType::kF16)
    return InvalidArgument("mixed precision: precision must be f32, bf16 or f16, got ", DTypeName(precision_));
  const DType low = precision_;
  const std::set<std::string> ops(ops_.begin(), ops_.end());

  // Every target is checked before the graph changes, so a refusal leaves it as it was.
  const std::vector<Node> nodes = graph->nodes();  // a copy: AddNode invalidates references
  std::vector<NodeId> targets;
  for (const Node& node : nodes) {
    if (!ops.count(node.op) || !IsTarget(*graph, node, low)) continue;
    LOOM_RETURN_IF_ERROR(CheckRunsInLow(*graph, node, low));
    targets.push_back(node.id);
  }
  if (targets.empty()) return false;

  std::map<ValueId, ValueId> low_of;                      // f32 value -> its `low` version
  std::map<NodeId, std::vector<NodeId>> before, after;    // new nodes, placed around each target
  const std::string low_name = DTypeName(low);
  for (NodeId id : targets) {
    std::vector<ValueId> inputs = graph->node(id).inputs;
    for (ValueId& v : inputs) {
      if (graph->type(v).dtype != DType::kF32) continue;
      auto it = low_of.find(v);
      if (it == low_of.end()) {
        const Value& value = graph->value(v);
        ValueId source = kNoValue;
        if (value.producer >= 0) {
          const Node& producer = graph->node(value.producer);
          if (producer.op == "Cast" && graph->type(producer.inputs[0]).dtype == low) source = producer.inputs[0];
        }
        if (source == kNoValue) {
          const NodeId cast = graph->AddNode(graph->UniqueName(value.name + "/to_" + low_name), "Cast", CastTo(low),
                                             {v}, {WithDType(value.type, low)});
          source = graph->node(cast).outputs[0];
          graph->mutable_value(source).replica_layout = graph->value(v).replica_layout;
          before[id].push_back(cast);
        }
        it = low_of.emplace(v, source).first;
      }
      v = it->second;
    }
    graph->mutable_node(id).inputs = inputs;

    // Each f32 output v: the node now produces a new `low` value w (with v's
    // name and layout), and a Cast back produces v, so v's consumers, graph
    // outputs and state updates keep reading f32.
    const std::vector<ValueId> outputs = graph->node(id).outputs;
    for (size_t j = 0; j < outputs.size(); ++j) {
      const ValueId v = outputs[j];
      if (graph->type(v).dtype != DType::kF32) continue;
      const std::string node_name = graph->node(id).name;
      const NodeId cast =
          graph->AddNode(graph->UniqueName(node_name + "/to_f32"), "Cast", CastTo(DType::kF32), {v}, {graph->type(v)});
      const ValueId w = graph->node(cast).outputs[0];
      Value& lowered = graph->mutable_value(w);
      Value& restored = graph->mutable_value(v);
      std::swap(lowered.name, restored.name);
      lowered.type = WithDType(restored.type, low);
      lowered.producer = id;
      lowered.output_index = static_cast<int>(j);
      lowered.replica_layout = restored.replica_layout;
      restored.producer = cast;
      restored.output_index = 0;
      graph->mutable_node(id).outputs[j] = w;
      graph->mutable_node(cast).inputs = {w};
      graph->mutable_node(cast).outputs = {v};
      low_of[v] = w;
      after[id].push_back(cast);
    }
  }

  std::vector<NodeId> order;
  for (const Node& node : nodes) {
    for (NodeId c : before[node.id]) order.push_back(c);
    order.push_back(node.id);
    for (NodeId c : after[node.id]) order.push_back(c);
  }
  graph->SetNodeOrder(order);
  LOOM_LOG_DEBUG("mixed precision: {} nodes in {}", targets.size(), low_name);
  return true;
}

StatusOr<bool> ApplyMixedPrecision(Graph* graph, DType precision) {
  MixedPrecisionPass pass(precision);
  LOOM_ASSIGN_OR_RETURN(bool changed, pass.Run(graph));
  if (changed) LOOM_RETURN_IF_ERROR(VerifyGraph(*graph));
  return changed;
}

}  // namespace loom
