#include "graph/training.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

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
// op's type inference reads). Fused replicas (graph/fusion.h) share the op
// and its boolean flags; each float hyper-parameter becomes a list with one
// value per replica.
struct UpdateSpec {
  std::string op;
  AttrMap attrs;
  std::vector<std::string> slots;
};

StatusOr<UpdateSpec> MakeUpdateSpec(const std::vector<proto::OptimizerConfig>& opts, bool fused) {
  const proto::OptimizerConfig& o = opts[0];
  for (size_t r = 1; r < opts.size(); ++r) {
    const proto::OptimizerConfig& p = opts[r];
    if (p.type() != o.type() || p.nesterov() != o.nesterov() || p.amsgrad() != o.amsgrad() ||
        p.centered() != o.centered())
      return InvalidArgument("replica ", r, " has optimizer ", p.type(), " (nesterov ", p.nesterov(), ", amsgrad ",
                             p.amsgrad(), ", centered ", p.centered(), ") but replica 0 has ", o.type(),
                             " (nesterov ", o.nesterov(), ", amsgrad ", o.amsgrad(), ", centered ", o.centered(),
                             "): fused replicas share one optimizer type and its flags");
  }
  auto value = [&](const std::function<double(const proto::OptimizerConfig&)>& get) -> AttrValue {
    if (!fused) return get(o);
    std::vector<double> v;
    for (const proto::OptimizerConfig& p : opts) v.push_back(get(p));
    return v;
  };
  auto any = [&](const std::function<bool(const proto::OptimizerConfig&)>& pred) {
    return std::any_of(opts.begin(), opts.end(), pred);
  };
  const AttrValue wd = value([](const proto::OptimizerConfig& p) { return p.weight_decay(); });
  const AttrValue eps = value([](const proto::OptimizerConfig& p) { return p.eps(); });
  const AttrValue momentum = value([](const proto::OptimizerConfig& p) { return p.momentum(); });
  UpdateSpec s;
  if (o.type() == "sgd") {
    s = {"SgdUpdate",
         {{"momentum", momentum},
          {"dampening", value([](const proto::OptimizerConfig& p) { return p.dampening(); })},
          {"weight_decay", wd},
          {"nesterov", o.nesterov()}},
         {}};
    if (any([](const proto::OptimizerConfig& p) { return p.momentum() != 0; })) s.slots.push_back("momentum_buffer");
  } else if (o.type() == "adam" || o.type() == "adamw") {
    s = {"AdamUpdate",
         {{"beta1", value([](const proto::OptimizerConfig& p) { return p.beta1(); })},
          {"beta2", value([](const proto::OptimizerConfig& p) { return p.beta2(); })},
          {"eps", eps},
          {"weight_decay", wd},
          {"decoupled", o.type() == "adamw"},
          {"amsgrad", o.amsgrad()}},
         {"exp_avg", "exp_avg_sq"}};
    if (o.amsgrad()) s.slots.push_back("max_exp_avg_sq");
  } else if (o.type() == "adadelta") {
    s = {"AdadeltaUpdate",
         {{"rho", value([](const proto::OptimizerConfig& p) { return p.rho(); })}, {"eps", eps}, {"weight_decay", wd}},
         {"square_avg", "acc_delta"}};
  } else {  // rmsprop (the type was validated by FindOptimizer)
    s = {"RmspropUpdate",
         {{"alpha", value([](const proto::OptimizerConfig& p) { return p.alpha(); })},
          {"eps", eps},
          {"weight_decay", wd},
          {"momentum", momentum},
          {"centered", o.centered()}},
         {"square_avg"}};
    if (any([](const proto::OptimizerConfig& p) { return p.momentum() > 0; })) s.slots.push_back("momentum_buffer");
    if (o.centered()) s.slots.push_back("grad_avg");
  }
  if (fused) s.attrs.Set("replicas", static_cast<int64_t>(opts.size()));
  return s;
}

// The training step of an unfused model (replicas = 0) or of R fused
// replicas (replicas = opts.size()): see the header.
StatusOr<Graph> BuildStep(const Graph& forward, const std::string& loss_output,
                          const std::vector<StepOptimizer>& step_opts, bool fused, bool isolate_divergence,
                          const std::optional<LossScaling>& loss_scaling) {
  auto it = forward.outputs().find(loss_output);
  if (it == forward.outputs().end()) return InvalidArgument("the model has no output named '", loss_output, "'");
  if (step_opts.empty()) return InvalidArgument("no optimizer configuration");
  const int64_t replicas = fused ? static_cast<int64_t>(step_opts.size()) : 0;
  bool clip = false, output_norm = false;
  std::vector<proto::OptimizerConfig> opts;
  for (const StepOptimizer& so : step_opts) {
    LOOM_ASSIGN_OR_RETURN(proto::OptimizerConfig o, OptimizerWithDefaults(so.config));
    if (!(o.clip_grad_norm() >= 0))
      return InvalidArgument("clip_grad_norm must be >= 0 (0 = no clipping), got ", o.clip_grad_norm());
    clip = clip || o.clip_grad_norm() > 0;
    output_norm = output_norm || so.output_grad_norm;
    opts.push_back(std::move(o));
  }
  for (const char* name : {kGradNormOutput, kActiveOutput, kLossScaleOutput, kGradsFiniteOutput})
    if (forward.outputs().count(name)) return InvalidArgument("the model already has an output named '", name, "'");
  if (loss_scaling)
    if (auto problem = LossScalingProblem(*loss_scaling))
      return InvalidArgument("loss_scale.", problem->first, " ", problem->second);
  LOOM_ASSIGN_OR_RETURN(const UpdateSpec spec, MakeUpdateSpec(opts, fused));

  Graph g = forward;
  GraphBuilder b(&g);
  const ValueId loss = it->second;
  if (fused && g.type(loss).shape != Shape({replicas}))
    return InvalidArgument("the fused loss must hold one value per replica, [", replicas, "], got ",
                           g.type(loss).shape.ToString());
  const Shape per_replica = fused ? Shape({replicas}) : Shape{};
  // In a fused step the values made here have one row per replica (the
  // optimizer's own state, the learning rates, the norms) or are shared.
  auto set_layout = [&](ValueId v, ReplicaLayout layout) {
    if (fused) g.mutable_value(v).replica_layout = layout;
  };
  // Loss scaling: what autodiff differentiates is each replica's loss times
  // its own scale.
  ValueId total = loss, scale = kNoValue, good_steps = kNoValue;
  if (loss_scaling) {
    const TensorType scaler{per_replica, g.type(loss).dtype};
    scale = b.Buffer(kLossScaleState, scaler, {{"init", "constant"}, {"value", loss_scaling->init_scale}});
    good_steps = b.Buffer(kLossScaleGoodSteps, scaler, {{"init", "zeros"}});
    set_layout(scale, ReplicaLayout::Axis(0));
    set_layout(good_steps, ReplicaLayout::Axis(0));
    LOOM_ASSIGN_OR_RETURN(total, b.Add1("Mul", {loss, scale}, {}, "loss_scale/scaled_loss"));
    set_layout(total, ReplicaLayout::Axis(0));
  }
  // The replicas' losses add up: each replica gets exactly its own gradient.
  if (fused) {
    LOOM_ASSIGN_OR_RETURN(total, b.Add1("ReduceSum", {total}, {}, "loss/replicas"));
  }
  std::vector<ValueId> trainable;
  const std::string& scope = step_opts[0].trainable_scope;
  if (!scope.empty()) {
    for (NodeId id : g.NodesWithOp(kParameterOp))
      if (g.node(id).name.rfind(scope + "/", 0) == 0) trainable.push_back(g.node(id).outputs[0]);
    if (trainable.empty()) return InvalidArgument("the model has no parameters under '", scope, "/' to train");
  }
  LOOM_ASSIGN_OR_RETURN(const auto raw_grads, BuildGradients(&g, total, trainable));
  if (raw_grads.empty()) return InvalidArgument("the model has no parameters to train");
  // Gradients in the order the backward pass makes them (the last layer's
  // first): the nodes that read them (the norm, the updates) are added in
  // that order, so a lowering issues their all-reduces in that order too,
  // the last layer's first (as DDP's buckets do), and where nothing but the
  // update reads a gradient, while the backward pass goes on
  // (graph/task_graph.cc, ReadGradientsEarly).
  std::vector<std::pair<ValueId, ValueId>> grads(raw_grads.begin(), raw_grads.end());
  std::stable_sort(grads.begin(), grads.end(), [&](const auto& a, const auto& b) {
    return g.value(a.second).producer < g.value(b.second).producer;
  });

  const DType dtype = g.type(grads.begin()->first).dtype;
  // A per-replica factor ([R], or a scalar when unfused) shaped to multiply
  // or divide `grad` ([R, ...]) row by row.
  auto factor_for = [&](ValueId factor, ValueId grad, const std::string& name) -> StatusOr<ValueId> {
    if (!fused) return factor;
    std::vector<int64_t> dims(g.type(grad).shape.rank(), 1);
    dims[0] = replicas;
    return b.Add1("Reshape", {factor}, {{"shape", dims}}, name);
  };
  if (loss_scaling) {
    for (auto& [param, grad] : grads) {
      const std::string pname = g.node(g.value(param).producer).name;
      LOOM_ASSIGN_OR_RETURN(ValueId factor, factor_for(scale, grad, pname + "/loss_scale"));
      LOOM_ASSIGN_OR_RETURN(grad, b.Add1("Div", {grad, factor}, {}, pname + "/unscaled_grad"));
    }
  }
  const ValueId lr = b.Input(kLearningRateInput, {per_replica, dtype});
  set_layout(lr, ReplicaLayout::Axis(0));
  const ValueId step = b.Input(kStepInput, {Shape{}, dtype});
  set_layout(step, ReplicaLayout::Shared());

  // Clipping as torch.nn.utils.clip_grad_norm_: one norm over all gradients
  // (of each replica), one factor for all of them.
  ValueId squared_norm = kNoValue;
  if (clip || output_norm || loss_scaling || (fused && isolate_divergence)) {
    std::vector<ValueId> all;
    for (const auto& [param, grad] : grads) all.push_back(grad);
    AttrMap attrs;
    if (fused) attrs.Set("replicas", replicas);
    LOOM_ASSIGN_OR_RETURN(squared_norm, b.Add1("SquaredNorm", all, attrs, "grad_clip/squared_norm"));
    set_layout(squared_norm, ReplicaLayout::Axis(0));
  }
  if (clip || output_norm) {
    LOOM_ASSIGN_OR_RETURN(ValueId norm, b.Add1("Sqrt", {squared_norm}, {}, "grad_clip/norm"));
    set_layout(norm, ReplicaLayout::Axis(0));
    g.outputs()[kGradNormOutput] = norm;
    if (clip) {
      // A replica without clipping clips at +inf: its factor is 1.
      std::vector<double> max_norms;
      for (const proto::OptimizerConfig& o : opts)
        max_norms.push_back(o.clip_grad_norm() > 0 ? o.clip_grad_norm() : std::numeric_limits<double>::infinity());
      AttrMap attrs;
      if (fused) {
        attrs.Set("max_norm", max_norms);
        attrs.Set("replicas", replicas);
      } else {
        attrs.Set("max_norm", max_norms[0]);
      }
      LOOM_ASSIGN_OR_RETURN(ValueId clip_scale, b.Add1("ClipScale", {norm}, attrs, "grad_clip/scale"));
      for (auto& [param, grad] : grads) {
        const std::string pname = g.node(g.value(param).producer).name;
        LOOM_ASSIGN_OR_RETURN(ValueId factor, factor_for(clip_scale, grad, pname + "/clip_factor"));
        LOOM_ASSIGN_OR_RETURN(grad, b.Add1("Mul", {grad, factor}, {}, pname + "/clipped_grad"));
      }
    }
  }

  // Which replicas update this step: those the caller keeps running
  // (replica_mask) and, when isolating divergence, whose loss and gradients
  // are finite; with loss scaling, only those whose gradients did not
  // overflow (an unfused step too). A replica left out keeps its parameters
  // and state.
  ValueId active = kNoValue, finite_grads = kNoValue;
  if (loss_scaling || (fused && isolate_divergence)) {
    LOOM_ASSIGN_OR_RETURN(finite_grads, b.Add1("IsFinite", {squared_norm}, {}, "divergence/grads"));
    set_layout(finite_grads, ReplicaLayout::Axis(0));
  }
  if (fused) {
    active = b.Input(kReplicaMaskInput, {per_replica, dtype});
    set_layout(active, ReplicaLayout::Axis(0));
    if (isolate_divergence) {
      LOOM_ASSIGN_OR_RETURN(ValueId finite_loss, b.Add1("IsFinite", {loss}, {}, "divergence/loss"));
      LOOM_ASSIGN_OR_RETURN(ValueId finite, b.Add1("Mul", {finite_grads, finite_loss}, {}, "divergence/finite"));
      LOOM_ASSIGN_OR_RETURN(active, b.Add1("Mul", {finite, active}, {}, "divergence/active"));
    } else if (loss_scaling) {
      LOOM_ASSIGN_OR_RETURN(active, b.Add1("Mul", {finite_grads, active}, {}, "divergence/active"));
    }
    set_layout(active, ReplicaLayout::Axis(0));
    g.outputs()[kActiveOutput] = active;
  } else if (loss_scaling) {
    active = finite_grads;
  }
  if (loss_scaling) {
    AttrMap attrs{{"growth_factor", loss_scaling->growth_factor},
                  {"backoff_factor", loss_scaling->backoff_factor},
                  {"growth_interval", loss_scaling->growth_interval}};
    LOOM_ASSIGN_OR_RETURN(auto outs, b.Add("LossScaleUpdate", {scale, good_steps, finite_grads}, attrs, "loss_scale/update"));
    for (ValueId out : outs) set_layout(out, ReplicaLayout::Axis(0));
    g.state_updates().push_back({scale, outs[0]});
    g.state_updates().push_back({good_steps, outs[1]});
    g.outputs()[kLossScaleOutput] = outs[0];
    g.outputs()[kGradsFiniteOutput] = finite_grads;
  }

  for (const auto& [param, grad] : grads) {
    const std::string pname = g.node(g.value(param).producer).name;
    const TensorType t = g.type(param);
    std::vector<ValueId> inputs = {param, grad}, slots;
    for (const std::string& slot : spec.slots) {
      AttrMap init{{"init", "zeros"}};
      slots.push_back(b.Buffer(pname + "/" + slot, t, init));
      set_layout(slots.back(), ReplicaLayout::Axis(0));
      inputs.push_back(slots.back());
    }
    inputs.push_back(lr);
    inputs.push_back(step);
    if (active != kNoValue) inputs.push_back(active);
    LOOM_ASSIGN_OR_RETURN(auto outs, b.Add(spec.op, inputs, spec.attrs, pname + "/update"));
    for (ValueId out : outs) set_layout(out, ReplicaLayout::Axis(0));
    g.state_updates().push_back({param, outs[0]});
    for (size_t k = 0; k < slots.size(); ++k) g.state_updates().push_back({slots[k], outs[1 + k]});
  }
  return g;
}

}  // namespace

std::optional<std::pair<std::string, std::string>> LossScalingProblem(const LossScaling& s) {
  if (!(s.init_scale > 0) || !std::isfinite(s.init_scale))
    return std::make_pair("init_scale", StrCat("must be finite and > 0, got ", s.init_scale));
  if (!(s.growth_factor > 1) || !std::isfinite(s.growth_factor))
    return std::make_pair("growth_factor", StrCat("must be finite and > 1, got ", s.growth_factor));
  if (!(s.backoff_factor > 0 && s.backoff_factor < 1))
    return std::make_pair("backoff_factor", StrCat("must be in (0, 1), got ", s.backoff_factor));
  if (s.growth_interval < 1 || s.growth_interval > (int64_t{1} << 24))
    return std::make_pair("growth_interval", StrCat("must be in [1, 16777216], got ", s.growth_interval));
  return std::nullopt;
}

StatusOr<proto::OptimizerConfig> OptimizerWithDefaults(const proto::OptimizerConfig& config) {
  proto::OptimizerConfig o = config;
  if (o.type().empty()) o.set_type("sgd");
  LOOM_ASSIGN_OR_RETURN(const OptimizerDefaults d, FindOptimizer(o.type()));
  if (!o.has_lr() || o.lr() == 0) o.set_lr(d.lr);
  if (!o.has_beta1()) o.set_beta1(0.9);
  if (!o.has_beta2()) o.set_beta2(0.999);
  if (!o.has_eps()) o.set_eps(d.eps);
  if (!o.has_weight_decay()) o.set_weight_decay(d.weight_decay);
  if (!o.has_rho()) o.set_rho(0.9);
  if (!o.has_alpha()) o.set_alpha(0.99);
  return o;
}

StatusOr<Graph> BuildTrainingGraph(const Graph& forward, const std::string& loss_output, const StepOptimizer& opt,
                                   const std::optional<LossScaling>& loss_scaling) {
  return BuildStep(forward, loss_output, {opt}, /*fused=*/false, /*isolate_divergence=*/false, loss_scaling);
}

StatusOr<Graph> BuildFusedTrainingGraph(const Graph& fused, const std::string& loss_output,
                                        const std::vector<StepOptimizer>& per_replica, bool isolate_divergence,
                                        const std::optional<LossScaling>& loss_scaling) {
  return BuildStep(fused, loss_output, per_replica, /*fused=*/true, isolate_divergence, loss_scaling);
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
