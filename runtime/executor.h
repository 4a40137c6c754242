// Runs a graph on one device: binds inputs, parameters and buffers, executes
// the nodes in order with outputs placed by the static memory plan, returns
// the graph's named outputs and applies its state updates (so one Run of a
// training graph is one forward + backward + update step).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/ir.h"
#include "ops/op.h"
#include "runtime/memory_plan.h"
#include "runtime/step_runner.h"

namespace loom {

struct ExecutorOptions {
  Device device = Device::Cpu();
  ThreadPool* pool = nullptr;  // CPU kernels; default: ThreadPool::Default()
  uint64_t seed = 0;           // random ops draw from streams keyed by (seed, node name, step)
  bool profile = false;        // time every kernel (see Executor::profile())
  // Runs of like nodes (a model's optimizer updates) as one call of their
  // op's group kernel where the device has one: one launch on a GPU, one
  // hand-off to the pool on the CPU. Off while profiling, which times each
  // node on its own.
  bool group_kernels = true;
  // A ReLU that alone reads a BatchNorm's output runs inside the
  // BatchNorm's pass (runtime/fold_activations.h), on every device: the same
  // bits, one pass over the activations fewer (on a GPU one launch fewer).
  // The graph() of the executor is then the folded one.
  bool fold_activations = true;
};

// The graph an executor with `options` plans and runs: `graph`, with ReLUs
// folded into BatchNorms (options.fold_activations).
Graph ExecutedGraph(Graph graph, const ExecutorOptions& options);
// The executor's memory plan of the graph it runs: graph outputs and new
// state values live to the end of the step.
MemoryPlan PlanStepMemory(const Graph& executed);

// Time spent per node, summed over the steps run with profiling on.
struct NodeProfile {
  std::string node, op;
  double seconds = 0;
  int64_t calls = 0;
};

// The RNG stream key of a node: a hash of its name, so that a random op
// draws the same numbers however the graph is rebuilt or split.
uint64_t NodeStreamKey(const std::string& node_name);
// Fills a state tensor (host, the node's whole shape) from the node's
// initializer attributes, as Executor::InitializeState does.
Status InitializeStateTensor(const Node& node, Tensor* t, uint64_t seed);

class Executor : public StepRunner {
 public:
  // Checks that every op has a kernel on the device and plans memory.
  static StatusOr<std::unique_ptr<Executor>> Create(const Graph& graph, const ExecutorOptions& options = {});

  // Fills every Parameter and Buffer from its initializer attributes
  // ("init": zeros | ones | constant(value) | normal(mean, std) |
  // uniform(low, high)). Streams are keyed by node name, so a parameter's
  // initial value does not depend on how many others precede it.
  Status InitializeState(uint64_t seed) override;

  // State tensors (Parameters and Buffers), by node name.
  const std::map<std::string, Tensor>& state() const { return state_; }
  std::vector<std::string> StateNames() const override;
  StatusOr<Tensor> GetState(const std::string& name) const override;
  Status SetState(const std::string& name, const Tensor& value) override;

  // One step. `feeds` are keyed by Input node name; every Input must be fed
  // with its exact shape and dtype. Returns copies of the graph's outputs
  // on the CPU, each the caller's alone: a result's buffer is reused for
  // the same output of a later step only once the caller has let go of it.
  StatusOr<std::map<std::string, Tensor>> Run(const std::map<std::string, Tensor>& feeds) override;
  // The same step without copying the outputs out: OutputView(name) reads
  // one in the executor's memory, valid until the next step overwrites it
  // (an output that is a state tensor shows it after the step's updates).
  // For callers that use a result before the next step (loom bench kernels
  // times the kernels, not copies of their results).
  Status RunInPlace(const std::map<std::string, Tensor>& feeds);
  StatusOr<Tensor> OutputView(const std::string& name) const;

  const Graph& graph() const override { return graph_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  // The step counter keys the random streams; a resumed run sets it back.
  int64_t step() const override { return step_; }
  void SetStep(int64_t step) override { step_ = step; }
  // Bytes the step needs on the device: the arena plus the state tensors.
  size_t PeakStepBytes() const;
  // Kernel calls a step makes: nodes with a kernel, a group counted once.
  int kernel_calls_per_step() const;
  // Per node, in execution order (empty unless options.profile).
  const std::vector<NodeProfile>& profile() const { return profile_; }
  // Zeroes the profile's times and calls (after a warm-up run).
  void ResetProfile() {
    for (NodeProfile& p : profile_) p.seconds = 0, p.calls = 0;
  }

 private:
  Executor(Graph graph, ExecutorOptions options) : graph_(std::move(graph)), options_(options) {}
  Status Prepare();
  void PlanGroups();
  KernelContext ContextFor(size_t i);
  StatusOr<Tensor> ResultOf(const std::string& name, const Tensor& value);
  Status Step(const std::map<std::string, Tensor>& feeds);  // feeds the inputs and runs the kernels
  Status FinishStep();                                        // the state updates; the step counter

  Graph graph_;
  ExecutorOptions options_;
  MemoryPlan plan_;
  std::shared_ptr<Buffer> arena_;
  std::map<std::string, Tensor> state_;
  std::vector<Tensor> values_;  // by ValueId: arena views, state or feeds
  std::vector<const KernelFn*> kernels_;  // by node index
  // By node index: the nodes a group kernel runs from this one (empty: the
  // node's own kernel, if any), and whether an earlier node's group ran it.
  std::vector<std::vector<size_t>> groups_;
  std::vector<bool> in_earlier_group_;
  std::vector<const GroupKernelFn*> group_kernels_;  // by node index, for group heads
  std::vector<uint64_t> node_keys_;       // by node index: the RNG stream key
  std::map<NodeId, int> node_index_;      // node id -> index in execution order
  std::vector<NodeProfile> profile_;      // by node index, when profiling
  std::map<std::string, Tensor> results_;  // by output name: the last step's result (ResultOf)
  int64_t step_ = 0;
  bool stepped_ = false;  // a step ran: the outputs hold its values
};

}  // namespace loom
