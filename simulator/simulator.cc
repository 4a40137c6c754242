#include "simulator/simulator.h"

#include <algorithm>
#include <map>

#include "core/chrome_trace.h"
#include "simulator/collectives.h"

namespace loom {
namespace {

// What scheduling needs of each task, flat (a few vectors for the whole
// graph instead of some per task, which made malloc the simulator's main
// cost): its seconds, the queues it holds (devices [0, D), then the
// machine's link resources) and the bytes it puts on link resources.
struct Steps {
  std::vector<double> seconds;
  std::vector<uint32_t> queue_end;  // task i holds queues[queue_end[i - 1], queue_end[i])
  std::vector<int32_t> queues;
  std::vector<uint32_t> traffic_end;  // likewise into traffic
  std::vector<LinkTraffic> traffic;

  size_t size() const { return seconds.size(); }
  static uint32_t Begin(const std::vector<uint32_t>& ends, size_t i) { return i ? ends[i - 1] : 0; }
  void Reserve(size_t tasks) {
    seconds.reserve(tasks);
    queue_end.reserve(tasks);
    traffic_end.reserve(tasks);
    queues.reserve(tasks + tasks / 4);
  }
  // Ends the step being appended.
  void Close(double s) {
    seconds.push_back(s);
    queue_end.push_back(static_cast<uint32_t>(queues.size()));
    traffic_end.push_back(static_cast<uint32_t>(traffic.size()));
  }
  // Appends steps [begin, end) of `from`.
  void Append(const Steps& from, size_t begin, size_t end) {
    AppendRange(from.queue_end, from.queues, begin, end, &queue_end, &queues);
    AppendRange(from.traffic_end, from.traffic, begin, end, &traffic_end, &traffic);
    seconds.insert(seconds.end(), from.seconds.begin() + static_cast<std::ptrdiff_t>(begin),
                   from.seconds.begin() + static_cast<std::ptrdiff_t>(end));
  }
  // Moves the steps from `begin` on to the empty `tail`.
  void MoveTail(size_t begin, Steps* tail) {
    tail->Append(*this, begin, size());
    Truncate(begin);
  }
  // Keeps the first `tasks` steps.
  void Truncate(size_t tasks) {
    queues.resize(Begin(queue_end, tasks));
    traffic.resize(Begin(traffic_end, tasks));
    seconds.resize(tasks);
    queue_end.resize(tasks);
    traffic_end.resize(tasks);
  }

 private:
  // One of the flat lists: the items of steps [begin, end), and their ends
  // moved to where the items land.
  template <typename T>
  static void AppendRange(const std::vector<uint32_t>& from_end, const std::vector<T>& from_items, size_t begin,
                          size_t end, std::vector<uint32_t>* to_end, std::vector<T>* to_items) {
    if (begin == end) return;
    const uint32_t first = Begin(from_end, begin), last = from_end[end - 1];
    const uint32_t shift = static_cast<uint32_t>(to_items->size()) - first;  // (modulo 2^32: may be negative)
    to_items->insert(to_items->end(), from_items.begin() + first, from_items.begin() + last);
    const size_t at = to_end->size();
    to_end->resize(at + (end - begin));
    uint32_t* out = to_end->data() + at;
    const uint32_t* in = from_end.data() + begin;
    for (size_t i = 0; i < end - begin; ++i) out[i] = in[i] + shift;
  }
};

class Scheduler {
 public:
  Scheduler(const TaskGraph& g, const Machine& m, const CostModel& cost)
      : g_(g), m_(m), cost_(cost), copies_on_device_(m.device().copies_on_device()) {}

  // Appends task t's step.
  void Append(const Task& t, Steps* s) {
    switch (t.kind) {
      case TaskKind::kCompute:
        s->queues.push_back(static_cast<int32_t>(t.device));
        return s->Close(cost_.ComputeSeconds(g_, t));
      case TaskKind::kTransfer: {
        const Machine::Route route = m_.RouteOf(t.src_device, t.device);
        if (copies_on_device_) {
          s->queues.push_back(static_cast<int32_t>(t.device));
          if (m_.NodeOf(t.src_device) != m_.NodeOf(t.device)) HoldProcesses({t.device, t.src_device}, s);
        }
        for (int64_t r : route) {
          if (!copies_on_device_) s->queues.push_back(static_cast<int32_t>(g_.devices + r));
          s->traffic.push_back({r, t.bytes});
        }
        const std::optional<double> measured = cost_.CommunicationSeconds(g_, t);
        return s->Close(measured ? *measured : Machine::MessageSeconds(route, t.bytes));
      }
      case TaskKind::kAllReduce:
      case TaskKind::kAllGather:
      case TaskKind::kReduceScatter:
      case TaskKind::kAllToAll: {
        double seconds = 0;
        if (copies_on_device_ || t.group.size() == 1) {  // (one device: a sum of what transfers brought)
          seconds = RootCollective(t, s);
        } else if (t.kind == TaskKind::kAllToAll) {
          seconds = AllToAllSeconds(t, s);
        } else {
          auto model = collectives_.find(t.group);
          if (model == collectives_.end()) model = collectives_.emplace(t.group, CollectiveModel(m_, t.group)).first;
          const size_t first = s->traffic.size();
          const CollectiveModel& c = model->second;
          seconds = (t.kind == TaskKind::kAllReduce   ? c.AllReduce(t.bytes, &s->traffic)
                     : t.kind == TaskKind::kAllGather ? c.AllGather(t.bytes, &s->traffic)
                                                      : c.ReduceScatter(t.bytes, &s->traffic))
                        .seconds;
          // It holds every link resource it crosses (Cost names each once).
          for (size_t i = first; i < s->traffic.size(); ++i)
            s->queues.push_back(static_cast<int32_t>(g_.devices + s->traffic[i].resource));
        }
        const std::optional<double> measured = cost_.CommunicationSeconds(g_, t);
        return s->Close(measured ? *measured : seconds);
      }
    }
  }

 private:
  // An all-to-all among devices with copy engines: every member's messages
  // at once (NCCL's grouped sends and receives), for the slowest one's
  // latency plus the busiest link resource's load over its bandwidth; it
  // holds every resource it crosses.
  double AllToAllSeconds(const Task& t, Steps* s) const {
    const size_t first = s->traffic.size();
    double latency = 0;
    for (int out : t.outputs)
      for (int src : t.sources) {
        const Piece& from = g_.pieces[static_cast<size_t>(src)];
        const Piece& to = g_.pieces[static_cast<size_t>(out)];
        const double bytes = AllToAllMessageBytes(from, to);
        if (bytes == 0) continue;
        const Machine::Route route = m_.RouteOf(from.device, to.device);
        latency = std::max(latency, route.link->latency_s());
        for (int64_t r : route) s->traffic.push_back({r, bytes});
      }
    // One entry per resource, its load summed.
    std::sort(s->traffic.begin() + static_cast<std::ptrdiff_t>(first), s->traffic.end(),
              [](const LinkTraffic& a, const LinkTraffic& b) { return a.resource < b.resource; });
    size_t kept = first;
    for (size_t i = first; i < s->traffic.size(); ++i) {
      if (kept > first && s->traffic[kept - 1].resource == s->traffic[i].resource) {
        s->traffic[kept - 1].bytes += s->traffic[i].bytes;
      } else {
        s->traffic[kept++] = s->traffic[i];
      }
    }
    s->traffic.resize(kept);
    double busiest = 0;
    for (size_t i = first; i < kept; ++i) {
      busiest = std::max(busiest, s->traffic[i].bytes / m_.LinkOf(s->traffic[i].resource).bandwidth());
      s->queues.push_back(static_cast<int32_t>(g_.devices + s->traffic[i].resource));
    }
    return latency + busiest;
  }

  // The task runtime's collectives, on the first member's queue: it
  // receives the pieces it does not hold, adds them (all-reduce,
  // reduce-scatter) or copies them into place (all-gather, all-to-all), and
  // hands every member its copy or part. Returns its seconds.
  double RootCollective(const Task& t, Steps* s) const {
    s->queues.push_back(static_cast<int32_t>(t.device));
    if (copies_on_device_ && m_.proto().nodes() > 1) {
      // Each other process holding a member runs its half on its first
      // such device (sources, then outputs: the runtime's RunnerOf).
      std::vector<int64_t> runners{t.device};
      for (const IdList* list : {&t.sources, &t.outputs})
        for (int p : *list) {
          const int64_t d = g_.pieces[static_cast<size_t>(p)].device;
          bool seen = false;
          for (int64_t r : runners) seen = seen || m_.NodeOf(r) == m_.NodeOf(d);
          if (!seen) runners.push_back(d);
        }
      if (runners.size() > 1) HoldProcesses(runners, s);
    }
    const double bytes = t.bytes, memory = m_.device().memory_bandwidth();
    auto message = [&](int64_t src, int64_t dst, double size) {
      const Machine::Route route = m_.RouteOf(src, dst);
      for (int64_t r : route) s->traffic.push_back({r, size});
      return Machine::MessageSeconds(route, size);
    };
    const bool sum = t.kind == TaskKind::kAllReduce || t.kind == TaskKind::kReduceScatter;
    double seconds = 0;
    for (int p : t.sources) {
      const Piece& piece = g_.pieces[static_cast<size_t>(p)];
      const double size = sum ? bytes : piece.bytes;  // a partial sum of the region, or a part of it
      if (piece.device != t.device) seconds += message(piece.device, t.device, size);
      if (!sum) seconds += 2 * size / memory;  // copied into the region
    }
    if (sum) seconds += static_cast<double>(t.sources.size() - 1) * 3 * bytes / memory;  // read two, write one
    for (int p : t.outputs) {
      const Piece& out = g_.pieces[static_cast<size_t>(p)];
      seconds += out.device == t.device ? 2 * out.bytes / memory : message(t.device, out.device, out.bytes);
    }
    return seconds;
  }

  // A message between processes (nodes of a machine whose devices make
  // their own copies): each process joining it runs its half on one device
  // (`runners`, the first already held), and sends and receives one message
  // at a time in the graph's order (the runtime's message turns), which the
  // process's link out stands for.
  void HoldProcesses(const std::vector<int64_t>& runners, Steps* s) const {
    for (size_t i = 1; i < runners.size(); ++i) s->queues.push_back(static_cast<int32_t>(runners[i]));
    for (int64_t r : runners) s->queues.push_back(static_cast<int32_t>(g_.devices + m_.LinkOut(m_.NodeOf(r))));
  }

  const TaskGraph& g_;
  const Machine& m_;
  const CostModel& cost_;
  const bool copies_on_device_;
  std::map<std::vector<int64_t>, CollectiveModel> collectives_;  // by group
};

Steps StepsOf(const TaskGraph& g, const Machine& m, const CostModel& cost) {
  Scheduler scheduler(g, m, cost);
  Steps steps;
  steps.Reserve(g.tasks.size());
  for (const Task& t : g.tasks) scheduler.Append(t, &steps);
  return steps;
}

// The schedule's running state after a prefix of the tasks: what a delta
// simulation restarts from.
struct Snapshot {
  size_t next = 0;  // tasks scheduled so far
  std::vector<double> free, busy, resource_bytes;
  double iteration = 0;
};

Snapshot Empty(int64_t devices, int64_t resources) {
  Snapshot s;
  s.free.assign(static_cast<size_t>(devices + resources), 0.0);
  s.busy.assign(static_cast<size_t>(devices), 0.0);
  s.resource_bytes.assign(static_cast<size_t>(resources), 0.0);
  return s;
}

// Snapshots every kEvery tasks (the k-th at task k kEvery), in one flat
// array: taking one copies a few dozen numbers and allocates nothing.
constexpr size_t kEvery = 64;
class Snapshots {
 public:
  size_t size() const { return width_ ? data_.size() / width_ : 0; }
  void Truncate(size_t k) { data_.resize(std::min(k, size()) * width_); }
  void Push(const Snapshot& s) {
    width_ = s.free.size() + s.busy.size() + s.resource_bytes.size() + 1;
    data_.insert(data_.end(), s.free.begin(), s.free.end());
    data_.insert(data_.end(), s.busy.begin(), s.busy.end());
    data_.insert(data_.end(), s.resource_bytes.begin(), s.resource_bytes.end());
    data_.push_back(s.iteration);
  }
  // The k-th, into `s` (shaped as the snapshots were).
  void Get(size_t k, Snapshot* s) const {
    auto at = data_.begin() + static_cast<std::ptrdiff_t>(k * width_);
    for (std::vector<double>* v : {&s->free, &s->busy, &s->resource_bytes}) {
      std::copy(at, at + static_cast<std::ptrdiff_t>(v->size()), v->begin());
      at += static_cast<std::ptrdiff_t>(v->size());
    }
    s->iteration = *at;
    s->next = k * kEvery;
  }

 private:
  size_t width_ = 0;
  std::vector<double> data_;
};

// Schedules tasks from.next ... after the state `from` into `r` (whose
// tasks before from.next are already set), snapshotting at every kEvery-th
// task when `snapshots` is given.
void Schedule(const TaskGraph& g, const Machine& m, const Steps& steps, Snapshot from, SimulationResult* r,
              Snapshots* snapshots) {
  const int64_t devices = g.devices;
  const double wake = m.device().dependency_latency_s();
  double* free = from.free.data();
  SimulatedTask* tasks = r->tasks.data();
  for (size_t i = from.next; i < steps.size(); ++i) {
    if (snapshots && i % kEvery == 0) {
      from.next = i;
      snapshots->Push(from);
    }
    const uint32_t q0 = Steps::Begin(steps.queue_end, i), q1 = steps.queue_end[i];
    const int64_t row = q0 < q1 ? steps.queues[q0] : -1;
    double start = 0;
    for (uint32_t k = Steps::Begin(g.dependency_end, i); k < g.dependency_end[i]; ++k) {
      const SimulatedTask& dep = tasks[g.dependencies[k]];
      start = std::max(start, dep.end + (dep.row != row ? wake : 0.0));  // another queue's: a wake-up
    }
    for (uint32_t q = q0; q < q1; ++q) start = std::max(start, free[steps.queues[q]]);
    const double seconds = steps.seconds[i], end = start + seconds;
    for (uint32_t q = q0; q < q1; ++q) {
      const int32_t queue = steps.queues[q];
      free[queue] = end;
      if (queue < devices) from.busy[static_cast<size_t>(queue)] += seconds;
    }
    for (uint32_t k = Steps::Begin(steps.traffic_end, i); k < steps.traffic_end[i]; ++k)
      from.resource_bytes[static_cast<size_t>(steps.traffic[k].resource)] += steps.traffic[k].bytes;
    tasks[i] = {start, end, q0 == q1 ? -1 : steps.queues[q0]};
    from.iteration = std::max(from.iteration, end);
  }
  r->iteration_seconds = from.iteration;
  r->device_busy_seconds = std::move(from.busy);
  r->resource_bytes = std::move(from.resource_bytes);
}

// Memory of the scheduled step: each piece is held from its writer's start
// (homes: all step) to its last reader's end (writebacks and outputs read
// at the step's end). The peak per device needs its events in time order
// (a sort, the costliest part of a simulation), so it is computed when
// asked for or when the bound (every piece of the device held all step)
// does not fit.
void AddMemory(const TaskGraph& g, const Machine& m, bool peak_wanted, SimulationResult& r) {
  const size_t devices = static_cast<size_t>(g.devices);
  const double memory = m.device().memory_bytes();
  std::vector<bool> sweep(devices, peak_wanted);
  bool any = peak_wanted;
  for (size_t d = 0; d < devices; ++d)
    if (g.piece_bytes[d] > memory) any = sweep[d] = true;
  r.fits = true;
  if (!any) return;

  // A piece is held from its producer's start (a home piece: all step) to
  // the end of its last reader, or of its producer when none reads it.
  std::vector<double> held_until(g.pieces.size(), 0.0);  // its readers' last end
  auto read_by = [&](int p, double until) {
    held_until[static_cast<size_t>(p)] = std::max(held_until[static_cast<size_t>(p)], until);
  };
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
    const Piece& piece = g.pieces[p];
    const size_t d = static_cast<size_t>(piece.device);
    if (!sweep[d]) continue;
    const SimulatedTask* producer = piece.producer < 0 ? nullptr : &r.tasks[static_cast<size_t>(piece.producer)];
    events[d].push_back({producer ? producer->start : 0.0, piece.bytes});
    events[d].push_back({std::max(held_until[p], producer ? producer->end : r.iteration_seconds), -piece.bytes});
  }
  if (peak_wanted) r.peak_memory_bytes.assign(devices, 0.0);
  for (size_t d = 0; d < devices; ++d) {
    if (!sweep[d]) continue;
    std::sort(events[d].begin(), events[d].end());
    double now = 0, peak = 0;
    for (const auto& [time, change] : events[d]) peak = std::max(peak, now += change);
    if (peak_wanted) r.peak_memory_bytes[d] = peak;
    if (peak > memory) r.fits = false;
  }
}

// What a step costs beyond its tasks: the runtime's overhead, and the
// copies of the inputs' slices it feeds before the first task starts.
double StepExtraSeconds(const TaskGraph& g, const Machine& m) {
  double seconds = m.proto().step_overhead_s();
  if (!m.proto().copies_feeds()) return seconds;
  for (const auto& [value, homes] : g.homes) {
    if (g.graph.node(g.graph.value(value).producer).op != kInputOp) continue;
    const double whole = static_cast<double>(g.graph.type(value).shape.numel() *
                                             static_cast<int64_t>(DTypeSize(g.graph.type(value).dtype)));
    for (int h : homes)
      if (g.pieces[static_cast<size_t>(h)].bytes < whole)  // a slice: copied (read and write)
        seconds += 2 * g.pieces[static_cast<size_t>(h)].bytes / m.device().memory_bandwidth();
  }
  return seconds;
}

Status CheckDevices(const TaskGraph& g, const Machine& m) {
  if (g.dependency_end.size() != g.tasks.size() || g.fingerprints.size() != g.tasks.size() ||
      g.cost_keys.size() != g.tasks.size())
    return InvalidArgument("a task graph without the lowering's arrays (dependencies, fingerprints, cost keys)");
  if (g.devices > m.devices())
    return InvalidArgument("the task graph has ", g.devices, " devices, machine ", m.name(), " has ", m.devices());
  return Status::Ok();
}

}  // namespace

LoweringOptions LoweringFor(const Machine& machine) {
  LoweringOptions options;
  options.collective_min_group = machine.device().copies_on_device() ? 0 : 3;
  return options;
}

StatusOr<SimulationResult> Simulate(const TaskGraph& g, const Machine& m, const CostModel& cost,
                                    const SimulateOptions& options) {
  LOOM_RETURN_IF_ERROR(CheckDevices(g, m));
  SimulationResult r;
  r.tasks.resize(g.tasks.size());
  Schedule(g, m, StepsOf(g, m, cost), Empty(g.devices, m.resources()), &r, nullptr);
  r.iteration_seconds += StepExtraSeconds(g, m);
  AddMemory(g, m, options.peak_memory, r);
  return r;
}

// The last graph's schedule, kept and changed in place.
struct DeltaSimulator::State {
  int64_t devices = 0;
  std::vector<uint64_t> keys;       // the last graph's TaskGraph::fingerprints
  std::vector<uint64_t> cost_keys;  // and its TaskGraph::cost_keys
  Steps steps;
  Snapshots snapshots;
  SimulationResult result;
};

DeltaSimulator::DeltaSimulator(const Machine& machine, const CostModel& cost, const SimulateOptions& options)
    : machine_(machine), cost_(cost), options_(options), state_(std::make_unique<State>()) {}
DeltaSimulator::~DeltaSimulator() = default;

StatusOr<const SimulationResult*> DeltaSimulator::Simulate(const TaskGraph& g) {
  LOOM_RETURN_IF_ERROR(CheckDevices(g, machine_));
  State& s = *state_;
  if (s.devices != g.devices) {
    s.keys.clear();  // nothing to keep
    s.cost_keys.clear();
    s.snapshots.Truncate(0);
    s.devices = g.devices;
  }
  // The schedule stands up to the first task that differs, and is taken up
  // again from the last snapshot before it.
  const size_t n = g.tasks.size();
  const size_t common = std::min(n, s.keys.size());
  size_t unchanged = 0;
  while (unchanged < common && s.keys[unchanged] == g.fingerprints[unchanged]) ++unchanged;
  Snapshot from = Empty(g.devices, machine_.resources());
  if (s.snapshots.size() > 0) {
    const size_t k = std::min(unchanged / kEvery, s.snapshots.size() - 1);
    s.snapshots.Get(k, &from);
    s.snapshots.Truncate(k);
  }
  const size_t restart = from.next;
  // The steps from there on: a task with the cost key of one of the last
  // graph's from there on takes its step (a change adds and drops tasks but
  // keeps the others in order, so the match is looked for a window ahead
  // of the last one; after a run of misses, only now and then), the rest
  // are costed.
  Steps tail;
  s.steps.MoveTail(restart, &tail);
  s.steps.Reserve(n);
  Scheduler scheduler(g, machine_, cost_);
  constexpr size_t kWindow = 1024, kMisses = 64;
  const size_t last_n = s.cost_keys.size();
  size_t j = restart, misses = 0;
  size_t run_begin = 0, run_end = 0;  // a run of the last graph's steps (of `tail`) not yet appended
  costed_ = 0;
  for (size_t i = restart; i < n; ++i) {
    size_t match = last_n;
    if (misses < kMisses || i % kMisses == 0)
      for (size_t k = j, end = std::min(last_n, j + kWindow); k < end; ++k)
        if (s.cost_keys[k] == g.cost_keys[i]) {
          match = k;
          break;
        }
    if (match < last_n) {
      if (match - restart != run_end) {
        s.steps.Append(tail, run_begin, run_end);
        run_begin = match - restart;
      }
      run_end = match - restart + 1;
      j = match + 1;
      misses = 0;
    } else {
      s.steps.Append(tail, run_begin, run_end);
      run_begin = run_end = 0;
      scheduler.Append(g.tasks[i], &s.steps);
      ++costed_;
      ++misses;
    }
  }
  s.steps.Append(tail, run_begin, run_end);
  s.keys = g.fingerprints;
  s.cost_keys = g.cost_keys;
  s.result.tasks.resize(n);
  s.result.peak_memory_bytes.clear();
  rescheduled_ = static_cast<int64_t>(n - restart);
  Schedule(g, machine_, s.steps, std::move(from), &s.result, &s.snapshots);
  s.result.iteration_seconds += StepExtraSeconds(g, machine_);
  AddMemory(g, machine_, options_.peak_memory, s.result);
  return &s.result;
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
