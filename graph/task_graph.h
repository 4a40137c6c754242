// The TaskGraph (docs/parallel.md): a training (or any) graph lowered onto
// devices under a strategy. The simulator costs it and the task runtime
// (runtime/task_runtime.h) runs it, task for task.
//
// Every compute node becomes one compute task per part of its split; a part
// reads regions of its inputs and writes regions of its outputs. Values live
// as pieces (a region on a device, written once). Where a part needs a
// region that its device does not hold, transfer tasks copy the missing
// pieces from the devices that hold them; partial sums (a batch part's
// weight gradient) are combined by an all-reduce task first; where a group
// of devices each reads the whole of a value that the group holds in pieces
// (the next layer of an OWT split), one all-gather task can replace the
// transfers between every pair, and where each reads its own part of a
// value the group holds as partial sums (that layer's input gradient), one
// reduce-scatter (LoweringOptions). Forward layers
// split as the strategy says; every other node (backward, update) follows
// the layer it belongs to ("<layer>/grad/...", "<param>/update"), choosing
// among its op's split rules the one that matches how its inputs arrive, or
// runs whole on the layer's first device when none applies. A random op
// splits only as its rules say (Dropout's parts draw by position, so they
// draw the whole's mask). A split that needs a reduction between its parts
// (BatchNorm's batch statistics under a sample split; DimSplit::expands)
// replaces the node by its op's expansion (OpDef::Expand), whose nodes
// split without one: the task graph's own graph is the input graph with
// those nodes replaced.
//
// Sources have no producer: an Input or a state value is held where its
// consumers read it ("home" pieces, filled from the fed tensor or the state
// before the step); after the step every state home piece is refreshed from
// the state's new value (writebacks, with transfers where needed), so data
// parallelism keeps a full copy of each parameter on every device.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/inline_vector.h"
#include "core/region.h"
#include "core/status.h"
#include "graph/attrs.h"
#include "graph/ir.h"
#include "graph/strategy.h"

namespace loom {

// Pieces a task reads or writes, tasks it waits for: a few ids each, held
// in place (graph/task_graph.cc replays hundreds of thousands of them per
// search proposal).
using IdList = InlineVector<int, 4>;

// A region of a value held on one device.
struct Piece {
  ValueId value = kNoValue;
  int64_t device = 0;
  Region region;
  bool partial = false;  // a partial sum of the region, to be all-reduced
  int64_t partial_index = 0;  // which partial sum: copies of one share it
  int producer = -1;     // the task that writes it; -1 for a home piece of a source
  double bytes = 0;      // the region's elements times the value's element size
};

// What a task reads of one value: `region`, tiled by `pieces` (on the
// task's device for compute tasks and writebacks). A window part's region
// may reach past the value's bounds (into a convolution's padding): those
// elements are zeros.
struct Operand {
  ValueId value = kNoValue;
  Region region;
  IdList pieces;
};

enum class TaskKind { kCompute, kTransfer, kAllReduce, kAllGather, kReduceScatter, kAllToAll };
// "compute", "transfer", "all-reduce", "all-gather", "reduce-scatter", "all-to-all"
const char* TaskKindName(TaskKind kind);

struct Task {
  int id = 0;
  TaskKind kind = TaskKind::kCompute;
  std::string name;    // "fc1[0]", "fc1:0 0->1", "fc1/grad/MatMul:0 all-reduce"
  int64_t device = 0;  // compute: where it runs; transfer: the destination; collectives: the first member
  // Compute: the node, its part, the part's attributes (shared by the
  // node's parts that have the same) and operands.
  NodeId node = -1;
  int64_t part = 0;
  std::shared_ptr<const AttrMap> attrs;
  std::vector<Operand> inputs;
  // Transfer: one source piece (on src_device). All-reduce: the distinct
  // partial sums (`sources`), the devices that hold them (`group`, copies
  // of one partial sum included), and `outputs` the sum on each of those
  // devices, in the group's order; or a part of them (the outputs' region:
  // devices that all read that part). A group of one device sums, over the
  // region of its output, partial sums that transfers brought there (and
  // its own): where each device reads a different part of a partial-sum
  // value, its parts move as in a reduce-scatter instead of an all-reduce
  // of the whole. All-gather: `sources` the distinct pieces that tile a
  // region, each on a device of `group`, and `outputs` the whole region on
  // each member, in the group's order. Reduce-scatter: `sources` the
  // distinct partial sums of one region, on members, added in their order;
  // `outputs` a part of the sum on each member (group order). All-to-all:
  // `sources` distinct pieces on members; `outputs` a region on each
  // member, assembled from the sources it meets.
  IdList sources;
  int64_t src_device = -1;
  std::vector<int64_t> group;
  IdList outputs;  // the pieces it writes
  // Compute: OpDef::Cost of the part; all-to-all: its outputs' bytes; others: the (sources') region's bytes.
  double flops = 0, bytes = 0;
  DType dtype = DType::kF32;    // compute: the element type of its work (its first floating output's)
  IdList deps;                  // tasks that finish first (all earlier in TaskGraph::tasks)
};

struct TaskGraph {
  // The graph the tasks run (Task::node): the lowered graph with the nodes
  // whose splits expand replaced by their expansions.
  Graph graph;
  int64_t devices = 1;
  // In a topological order: the order each device's queue runs its tasks
  // in, in the runtime and in the simulator.
  std::vector<Task> tasks;
  std::vector<Piece> pieces;
  // Per device: the bytes of all its pieces, the most a step can hold there.
  std::vector<double> piece_bytes;
  // By task: a 64-bit hash of everything that decides how the task runs and
  // when it may (kind, devices, name, work, dependencies, group, and the
  // regions and places of what it reads and writes). Tasks of two task
  // graphs with equal fingerprints are the same task: delta simulation
  // reuses their costs (a collision, at odds of about 2^-64 a pair, would
  // reuse a stale one). Kept apart from the tasks so that comparing two
  // graphs reads one array.
  std::vector<uint64_t> fingerprints;
  // By task: the part of its fingerprint that decides its cost (all but the
  // dependencies), which stays the task's wherever it lands in the order:
  // delta simulation reuses the cost of a task it has seen at any place.
  std::vector<uint64_t> cost_keys;
  // The tasks' dependencies in one array, task i's at [dependency_end[i -
  // 1], dependency_end[i]): Task::deps laid out for the simulator, which
  // reads them all and would otherwise wait on a cache miss per task.
  std::vector<int> dependencies;
  std::vector<uint32_t> dependency_end;
  // Home pieces of sources: Input values (sliced from the feed) and state
  // values (kept between steps), by value.
  std::map<ValueId, std::vector<int>> homes;
  // After the step: home piece <- the state's new value (on its device).
  std::vector<std::pair<int, Operand>> writebacks;
  // The graph's named outputs, each tiled by pieces on any devices.
  std::map<std::string, Operand> outputs;

  // One line per task: "12 compute fc1[1] on 1  deps 3,4  flops 4096 bytes 8192".
  std::string ToString() const;
  // {"devices": N, "tasks": [{"id", "kind", "name", "device", "src_device",
  // "group", "flops", "bytes", "deps"}...]}
  std::string ToJson() const;
  // Bytes moved by transfer and collective tasks (all-reduce: the region
  // once per member, a one-device sum nothing; all-gather: what each member
  // lacks of the region; reduce-scatter: each member's part of every
  // partial sum held elsewhere; all-to-all: what each output takes from
  // sources on other devices).
  double TransferBytes() const;
};

// How a lowering moves values: what the devices' runtime moves well.
struct LoweringOptions {
  // When at least this many devices each read the whole of a region of a
  // value whose pieces those devices hold (one copy of each part of it),
  // one all-gather task brings it to all of them instead of a transfer per
  // (piece, reader) pair: on 64 devices, 1 task for 4,032; when each reads
  // its own part of a value they hold as partial sums of one region, one
  // reduce-scatter sums it instead of transfers and a sum per reader; when
  // they all read one part of it, an all-reduce of that part; when each
  // reads its own region of a value they hold in other pieces (a Linear's
  // columns read by rows), one all-to-all.
  // Collective libraries (NCCL's ring) move values so; the CPU task runtime
  // runs a collective on one device and transfers on every reader at once,
  // so it lowers without (0: never).
  int64_t collective_min_group = 0;
};

// The bytes an all-to-all moves from `source` to `output` (0 on one device).
double AllToAllMessageBytes(const Piece& source, const Piece& output);

// What one part of a node reads and writes.
struct PartRegions {
  PartRegions(size_t inputs, size_t outputs)
      : inputs(inputs), outputs(outputs), partial(outputs), partial_index(outputs) {}

  std::vector<Region> inputs, outputs;
  std::vector<bool> partial;  // per output: a partial sum of its region
  // Per output: which partial sum it is (its coordinates along the dims
  // that sum it); parts that differ only along dims that replicate it hold
  // copies of the same partial sum, which an all-reduce adds once.
  std::vector<int64_t> partial_index;
};

// The parts of the forward layer `node` of `forward` under `split` (parts
// in row-major order of the dimensions) by its op's `rules`
// (NodeSplitRules: the sample rule follows the batch), as the lowering
// plans them; the error BuildTaskGraph would give when its op does not
// realise the split for these shapes. A split that expands (BatchNorm's
// sample split) gives the unexpanded op's regions. What a search checks
// its configurations with, and costs moving values between them by.
StatusOr<std::vector<PartRegions>> LayerParts(const Graph& forward, const Node& node, const SplitRules& rules,
                                              const LayerSplit& split);

// Lowers `graph` (attributes canonical, as built) with the splits of its
// forward layers by name (Strategy::Resolve on the forward graph), onto
// devices 0 .. devices - 1. Errors name the layer: a split that no rule of
// its op realises for these shapes.
StatusOr<TaskGraph> BuildTaskGraph(const Graph& graph, const std::map<std::string, LayerSplit>& layers,
                                   int64_t devices, const LoweringOptions& options = {});

// Lowers one graph again and again under changing splits: a strategy
// search's proposals. A node whose layer's split is unchanged and whose
// inputs stand as they stood in the last lowering (equal versions: the same
// pieces, made in the same order, split the same way) is not planned again:
// its tasks, pieces and effects are replayed, renumbered. So a proposal that
// changes one layer plans that layer's nodes and their neighbours'.
//
// Each result has BuildTaskGraph's tasks, pieces, homes, writebacks, outputs
// and fingerprints (graph/incremental_lowering_test: zoo models under
// random changes), but its graph is the lowering's own: the input graph
// plus every expansion made so far, every node reading its inputs as built,
// so the ids of expansions' nodes and values may differ from
// BuildTaskGraph's. It is what the simulator and the cost models read (the
// nodes of the tasks); the task runtime runs BuildTaskGraph's.
class IncrementalLowering {
 public:
  IncrementalLowering(const Graph& graph, int64_t devices, const LoweringOptions& options = {});
  ~IncrementalLowering();
  // The task graph, valid until the next call. Errors as BuildTaskGraph's;
  // after one the next call plans every node.
  StatusOr<const TaskGraph*> Lower(const std::map<std::string, LayerSplit>& layers);
  // How many nodes (of the graph's order) the last call planned; it
  // replayed the others.
  int64_t planned() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t devices_;
};

// Strategy::Resolve on `forward`, by node name.
StatusOr<std::map<std::string, LayerSplit>> ResolveLayers(const Strategy& strategy, const Graph& forward);

// The two together: `step` lowered under `strategy` (resolved on the step's
// forward graph `forward`) onto the strategy's devices.
StatusOr<TaskGraph> LowerToTaskGraph(const Graph& step, const Strategy& strategy, const Graph& forward,
                                     const LoweringOptions& options = {});

}  // namespace loom
