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

// Names of the scalar inputs that a training step is fed, and of the
// gradient-norm output.
inline constexpr const char* kLearningRateInput = "lr";
inline constexpr const char* kStepInput = "step";  // 1-based update count
inline constexpr const char* kGradNormOutput = "grad_norm";
// Fused training only: which replicas the step may update (fed, [R]) and
// which it did update (output, [R]); both 1 or 0 per replica.
inline constexpr const char* kReplicaMaskInput = "replica_mask";
inline constexpr const char* kActiveOutput = "active";

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
StatusOr<Graph> BuildTrainingGraph(const Graph& forward, const std::string& loss_output, const StepOptimizer& opt);

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
//    optimizer state stay as they were) and the others are untouched.
StatusOr<Graph> BuildFusedTrainingGraph(const Graph& fused, const std::string& loss_output,
                                        const std::vector<StepOptimizer>& per_replica, bool isolate_divergence);

// Forward only, every "training" attribute set to false, no state updates.
StatusOr<Graph> BuildEvalGraph(const Graph& forward);

}  // namespace loom
