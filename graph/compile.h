// Compile: the one way from a model's forward graph to a program that an
// executor runs. Every caller (the trainers, `loom bench`, `loom plan`, the
// embedding API) goes through it, so every program is built by the same
// PassPipeline (graph/pass.h): the verifier runs before the first pass and
// after each one, and --dump-graphs writes the graph after each pass.
//
//   mixed-precision when options.precision is bf16 or f16: the FLOP-heavy
//                   ops in that dtype, the rest in f32 (graph/mixed_precision.h)
//   fuse-replicas   when options.fusion is set: R replicas as one array (graph/fusion.h)
//   training-step   Program::kTrainingStep: autodiff, clipping, optimizer
//                   updates (graph/training.h); for f16, with dynamic
//                   loss scaling per replica
//
//   CompileOptions o;
//   o.optimizers = {sgd};
//   LOOM_ASSIGN_OR_RETURN(Graph step, Compile(model.graph(), Program::kTrainingStep, o));
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "graph/fusion.h"
#include "graph/ir.h"
#include "graph/training.h"

namespace loom {

enum class Program {
  kTrainingStep,  // one optimizer update per run
  kForward,       // the model as built (evaluation, sampling, inference)
};

struct CompileOptions {
  // Unset: the model as it is. Set: an array of fusion->replicas replicas.
  std::optional<FusionOptions> fusion;
  // kTrainingStep only: one config, or one per replica when fused.
  std::vector<StepOptimizer> optimizers;
  std::string loss_output = "loss";
  // Fused steps: a replica whose loss or gradient is not finite skips its update.
  bool isolate_divergence = true;
  // kF32 (as built), kBF16 or kF16: mixed precision with f32 master weights.
  DType precision = DType::kF32;
  // f16 training steps: the dynamic loss scaler's settings.
  LossScaling loss_scaling;
  // Names the pipeline in errors and dumps ("train", "eval", "d_step").
  std::string name = "program";
  // When set, the graph after each pass goes to "<dir>/<name>.<NN>.<pass>.txt".
  std::string dump_dir;
};

// Errors name the pipeline and the pass, and what is wrong where.
StatusOr<Graph> Compile(const Graph& model, Program program, const CompileOptions& options);

// Options of a training step with one optimizer config: of one model, or of
// `fusion`'s replicas, every one trained with `optimizer`.
CompileOptions StepOptions(const StepOptimizer& optimizer, std::optional<FusionOptions> fusion = std::nullopt);

}  // namespace loom
