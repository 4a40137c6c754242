// The execution simulator (docs/simulator.md): predicts a TaskGraph's step
// on a Machine with a CostModel, scheduling the tasks as the task runtime
// does, so a prediction can be checked task by task against a trace.
//
// Every task occupies queues that serve it in the task graph's order (the
// runtime's order: each device runs its queue in that order, waiting for
// the tasks it depends on):
//   - a compute task its device, for the cost model's seconds;
//   - a transfer its destination device when the machine's devices make
//     their own copies (CPU devices of the task runtime), else the links of
//     its route (copy engines beside the compute), for the link's latency
//     plus bytes over bandwidth;
//   - an all-reduce or all-gather, on devices that copy: its first member,
//     which receives every piece it does not hold, adds them (or copies
//     them into the region) and sends each member its copy (the runtime's
//     algorithm); else the link resources its algorithm crosses, for
//     CollectiveModel's seconds (simulator/collectives.h: a ring, or
//     NCCL's ring or tree).
// A task starts when the tasks it depends on have ended and its queues are
// free. Queues are first-in first-out in graph order, so one pass over the
// tasks in order schedules them exactly.
//
// Memory: a piece is held on its device from its writer's start to the end
// of its last reader (homes, the sources' pieces, all step long); the peak
// per device is against the device's memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/task_graph.h"
#include "simulator/cost_model.h"
#include "simulator/machine.h"

namespace loom {

struct SimulatedTask {
  double start = 0, end = 0;
  // Where it shows: its device, or (a message on links) devices + its first
  // link resource; -1 when it took no time anywhere (a one-member ring).
  int64_t row = -1;
};

struct SimulationResult {
  double iteration_seconds = 0;
  std::vector<SimulatedTask> tasks;            // by task id
  std::vector<double> device_busy_seconds;     // per device of the task graph
  std::vector<double> resource_bytes;          // per link resource of the machine (Machine::ResourceName)
  std::vector<double> peak_memory_bytes;       // per device of the task graph; empty unless asked for
  bool fits = true;                            // every device's peak within its memory (always set)
};

struct SimulateOptions {
  // Per-device peak memory (a sort of every piece's lifetime: the costliest
  // part of a simulation). Without it `fits` is still exact: a device is
  // swept only when all its pieces at once would not fit.
  bool peak_memory = true;
};

// How to lower a step for `machine` (graph/task_graph.h): devices with
// copy engines run collective libraries (NCCL), so a region that 3 or more
// of them read whole is all-gathered; devices that make their own copies
// (the CPU task runtime) move it by transfers, each reader its own.
LoweringOptions LoweringFor(const Machine& machine);

// The task graph's devices are the machine's first ones.
StatusOr<SimulationResult> Simulate(const TaskGraph& graph, const Machine& machine, const CostModel& cost,
                                    const SimulateOptions& options = {});

// Delta simulation: keeps the last task graph's schedule and, given the
// next one (a strategy with some layers changed), reuses it up to the first
// task that differs and schedules from there; of those tasks, the ones the
// last graph had too (equal TaskGraph::cost_keys, wherever they now stand)
// keep their costs, and only the others go to the cost model. The result is
// Simulate's, to the bit.
class DeltaSimulator {
 public:
  DeltaSimulator(const Machine& machine, const CostModel& cost, const SimulateOptions& options = {});
  ~DeltaSimulator();
  // The result, valid until the next call.
  StatusOr<const SimulationResult*> Simulate(const TaskGraph& graph);
  // Tasks the last call scheduled again (all of them on the first call),
  // and of those the ones it asked the cost model for.
  int64_t rescheduled() const { return rescheduled_; }
  int64_t costed() const { return costed_; }

 private:
  struct State;
  const Machine& machine_;
  const CostModel& cost_;
  const SimulateOptions options_;
  std::unique_ptr<State> state_;
  int64_t rescheduled_ = 0, costed_ = 0;
};

// The simulated step as Chrome trace JSON in the task runtime's layout
// (TaskRuntime::TraceJson): a row per device, then one per link resource
// that carried a message.
std::string SimulationTraceJson(const TaskGraph& graph, const Machine& machine, const SimulationResult& result);

}  // namespace loom
