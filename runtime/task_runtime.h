// Runs a TaskGraph (graph/task_graph.h) on devices of this process: CPU
// devices (`--devices cpu:N`) or CUDA devices (`--devices cuda:0,1`, or
// `cuda:0x4`: four devices as four streams of one GPU). One worker thread
// per device runs that device's tasks in the task graph's order, each
// waiting for the tasks it depends on; transfers copy regions between the
// devices' pieces, all-reduces sum partial pieces in the group's order (so
// results do not depend on timing), all-gathers and all-to-alls assemble
// each member's region from the members' pieces on the first member and
// hand it out.
// Each device's work goes on its own WorkQueue (core/work_queue.h). On the
// CPU that work is done when queued, and each device has a thread pool for
// its kernels. On a GPU the worker only queues it (kernels, copies, the
// all-reduce's adds) on the device's stream: a task's work waits for its
// dependencies on other devices through their markers (CUDA events), so
// the host thread never waits for the GPU inside a step; each worker
// synchronizes its stream at the step's end.
// The pieces a step makes and frees live at their places in one arena per
// device (runtime/task_memory_plan.h), which is safe on a GPU because the
// plan's order (dependencies and each device's order) is the streams'
// order too; sources' home pieces live between steps, and the pieces that
// outlive a step (what writebacks and outputs read) come from the device's
// caching allocator.
//
// The interface mirrors Executor's: state by name (assembled from and
// scattered to the home pieces), one Run per step.
//
// Processes (TaskRuntimeOptions::communicator): each of comm.size() ranks
// runs k = devices / comm.size() devices, devices [r k, (r + 1) k) on rank
// r, from the same task graph. A rank runs its devices' compute tasks and
// its halves of the transfers and collectives that cross to other ranks:
// the sender sends the region, the receiver receives it; a collective's
// first member receives the pieces it does not hold (an all-reduce adds
// them in the group's order: the bits of one process) and sends each
// member its copy. A rank's cross-rank tasks run one at a time in the graph's order,
// whichever of its device threads runs them, so each pair of ranks sends
// and receives in the same order and every wait is met.
// Messages go through the host (the communicator is a CPU one): a send
// waits for its queue's work, a receive is copied into its piece as work
// of the queue (SendAfter, ReceiveInto), so CUDA devices cross processes
// as CPU ones do.
// Every rank makes the same calls in the same order (Run, GetState, ...):
// outputs and state are broadcast from the ranks that hold them. A failing
// rank aborts the communicator, so the others fail instead of waiting.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/chrome_trace.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "core/work_queue.h"
#include "graph/ir.h"
#include "graph/task_graph.h"
#include "ops/op.h"
#include "runtime/comm/communicator.h"
#include "runtime/step_runner.h"
#include "runtime/task_memory_plan.h"

namespace loom {

struct TaskRuntimeOptions {
  // The device each of the task graph's devices runs on: all CPU or all
  // CUDA; a GPU may appear more than once (a stream each). Empty: CPU.
  std::vector<Device> devices;
  int threads_per_device = 1;  // CPU devices' kernel pools
  uint64_t seed = 0;    // random ops draw from streams keyed by (seed, node name, step), as in Executor
  bool trace = false;   // record every task's start and end (trace(), TraceJson())
  // Tests: makes device d's queue instead of CreateWorkQueue (an
  // asynchronous CPU queue, tests/async_work_queue.h, checks on the CPU
  // the order that a GPU's streams and events rely on).
  std::function<StatusOr<std::unique_ptr<WorkQueue>>(int64_t device, int markers)> make_queue;
  // Not owned; when set, this runtime is rank comm.rank() of comm.size()
  // processes and runs its share of the devices (a CPU communicator; the
  // task graph's devices a multiple of comm.size()).
  Communicator* communicator = nullptr;
};

// One task's run in the last step, in seconds from the step's start.
struct TaskSpan {
  int task = 0;
  double start = 0, end = 0;
};

class TaskRuntime : public StepRunner {
 public:
  // Checks every compute task's kernel on its device for its part's types
  // and allocates the state's home pieces.
  static StatusOr<std::unique_ptr<TaskRuntime>> Create(TaskGraph tasks, const TaskRuntimeOptions& options = {});
  ~TaskRuntime();

  Status InitializeState(uint64_t seed) override;
  std::vector<std::string> StateNames() const override;
  StatusOr<Tensor> GetState(const std::string& name) const override;
  Status SetState(const std::string& name, const Tensor& value) override;

  // One step; feeds keyed by Input node name, outputs whole on the host.
  StatusOr<std::map<std::string, Tensor>> Run(const std::map<std::string, Tensor>& feeds) override;

  const Graph& graph() const override { return tasks_.graph; }
  const TaskGraph& task_graph() const { return tasks_; }
  int64_t step() const override { return step_; }
  void SetStep(int64_t step) override { step_ = step; }
  const std::vector<TaskSpan>& trace() const { return trace_; }
  // The last step as Chrome trace JSON: one row per device, one per link.
  std::string TraceJson() const;
  // The last step's spans (the tasks this process ran) in `group` of
  // `trace`, shifted by `offset_s`; returns where the step ends on that
  // clock (its last span's end).
  double AppendTrace(ChromeTrace& trace, int64_t group, double offset_s) const;

 private:
  TaskRuntime(TaskGraph tasks, TaskRuntimeOptions options);
  Status Prepare();
  // The rank that runs `device` (0 without a communicator).
  int Owner(int64_t device) const { return comm_ ? static_cast<int>(device / devices_per_rank_) : 0; }
  // Whether this process runs `device` (always without a communicator).
  bool Local(int64_t device) const { return comm_ == nullptr || Owner(device) == comm_->rank(); }
  // The local device whose thread runs `task` (or this rank's half of it),
  // -1 when this process has no part in it.
  int64_t RunnerOf(const Task& task) const;
  // Whether `task` exchanges between ranks (a message task).
  bool CrossesRanks(const Task& task) const;
  // Queues `task` on its runner's queue after its dependencies on other
  // queues, then marks it there.
  Status RunTask(const Task& task, int64_t runner);
  Status QueueTask(const Task& task, WorkQueue& queue, ThreadPool* pool);
  Status RunRemoteTransfer(const Task& task, WorkQueue& queue);
  Status RunAllReduce(const Task& task, WorkQueue& queue, ThreadPool* pool);
  Status RunRedistribute(const Task& task, WorkQueue& queue);
  Status JoinCollective(const Task& task, WorkQueue& queue);
  // A message to or from another rank of a tensor that work queued on
  // `queue` makes, or whose bytes earlier work there still reads (the memory
  // plan reuses them in the queue's order). SendAfter sends once that work
  // is done; ReceiveInto receives on the host and copies into *dst as work
  // of `queue`. The communicator is a CPU one: a GPU's tensors go through
  // the host. On the CPU's queue both are the plain call.
  Status SendAfter(WorkQueue& queue, const Tensor& t, int rank) const;
  Status ReceiveInto(WorkQueue& queue, Tensor* dst, int rank) const;
  const Region& SummedRegion(const Task& task) const;
  Status HandOut(const Task& task, WorkQueue& queue, const std::vector<Tensor>& results,
                 const std::vector<const Region*>& regions);
  // Queues one of the all-reduce's helper kernels (Add, Cast) on `queue`;
  // `node` must outlive the work.
  Status RunHelper(const KernelFn* kernel, const Node& node, std::vector<Tensor> inputs, Tensor output,
                   WorkQueue& queue, ThreadPool* pool) const;
  // The part `region` of host tensor `whole` (holding `all`) as a tensor on
  // device d.
  StatusOr<Tensor> PartOn(const Tensor& whole, const Region& all, const Region& region, int64_t d) const;
  // Piece p on every rank, on the host: broadcast from the rank that holds
  // it (every rank calls this for the same pieces in the same order, with
  // no step running).
  StatusOr<Tensor> PieceEverywhere(int p) const;
  // The tensor piece p is written into: its place in its device's arena,
  // or (a piece that outlives the step) a block of the device's allocator.
  StatusOr<Tensor> PieceTensor(int p) const;
  // Op's region from its pieces: the piece itself when it is the region,
  // else a copy from `allocator`, queued on `queue`.
  StatusOr<Tensor> Assemble(const Operand& op, Allocator* allocator, WorkQueue& queue) const;
  // Device d's memory: its caching allocator (core/allocator.h), so a step
  // reuses the blocks of the last one.
  Allocator* AllocatorOf(int64_t device) const { return allocators_[static_cast<size_t>(device)]; }
  void Release(const Task& task);

  TaskGraph tasks_;
  TaskRuntimeOptions options_;
  std::vector<Device> devices_;                      // per device: where it runs
  std::vector<Allocator*> allocators_;               // per device
  std::vector<std::unique_ptr<ThreadPool>> pools_;  // per local CPU device
  std::vector<std::unique_ptr<WorkQueue>> work_;    // per local device
  std::vector<std::vector<int>> queues_;            // per device: task ids in order
  std::vector<int64_t> runner_;                     // by task id: the local device that runs it, -1 none
  std::vector<int> marker_;                         // by task id: its marker on its runner's queue
  const KernelFn* add_kernel_ = nullptr;            // the all-reduce's helpers on the devices' kind
  const KernelFn* cast_kernel_ = nullptr;
  Communicator* comm_ = nullptr;                    // options_.communicator
  std::vector<Tensor> pieces_;                      // by piece id (homes persist); this process's only
  TaskMemoryPlan memory_plan_;                      // where each piece a step makes and frees lives
  std::vector<std::shared_ptr<Buffer>> arenas_;     // per device: the planned pieces' bytes (null: none)
  int64_t devices_per_rank_ = 1;                    // processes: devices each rank runs
  std::vector<char> runs_here_;                     // by task id: this process runs it (or its half)
  std::vector<int64_t> message_turn_;               // by task id: its place among this rank's cross-rank tasks, or -1
  int64_t messages_ = 0;
  std::vector<int> readers_;                        // by piece id: tasks, writebacks and outputs that read it
  std::vector<const KernelFn*> kernels_;            // by task id (compute tasks)
  std::map<std::string, ValueId> state_values_;     // state node name -> its value
  std::vector<TaskSpan> trace_;
  int64_t step_ = 0;
  struct StepState;  // synchronisation of one step
  StepState* step_state_ = nullptr;  // during Run
  class DeviceThreads;
  std::vector<size_t> local_devices_;       // the devices this process runs
  std::unique_ptr<DeviceThreads> threads_;  // one per local device but the first (the caller runs it)
};

}  // namespace loom
