// Turns a model's forward graph into the graphs that training runs:
//  - the training step: forward + backward (autodiff) + optimizer update
//    nodes, with every parameter and optimizer state replaced through the
//    graph's state updates, so one Executor::Run is one step;
//  - the evaluation graph: forward only, BatchNorm and Dropout in eval mode.
#pragma once

#include <string>

#include "graph/ir.h"

namespace loom {

struct OptimizerConfig {
  std::string type = "sgd";  // sgd | adam | adamw
  double momentum = 0.0;     // sgd
  double dampening = 0.0;    // sgd
  bool nesterov = false;     // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  double weight_decay = 0.0;
};

// Names of the scalar inputs that a training step is fed.
inline constexpr const char* kLearningRateInput = "lr";
inline constexpr const char* kStepInput = "step";  // 1-based update count

// `loss_output` names a scalar in forward.outputs(). The result has the same
// outputs plus the scalar inputs "lr" and "step", one optimizer
// state Buffer per parameter and slot ("<param>/momentum", "<param>/adam_m",
// "<param>/adam_v"), and its state updates.
StatusOr<Graph> BuildTrainingGraph(const Graph& forward, const std::string& loss_output, const OptimizerConfig& opt);

// Forward only, every "training" attribute set to false, no state updates.
StatusOr<Graph> BuildEvalGraph(const Graph& forward);

}  // namespace loom
