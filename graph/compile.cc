#include "graph/compile.h"

#include <utility>

#include "graph/mixed_precision.h"
#include "graph/pass.h"

namespace loom {
namespace {

// Both passes replace the graph: fusion and the training step build a new
// graph from the old one rather than editing it in place.
class FuseReplicasPass : public Pass {
 public:
  explicit FuseReplicasPass(FusionOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "fuse-replicas"; }
  StatusOr<bool> Run(Graph* graph) override {
    LOOM_ASSIGN_OR_RETURN(Graph fused, FuseReplicas(*graph, options_));
    *graph = std::move(fused);
    return true;
  }

 private:
  FusionOptions options_;
};

class TrainingStepPass : public Pass {
 public:
  TrainingStepPass(const CompileOptions& options, bool fused) : options_(options), fused_(fused) {}
  std::string name() const override { return "training-step"; }
  StatusOr<bool> Run(Graph* graph) override {
    // bf16 keeps f32's exponent range; f16 gradients need scaling.
    std::optional<LossScaling> loss_scaling;
    if (options_.precision == DType::kF16) loss_scaling = options_.loss_scaling;
    StatusOr<Graph> step = fused_ ? BuildFusedTrainingGraph(*graph, options_.loss_output, options_.optimizers,
                                                            options_.isolate_divergence, loss_scaling)
                                  : BuildTrainingGraph(*graph, options_.loss_output, options_.optimizers.at(0),
                                                       loss_scaling);
    if (!step.ok()) return step.status();
    *graph = std::move(*step);
    return true;
  }

 private:
  const CompileOptions& options_;
  const bool fused_;
};

}  // namespace

StatusOr<Graph> Compile(const Graph& model, Program program, const CompileOptions& options) {
  const bool fused = options.fusion.has_value();
  if (program == Program::kTrainingStep) {
    const size_t want = fused ? static_cast<size_t>(options.fusion->replicas) : 1;
    if (options.optimizers.size() != want)
      return InvalidArgument("compiling '", options.name, "': a training step of ",
                             fused ? StrCat(want, " fused replicas") : std::string("one model"), " needs ", want,
                             " optimizer config", want == 1 ? "" : "s", ", got ", options.optimizers.size());
  }
  PassPipelineOptions po;
  po.dump_dir = options.dump_dir;
  PassPipeline pipeline(options.name, po);
  // Casts are element-wise, so the fused graph carries them replica by replica.
  if (options.precision != DType::kF32) pipeline.AddPass<MixedPrecisionPass>(options.precision);
  if (fused) pipeline.AddPass<FuseReplicasPass>(*options.fusion);
  if (program == Program::kTrainingStep) pipeline.AddPass<TrainingStepPass>(options, fused);
  Graph graph = model;
  LOOM_RETURN_IF_ERROR(pipeline.Run(&graph).status());
  return graph;
}

CompileOptions StepOptions(const StepOptimizer& optimizer, std::optional<FusionOptions> fusion) {
  CompileOptions o;
  o.optimizers.assign(fusion ? static_cast<size_t>(fusion->replicas) : 1, optimizer);
  o.fusion = std::move(fusion);
  return o;
}

}  // namespace loom
