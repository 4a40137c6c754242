#include "simulator/simulator.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/chrome_trace.h"

namespace loom {
namespace {

// Queues: devices [0, D), then the machine's link resources.
struct Occupancy {
  std::vector<int64_t> queues;
  double seconds = 0;
  std::vector<std::pair<int64_t, double>> resource_bytes;  // what it moves on which link resource
};

double PieceBytes(const TaskGraph& g, int p) {
  const Piece& piece = g.pieces[static_cast<size_t>(p)];
  return static_cast<double>(piece.region.numel() * static_cast<int64_t>(DTypeSize(g.graph.type(piece.value).dtype)));
}

class Scheduler {
 public:
  Scheduler(const TaskGraph& g, const Machine& m, const CostModel& cost) : g_(g), m_(m), cost_(cost) {}

  Occupancy Of(const Task& t) const {
    Occupancy o;
    const int64_t devices = g_.devices;
    const bool copies_on_device = m_.device().copies_on_device();
    switch (t.kind) {
      case TaskKind::kCompute:
        o.queues = {t.device};
        o.seconds = cost_.ComputeSeconds(g_, t);
        return o;
      case TaskKind::kTransfer: {
        const Machine::Route route = m_.RouteOf(t.src_device, t.device);
        o.seconds = Machine::MessageSeconds(route, t.bytes);
        if (copies_on_device) {
          o.queues = {t.device};
        } else {
          for (int64_t r : route.resources) o.queues.push_back(devices + r);
        }
        for (int64_t r : route.resources) o.resource_bytes.push_back({r, t.bytes});
        return o;
      }
      case TaskKind::kAllReduce:
        return copies_on_device ? RootAllReduce(t) : RingAllReduce(t);
    }
    return o;
  }

 private:
  // The task runtime's all-reduce: the first member receives the partial
  // sums it does not hold, adds them, and hands every member a copy.
  Occupancy RootAllReduce(const Task& t) const {
    Occupancy o;
    o.queues = {t.device};
    const double bytes = t.bytes, memory = m_.device().memory_bandwidth();
    auto message = [&](int64_t src, int64_t dst) {
      const Machine::Route route = m_.RouteOf(src, dst);
      for (int64_t r : route.resources) o.resource_bytes.push_back({r, bytes});
      return Machine::MessageSeconds(route, bytes);
    };
    for (int p : t.sources) {
      const int64_t d = g_.pieces[static_cast<size_t>(p)].device;
      if (d != t.device) o.seconds += message(d, t.device);
    }
    o.seconds += static_cast<double>(t.sources.size() - 1) * 3 * bytes / memory;  // read two, write one
    for (int p : t.outputs) {
      const int64_t d = g_.pieces[static_cast<size_t>(p)].device;
      o.seconds += d == t.device ? 2 * bytes / memory : message(t.device, d);
    }
    return o;
  }

  // A ring over the members: 2(n-1) steps of bytes / n each, every member
  // sending to the next at once; the slowest link of the ring sets the pace.
  Occupancy RingAllReduce(const Task& t) const {
    Occupancy o;
    const std::vector<int64_t>& ring = t.group;
    const double n = static_cast<double>(ring.size());
    if (ring.size() < 2) return o;
    double step = 0;
    for (size_t i = 0; i < ring.size(); ++i) {
      const Machine::Route route = m_.RouteOf(ring[i], ring[(i + 1) % ring.size()]);
      step = std::max(step, Machine::MessageSeconds(route, t.bytes / n));
      for (int64_t r : route.resources) {
        o.queues.push_back(g_.devices + r);
        o.resource_bytes.push_back({r, 2 * (n - 1) / n * t.bytes});
      }
    }
    std::sort(o.queues.begin(), o.queues.end());
    o.queues.erase(std::unique(o.queues.begin(), o.queues.end()), o.queues.end());
    o.seconds = 2 * (n - 1) * step;
    return o;
  }

  const TaskGraph& g_;
  const Machine& m_;
  const CostModel& cost_;
};

// The schedule's running state after a prefix of the tasks: what a delta
// simulation restarts from.
struct Snapshot {
  size_t next = 0;  // tasks scheduled so far
  std::vector<double> free, busy, resource_bytes;
  double iteration = 0;
};

// What scheduling a task needs of it; equal for tasks that cost the same.
struct TaskStep {
  Occupancy occupancy;
  std::vector<int> deps;
};

// What the simulation of a task depends on, hashed (FNV-1a over its kind,
// devices, name, FLOPs, bytes, dependencies, ring, and its regions and
// pieces' places): equal keys are the same task for the delta simulation
// (a collision, at odds of 2^-64 a pair, would reuse a stale cost).
class KeyHash {
 public:
  void Add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) h_ = (h_ ^ p[i]) * 1099511628211ull;
  }
  template <typename T>
  void Add(const T& value) {
    Add(&value, sizeof(value));
  }
  template <typename T>
  void AddAll(const std::vector<T>& values) {
    Add(values.size());
    if (!values.empty()) Add(values.data(), values.size() * sizeof(T));
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

uint64_t TaskKey(const TaskGraph& g, const Task& t) {
  KeyHash h;
  h.Add(t.kind);
  h.Add(t.device);
  h.Add(t.src_device);
  h.Add(t.name.data(), t.name.size());
  h.Add(t.flops);
  h.Add(t.bytes);
  h.AddAll(t.deps);
  h.AddAll(t.group);
  for (const Operand& op : t.inputs) {
    h.AddAll(op.region.lo);
    h.AddAll(op.region.hi);
  }
  for (const std::vector<int>* list : {&t.sources, &t.outputs}) {
    h.Add(list->size());
    for (int p : *list) {
      const Piece& piece = g.pieces[static_cast<size_t>(p)];
      h.Add(piece.device);
      h.AddAll(piece.region.lo);
      h.AddAll(piece.region.hi);
    }
  }
  return h.value();
}

// Schedules steps[from.next ...] after the state `from` into `r` (whose
// tasks before from.next are already set), snapshotting every kEvery tasks.
constexpr size_t kEvery = 64;
void Schedule(const std::vector<TaskStep>& steps, int64_t devices, Snapshot from, SimulationResult* r,
              std::vector<Snapshot>* snapshots) {
  for (size_t i = from.next; i < steps.size(); ++i) {
    if (i % kEvery == 0) {
      from.next = i;
      snapshots->push_back(from);
    }
    const TaskStep& t = steps[i];
    double start = 0;
    for (int d : t.deps) start = std::max(start, r->tasks[static_cast<size_t>(d)].end);
    for (int64_t q : t.occupancy.queues) start = std::max(start, from.free[static_cast<size_t>(q)]);
    const double end = start + t.occupancy.seconds;
    for (int64_t q : t.occupancy.queues) {
      from.free[static_cast<size_t>(q)] = end;
      if (q < devices) from.busy[static_cast<size_t>(q)] += t.occupancy.seconds;
    }
    for (const auto& [resource, bytes] : t.occupancy.resource_bytes) from.resource_bytes[static_cast<size_t>(resource)] += bytes;
    r->tasks[i] = {start, end, t.occupancy.queues.empty() ? -1 : t.occupancy.queues[0]};
    from.iteration = std::max(from.iteration, end);
  }
  r->iteration_seconds = from.iteration;
  r->device_busy_seconds = from.busy;
  r->resource_bytes = from.resource_bytes;
}

Snapshot Empty(int64_t devices, int64_t resources) {
  Snapshot s;
  s.free.assign(static_cast<size_t>(devices + resources), 0.0);
  s.busy.assign(static_cast<size_t>(devices), 0.0);
  s.resource_bytes.assign(static_cast<size_t>(resources), 0.0);
  return s;
}

// Peak memory per device of the scheduled step.
void AddMemory(const TaskGraph& g, const Machine& m, SimulationResult& r) {
  const size_t devices = static_cast<size_t>(g.devices);
  // Memory: each piece from its writer's start (homes: all step) to its last
  // reader's end (writebacks and outputs read at the step's end).
  std::vector<double> held_from(g.pieces.size(), 0.0), held_until(g.pieces.size(), 0.0);
  for (size_t p = 0; p < g.pieces.size(); ++p) {
    const int producer = g.pieces[p].producer;
    held_from[p] = producer < 0 ? 0.0 : r.tasks[static_cast<size_t>(producer)].start;
    held_until[p] = producer < 0 ? r.iteration_seconds : r.tasks[static_cast<size_t>(producer)].end;
  }
  auto read_by = [&](int p, double until) { held_until[static_cast<size_t>(p)] = std::max(held_until[static_cast<size_t>(p)], until); };
  for (const Task& t : g.tasks) {
    for (int p : t.sources) read_by(p, r.tasks[static_cast<size_t>(t.id)].end);
    for (const Operand& op : t.inputs)
      for (int p : op.pieces) read_by(p, r.tasks[static_cast<size_t>(t.id)].end);
  }
  for (const auto& [home, op] : g.writebacks)
    for (int p : op.pieces) read_by(p, r.iteration_seconds);
  for (const auto& [name, op] : g.outputs)
    for (int p : op.pieces) read_by(p, r.iteration_seconds);
  // Per device: +bytes at the start, -bytes at the end; frees first at ties.
  std::vector<std::vector<std::pair<double, double>>> events(devices);
  for (size_t p = 0; p < g.pieces.size(); ++p) {
    const double bytes = PieceBytes(g, static_cast<int>(p));
    auto& e = events[static_cast<size_t>(g.pieces[p].device)];
    e.push_back({held_from[p], bytes});
    e.push_back({held_until[p], -bytes});
  }
  r.peak_memory_bytes.assign(devices, 0.0);
  for (size_t d = 0; d < devices; ++d) {
    std::sort(events[d].begin(), events[d].end());
    double now = 0;
    for (const auto& [time, bytes] : events[d]) r.peak_memory_bytes[d] = std::max(r.peak_memory_bytes[d], now += bytes);
    if (r.peak_memory_bytes[d] > m.device().memory_bytes()) r.fits = false;
  }
}

Status CheckDevices(const TaskGraph& g, const Machine& m) {
  if (g.devices > m.devices())
    return InvalidArgument("the task graph has ", g.devices, " devices, machine ", m.name(), " has ", m.devices());
  return Status::Ok();
}

}  // namespace

StatusOr<SimulationResult> Simulate(const TaskGraph& g, const Machine& m, const CostModel& cost) {
  LOOM_RETURN_IF_ERROR(CheckDevices(g, m));
  const Scheduler scheduler(g, m, cost);
  std::vector<TaskStep> steps;
  steps.reserve(g.tasks.size());
  for (const Task& t : g.tasks) steps.push_back({scheduler.Of(t), t.deps});
  SimulationResult r;
  r.tasks.assign(g.tasks.size(), SimulatedTask{});
  std::vector<Snapshot> unused;
  Schedule(steps, g.devices, Empty(g.devices, m.resources()), &r, &unused);
  AddMemory(g, m, r);
  return r;
}

struct DeltaSimulator::State {
  int64_t devices = 0;
  std::vector<uint64_t> keys;  // TaskKey by task
  std::vector<TaskStep> steps;
  std::vector<Snapshot> snapshots;  // at tasks 0, kEvery, 2 kEvery, ...
  SimulationResult result;
};

DeltaSimulator::DeltaSimulator(const Machine& machine, const CostModel& cost) : machine_(machine), cost_(cost) {}
DeltaSimulator::~DeltaSimulator() = default;

StatusOr<SimulationResult> DeltaSimulator::Simulate(const TaskGraph& g) {
  LOOM_RETURN_IF_ERROR(CheckDevices(g, machine_));
  const Scheduler scheduler(g, machine_, cost_);
  const State* last = state_ && state_->devices == g.devices ? state_.get() : nullptr;
  auto next = std::make_unique<State>();
  next->devices = g.devices;
  next->steps.reserve(g.tasks.size());
  next->keys.reserve(g.tasks.size());
  // The tasks equal to the last graph's at their place keep their cost; the
  // schedule is kept up to the first that differs.
  size_t unchanged = 0;
  bool prefix = last != nullptr;
  for (size_t i = 0; i < g.tasks.size(); ++i) {
    next->keys.push_back(TaskKey(g, g.tasks[i]));
    const bool same = last && i < last->keys.size() && last->keys[i] == next->keys[i];
    next->steps.push_back(same ? last->steps[i] : TaskStep{scheduler.Of(g.tasks[i]), g.tasks[i].deps});
    prefix = prefix && same;
    if (prefix) unchanged = i + 1;
  }
  SimulationResult r;
  r.tasks.assign(g.tasks.size(), SimulatedTask{});
  Snapshot from = Empty(g.devices, machine_.resources());
  if (last && unchanged > 0 && !last->snapshots.empty()) {
    // The last snapshot at or before the first change (snapshot k is at task k kEvery).
    const size_t k = std::min(unchanged / kEvery, last->snapshots.size() - 1);
    from = last->snapshots[k];
    next->snapshots.assign(last->snapshots.begin(), last->snapshots.begin() + static_cast<std::ptrdiff_t>(k));
    std::copy(last->result.tasks.begin(), last->result.tasks.begin() + static_cast<std::ptrdiff_t>(from.next),
              r.tasks.begin());
  }
  rescheduled_ = static_cast<int64_t>(g.tasks.size() - from.next);
  Schedule(next->steps, g.devices, from, &r, &next->snapshots);
  AddMemory(g, machine_, r);
  next->result = r;
  state_ = std::move(next);
  return r;
}

std::string SimulationTraceJson(const TaskGraph& g, const Machine& m, const SimulationResult& r) {
  std::map<int64_t, int64_t> rows;  // link resource -> row
  int64_t next_row = g.devices;
  for (size_t q = 0; q < r.resource_bytes.size(); ++q)
    if (r.resource_bytes[q] > 0) rows[static_cast<int64_t>(q)] = next_row++;
  ChromeTrace trace;
  for (int64_t d = 0; d < g.devices; ++d) trace.NameRow(d, StrCat("device ", d));
  for (const auto& [resource, row] : rows) trace.NameRow(row, "link " + m.ResourceName(resource));
  for (const Task& t : g.tasks) {
    const SimulatedTask& span = r.tasks[static_cast<size_t>(t.id)];
    if (span.row < 0) continue;
    trace.Span(span.row < g.devices ? span.row : rows.at(span.row - g.devices), t.name, TaskKindName(t.kind),
               span.start, span.end);
  }
  return trace.Json();
}

}  // namespace loom
