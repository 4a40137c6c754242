#include "runtime/memory_plan.h"

#include <algorithm>
#include <vector>

namespace loom {

MemoryPlan PlanMemory(const Graph& graph, const std::set<ValueId>& keep, size_t alignment) {
  MemoryPlan plan;
  const auto& nodes = graph.nodes();
  const int end = static_cast<int>(nodes.size());
  for (int i = 0; i < end; ++i) {
    if (IsSourceOp(nodes[i].op)) continue;
    for (ValueId v : nodes[i].outputs) {
      const TensorType& t = graph.type(v);
      MemoryPlan::Slot s;
      size_t bytes = static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype);
      s.bytes = (bytes + alignment - 1) / alignment * alignment;
      s.first = i;
      s.last = keep.count(v) ? end : i;
      plan.slots[v] = s;
    }
  }
  for (int i = 0; i < end; ++i)
    for (ValueId v : nodes[i].inputs) {
      auto it = plan.slots.find(v);
      if (it != plan.slots.end()) it->second.last = std::max(it->second.last, i);
    }

  // Greedy by size (largest first): place each value at the lowest offset
  // that does not collide with a placed value whose lifetime overlaps.
  std::vector<ValueId> order;
  for (const auto& [v, s] : plan.slots) {
    order.push_back(v);
    plan.unplanned_bytes += s.bytes;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](ValueId a, ValueId b) { return plan.slots[a].bytes > plan.slots[b].bytes; });
  std::vector<ValueId> placed;
  for (ValueId v : order) {
    MemoryPlan::Slot& s = plan.slots[v];
    std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of overlapping lifetimes
    for (ValueId p : placed) {
      const MemoryPlan::Slot& o = plan.slots[p];
      if (o.first <= s.last && s.first <= o.last) busy.push_back({o.offset, o.offset + o.bytes});
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [b, e] : busy) {
      if (offset + s.bytes <= b) break;
      offset = std::max(offset, e);
    }
    s.offset = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + s.bytes);
    placed.push_back(v);
  }
  return plan;
}

}  // namespace loom
