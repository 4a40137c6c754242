#include "runtime/memory_plan.h"

#include <algorithm>
#include <vector>

#include "ops/op.h"

namespace loom {

MemoryPlan PlanMemory(const Graph& graph, const std::set<ValueId>& keep, size_t alignment) {
  MemoryPlan plan;
  const auto& nodes = graph.nodes();
  const int end = static_cast<int>(nodes.size());
  const OpRegistry& registry = OpRegistry::Global();

  // Views first: every value's root is the value that owns its bytes.
  std::map<ValueId, ValueId> root;
  auto root_of = [&](ValueId v) {
    auto it = root.find(v);
    return it == root.end() ? v : it->second;
  };
  for (const Node& n : nodes) {
    const OpDef* def = registry.FindOp(n.op);
    if (def && def->IsView() && !n.inputs.empty()) root[n.outputs[0]] = root_of(n.inputs[0]);
  }
  // The last node reading each root (through any of its views).
  std::map<ValueId, int> last_use;
  for (int i = 0; i < end; ++i)
    for (ValueId v : nodes[i].inputs) last_use[root_of(v)] = i;
  std::set<ValueId> kept_roots;
  for (ValueId v : keep) kept_roots.insert(root_of(v));

  for (int i = 0; i < end; ++i) {
    const Node& n = nodes[i];
    if (IsSourceOp(n.op)) continue;
    const OpDef* def = registry.FindOp(n.op);
    const bool view = def && def->IsView() && !n.inputs.empty();
    for (int o = 0; o < static_cast<int>(n.outputs.size()); ++o) {
      const ValueId v = n.outputs[o];
      if (view) {
        plan.aliases.push_back({v, root.at(v)});
        continue;
      }
      // In place over a state value that nothing reads afterwards.
      const int k = def ? def->InPlaceInput(n.attrs, o) : -1;
      if (k >= 0 && k < static_cast<int>(n.inputs.size())) {
        const ValueId in = root_of(n.inputs[k]);
        const Value& src = graph.value(in);
        if (IsStateOp(graph.node(src.producer).op) && last_use[in] == i && !kept_roots.count(in) &&
            src.type == graph.type(v)) {
          plan.aliases.push_back({v, in});
          root[v] = in;
          kept_roots.insert(in);  // one output per state value
          continue;
        }
      }
      const TensorType& t = graph.type(v);
      MemoryPlan::Slot s;
      size_t bytes = static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype);
      s.bytes = (bytes + alignment - 1) / alignment * alignment;
      s.first = i;
      s.last = i;
      plan.slots[v] = s;
    }
  }
  // A slot lives until the last read of it or of any of its views, or to
  // the end when it (or a view of it) is kept.
  for (const auto& [v, i] : last_use) {
    auto it = plan.slots.find(v);
    if (it != plan.slots.end()) it->second.last = std::max(it->second.last, i);
  }
  for (ValueId v : keep) {
    auto it = plan.slots.find(root_of(v));
    if (it != plan.slots.end()) it->second.last = end;
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
