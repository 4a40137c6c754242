#include "runtime/fold_activations.h"

#include <map>
#include <optional>
#include <set>
#include <vector>

#include "ops/op.h"

namespace loom {

namespace {

bool IsViewNode(const Node& n) {
  const OpDef* def = OpRegistry::Global().FindOp(n.op);
  return def && def->IsView() && !n.inputs.empty() && n.outputs.size() == 1;
}

// The activations folded, by op: the BatchNorm ops' attr activation, and
// the backward op, whose saved input (ReLU's output, ReLU6's input) gives
// the same mask read from the output: ReLU6's 0 < x < 6 holds exactly
// where 0 < clamp(x, 0, 6) < 6.
struct Foldable {
  const char* op;
  const char* backward;
  const char* activation;
};
constexpr Foldable kFoldable[] = {{"ReLU", "ReLUBackward", "relu"}, {"ReLU6", "ReLU6Backward", "relu6"}};

const Foldable* FoldableOf(const std::string& op, bool backward) {
  for (const Foldable& f : kFoldable)
    if (op == (backward ? f.backward : f.op)) return &f;
  return nullptr;
}

// The BatchNorm whose y is `v` (the activation's input), or whose y `v` is
// a view of through views that only the next one reads, where `v` has one
// reader besides the activation's backward ops (the activation) and no
// value on the way is kept; else -1.
NodeId FoldableBatchNorm(const Graph& g, ValueId v, const std::map<ValueId, std::vector<NodeId>>& readers,
                         const std::set<ValueId>& keep, const Foldable& activation) {
  for (bool first = true;; first = false) {
    if (keep.count(v)) return -1;
    auto r = readers.find(v);
    if (r == readers.end()) return -1;
    size_t others = 0;  // readers but the activation's backward (at the activation's input only)
    for (NodeId reader : r->second) {
      const Node& n = g.node(reader);
      others += !(first && n.op == activation.backward && n.inputs.size() == 2 && n.inputs[1] == v);
    }
    if (others != 1) return -1;
    const NodeId producer = g.value(v).producer;
    if (producer < 0) return -1;
    const Node& n = g.node(producer);
    if (n.op == "BatchNorm")
      return n.outputs[0] == v && n.attrs.Str("activation", "none") == "none" ? producer : -1;
    if (!IsViewNode(n)) return -1;
    v = n.inputs[0];
  }
}

// Where an activation's backward output dt goes when it folds into a
// BatchNormBackward: that node, and the views between (each value on the
// way read once and not kept); nullopt when it does not.
struct BackwardFold {
  NodeId batch_norm_backward = -1;
  std::vector<NodeId> views;  // from dt to the BatchNormBackward's dy
};
std::optional<BackwardFold> FoldableBatchNormBackward(const Graph& g, ValueId dt,
                                                      const std::map<ValueId, std::vector<NodeId>>& readers,
                                                      const std::set<ValueId>& keep) {
  BackwardFold fold;
  for (ValueId v = dt;;) {
    if (keep.count(v)) return std::nullopt;
    auto r = readers.find(v);
    if (r == readers.end() || r->second.size() != 1) return std::nullopt;
    const Node& reader = g.node(r->second[0]);
    if (reader.op == "BatchNormBackward") {
      if (reader.inputs[0] != v || reader.inputs.size() != 5 || reader.attrs.Str("activation", "none") != "none")
        return std::nullopt;
      fold.batch_norm_backward = reader.id;
      return fold;
    }
    if (!IsViewNode(reader) || reader.inputs[0] != v) return std::nullopt;
    fold.views.push_back(reader.id);
    v = reader.outputs[0];
  }
}

// `v`, or the value it is a view of through views, whose type is `type`;
// kNoValue when there is none.
ValueId ViewedAs(const Graph& g, ValueId v, const TensorType& type) {
  while (g.type(v) != type) {
    const NodeId producer = g.value(v).producer;
    if (producer < 0 || !IsViewNode(g.node(producer))) return kNoValue;
    v = g.node(producer).inputs[0];
  }
  return v;
}

// The forward half: a ReLU or ReLU6 into the BatchNorm it reads.
int FoldForward(Graph* graph, const std::set<ValueId>& keep) {
  const std::map<ValueId, std::vector<NodeId>> readers = graph->Consumers();
  std::map<ValueId, ValueId> replaced;  // a folded ReLU's output -> its input
  std::vector<NodeId> folded;
  for (const Node& act : graph->nodes()) {
    const Foldable* f = FoldableOf(act.op, false);
    if (!f || act.inputs.size() != 1 || keep.count(act.outputs[0])) continue;
    const NodeId bn = FoldableBatchNorm(*graph, act.inputs[0], readers, keep, *f);
    if (bn < 0) continue;
    graph->mutable_node(bn).attrs.Set("activation", f->activation);
    replaced[act.outputs[0]] = act.inputs[0];
    folded.push_back(act.id);
  }
  if (folded.empty()) return 0;
  for (const Node& n : graph->nodes())
    for (ValueId& v : graph->mutable_node(n.id).inputs)
      if (auto it = replaced.find(v); it != replaced.end()) v = it->second;
  graph->RemoveNodes(folded);
  return static_cast<int>(folded.size());
}

// The backward half: a ReLUBackward or ReLU6Backward (dy, s) -> dt that
// only a BatchNormBackward reads (through views) is done by it: it reads dy
// (the views now view dy) and s (or the value s views with its dy's type)
// and masks dy itself.
int FoldBackward(Graph* graph, const std::set<ValueId>& keep) {
  const std::map<ValueId, std::vector<NodeId>> readers = graph->Consumers();
  std::vector<NodeId> folded;
  for (const Node& node : graph->nodes()) {
    const Foldable* f = FoldableOf(node.op, true);
    if (!f || node.inputs.size() != 2) continue;
    const std::optional<BackwardFold> fold = FoldableBatchNormBackward(*graph, node.outputs[0], readers, keep);
    if (!fold) continue;
    Node& bnb = graph->mutable_node(fold->batch_norm_backward);
    const ValueId y = ViewedAs(*graph, node.inputs[1], graph->type(bnb.inputs[0]));
    if (y == kNoValue) continue;
    const ValueId dy = node.inputs[0];
    if (fold->views.empty()) {
      bnb.inputs[0] = dy;
    } else {
      graph->mutable_node(fold->views[0]).inputs[0] = dy;  // dt and dy have one type
    }
    bnb.inputs.push_back(y);
    bnb.attrs.Set("activation", f->activation);
    folded.push_back(node.id);
  }
  graph->RemoveNodes(folded);
  return static_cast<int>(folded.size());
}

}  // namespace

int FoldReluIntoBatchNorm(Graph* graph) {
  std::set<ValueId> keep;
  for (const auto& [name, v] : graph->outputs()) keep.insert(v);
  for (const StateUpdate& u : graph->state_updates()) keep.insert(u.new_value);
  for (const auto& [parameter, gradient] : graph->gradients()) keep.insert(gradient);
  const int forward = FoldForward(graph, keep);
  return forward + FoldBackward(graph, keep);
}

}  // namespace loom
