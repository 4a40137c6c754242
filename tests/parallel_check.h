// Runs a training step on one device and under a strategy on CPU devices
// (runtime/task_runtime.h) from the same initial state, and compares the
// two: the equivalence checks of docs/parallel.md.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/fusion.h"
#include "graph/ir.h"
#include "graph/task_graph.h"
#include "runtime/task_runtime.h"
#include "tests/small_zoo.h"

namespace loom::testing {

struct StepCase {
  Graph forward;  // what strategies name layers of (fused when the step is)
  Graph step;     // the training step: SGD with momentum 0.9, lr fed
  std::map<std::string, Tensor> feeds;
};

// The step of `model` (its output "loss"), fused when `fusion` is set, with
// `feeds` for the model's inputs; the step's own inputs (lr, step, replica
// mask) are added. A `trainable_scope` trains only the parameters under it
// (StepOptimizer::trainable_scope).
StatusOr<StepCase> MakeStepCase(const Graph& model, const std::optional<FusionOptions>& fusion,
                                std::map<std::string, Tensor> feeds, double lr = 0.1,
                                const std::string& trainable_scope = "");

struct StepResults {
  std::vector<std::map<std::string, Tensor>> outputs;  // per step
  std::map<std::string, Tensor> state;                  // after the last step
};

// `steps` steps from the state Executor::InitializeState(seed) makes.
StatusOr<StepResults> RunOneDevice(const StepCase& c, int steps, uint64_t seed);
StatusOr<TaskGraph> LowerStrategy(const StepCase& c, const std::string& strategy_text,
                                  const LoweringOptions& lowering = {});
// `options`: the task runtime's (its devices, its queues); CPU devices
// by default.
StatusOr<StepResults> RunOnDevices(const StepCase& c, const std::string& strategy_text, int steps, uint64_t seed,
                                   const LoweringOptions& lowering = {}, const TaskRuntimeOptions& options = {});
// The same with the devices shared out among `ranks` processes (0: one
// device each), played by threads of this one joined by local
// communicators: every rank's results. `options` as RunOnDevices's (its
// communicator is set per rank).
StatusOr<std::vector<StepResults>> RunAsProcesses(const StepCase& c, const std::string& strategy_text, int steps,
                                                  uint64_t seed, int ranks = 0, const LoweringOptions& lowering = {},
                                                  const TaskRuntimeOptions& options = {});

// The first output or state whose largest relative difference exceeds
// `tolerance` ("step 1 output loss: 3.1e-05"), or "" when none does.
std::string FirstMismatch(const StepResults& want, const StepResults& got, double tolerance);

// A zoo classifier in f64 on `input`-shaped examples ([1, 8, 8] images or
// [64] features), batch 8, 4 classes, fused as `replicas` when > 0
// (seeds 100, 101, ...); inputs uniform in [-1, 1], the same on every call.
StepCase ClassifierCase(const std::string& model, const std::map<std::string, std::string>& args, const Shape& input,
                        int replicas = 0);

// A zoo model at a reduced size (tests/small_zoo.h) as a step case in f64,
// fused when `fusion` is set; PointNet (its T-Nets) and ResNet-101 (its
// BatchNorm over 1x1 and 2x2 planes) with a batch of 8, where BatchNorm
// over 2 examples would amplify rounding about 1e12-fold, the others with
// kZooBatch.
StepCase ZooStepCase(const SmallModel& model, const std::optional<FusionOptions>& fusion);
// One of a zoo GAN's two steps (models::BuildGanStep) at a reduced size as
// a step case in f64, training its own network only (as train/gan_run.h
// does), fused when `fusion` is set; noise N(0, 1) and real images uniform
// in [-1, 1], the same on every call.
StepCase GanStepCase(const SmallModel& model, models::GanStep step, const std::optional<FusionOptions>& fusion);
// Calls `visit` with every zoo model but the GANs as a step case, unfused
// ("resnet18") and fused over 2 replicas seeded 7 and 8 ("resnet18.fused").
void ForEachZooStepCase(const std::function<void(const std::string& name, const StepCase& c)>& visit);
// The steps the zoo-wide checks take: 1 with BatchNorm (statistics over a
// small batch amplify summation-order differences with every step), else 3.
int ZooSteps(const StepCase& c);
// The relative tolerance of those checks against one device: 1e-9 (only
// summation orders differ), 1e-4 with BatchNorm (statistics over a small
// batch amplify those differences; a wrong split is off by 1e-2 and more).
double ZooTolerance(const StepCase& c);

// Calls `check` with every zoo model but the GANs (unfused), its results on
// one device (ZooSteps steps from seed 5), and the strategies the zoo-wide
// runtime checks run it under: dp, OWT and model over 2 devices, then one
// random strategy over 3 (RandomStrategy) that fits its shapes.
void ForEachZooRuntimeCase(std::mt19937_64& rng, const std::function<void(const StepCase& c, const StepResults& want,
                                                                          const std::vector<std::string>& strategies)>& check);

// Strategies whose devices are shared out among processes so that every
// kind of cross-rank exchange happens (transfers, all-reduces, attribute
// halos, several devices per rank, replicas): check(case, strategy, ranks)
// for each, on a CNN with dropout and a fused MLP.
void ForEachProcessSplitCase(const std::function<void(const StepCase& c, const std::string& strategy, int ranks)>& check);

// Calls `check` with the MLP, CNN and Transformer LM of the small zoo fused
// as 2 replicas (seeds 7, 8), each with its results on one device and the
// strategy that splits the replicas over 2 devices.
void ForEachReplicaSplitCase(
    const std::function<void(const StepCase& c, const StepResults& want, const std::string& strategy)>& check);

// A strategy over `devices` devices: per forward layer, degrees of 1 or 2
// for the dimensions its op declares (sample, attribute, parameter, and
// replica in a fused graph), parts on random distinct devices. It may still
// not fit a layer's shapes: LowerStrategy says.
std::string RandomStrategy(const Graph& forward, int64_t devices, std::mt19937_64& rng);

}  // namespace loom::testing
