#include "runtime/task_memory_plan.h"

#include <algorithm>
#include <utility>

namespace loom {

TaskOrder::TaskOrder(const TaskGraph& tasks, const std::vector<int64_t>& queue_of) : queue_of_(queue_of) {
  for (int64_t q : queue_of) queues_ = std::max(queues_, static_cast<size_t>(q + 1));
  const size_t n = tasks.tasks.size();
  position_.assign(n, -1);
  clock_.assign(n * queues_, -1);
  std::vector<int64_t> next(queues_, 0);
  std::vector<int> last(queues_, -1);  // the last task of each queue so far
  // Tasks are in a topological order, and each queue runs its own in that
  // order: one pass sees every predecessor first.
  for (size_t t = 0; t < n; ++t) {
    const int64_t q = queue_of_[t];
    if (q < 0) continue;
    int32_t* clock = &clock_[t * queues_];
    auto follow = [&](int before) {
      const int32_t* c = &clock_[static_cast<size_t>(before) * queues_];
      for (size_t k = 0; k < queues_; ++k) clock[k] = std::max(clock[k], c[k]);
      const int64_t bq = queue_of_[static_cast<size_t>(before)];
      clock[bq] = std::max<int32_t>(clock[bq], static_cast<int32_t>(position_[static_cast<size_t>(before)]));
    };
    for (int d : tasks.tasks[t].deps)
      if (queue_of_[static_cast<size_t>(d)] >= 0) follow(d);
    if (last[static_cast<size_t>(q)] >= 0) follow(last[static_cast<size_t>(q)]);
    position_[t] = next[static_cast<size_t>(q)]++;
    last[static_cast<size_t>(q)] = static_cast<int>(t);
  }
}

bool TaskOrder::Before(int a, int b) const {
  const int64_t qa = queue_of_[static_cast<size_t>(a)];
  if (a == b || qa < 0 || queue_of_[static_cast<size_t>(b)] < 0) return false;
  return clock_[static_cast<size_t>(b) * queues_ + static_cast<size_t>(qa)] >= position_[static_cast<size_t>(a)];
}

TaskMemoryPlan PlanTaskMemory(const TaskGraph& tasks, const std::vector<int64_t>& queue_of,
                              const std::vector<bool>& planned_device, size_t alignment) {
  const size_t n = tasks.pieces.size();
  TaskMemoryPlan plan;
  plan.offset.assign(n, TaskMemoryPlan::kUnplanned);
  plan.arena_bytes.assign(static_cast<size_t>(tasks.devices), 0);
  plan.planned_bytes.assign(static_cast<size_t>(tasks.devices), 0);

  // Each piece's uses: its writer, then its readers.
  std::vector<std::vector<int>> uses(n);
  std::vector<bool> outlives(n, false);
  for (size_t p = 0; p < n; ++p)
    if (tasks.pieces[p].producer >= 0) uses[p].push_back(tasks.pieces[p].producer);
  for (const Task& t : tasks.tasks) {
    for (int p : t.sources) uses[static_cast<size_t>(p)].push_back(t.id);
    for (const Operand& op : t.inputs)
      for (int p : op.pieces) uses[static_cast<size_t>(p)].push_back(t.id);
  }
  for (const auto& [home, op] : tasks.writebacks)
    for (int p : op.pieces) outlives[static_cast<size_t>(p)] = true;
  for (const auto& [name, op] : tasks.outputs)
    for (int p : op.pieces) outlives[static_cast<size_t>(p)] = true;

  std::vector<std::vector<int>> by_device(static_cast<size_t>(tasks.devices));
  for (size_t p = 0; p < n; ++p) {
    const Piece& piece = tasks.pieces[p];
    if (piece.producer < 0 || outlives[p] || !planned_device[static_cast<size_t>(piece.device)]) continue;
    if (queue_of[static_cast<size_t>(piece.producer)] < 0) continue;
    by_device[static_cast<size_t>(piece.device)].push_back(static_cast<int>(p));
  }

  const TaskOrder order(tasks, queue_of);
  // Piece a is done before piece b is written: every use of a before b's writer.
  auto done_before = [&](int a, int b) {
    const int writer = tasks.pieces[static_cast<size_t>(b)].producer;
    for (int u : uses[static_cast<size_t>(a)])
      if (!order.Before(u, writer)) return false;
    return true;
  };
  auto bytes_of = [&](int p) {
    const Piece& piece = tasks.pieces[static_cast<size_t>(p)];
    const size_t b = static_cast<size_t>(piece.region.numel()) * DTypeSize(tasks.graph.type(piece.value).dtype);
    return (b + alignment - 1) / alignment * alignment;
  };
  for (size_t d = 0; d < by_device.size(); ++d) {
    std::vector<int>& pieces = by_device[d];
    // Largest first, each at the lowest offset clear of the placed pieces
    // it may be live with.
    std::stable_sort(pieces.begin(), pieces.end(), [&](int a, int b) { return bytes_of(a) > bytes_of(b); });
    std::vector<int> placed;
    std::vector<std::pair<size_t, size_t>> busy;
    for (int p : pieces) {
      const size_t bytes = bytes_of(p);
      busy.clear();
      for (int o : placed)
        if (!done_before(o, p) && !done_before(p, o)) {
          const size_t at = static_cast<size_t>(plan.offset[static_cast<size_t>(o)]);
          busy.emplace_back(at, at + bytes_of(o));
        }
      std::sort(busy.begin(), busy.end());
      size_t offset = 0;
      for (const auto& [begin, end] : busy) {
        if (offset + bytes <= begin) break;
        offset = std::max(offset, end);
      }
      plan.offset[static_cast<size_t>(p)] = static_cast<int64_t>(offset);
      plan.arena_bytes[d] = std::max(plan.arena_bytes[d], offset + bytes);
      plan.planned_bytes[d] += bytes;
      placed.push_back(p);
    }
  }
  return plan;
}

}  // namespace loom
