// Static memory plan for one graph execution: every intermediate value gets
// an offset in one arena, and values whose lifetimes do not overlap share
// bytes. Lifetimes are node-index intervals [producer, last consumer].
#pragma once

#include <cstdint>
#include <map>
#include <set>

#include "graph/ir.h"

namespace loom {

struct MemoryPlan {
  struct Slot {
    size_t offset = 0;
    size_t bytes = 0;
    int first = 0;  // index (in execution order) of the producing node
    int last = 0;   // index of the last consumer (num_nodes if kept to the end)
  };
  std::map<ValueId, Slot> slots;
  size_t arena_bytes = 0;     // what the plan allocates
  size_t unplanned_bytes = 0; // sum of all slots: what one buffer per value would take
};

// Plans all values produced by non-source nodes. Values in `keep` (graph
// outputs, new state values) live until the end of the step.
MemoryPlan PlanMemory(const Graph& graph, const std::set<ValueId>& keep, size_t alignment = 64);

}  // namespace loom
