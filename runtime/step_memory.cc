#include "runtime/step_memory.h"

#include <algorithm>
#include <set>

#include "runtime/executor.h"
#include "runtime/memory_plan.h"

namespace loom {

namespace {

// Ops whose CPU kernels allocate a scratch tensor while they run, and which
// input has the scratch's type (ops/rnn_ops.cc, ops/attention_ops.cc).
struct ScratchRule {
  const char* op;
  int like_input;
};
constexpr ScratchRule kScratch[] = {
    {"LSTMBackward", 6},                       // d_pre [T, N, 4Hd], like gates
    {"ScaledDotProductAttentionBackward", 3},  // ds [B, H, Tq, Tk], like probs
};

StatusOr<size_t> BytesOf(const Graph& graph, const Node& node, ValueId v) {
  const TensorType& t = graph.type(v);
  for (int64_t d : t.shape.dims())
    if (d < 0)
      return InvalidArgument("node '", node.name, "' (", node.op, "): output ", t.ToString(),
                             " has no static size");
  return static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype);
}

}  // namespace

StatusOr<StepMemory> EstimateStepMemory(const Graph& model_step, Device device) {
  ExecutorOptions options;
  options.device = device;
  const Graph graph = ExecutedGraph(model_step, options);
  StepMemory m;
  size_t largest_state = 0, largest_input = 0, scratch = 0, outputs = 0;
  for (const Node& n : graph.nodes()) {
    for (ValueId v : n.outputs) LOOM_RETURN_IF_ERROR(BytesOf(graph, n, v).status());
    if (IsStateOp(n.op)) {
      LOOM_ASSIGN_OR_RETURN(size_t b, BytesOf(graph, n, n.outputs[0]));
      m.state_bytes += b;
      largest_state = std::max(largest_state, b);
    } else if (n.op == kInputOp) {
      LOOM_ASSIGN_OR_RETURN(size_t b, BytesOf(graph, n, n.outputs[0]));
      m.input_bytes += b;
      largest_input = std::max(largest_input, b);
    }
    for (const ScratchRule& rule : kScratch) {
      if (n.op != rule.op || static_cast<int>(n.inputs.size()) <= rule.like_input) continue;
      const TensorType& t = graph.type(n.inputs[rule.like_input]);
      scratch = std::max(scratch, static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype));
    }
  }
  for (const auto& [name, v] : graph.outputs()) {
    const TensorType& t = graph.type(v);
    outputs += static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype);
  }

  m.arena_bytes = PlanStepMemory(graph).arena_bytes;  // the Executor's plan

  // On top of state + arena + inputs, one of these at a time (step_memory.h).
  m.transient_bytes = scratch;
  if (device.is_cpu()) {
    m.transient_bytes = std::max(largest_state, outputs + scratch);
  } else {
    m.transient_bytes = std::max(m.transient_bytes, largest_input);
  }
  return m;
}

}  // namespace loom
