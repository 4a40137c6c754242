// What one step of a graph needs on its device, from the graph and the
// static memory plan alone (nothing is allocated or run): the numbers
// `loom plan` uses to say how many fused replicas fit in a device's memory.
//
// The Executor allocates, on its device:
//   - one tensor per Parameter and Buffer (Executor::Create);
//   - the activation arena of PlanStepMemory, planned as the Executor plans
//     it, on the graph it runs (ExecutedGraph: on the CPU, ReLUs folded
//     into BatchNorms);
//   - the fed Inputs: the caller's tensors on a CPU device, the Executor's
//     copies of them on another;
//   - on top of these (transient_bytes), the most of:
//       on the CPU, where host tensors are device tensors: InitializeState
//       fills each state tensor through a host tensor of its size (the
//       largest counts); Run's host copies of the outputs (all of them,
//       kept from the first Run on: a later step copies into them, see
//       Executor::Run) together with a kernel's scratch;
//       on CUDA: Run copies each feed to the device before the previous
//       step's copy goes (the largest Input counts), or a kernel's scratch;
//     a kernel's scratch being the tensor a kernel allocates while it runs
//     (LstmBackward: its [T, N, 4H] pre-activation gradient;
//     AttentionBackward: its [B, H, Tq, Tk] score gradient; on CUDA,
//     BatchNormBackward with the ReLU mask: its masked dy).
// So total() is the allocator's peak over Executor::Create, InitializeState
// and Runs whose feeds are alive throughout; runtime/step_memory_test.cc
// checks it against the CPU allocator's measured peak, byte for byte.
// state_bytes + arena_bytes == Executor::PeakStepBytes().
//
// Not counted: CUDA library workspaces (cuBLAS's) and the CUDA context; the
// caller's own host tensors on a CUDA device (feeds, checkpoint copies); a
// second executor (loom train also keeps an evaluation graph's executor with
// its own copy of the parameters and an arena at the evaluation batch).
#pragma once

#include <cstddef>

#include "core/device.h"
#include "core/status.h"
#include "graph/ir.h"

namespace loom {

struct StepMemory {
  size_t state_bytes = 0;      // every Parameter and Buffer (weights, optimizer slots, BatchNorm statistics)
  size_t arena_bytes = 0;      // the activation arena of the memory plan (MemoryPlan::arena_bytes)
  size_t input_bytes = 0;      // the fed Inputs
  size_t transient_bytes = 0;  // the most allocated on top of the others at one time (see above)

  // The step's peak on the device.
  size_t total() const { return state_bytes + arena_bytes + input_bytes + transient_bytes; }
};

// Errors name the node whose output has no static size.
StatusOr<StepMemory> EstimateStepMemory(const Graph& graph, Device device = Device::Cpu());

}  // namespace loom
