// Static memory plan of a TaskGraph, per device: every piece a step makes
// and frees within the step gets an offset in its device's arena, and two
// pieces share bytes only when one's every use (its writer and its readers)
// is certain to end before the other's writer starts, whatever the timing
// of the devices' threads.
//
// "Certain" is the task runtime's order: a task starts after the tasks it
// depends on, and each queue runs its tasks one at a time in the graph's
// order. Task a happens before task b when a path of those edges leads
// from a to b; vector clocks (per task, the last position of each queue it
// follows) answer that in O(1) per pair.
//
// Pieces that outlive the step stay out of the plan and come from the
// device's allocator: sources' homes, and the pieces that writebacks and
// the step's outputs read (a home takes its new value's tensor after the
// step, and the next step's arena would write over it).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/task_graph.h"

namespace loom {

struct TaskMemoryPlan {
  static constexpr int64_t kUnplanned = -1;
  std::vector<int64_t> offset;         // by piece: its offset in its device's arena, or kUnplanned
  std::vector<size_t> arena_bytes;     // by device: what its arena allocates
  std::vector<size_t> planned_bytes;   // by device: the planned pieces' bytes summed (one buffer each)
};

// `queue_of[t]`: the queue (device thread) that runs task t, -1 for a task
// this process does not run (its pieces are not planned, and it orders
// nothing). Pieces of devices `planned_device` says false for are not
// planned. Offsets are multiples of `alignment`.
TaskMemoryPlan PlanTaskMemory(const TaskGraph& tasks, const std::vector<int64_t>& queue_of,
                              const std::vector<bool>& planned_device, size_t alignment = 64);

// The happens-before relation the plan rests on, for checks: whether task
// a certainly ends before task b starts.
class TaskOrder {
 public:
  TaskOrder(const TaskGraph& tasks, const std::vector<int64_t>& queue_of);
  bool Before(int a, int b) const;

 private:
  size_t queues_ = 0;
  std::vector<int64_t> queue_of_, position_;  // by task
  std::vector<int32_t> clock_;                // by task x queue: the last position of the queue it follows, -1 none
};

}  // namespace loom
