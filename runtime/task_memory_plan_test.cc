// The per-device memory plan against a brute-force order: pieces that share
// bytes must be certainly apart in time (every use of one before the
// other's writer, by a path of dependencies and queue order), whatever the
// strategy; what outlives the step stays out of the arenas.
#include "runtime/task_memory_plan.h"

#include <catch2/catch.hpp>

#include <random>

#include "tests/parallel_check.h"

namespace loom {
namespace {

// reach[a][b]: a path of dependencies and queue order leads from a to b.
std::vector<std::vector<bool>> Reachability(const TaskGraph& tg, const std::vector<int64_t>& queue_of) {
  const size_t n = tg.tasks.size();
  std::vector<std::vector<int>> next(n);
  std::map<int64_t, int> last;
  for (size_t t = 0; t < n; ++t) {
    for (int d : tg.tasks[t].deps) next[static_cast<size_t>(d)].push_back(static_cast<int>(t));
    auto it = last.find(queue_of[t]);
    if (it != last.end()) next[static_cast<size_t>(it->second)].push_back(static_cast<int>(t));
    last[queue_of[t]] = static_cast<int>(t);
  }
  std::vector<std::vector<bool>> reach(n, std::vector<bool>(n, false));
  for (size_t a = 0; a < n; ++a) {
    std::vector<int> stack(next[a].begin(), next[a].end());
    while (!stack.empty()) {
      const int b = stack.back();
      stack.pop_back();
      if (reach[a][static_cast<size_t>(b)]) continue;
      reach[a][static_cast<size_t>(b)] = true;
      stack.insert(stack.end(), next[static_cast<size_t>(b)].begin(), next[static_cast<size_t>(b)].end());
    }
  }
  return reach;
}

// The plan for `tg` on one process (a queue per device), checked pair by pair.
TaskMemoryPlan CheckPlan(const TaskGraph& tg) {
  std::vector<int64_t> queue_of;
  for (const Task& t : tg.tasks) queue_of.push_back(t.device);
  const TaskMemoryPlan plan = PlanTaskMemory(tg, queue_of, std::vector<bool>(static_cast<size_t>(tg.devices), true));
  const auto reach = Reachability(tg, queue_of);
  const TaskOrder order(tg, queue_of);
  for (size_t a = 0; a < tg.tasks.size(); ++a)
    for (size_t b = 0; b < tg.tasks.size(); ++b)
      if (order.Before(static_cast<int>(a), static_cast<int>(b)) != reach[a][b]) {
        FAIL("TaskOrder::Before(" << a << ", " << b << ") = " << !reach[a][b]);
      }
  std::vector<std::vector<int>> uses(tg.pieces.size());
  for (size_t p = 0; p < tg.pieces.size(); ++p)
    if (tg.pieces[p].producer >= 0) uses[p].push_back(tg.pieces[p].producer);
  for (const Task& t : tg.tasks) {
    for (int p : t.sources) uses[static_cast<size_t>(p)].push_back(t.id);
    for (const Operand& op : t.inputs)
      for (int p : op.pieces) uses[static_cast<size_t>(p)].push_back(t.id);
  }
  auto done_before = [&](size_t a, size_t b) {
    for (int u : uses[a])
      if (!reach[static_cast<size_t>(u)][static_cast<size_t>(tg.pieces[b].producer)]) return false;
    return true;
  };
  auto bytes = [&](size_t p) {
    return static_cast<int64_t>(tg.pieces[p].region.numel() * DTypeSize(tg.graph.type(tg.pieces[p].value).dtype));
  };
  int64_t shared = 0;
  for (size_t a = 0; a < tg.pieces.size(); ++a) {
    if (plan.offset[a] == TaskMemoryPlan::kUnplanned) continue;
    CHECK(plan.offset[a] % 64 == 0);
    CHECK(plan.offset[a] + bytes(a) <= static_cast<int64_t>(plan.arena_bytes[static_cast<size_t>(tg.pieces[a].device)]));
    for (size_t b = a + 1; b < tg.pieces.size(); ++b) {
      if (plan.offset[b] == TaskMemoryPlan::kUnplanned || tg.pieces[a].device != tg.pieces[b].device) continue;
      const bool overlap = plan.offset[a] < plan.offset[b] + bytes(b) && plan.offset[b] < plan.offset[a] + bytes(a);
      if (!overlap) continue;
      ++shared;
      if (!done_before(a, b) && !done_before(b, a))
        FAIL("pieces " << a << " and " << b << " on device " << tg.pieces[a].device << " share bytes but may be live "
                       << "at once");
    }
  }
  // Homes, and what writebacks and outputs read, are not in the arenas.
  for (const auto& [value, homes] : tg.homes)
    for (int h : homes) CHECK(plan.offset[static_cast<size_t>(h)] == TaskMemoryPlan::kUnplanned);
  for (const auto& [home, op] : tg.writebacks)
    for (int p : op.pieces) CHECK(plan.offset[static_cast<size_t>(p)] == TaskMemoryPlan::kUnplanned);
  for (const auto& [name, op] : tg.outputs)
    for (int p : op.pieces) CHECK(plan.offset[static_cast<size_t>(p)] == TaskMemoryPlan::kUnplanned);
  CHECK(shared > 0);  // pieces reuse memory
  for (int64_t d = 0; d < tg.devices; ++d) CHECK(plan.arena_bytes[static_cast<size_t>(d)] <= plan.planned_bytes[static_cast<size_t>(d)]);
  return plan;
}

TEST_CASE("pieces share arena bytes only when one's uses certainly end before the other is written") {
  const testing::StepCase cnn =
      testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8});
  const testing::StepCase mlp = testing::ClassifierCase("mlp", {{"hidden", "32,32"}}, {64});
  std::mt19937_64 rng(11);
  std::vector<std::pair<const testing::StepCase*, std::string>> cases = {
      {&cnn, "devices: 1\n"},
      {&cnn, "devices: 2\ndefault_split { sample: 2 }\n"},
      {&cnn, "devices: 2\ndefault_split { sample: 2 }\nlayer { layer: \"fc\" parameter: 2 }\n"},
      {&cnn, "devices: 2\nlayer { layer: \"stage1/*\" devices: 1 }\n"},
      {&mlp, "devices: 4\ndefault_split { sample: 2 parameter: 2 }\n"},
  };
  for (int i = 0; i < 6; ++i) cases.emplace_back(&cnn, testing::RandomStrategy(cnn.forward, 3, rng));
  for (const auto& [c, text] : cases) {
    INFO(text);
    auto tg = testing::LowerStrategy(*c, text);
    if (!tg.ok()) continue;  // a random split the shapes cannot take
    const TaskMemoryPlan plan = CheckPlan(*tg);
    size_t arena = 0, planned = 0;
    for (int64_t d = 0; d < tg->devices; ++d) {
      arena += plan.arena_bytes[static_cast<size_t>(d)];
      planned += plan.planned_bytes[static_cast<size_t>(d)];
    }
    INFO("arena " << arena << " of " << planned);
    CHECK(arena < planned);
  }
}

}  // namespace
}  // namespace loom
