// Static memory plan for one graph execution: every intermediate value gets
// an offset in one arena, and values whose lifetimes do not overlap share
// bytes. Lifetimes are node-index intervals [producer, last consumer].
// Some values take no bytes of their own (aliases):
//  - the output of a view op (Reshape, Flatten, Identity: OpDef::IsView) is
//    its input's bytes seen with another shape; the input lives as long as
//    its views are used;
//  - an optimizer update's new parameter or state is written over the old
//    one (OpDef::InPlaceInput) when the update is the old value's last
//    reader, so the step updates state in place instead of copying.
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
  // Value -> the value whose bytes it is (a planned value, a state value or
  // an input), in execution order of the aliasing nodes.
  std::vector<std::pair<ValueId, ValueId>> aliases;
  size_t arena_bytes = 0;     // what the plan allocates
  size_t unplanned_bytes = 0; // sum of all slots: what one buffer per value would take
};

// Plans all values produced by non-source nodes. Values in `keep` (graph
// outputs, new state values) live until the end of the step.
MemoryPlan PlanMemory(const Graph& graph, const std::set<ValueId>& keep, size_t alignment = 64);

}  // namespace loom
