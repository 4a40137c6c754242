// Turns a model's forward graph into the graphs that training runs:
//  - the training step: forward + backward (autodiff) + optional gradient
//    clipping + optimizer update nodes, with every parameter and optimizer
//    state replaced through the graph's state updates, so one Executor::Run
//    is one step;
//  - the evaluation graph: forward only, BatchNorm and Dropout in eval mode.
// Optimizers and clipping follow torch.optim and
// torch.nn.utils.clip_grad_norm_ (docs/optimizers.md).
#pragma once

#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "core/proto/optimizer.pb.h"
#include "graph/ir.h"

namespace loom {

// A training step's optimizer: the optimizer block as configured (one
// schema with train configs, core/proto/optimizer.proto; unset fields take
// torch.optim's defaults, OptimizerWithDefaults) and what the caller adds.
struct StepOptimizer {
  proto::OptimizerConfig config;
  // Adds the "grad_norm" output even when not clipping (clipping always adds
  // it), at the cost of one read of every gradient.
  bool output_grad_norm = false;
  // Empty: train every Parameter. Otherwise only those named "<scope>/...";
  // the others are read as constants (a GAN step trains one of its two
  // networks). Fused steps take it from the first replica's.
  std::string trainable_scope;
};

// `config` with every unset field at torch.optim's default for its type
// (sgd when unset): lr 1.0 for adadelta, 0.01 for rmsprop, 0.001 otherwise;
// betas (0.9, 0.999); eps 1e-6 for adadelta, 1e-8 otherwise; weight_decay
// 0.01 for adamw, 0 otherwise; rho 0.9; alpha 0.99; everything else 0 or
// false. An error for an unknown type.
StatusOr<proto::OptimizerConfig> OptimizerWithDefaults(const proto::OptimizerConfig& config);

// Dynamic loss scaling for f16 training, with torch.cuda.amp.GradScaler's
// defaults (docs/mixed_precision.md). Each replica of a fused step has its
// own scale: one that overflows skips its own update and backs off alone.
struct LossScaling {
  double init_scale = 65536;     // finite, > 0
  double growth_factor = 2;      // > 1
  double backoff_factor = 0.5;   // in (0, 1)
  int64_t growth_interval = 2000;  // in [1, 2^24]
};
// The first setting of `s` out of its range as (field, message), e.g.
// ("backoff_factor", "must be in (0, 1), got 1.5"); nullopt when all are
// valid. The one check of train configs and of the training step.
std::optional<std::pair<std::string, std::string>> LossScalingProblem(const LossScaling& s);

// Names of the scalar inputs that a training step is fed, and of the
// gradient-norm output.
inline constexpr const char* kLearningRateInput = "lr";
inline constexpr const char* kStepInput = "step";  // 1-based update count
inline constexpr const char* kGradNormOutput = "grad_norm";
// Fused training only: which replicas the step may update (fed, [R]) and
// which it did update (output, [R]); both 1 or 0 per replica.
inline constexpr const char* kReplicaMaskInput = "replica_mask";
inline constexpr const char* kActiveOutput = "active";
// Loss-scaled steps only: the scale the next step uses and whether this
// step's gradients were finite (1 or 0; per replica when fused), and the
// scaler's state Buffers.
inline constexpr const char* kLossScaleOutput = "loss_scale";
inline constexpr const char* kGradsFiniteOutput = "grads_finite";
inline constexpr const char* kLossScaleState = "loss_scale/scale";
inline constexpr const char* kLossScaleGoodSteps = "loss_scale/good_steps";

// `loss_output` names a scalar in forward.outputs(). The result has the same
// outputs (plus "grad_norm", the global L2 norm of the unclipped gradients,
// when clipping or asked for), the scalar inputs "lr" and "step", one
// zero-initialised optimizer state Buffer per parameter and slot named
// "<param>/<slot>" with torch's state names:
//   sgd (momentum != 0):  momentum_buffer
//   adam, adamw:          exp_avg, exp_avg_sq (+ max_exp_avg_sq with amsgrad)
//   adadelta:             square_avg, acc_delta
//   rmsprop:              square_avg (+ momentum_buffer if momentum > 0,
//                         + grad_avg if centered)
// and the state updates of parameters and slots.
//
// With `loss_scaling`: autodiff differentiates loss * scale (the Buffer
// "loss_scale/scale", initialised to init_scale), every gradient is divided
// by the scale before clipping and the norm, and a step whose unscaled
// gradients are not all finite leaves the parameters and optimizer state as
// they were (the update ops' `active` input); LossScaleUpdate then backs the
// scale off or grows it. Outputs "loss_scale" and "grads_finite" are added
// and "grad_norm" is computed either way.
StatusOr<Graph> BuildTrainingGraph(const Graph& forward, const std::string& loss_output, const StepOptimizer& opt,
                                   const std::optional<LossScaling>& loss_scaling = std::nullopt);

// The training step of R fused replicas (graph/fusion.h), replica r trained
// with per_replica[r] (R = per_replica.size()). As above, except:
//  - the fused `loss_output` is [R]; the gradients are those of its sum, so
//    each replica gets exactly its own gradient;
//  - input "lr" is [R]; every optimizer hyper-parameter and the clipping
//    norm may differ per replica; type and boolean flags must not;
//  - "grad_norm" (when clipping or asked for) is [R], each replica's norm;
//  - input "replica_mask" [R] says which replicas may update; output
//    "active" [R] says which did. With isolate_divergence, a replica whose
//    loss or gradient norm is NaN or inf does not update (its parameters and
//    optimizer state stay as they were) and the others are untouched;
//  - with loss scaling, the scaler is [R]: replica r's gradients carry its
//    own scale, and a replica whose gradients overflowed is inactive this
//    step (grads_finite[r] = 0) while the others update. With
//    isolate_divergence, only a non-finite loss counts as divergence then.
StatusOr<Graph> BuildFusedTrainingGraph(const Graph& fused, const std::string& loss_output,
                                        const std::vector<StepOptimizer>& per_replica, bool isolate_divergence,
                                        const std::optional<LossScaling>& loss_scaling = std::nullopt);

// Forward only, every "training" attribute set to false, no state updates.
StatusOr<Graph> BuildEvalGraph(const Graph& forward);

}  // namespace loom
