// Helpers shared by the zoo's model tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "graph/fusion.h"
#include "graph/ir.h"
#include "graph/training.h"
#include "runtime/executor.h"

namespace loom::models::testing {

// Elements of every Parameter (BatchNorm running statistics are Buffers).
inline int64_t ParameterCount(const Graph& g) {
  int64_t n = 0;
  for (NodeId id : g.NodesWithOp(kParameterOp)) n += g.type(g.node(id).outputs[0]).shape.numel();
  return n;
}

inline std::set<std::string> ParameterNames(const Graph& g) {
  std::set<std::string> names;
  for (NodeId id : g.NodesWithOp(kParameterOp)) names.insert(g.node(id).name);
  return names;
}

inline std::map<std::string, Shape> ParameterShapes(const Graph& g) {
  std::map<std::string, Shape> shapes;
  for (NodeId id : g.NodesWithOp(kParameterOp)) shapes[g.node(id).name] = g.type(g.node(id).outputs[0]).shape;
  return shapes;
}

// Token ids uniform in [0, vocab), a function of `key` only.
inline Tensor RandomTokens(const Shape& s, int64_t vocab, uint64_t key) {
  Rng rng = Rng::Stream(11, key);
  Tensor t = Tensor::Zeros(s, DType::kI64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = rng.UniformInt(vocab);
  return t;
}

// |a - b| <= tol * max(1, |b|): the fused-vs-separate tolerance.
inline bool Near(double a, double b, double tol = 1e-9) { return std::abs(a - b) <= tol * std::max(1.0, std::abs(b)); }

// The loss of `forward` before and after one plain-SGD step (learning rate
// `lr`, parameters under `opt.trainable_scope` when set) on `feeds`, the
// state initialised with seed 1.
struct LossChange {
  double before = 0, after = 0;
};
inline StatusOr<LossChange> LossAcrossOneStep(const Graph& forward, std::map<std::string, Tensor> feeds, double lr,
                                              const StepOptimizer& opt = {}) {
  LOOM_ASSIGN_OR_RETURN(Graph train, BuildTrainingGraph(forward, "loss", opt));
  LOOM_ASSIGN_OR_RETURN(auto e, Executor::Create(train));
  LOOM_RETURN_IF_ERROR(e->InitializeState(1));
  const DType dtype = train.type(train.node(*train.FindNode(kLearningRateInput)).outputs[0]).dtype;
  LOOM_ASSIGN_OR_RETURN(feeds[kLearningRateInput], Tensor::FromVector<double>({}, {lr}).Cast(dtype));
  LOOM_ASSIGN_OR_RETURN(feeds[kStepInput], Tensor::FromVector<double>({}, {1}).Cast(dtype));
  LOOM_ASSIGN_OR_RETURN(auto first, e->Run(feeds));
  LOOM_ASSIGN_OR_RETURN(auto second, e->Run(feeds));  // reports the loss after the first update
  return LossChange{first.at("loss").ScalarAt(0), second.at("loss").ScalarAt(0)};
}

// An output of `g` fused as seeds.size() replicas (graph/fusion.h, fed
// `fused_feeds`), and of each replica's separate model (initialised with its
// seed, as fusion initialises the replica; fed `separate_feeds`).
struct FusedAndSeparate {
  std::vector<double> fused;                  // [R, ...] flattened
  std::vector<std::vector<double>> separate;  // per replica
};
inline StatusOr<FusedAndSeparate> RunFusedAndSeparate(const Graph& g, const std::vector<uint64_t>& seeds,
                                                      const std::map<std::string, Tensor>& fused_feeds,
                                                      const std::map<std::string, Tensor>& separate_feeds,
                                                      const std::string& output) {
  FusedAndSeparate result;
  LOOM_ASSIGN_OR_RETURN(Graph fused, FuseReplicas(g, FusionOptions{static_cast<int>(seeds.size()), seeds, {}, {}}));
  LOOM_ASSIGN_OR_RETURN(auto fe, Executor::Create(fused));
  LOOM_RETURN_IF_ERROR(fe->InitializeState(0));
  LOOM_ASSIGN_OR_RETURN(auto fused_out, fe->Run(fused_feeds));
  result.fused = fused_out.at(output).ToDoubleVector();
  for (uint64_t seed : seeds) {
    LOOM_ASSIGN_OR_RETURN(auto se, Executor::Create(g, ExecutorOptions{Device::Cpu(), nullptr, seed, false}));
    LOOM_RETURN_IF_ERROR(se->InitializeState(seed));
    LOOM_ASSIGN_OR_RETURN(auto out, se->Run(separate_feeds));
    result.separate.push_back(out.at(output).ToDoubleVector());
  }
  return result;
}

// "" when replica r's slice of `fused` equals `separate[r]` (Near) for every
// replica; else the first difference ("replica 1 [17]: 0.25 vs 0.5").
inline std::string FusedMismatch(const FusedAndSeparate& run, double tol = 1e-9) {
  const size_t replicas = run.separate.size();
  if (replicas == 0 || run.fused.size() != replicas * run.separate[0].size())
    return "the fused output has " + std::to_string(run.fused.size()) + " values for " + std::to_string(replicas) +
           " replicas of " + std::to_string(replicas ? run.separate[0].size() : 0);
  const size_t n = run.separate[0].size();
  for (size_t r = 0; r < replicas; ++r)
    for (size_t i = 0; i < n; ++i)
      if (!Near(run.fused[r * n + i], run.separate[r][i], tol))
        return "replica " + std::to_string(r) + " [" + std::to_string(i) + "]: " + std::to_string(run.fused[r * n + i]) +
               " vs " + std::to_string(run.separate[r][i]);
  return "";
}

// Uniform in [-1, 1), a function of `key` only.
inline Tensor RandomInput(const Shape& s, DType dtype, uint64_t key) {
  Rng rng = Rng::Stream(7, key);
  Tensor t = Tensor::Zeros(s, DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.Uniform(-1, 1);
  return *t.Cast(dtype);
}

}  // namespace loom::models::testing
