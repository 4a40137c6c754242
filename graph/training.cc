#include "graph/training.h"

#include "graph/autodiff.h"
#include "graph/builder.h"

namespace loom {

StatusOr<Graph> BuildTrainingGraph(const Graph& forward, const std::string& loss_output, const OptimizerConfig& opt) {
  auto it = forward.outputs().find(loss_output);
  if (it == forward.outputs().end()) return InvalidArgument("the model has no output named '", loss_output, "'");
  if (opt.type != "sgd" && opt.type != "adam" && opt.type != "adamw")
    return InvalidArgument("unknown optimizer '", opt.type, "' (expected sgd, adam or adamw)");
  Graph g = forward;
  LOOM_ASSIGN_OR_RETURN(auto grads, BuildGradients(&g, it->second));
  if (grads.empty()) return InvalidArgument("the model has no parameters to train");

  GraphBuilder b(&g);
  const DType dtype = g.type(grads.begin()->first).dtype;
  const ValueId lr = b.Input(kLearningRateInput, {Shape{}, dtype});
  const bool adam = opt.type != "sgd";
  const ValueId step = b.Input(kStepInput, {Shape{}, dtype});
  for (const auto& [param, grad] : grads) {
    const std::string& pname = g.node(g.value(param).producer).name;
    const TensorType& t = g.type(param);
    AttrMap zeros{{"init", "zeros"}};
    if (!adam) {
      ValueId buf = b.Buffer(pname + "/momentum", t, zeros);
      AttrMap a{{"momentum", opt.momentum}, {"dampening", opt.dampening}, {"weight_decay", opt.weight_decay},
                {"nesterov", opt.nesterov}};
      LOOM_ASSIGN_OR_RETURN(auto outs, b.Add("SgdUpdate", {param, grad, buf, lr, step}, a, pname + "/update"));
      g.state_updates().push_back({param, outs[0]});
      g.state_updates().push_back({buf, outs[1]});
    } else {
      ValueId m = b.Buffer(pname + "/adam_m", t, zeros);
      ValueId v = b.Buffer(pname + "/adam_v", t, zeros);
      AttrMap a{{"beta1", opt.beta1}, {"beta2", opt.beta2}, {"eps", opt.eps}, {"weight_decay", opt.weight_decay},
                {"decoupled", opt.type == "adamw"}};
      LOOM_ASSIGN_OR_RETURN(auto outs, b.Add("AdamUpdate", {param, grad, m, v, lr, step}, a, pname + "/update"));
      g.state_updates().push_back({param, outs[0]});
      g.state_updates().push_back({m, outs[1]});
      g.state_updates().push_back({v, outs[2]});
    }
  }
  return g;
}

StatusOr<Graph> BuildEvalGraph(const Graph& forward) {
  Graph g = forward;
  std::vector<NodeId> ids;
  for (const Node& n : g.nodes()) ids.push_back(n.id);
  for (NodeId id : ids) {
    Node& n = g.mutable_node(id);
    if (n.attrs.Has("training")) n.attrs.Set("training", false);
  }
  g.state_updates().clear();
  g.gradients().clear();
  return g;
}

}  // namespace loom
