#include "graph/training.h"

#include <cmath>

#include "graph/autodiff.h"
#include "graph/builder.h"

namespace loom {
namespace {

// torch.optim's defaults per optimizer type.
struct OptimizerDefaults {
  const char* type;
  double lr, eps, weight_decay;
};
constexpr OptimizerDefaults kOptimizers[] = {
    {"sgd", 1e-3, 0.0, 0.0},      {"adam", 1e-3, 1e-8, 0.0},     {"adamw", 1e-3, 1e-8, 1e-2},
    {"adadelta", 1.0, 1e-6, 0.0}, {"rmsprop", 1e-2, 1e-8, 0.0},
};

StatusOr<OptimizerDefaults> FindOptimizer(const std::string& type) {
  for (const OptimizerDefaults& d : kOptimizers)
    if (type == d.type) return d;
  return InvalidArgument("unknown optimizer '", type, "' (expected sgd, adam, adamw, adadelta or rmsprop)");
}

// The update op of a configuration, its attributes, and its state slots in
// the op's input order (which slots exist follows the same attributes the
// op's type inference reads).
struct UpdateSpec {
  std::string op;
  AttrMap attrs;
  std::vector<std::string> slots;
};

UpdateSpec MakeUpdateSpec(const OptimizerConfig& o) {
  const double wd = o.EffectiveWeightDecay();
  if (o.type == "sgd") {
    UpdateSpec s{"SgdUpdate",
                 {{"momentum", o.momentum}, {"dampening", o.dampening}, {"weight_decay", wd}, {"nesterov", o.nesterov}},
                 {}};
    if (o.momentum != 0) s.slots.push_back("momentum_buffer");
    return s;
  }
  if (o.type == "adam" || o.type == "adamw") {
    UpdateSpec s{"AdamUpdate",
                 {{"beta1", o.beta1},
                  {"beta2", o.beta2},
                  {"eps", o.EffectiveEps()},
                  {"weight_decay", wd},
                  {"decoupled", o.type == "adamw"},
                  {"amsgrad", o.amsgrad}},
                 {"exp_avg", "exp_avg_sq"}};
    if (o.amsgrad) s.slots.push_back("max_exp_avg_sq");
    return s;
  }
  if (o.type == "adadelta")
    return {"AdadeltaUpdate",
            {{"rho", o.rho}, {"eps", o.EffectiveEps()}, {"weight_decay", wd}},
            {"square_avg", "acc_delta"}};
  // rmsprop (the type was validated by FindOptimizer).
  UpdateSpec s{"RmspropUpdate",
               {{"alpha", o.alpha},
                {"eps", o.EffectiveEps()},
                {"weight_decay", wd},
                {"momentum", o.momentum},
                {"centered", o.centered}},
               {"square_avg"}};
  if (o.momentum > 0) s.slots.push_back("momentum_buffer");
  if (o.centered) s.slots.push_back("grad_avg");
  return s;
}

}  // namespace

double OptimizerConfig::EffectiveEps() const {
  if (eps) return *eps;
  auto d = FindOptimizer(type);
  return d.ok() ? d->eps : 0.0;
}

double OptimizerConfig::EffectiveWeightDecay() const {
  if (weight_decay) return *weight_decay;
  auto d = FindOptimizer(type);
  return d.ok() ? d->weight_decay : 0.0;
}

StatusOr<double> DefaultLearningRate(const std::string& optimizer_type) {
  LOOM_ASSIGN_OR_RETURN(OptimizerDefaults d, FindOptimizer(optimizer_type));
  return d.lr;
}

StatusOr<Graph> BuildTrainingGraph(const Graph& forward, const std::string& loss_output, const OptimizerConfig& opt) {
  auto it = forward.outputs().find(loss_output);
  if (it == forward.outputs().end()) return InvalidArgument("the model has no output named '", loss_output, "'");
  LOOM_RETURN_IF_ERROR(FindOptimizer(opt.type).status());
  if (!(opt.max_grad_norm >= 0))
    return InvalidArgument("max_grad_norm must be >= 0 (0 = no clipping), got ", opt.max_grad_norm);
  const bool clip = opt.max_grad_norm > 0;
  if ((clip || opt.output_grad_norm) && forward.outputs().count(kGradNormOutput))
    return InvalidArgument("the model already has an output named '", kGradNormOutput, "'");
  Graph g = forward;
  LOOM_ASSIGN_OR_RETURN(auto grads, BuildGradients(&g, it->second));
  if (grads.empty()) return InvalidArgument("the model has no parameters to train");

  GraphBuilder b(&g);
  const DType dtype = g.type(grads.begin()->first).dtype;
  const ValueId lr = b.Input(kLearningRateInput, {Shape{}, dtype});
  const ValueId step = b.Input(kStepInput, {Shape{}, dtype});

  // Clipping as torch.nn.utils.clip_grad_norm_: one norm over all gradients,
  // one factor for all of them.
  if (clip || opt.output_grad_norm) {
    std::vector<ValueId> all;
    for (const auto& [param, grad] : grads) all.push_back(grad);
    LOOM_ASSIGN_OR_RETURN(ValueId sq, b.Add1("SquaredNorm", all, {}, "grad_clip/squared_norm"));
    LOOM_ASSIGN_OR_RETURN(ValueId norm, b.Add1("Sqrt", {sq}, {}, "grad_clip/norm"));
    g.outputs()[kGradNormOutput] = norm;
    if (clip) {
      LOOM_ASSIGN_OR_RETURN(ValueId scale,
                            b.Add1("ClipScale", {norm}, {{"max_norm", opt.max_grad_norm}}, "grad_clip/scale"));
      for (auto& [param, grad] : grads) {
        const std::string pname = g.node(g.value(param).producer).name;
        LOOM_ASSIGN_OR_RETURN(grad, b.Add1("Mul", {grad, scale}, {}, pname + "/clipped_grad"));
      }
    }
  }

  const UpdateSpec spec = MakeUpdateSpec(opt);
  for (const auto& [param, grad] : grads) {
    const std::string pname = g.node(g.value(param).producer).name;
    const TensorType t = g.type(param);
    std::vector<ValueId> inputs = {param, grad}, slots;
    for (const std::string& slot : spec.slots) {
      slots.push_back(b.Buffer(pname + "/" + slot, t, AttrMap{{"init", "zeros"}}));
      inputs.push_back(slots.back());
    }
    inputs.push_back(lr);
    inputs.push_back(step);
    LOOM_ASSIGN_OR_RETURN(auto outs, b.Add(spec.op, inputs, spec.attrs, pname + "/update"));
    g.state_updates().push_back({param, outs[0]});
    for (size_t k = 0; k < slots.size(); ++k) g.state_updates().push_back({slots[k], outs[1 + k]});
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
