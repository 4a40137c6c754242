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
// the backward op. A mask's backward (ReLU's, ReLU6's) gives the same
// gradient from the activation's input or output: ReLU6's 0 < x < 6 holds
// exactly where 0 < clamp(x, 0, 6) < 6, so an unfolded ReLU6Backward still
// reads the right values after its forward folds. Hardswish's backward
// needs the input itself, which the fold overwrites: it folds forward only
// once no backward op reads the input (its own folded first).
struct Foldable {
  const char* op;
  const char* backward;
  const char* activation;
  bool mask;
};
constexpr Foldable kFoldable[] = {{"ReLU", "ReLUBackward", "relu", true},
                                  {"ReLU6", "ReLU6Backward", "relu6", true},
                                  {"Hardswish", "HardswishBackward", "hardswish", false}};

const Foldable* FoldableOf(const std::string& op, bool backward) {
  for (const Foldable& f : kFoldable)
    if (op == (backward ? f.backward : f.op)) return &f;
  return nullptr;
}

// The BatchNorm whose y is `v` (the activation's input), or whose y `v` is
// a view of through views that only the next one reads, where `v` has one
// reader besides a mask's backward ops (the activation) and no value on
// the way is kept; else -1.
NodeId FoldableBatchNorm(const Graph& g, ValueId v, const std::map<ValueId, std::vector<NodeId>>& readers,
                         const std::set<ValueId>& keep, const Foldable& activation) {
  for (bool first = true;; first = false) {
    if (keep.count(v)) return -1;
    auto r = readers.find(v);
    if (r == readers.end()) return -1;
    size_t others = 0;  // readers but the activation's backward (at the activation's input only)
    for (NodeId reader : r->second) {
      const Node& n = g.node(reader);
      others += !(first && activation.mask && n.op == activation.backward && n.inputs.size() == 2 && n.inputs[1] == v);
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

// The value `v` is a view of through views, or `v`.
ValueId Unviewed(const Graph& g, ValueId v) {
  for (NodeId p = g.value(v).producer; p >= 0 && IsViewNode(g.node(p)); p = g.value(v).producer)
    v = g.node(p).inputs[0];
  return v;
}

// The BatchNorm whose backward node `bnb` is (its x, gamma and saved
// statistics), or -1.
NodeId ForwardOf(const Graph& g, const Node& bnb) {
  const NodeId id = g.value(bnb.inputs[3]).producer;
  if (id < 0) return -1;
  const Node& bn = g.node(id);
  const bool same = bn.op == "BatchNorm" && bn.inputs.size() == 5 && bn.outputs.size() == 5 &&
                    bn.inputs[0] == bnb.inputs[1] && bn.inputs[1] == bnb.inputs[2] &&
                    bn.outputs[3] == bnb.inputs[3] && bn.outputs[4] == bnb.inputs[4];
  return same ? id : -1;
}

// Whether `s`, the saved value of an activation's backward, gives the
// gradient that BatchNorm `bn`'s pre-activation values z give, which
// BatchNormBackward rebuilds: s is z (bn's y, through views), or for a mask
// also z with this activation folded in or the activation of z (ReLU's y >
// 0 and ReLU6's 0 < y < 6 hold exactly where z > 0 and 0 < z < 6).
bool SavesBatchNormValues(const Graph& g, ValueId s, const Node& bn, const Foldable& activation) {
  const std::string folded = bn.attrs.Str("activation", "none");
  if (folded != "none" && (!activation.mask || folded != activation.activation)) return false;
  const ValueId v = Unviewed(g, s);
  if (v == bn.outputs[0]) return true;
  if (!activation.mask) return false;
  const NodeId producer = g.value(v).producer;
  if (producer < 0) return false;
  const Node& act = g.node(producer);
  return act.op == activation.op && act.inputs.size() == 1 && Unviewed(g, act.inputs[0]) == bn.outputs[0];
}

// The forward half: a ReLU, ReLU6 or Hardswish into the BatchNorm it reads.
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

// The backward half: an activation's backward (dy, s) -> dt that only a
// BatchNormBackward reads (through views), where s gives what the
// BatchNorm's pre-activation values give, is done by it: it reads dy (the
// views now view dy) and the BatchNorm's beta, and takes dy through the
// activation's backward itself.
int FoldBackward(Graph* graph, const std::set<ValueId>& keep) {
  const std::map<ValueId, std::vector<NodeId>> readers = graph->Consumers();
  std::vector<NodeId> folded;
  for (const Node& node : graph->nodes()) {
    const Foldable* f = FoldableOf(node.op, true);
    if (!f || node.inputs.size() != 2) continue;
    const std::optional<BackwardFold> fold = FoldableBatchNormBackward(*graph, node.outputs[0], readers, keep);
    if (!fold) continue;
    Node& bnb = graph->mutable_node(fold->batch_norm_backward);
    const NodeId bn = ForwardOf(*graph, bnb);
    if (bn < 0 || !SavesBatchNormValues(*graph, node.inputs[1], graph->node(bn), *f)) continue;
    const ValueId dy = node.inputs[0];
    if (fold->views.empty()) {
      bnb.inputs[0] = dy;
    } else {
      graph->mutable_node(fold->views[0]).inputs[0] = dy;  // dt and dy have one type
    }
    bnb.inputs.push_back(graph->node(bn).inputs[2]);  // beta
    bnb.attrs.Set("activation", f->activation);
    folded.push_back(node.id);
  }
  graph->RemoveNodes(folded);
  return static_cast<int>(folded.size());
}

}  // namespace

int FoldActivationsIntoBatchNorm(Graph* graph) {
  std::set<ValueId> keep;
  for (const auto& [name, v] : graph->outputs()) keep.insert(v);
  for (const StateUpdate& u : graph->state_updates()) keep.insert(u.new_value);
  for (const auto& [parameter, gradient] : graph->gradients()) keep.insert(gradient);
  // Backward first: a folded Hardswish overwrites the values its backward
  // would read.
  const int backward = FoldBackward(graph, keep);
  return backward + FoldForward(graph, keep);
}

}  // namespace loom
