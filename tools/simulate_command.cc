// `loom simulate --config C --machine M [--strategy S] [--devices N]
// [--trace F] [--json F]`: the predicted training step of a config's model
// on a machine (simulator/simulator.h, docs/simulator.md) under a standard
// strategy or a strategy file.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <google/protobuf/text_format.h>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "core/file_util.h"
#include "core/parse.h"
#include "graph/strategy.h"
#include "graph/task_graph.h"
#include "search/baselines.h"
#include "search/space.h"
#include "runtime/task_runtime.h"
#include "simulator/profile.h"
#include "simulator/simulator.h"
#include "tools/bench_data.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/config/train_config.h"

namespace loom::tools {

FlagCostModel::FlagCostModel(const std::string& path, Profile profile, const Machine& machine)
    : path_(path),
      profile_(std::move(profile)),
      analytical_(machine),
      calibrated_(machine, profile_.WorkSamples()),
      profiled_(profile_, calibrated_) {}

StatusOr<std::unique_ptr<FlagCostModel>> FlagCostModel::Load(const std::string& profile_path,
                                                            const Machine& machine) {
  Profile profile;
  if (!profile_path.empty()) {
    LOOM_ASSIGN_OR_RETURN(profile, Profile::Load(profile_path));
  }
  return std::unique_ptr<FlagCostModel>(new FlagCostModel(profile_path, std::move(profile), machine));
}

const CostModel& FlagCostModel::get() const {
  return path_.empty() ? static_cast<const CostModel&>(analytical_) : profiled_;
}

std::string FlagCostModel::Describe() const {
  if (path_.empty()) return "the analytical roofline";
  return StrCat("profile ", path_, ": ", profiled_.hits(), " tasks measured, ", profiled_.misses(),
                " by the roofline calibrated on it");
}

Status SimulateCommand(const std::vector<std::string>& args) {
  Flags flags({{"config", "the training config whose step to predict"},
               {"machine", "a machine file (simulator/machines/*.pbtxt)"},
               {"strategy", "dp (default), replica, model, owt, or a strategy file"},
               {"devices", "the devices the strategy uses (default: the machine's; a strategy file says its own)"},
               {"profile", "this machine's measured task times (loom profile) for the tasks they cover; the roofline "
                           "calibrated on them for the rest"},
               {"trace", "write the predicted step as Chrome trace JSON (the task runtime's --trace layout)"},
               {"json", "write the prediction as JSON"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom simulate --config FILE --machine FILE [flags]\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  if (!flags.Has("config")) return InvalidArgument("loom simulate needs --config FILE");
  if (!flags.Has("machine")) return InvalidArgument("loom simulate needs --machine FILE (e.g. simulator/machines/h200_8_nvswitch.pbtxt)");
  LOOM_ASSIGN_OR_RETURN(const Machine machine, Machine::Load(flags.Str("machine", "")));
  LOOM_ASSIGN_OR_RETURN(const proto::TrainConfig config, LoadTrainConfig(flags.Str("config", "")));
  const std::string name = flags.Str("strategy", "dp");
  // A strategy file says its devices; a standard one takes the machine's.
  int64_t file_devices = 0;
  if (!flags.Has("devices") && !ParseStandardStrategy(name).ok() && std::filesystem::exists(name)) {
    LOOM_ASSIGN_OR_RETURN(const Strategy file, Strategy::Load(name));
    file_devices = file.devices();
  }
  LOOM_ASSIGN_OR_RETURN(const int64_t devices, flags.Int("devices", file_devices > 0 ? file_devices : machine.devices()));
  if (devices < 1 || devices > machine.devices())
    return InvalidArgument("--devices ", devices, ": machine ", machine.name(), " has ", machine.devices(), " devices");
  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  LOOM_ASSIGN_OR_RETURN(const Strategy strategy, LoadOrMakeStrategy(name, programs.forward, devices, "--strategy"));
  LOOM_ASSIGN_OR_RETURN(const TaskGraph tasks,
                        LowerToTaskGraph(programs.step, strategy, programs.forward, LoweringFor(machine)));
  LOOM_ASSIGN_OR_RETURN(const std::unique_ptr<FlagCostModel> cost,
                        FlagCostModel::Load(flags.Str("profile", ""), machine));
  LOOM_ASSIGN_OR_RETURN(const SimulationResult r, Simulate(tasks, machine, cost->get()));

  const std::string model = cost->Describe();
  std::printf("%s on %s (%s x %lld), strategy %s: %zu tasks, costs from %s\n", flags.Str("config", "").c_str(),
              machine.name().c_str(), machine.device().kind().c_str(), static_cast<long long>(strategy.devices()),
              name.c_str(), tasks.tasks.size(), model.c_str());
  std::printf("iteration: %.6g ms%s\n", r.iteration_seconds * 1e3,
              r.fits ? "" : "  (does NOT fit: a device's peak memory exceeds its memory)");
  std::printf("%8s %12s %8s %14s\n", "device", "busy ms", "busy", "peak MiB");
  for (int64_t d = 0; d < tasks.devices; ++d) {
    const double busy = r.device_busy_seconds[static_cast<size_t>(d)];
    std::printf("%8lld %12.4f %7.1f%% %14.2f\n", static_cast<long long>(d), busy * 1e3,
                r.iteration_seconds > 0 ? 100 * busy / r.iteration_seconds : 0.0,
                r.peak_memory_bytes[static_cast<size_t>(d)] / (1 << 20));
  }
  double moved = 0;
  for (size_t q = 0; q < r.resource_bytes.size(); ++q) {
    if (r.resource_bytes[q] == 0) continue;
    moved += r.resource_bytes[q];
    std::printf("link %-14s %14.0f bytes\n", machine.ResourceName(static_cast<int64_t>(q)).c_str(),
                r.resource_bytes[q]);
  }
  std::printf("bytes on links: %.0f (task graph: %.0f moved)\n", moved, tasks.TransferBytes());

  if (flags.Has("trace")) {
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(flags.Str("trace", ""), SimulationTraceJson(tasks, machine, r)));
    std::printf("trace: %s\n", flags.Str("trace", "").c_str());
  }
  if (flags.Has("json")) {
    std::ostringstream json;
    json.precision(17);  // seconds and bytes as computed
    json << "{\"machine\": " << JsonQuoted(machine.name()) << ", \"strategy\": " << JsonQuoted(name)
         << ", \"devices\": " << tasks.devices << ", \"iteration_s\": " << r.iteration_seconds
         << ", \"fits\": " << (r.fits ? "true" : "false") << ", \"device_busy_s\": [";
    for (int64_t d = 0; d < tasks.devices; ++d) json << (d ? ", " : "") << r.device_busy_seconds[static_cast<size_t>(d)];
    json << "], \"peak_memory_bytes\": [";
    for (int64_t d = 0; d < tasks.devices; ++d) json << (d ? ", " : "") << r.peak_memory_bytes[static_cast<size_t>(d)];
    json << "], \"link_bytes\": {";
    bool first = true;
    for (size_t q = 0; q < r.resource_bytes.size(); ++q) {
      if (r.resource_bytes[q] == 0) continue;
      json << (first ? "" : ", ") << JsonQuoted(machine.ResourceName(static_cast<int64_t>(q))) << ": "
           << r.resource_bytes[q];
      first = false;
    }
    json << "}}\n";
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(flags.Str("json", ""), json.str()));
    std::printf("json: %s\n", flags.Str("json", "").c_str());
  }
  return Status::Ok();
}

// A device per core (or per device asked for), one thread each: Eigen's
// one-thread GEMM rates as the peaks, memcpy for the copies and twice its
// rate (read and write) as the memory bandwidth, the runtime's cost per
// task as the launch overhead, its wake-up of another device's thread as
// the dependency latency, its cost of a step beyond the tasks as the step
// overhead; devices make their own copies, the runtime copies the feeds.
StatusOr<Machine> ProbeCpuMachine(int reps, int64_t devices) {
  proto::Machine m;
  m.set_name("cpu_local");
  m.set_nodes(1);
  m.set_devices_per_node(std::max<int64_t>({1, devices, std::thread::hardware_concurrency()}));
  proto::DeviceSpec* d = m.mutable_device();
  d->set_kind("cpu");
  d->set_peak_flops_f32(EigenGemmFlops<float>(reps));
  d->set_peak_flops_f64(EigenGemmFlops<double>(reps));
  const double copy = MemcpyBytesPerSecond(reps);
  d->set_memory_bandwidth(2 * copy);
  d->set_memory_bytes(static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)));
  LOOM_ASSIGN_OR_RETURN(const TaskOverhead overhead, MeasureTaskOverhead(reps));
  d->set_launch_overhead_s(overhead.runtime_s);
  d->set_copies_on_device(true);
  d->set_dependency_latency_s(overhead.wake_s);
  m.set_step_overhead_s(overhead.step_s);
  m.set_copies_feeds(true);
  m.mutable_intra_node()->set_latency_s(overhead.runtime_s);
  m.mutable_intra_node()->set_bandwidth(copy);
  return Machine::FromProto(m, "the probe");
}

namespace {

std::string MachineText(const Machine& machine) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(machine.proto(), &text);
  return StrCat("# Measured by `loom machine probe` on ", CpuModelName(), " (", machine.devices(),
                " cores): peaks are Eigen's one-thread GEMM, bandwidths memcpy's, the launch\n"
                "# overhead the task runtime's cost per task, the dependency latency its wake-up of another "
                "device's thread,\n# the step overhead its cost of a step beyond the tasks.",
                machine.proto().nodes() > 1 ? StrCat(" Under mpirun: a node per process (each probed as they ran "
                                                     "together), the\n# inter-node link their messages' ping-pong.\n")
                                            : std::string("\n"),
                text);
}

double Quantile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  return x[static_cast<size_t>(q * static_cast<double>(x.size() - 1) + 0.5)];
}

// Kendall's tau-a of two orders of the same items.
double KendallTau(const std::vector<double>& a, const std::vector<double>& b) {
  double concordant = 0, discordant = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = i + 1; j < a.size(); ++j) {
      const double s = (a[i] - a[j]) * (b[i] - b[j]);
      if (s > 0) ++concordant;
      if (s < 0) ++discordant;
    }
  const double pairs = static_cast<double>(a.size() * (a.size() - 1) / 2);
  return pairs > 0 ? (concordant - discordant) / pairs : 1.0;
}

}  // namespace

// `loom profile`: every compute task's time in traced steps of the task
// runtime, by signature, written as a profile file (simulator/profile.h).
Status ProfileCommand(const std::vector<std::string>& args) {
  Flags flags({{"config", "the training config whose step to profile"},
               {"devices", "CPU devices of the task runtime (default 1), one thread each; or a list: cuda:0x2"},
               {"strategy", "dp (default), replica, model, owt, or a strategy file"},
               {"steps", "traced steps after a warm-up (default 10)"},
               {"out", "the profile file to write"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom profile --config FILE --out FILE [flags]\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  if (!flags.Has("config")) return InvalidArgument("loom profile needs --config FILE");
  if (!flags.Has("out")) return InvalidArgument("loom profile needs --out FILE (the profile to write)");
  LOOM_ASSIGN_OR_RETURN(const proto::TrainConfig config, LoadTrainConfig(flags.Str("config", "")));
  LOOM_ASSIGN_OR_RETURN(const std::vector<Device> device_list, flags.Devices("devices", 1));
  const int64_t devices = static_cast<int64_t>(device_list.size());
  LOOM_ASSIGN_OR_RETURN(const int64_t steps, flags.Int("steps", 10));
  if (steps < 1) return InvalidArgument("--steps must be >= 1");
  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  const std::string name = flags.Str("strategy", "dp");
  LOOM_ASSIGN_OR_RETURN(const Strategy strategy, LoadOrMakeStrategy(name, programs.forward, devices, "--strategy"));
  LOOM_ASSIGN_OR_RETURN(const TaskGraph tasks, LowerToTaskGraph(programs.step, strategy, programs.forward));
  TaskRuntimeOptions o;
  o.trace = true;  // on a GPU each task waits for its work, so its span is the work's time
  o.devices = device_list;
  LOOM_ASSIGN_OR_RETURN(auto runtime, TaskRuntime::Create(tasks, o));
  LOOM_RETURN_IF_ERROR(runtime->InitializeState(config.seed()));
  LOOM_ASSIGN_OR_RETURN(const BenchData data, LoadBenchData(config));
  const std::map<std::string, Tensor> feeds = RandomFeeds(programs.step, data.feeds);
  LOOM_RETURN_IF_ERROR(runtime->Run(feeds).status());  // warm-up
  Profile profile;
  for (int64_t step = 0; step < steps; ++step) {
    LOOM_RETURN_IF_ERROR(runtime->Run(feeds).status());
    for (const TaskSpan& span : runtime->trace()) {
      const Task& t = tasks.tasks[static_cast<size_t>(span.task)];
      profile.AddTask(tasks, t, span.end - span.start);
    }
  }
  LOOM_RETURN_IF_ERROR(WriteFileAtomically(flags.Str("out", ""), profile.ToText()));
  std::printf("%zu task signatures from %lld steps of %s on %s (%s): %s\n", profile.size(),
              static_cast<long long>(steps), name.c_str(),
              device_list[0].is_cuda() ? flags.Str("devices", "").c_str() : StrCat("cpu:", devices).c_str(),
              device_list[0].is_cuda() ? "GPU" : CpuModelName().c_str(), flags.Str("out", "").c_str());
  return Status::Ok();
}

namespace {

// Under mpirun: ranks 0 and 1 time ping-pongs of a small message (the
// latency) and a large one (the bandwidth, past the latency); the other
// ranks wait. Every rank returns the link.
StatusOr<proto::LinkSpec> MeasureMessages(Communicator& world, int reps) {
  auto half_round_trip = [&](int64_t floats) -> StatusOr<double> {
    Tensor message = Tensor::Zeros(Shape({floats}), DType::kF32);
    std::vector<double> times;
    for (int r = 0; r < reps + 1; ++r) {  // (the first a warm-up)
      const auto start = std::chrono::steady_clock::now();
      if (world.rank() == 0) {
        LOOM_RETURN_IF_ERROR(world.Send(message, 1));
        LOOM_RETURN_IF_ERROR(world.Recv(message, 1));
      } else if (world.rank() == 1) {
        LOOM_RETURN_IF_ERROR(world.Recv(message, 0));
        LOOM_RETURN_IF_ERROR(world.Send(message, 0));
      }
      if (r > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 2);
    }
    std::sort(times.begin(), times.end());
    Tensor t = Tensor::FromVector(Shape({1}), std::vector<double>{times[times.size() / 2]});
    LOOM_RETURN_IF_ERROR(world.Broadcast(t, 0));  // rank 0's time for every rank
    return t.data<double>()[0];
  };
  constexpr int64_t kLarge = 4 << 20;  // 16 MiB
  LOOM_ASSIGN_OR_RETURN(const double latency, half_round_trip(1));
  LOOM_ASSIGN_OR_RETURN(const double large, half_round_trip(kLarge));
  proto::LinkSpec link;
  link.set_latency_s(latency);
  link.set_bandwidth(static_cast<double>(kLarge * 4) / std::max(large - latency, 1e-9));
  return link;
}

}  // namespace

// Under mpirun every process probes its device at once (as they run
// together: a waiting process would poll for messages on a core the probe
// may share).
StatusOr<Machine> ProbeMachine(int reps, Communicator* world, int64_t devices) {
  LOOM_ASSIGN_OR_RETURN(const Machine machine, ProbeCpuMachine(reps, world == nullptr ? devices : 0));
  if (world == nullptr) return machine;
  LOOM_ASSIGN_OR_RETURN(const proto::LinkSpec link, MeasureMessages(*world, 5 * reps));
  proto::Machine m = machine.proto();
  m.set_name(StrCat(m.name(), "_np", world->size()));
  m.set_nodes(world->size());
  m.set_devices_per_node(std::max<int64_t>(1, (devices > 0 ? devices : m.devices_per_node()) / world->size()));
  *m.mutable_inter_node() = link;
  return Machine::FromProto(m, "the probe");
}

Status MachineCommand(const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "probe")
    return InvalidArgument("usage: loom machine probe [--out FILE] [--reps N]");
  Flags flags({{"out", "write the machine file here (else print it)"}, {"reps", "timed repetitions (default 5)"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(args.begin() + 1, args.end())));
  if (flags.help_requested()) {
    std::printf("usage: loom machine probe [flags]\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  LOOM_ASSIGN_OR_RETURN(const int64_t reps, flags.Int("reps", 5));
  Communicator* world = ProcessCommunicator();
  if (world != nullptr && world->size() == 1) world = nullptr;
  LOOM_ASSIGN_OR_RETURN(const Machine machine, ProbeMachine(static_cast<int>(std::max<int64_t>(1, reps)), world));
  if (world != nullptr && world->rank() != 0) return Status::Ok();  // rank 0 writes
  const std::string text = MachineText(machine);
  if (!flags.Has("out")) {
    std::fputs(text.c_str(), stdout);
    return Status::Ok();
  }
  LOOM_RETURN_IF_ERROR(WriteFileAtomically(flags.Str("out", ""), text));
  std::printf("wrote %s\n", flags.Str("out", "").c_str());
  return Status::Ok();
}

namespace {

// Each task's time in one traced step: the simulator's replay of it.
class MeasuredCost final : public CostModel {
 public:
  explicit MeasuredCost(const std::vector<double>& seconds) : seconds_(seconds) {}
  double ComputeSeconds(const TaskGraph&, const Task& task) const override {
    return seconds_[static_cast<size_t>(task.id)];
  }
  std::optional<double> CommunicationSeconds(const TaskGraph&, const Task& task) const override {
    return seconds_[static_cast<size_t>(task.id)];
  }

 private:
  const std::vector<double>& seconds_;
};

// One traced step, gathered from every process of the run (each traces the
// tasks its devices run, on its own clock).
struct TracedStep {
  double seconds = 0;               // the slowest process's
  std::vector<double> task_seconds;  // by task; a task two processes run (a message): the shorter span
  double makespan = 0;               // first task's start to the last's end, the longest of the processes
  double waits = 0;  // device threads idle past a task's dependencies (of the same process) and their previous task
};

StatusOr<TracedStep> Gather(const TaskGraph& g, double seconds, const std::vector<TaskSpan>& trace,
                            Communicator* world) {
  TracedStep s;
  s.seconds = seconds;
  constexpr double kNotRun = std::numeric_limits<double>::infinity();
  s.task_seconds.assign(g.tasks.size(), kNotRun);
  auto ran = [&](int id) {
    const TaskSpan& span = trace[static_cast<size_t>(id)];
    return span.task == id && span.end > 0;
  };
  double first = kNotRun, last = 0;
  std::vector<double> device_free(static_cast<size_t>(g.devices), -1);
  for (const Task& t : g.tasks) {
    if (!ran(t.id)) continue;
    const TaskSpan& span = trace[static_cast<size_t>(t.id)];
    s.task_seconds[static_cast<size_t>(t.id)] = span.end - span.start;
    first = std::min(first, span.start);
    last = std::max(last, span.end);
    double ready = device_free[static_cast<size_t>(t.device)];
    for (int d : t.deps)
      if (ran(d)) ready = std::max(ready, trace[static_cast<size_t>(d)].end);
    if (ready >= 0) s.waits += std::max(0.0, span.start - ready);
    device_free[static_cast<size_t>(t.device)] = span.end;
  }
  s.makespan = last - std::min(first, last);
  if (world == nullptr) return s;
  // Minimum over processes: the maximum of the negations.
  Tensor spans = Tensor::FromVector(Shape({static_cast<int64_t>(g.tasks.size())}), s.task_seconds);
  double* x = spans.data<double>();
  for (int64_t i = 0; i < spans.numel(); ++i) x[i] = -x[i];
  LOOM_RETURN_IF_ERROR(world->AllReduce(spans, ReduceOp::kMax));
  for (int64_t i = 0; i < spans.numel(); ++i) s.task_seconds[static_cast<size_t>(i)] = -x[i];
  Tensor longest = Tensor::FromVector(Shape({2}), std::vector<double>{s.seconds, s.makespan});
  LOOM_RETURN_IF_ERROR(world->AllReduce(longest, ReduceOp::kMax));
  s.seconds = longest.data<double>()[0];
  s.makespan = longest.data<double>()[1];
  Tensor waits = Tensor::FromVector(Shape({1}), std::vector<double>{s.waits});
  LOOM_RETURN_IF_ERROR(world->AllReduce(waits, ReduceOp::kSum));
  s.waits = waits.data<double>()[0];
  return s;
}

// Per op: the compute tasks' measured time in one step against the cost
// model's, largest differences first.
std::string OpTable(const std::string& strategy, const TaskGraph& g, const std::vector<double>& seconds,
                    const CostModel& cost) {
  struct Row {
    int64_t tasks = 0;
    double measured = 0, modelled = 0;
  };
  std::map<std::string, Row> ops;
  for (const Task& t : g.tasks) {
    if (t.kind != TaskKind::kCompute) continue;
    Row& row = ops[g.graph.node(t.node).op];
    ++row.tasks;
    row.measured += seconds[static_cast<size_t>(t.id)];
    row.modelled += cost.ComputeSeconds(g, t);
  }
  std::vector<std::pair<std::string, Row>> rows(ops.begin(), ops.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return std::abs(a.second.measured - a.second.modelled) > std::abs(b.second.measured - b.second.modelled);
  });
  std::ostringstream out;
  out << strategy << ": compute tasks by op (the median step), largest differences first\n";
  char line[200];
  std::snprintf(line, sizeof(line), "  %-28s %6s %12s %12s %9s\n", "op", "tasks", "measured ms", "model ms",
                "diff");
  out << line;
  for (size_t i = 0; i < rows.size() && i < 6; ++i) {
    const Row& row = rows[i].second;
    std::snprintf(line, sizeof(line), "  %-28s %6lld %12.3f %12.3f %+8.1f%%\n", rows[i].first.c_str(),
                  static_cast<long long>(row.tasks), row.measured * 1e3, row.modelled * 1e3,
                  row.measured > 0 ? 100 * (row.modelled - row.measured) / row.measured : 0.0);
    out << line;
  }
  return out.str();
}

}  // namespace

// `loom bench simulator`: for each strategy on cpu:N of this machine, the
// step the simulator predicts (costs from a profile measured first, in runs
// of their own) against the step measured afterwards (the median of `reps`
// steps, the strategies interleaved), with the error and the order.
// `loom bench simulator --speed`: how long a full simulation of the
// config's data-parallel step on the machine's devices takes, and a delta
// simulation after one layer changes (the last forward layer's split
// alternating between two), against the lowering a proposal also needs.
Status BenchSimulatorSpeed(const Flags& flags, const proto::TrainConfig& config, const Machine& machine) {
  LOOM_ASSIGN_OR_RETURN(const int64_t devices, flags.Int("devices", machine.devices()));
  LOOM_ASSIGN_OR_RETURN(const int64_t reps, flags.Int("reps", 20));
  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  LOOM_ASSIGN_OR_RETURN(proto::Strategy dp, MakeStandardStrategy(programs.forward, StandardStrategy::kDataParallel,
                                                                 devices));
  // The other proposal: the last forward layer (by node order) whole on device 0.
  std::string last_layer;
  for (const Node& n : programs.forward.nodes())
    if (!IsSourceOp(n.op)) last_layer = n.name;
  proto::Strategy moved = dp;
  proto::LayerSplit* entry = moved.add_layer();
  entry->set_layer(last_layer);
  entry->add_devices(0);
  std::vector<TaskGraph> graphs;
  std::vector<double> lowering;
  for (const proto::Strategy* s : {&dp, &moved}) {
    LOOM_ASSIGN_OR_RETURN(const Strategy strategy, Strategy::FromProto(*s, "bench"));
    const auto start = std::chrono::steady_clock::now();
    LOOM_ASSIGN_OR_RETURN(TaskGraph g, LowerToTaskGraph(programs.step, strategy, programs.forward, LoweringFor(machine)));
    lowering.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    graphs.push_back(std::move(g));
  }
  // As a search calls it: the schedule and whether it fits, no peak memory.
  const AnalyticalCostModel cost(machine);
  const SimulateOptions search_options{.peak_memory = false};
  std::vector<double> full, with_memory, delta;
  DeltaSimulator incremental(machine, cost, search_options);
  LOOM_RETURN_IF_ERROR(incremental.Simulate(graphs[0]).status());
  int64_t rescheduled = 0, costed = 0;
  auto seconds_since = [](std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (int64_t r = 0; r < reps; ++r) {
    const TaskGraph& g = graphs[static_cast<size_t>((r + 1) % 2)];
    auto start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(Simulate(g, machine, cost, search_options).status());
    full.push_back(seconds_since(start));
    start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(Simulate(g, machine, cost).status());
    with_memory.push_back(seconds_since(start));
    start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(incremental.Simulate(g).status());
    delta.push_back(seconds_since(start));
    rescheduled += incremental.rescheduled();
    costed += incremental.costed();
  }
  auto line = [](const char* what, const std::vector<double>& x) {
    std::printf("%-32s %9.3f ms (p10 %.3f, p90 %.3f)", what, Quantile(x, 0.5) * 1e3, Quantile(x, 0.1) * 1e3,
                Quantile(x, 0.9) * 1e3);
  };
  std::printf("%s on %s, %lld devices, dp: %zu tasks, %zu pieces (%s)\n", flags.Str("config", "").c_str(),
              machine.name().c_str(), static_cast<long long>(devices), graphs[0].tasks.size(),
              graphs[0].pieces.size(), CpuModelName().c_str());
  line("full simulation", full);
  std::printf("\n");
  line("full, with peak memory per device", with_memory);
  std::printf("\n");
  line("delta simulation", delta);
  std::printf(", %.1fx faster than full; %lld of %zu tasks rescheduled per change (the last layer's), %lld costed\n",
              Quantile(full, 0.5) / Quantile(delta, 0.5), static_cast<long long>(rescheduled / reps),
              graphs[0].tasks.size(), static_cast<long long>(costed / reps));
  std::printf("lowering a proposal to its task graph from scratch: %.3f ms\n", Quantile(lowering, 0.5) * 1e3);

  // Proposals as the search's chain makes them: one layer's configuration
  // changed at random, half of them accepted, each lowered incrementally and
  // delta-simulated.
  LOOM_ASSIGN_OR_RETURN(SearchSpace space, SearchSpace::Build(programs.forward, devices));
  LOOM_ASSIGN_OR_RETURN(const Strategy dp_strategy, Strategy::FromProto(dp, "dp"));
  LOOM_ASSIGN_OR_RETURN(Choice current, space.ChoiceOf(dp_strategy));
  IncrementalLowering proposals(programs.step, devices);
  DeltaSimulator chain(machine, cost, search_options);
  std::mt19937_64 rng(1);
  std::vector<double> lower_s, simulate_s;
  int64_t planned = 0;
  const int64_t count = 20 * reps;
  const auto began = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < count; ++r) {
    Choice next = current;
    const size_t layer = static_cast<size_t>(rng() % next.size());
    next[layer] = static_cast<int>(rng() % space.layers()[layer].configs.size());
    auto start = std::chrono::steady_clock::now();
    LOOM_ASSIGN_OR_RETURN(const TaskGraph* g, proposals.Lower(space.Splits(next)));
    lower_s.push_back(seconds_since(start));
    start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(chain.Simulate(*g).status());
    simulate_s.push_back(seconds_since(start));
    if (r > 0) planned += proposals.planned();
    if (rng() % 2) current = std::move(next);
  }
  const double total = seconds_since(began);
  std::printf("proposals (one layer changed at random): %.0f per second; lowering %.3f ms (p10 %.3f, p90 %.3f), "
              "delta simulation %.3f ms; %.1f of %d nodes planned per proposal\n",
              static_cast<double>(count) / total, Quantile(lower_s, 0.5) * 1e3, Quantile(lower_s, 0.1) * 1e3,
              Quantile(lower_s, 0.9) * 1e3, Quantile(simulate_s, 0.5) * 1e3,
              static_cast<double>(planned) / static_cast<double>(count - 1), programs.step.num_nodes());
  return Status::Ok();
}

Status BenchSimulator(const std::vector<std::string>& args) {
  Flags flags({{"config", "the training config whose step to split"},
               {"speed?", "measure the simulator's own speed instead (full and delta simulation, lowering)"},
               {"devices", "CPU devices (default 2), one thread each"},
               {"strategies", "standard strategies or strategy files (default dp,owt,model)"},
               {"reps", "measured steps of each strategy, interleaved (default 20; the profile takes 5 more)"},
               {"machine", "this machine's file (default: probed now)"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom bench simulator --config FILE [flags]\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  if (!flags.Has("config")) return InvalidArgument("loom bench simulator needs --config FILE");
  LOOM_ASSIGN_OR_RETURN(const proto::TrainConfig config, LoadTrainConfig(flags.Str("config", "")));
  if (flags.Bool("speed")) {
    if (!flags.Has("machine")) return InvalidArgument("loom bench simulator --speed needs --machine FILE");
    LOOM_ASSIGN_OR_RETURN(const Machine machine, Machine::Load(flags.Str("machine", "")));
    return BenchSimulatorSpeed(flags, config, machine);
  }
  // Under mpirun each process runs its share of the devices; rank 0 reports.
  Communicator* world = ProcessCommunicator();
  if (world != nullptr && world->size() == 1) world = nullptr;
  const bool speaks = world == nullptr || world->rank() == 0;
  LOOM_ASSIGN_OR_RETURN(const int64_t devices, flags.Int("devices", world ? world->size() : 2));
  LOOM_ASSIGN_OR_RETURN(const int64_t reps, flags.Int("reps", 20));
  if (devices < 1 || reps < 1) return InvalidArgument("--devices and --reps must be >= 1");
  if (world && devices % world->size() != 0)
    return InvalidArgument("--devices ", devices, " under mpirun -np ", world->size(),
                           ": each process runs as many devices (a multiple of ", world->size(), ")");
  std::optional<Machine> machine;
  if (flags.Has("machine")) {
    LOOM_ASSIGN_OR_RETURN(machine, Machine::Load(flags.Str("machine", "")));
  } else {
    LOOM_ASSIGN_OR_RETURN(machine, ProbeMachine(5, world, devices));
  }
  if (devices > machine->devices())
    return InvalidArgument("--devices ", devices, ": machine ", machine->name(), " has ", machine->devices());
  // The processes are the simulated machine's nodes: a message between them
  // holds a device of each (simulator/simulator.h).
  if (world && (machine->proto().nodes() != world->size() ||
                machine->proto().devices_per_node() * world->size() != devices))
    return InvalidArgument("machine ", machine->name(), " has ", machine->proto().nodes(), " nodes of ",
                           machine->proto().devices_per_node(), " devices; under mpirun -np ", world->size(),
                           " with ", devices, " devices it needs one node per process (`mpirun -np ", world->size(),
                           " loom machine probe` writes one)");
  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  LOOM_ASSIGN_OR_RETURN(const BenchData data, LoadBenchData(config));
  const std::map<std::string, Tensor> feeds = RandomFeeds(programs.step, data.feeds);

  struct Variant {
    std::string name;
    TaskGraph tasks;
    std::unique_ptr<TaskRuntime> runtime;
    Profile profile;                // its own tasks' times
    std::vector<TracedStep> steps;  // the measured ones
  };
  std::vector<Variant> variants;
  for (const std::string& name : SplitCommas(flags.Str("strategies", "dp,owt,model"))) {
    LOOM_ASSIGN_OR_RETURN(const Strategy strategy, LoadOrMakeStrategy(name, programs.forward, devices, "--strategies"));
    Variant v{name, {}, nullptr, {}, {}};
    LOOM_ASSIGN_OR_RETURN(v.tasks, LowerToTaskGraph(programs.step, strategy, programs.forward));
    TaskRuntimeOptions o;
    o.trace = true;
    o.communicator = world;
    LOOM_ASSIGN_OR_RETURN(v.runtime, TaskRuntime::Create(v.tasks, o));
    LOOM_RETURN_IF_ERROR(v.runtime->InitializeState(config.seed()));
    variants.push_back(std::move(v));
  }
  auto traced_step = [&](Variant& v) -> StatusOr<TracedStep> {
    const auto start = std::chrono::steady_clock::now();
    LOOM_RETURN_IF_ERROR(v.runtime->Run(feeds).status());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return Gather(v.tasks, seconds, v.runtime->trace(), world);
  };
  // The profile: every task's time (kernels, transfers, all-reduces) in 5
  // traced steps of each strategy (after a warm-up), before and apart from
  // the measured steps.
  constexpr int kProfileSteps = 5;
  for (int step = 0; step <= kProfileSteps; ++step)
    for (Variant& v : variants) {
      LOOM_ASSIGN_OR_RETURN(const TracedStep traced, traced_step(v));
      if (step == 0) continue;
      for (const Task& t : v.tasks.tasks)
        v.profile.AddTask(v.tasks, t, traced.task_seconds[static_cast<size_t>(t.id)]);
    }
  Profile profile;
  for (const Variant& v : variants) profile.Add(v.profile);
  for (int64_t step = 0; step < reps; ++step)
    for (Variant& v : variants) {
      LOOM_ASSIGN_OR_RETURN(TracedStep traced, traced_step(v));
      v.steps.push_back(std::move(traced));
    }
  if (!speaks) return Status::Ok();

  const AnalyticalCostModel analytical(*machine);
  std::printf("%s, batch %lld, %s (one thread each), machine %s; profile: %zu task signatures from %d steps "
              "each; %lld measured steps each, interleaved (%s)\n\n",
              flags.Str("config", "").c_str(), static_cast<long long>(config.data().batch_size()),
              world ? StrCat(devices, " devices in ", world->size(), " MPI processes").c_str()
                    : StrCat("cpu:", devices).c_str(),
              machine->name().c_str(), profile.size(), kProfileSteps, static_cast<long long>(reps),
              CpuModelName().c_str());
  std::printf("%-10s %12s %24s %8s %9s %9s %8s %17s %11s %16s\n", "strategy", "predicted ms",
              "measured ms (p10-p90)", "error", "tasks ms", "replay ms", "waits ms", "comm ms meas/sim",
              "roofline ms", "from others ms");
  std::vector<double> predicted, measured, errors, others_errors;
  std::vector<std::string> notes;
  for (const Variant& v : variants) {
    const ProfiledCostModel cost(profile, analytical);
    LOOM_ASSIGN_OR_RETURN(const SimulationResult r, Simulate(v.tasks, *machine, cost));
    LOOM_ASSIGN_OR_RETURN(const SimulationResult roof, Simulate(v.tasks, *machine, analytical));
    // From the other strategies' profiles alone, the roofline calibrated on
    // them for the kernels they did not run (what a search would know).
    Profile others;
    for (const Variant& o : variants)
      if (&o != &v) others.Add(o.profile);
    const CalibratedCostModel calibrated(*machine, others.WorkSamples());
    const ProfiledCostModel from_others(others, calibrated);
    LOOM_ASSIGN_OR_RETURN(const SimulationResult other, Simulate(v.tasks, *machine, from_others));
    std::vector<double> seconds;
    for (const TracedStep& step : v.steps) seconds.push_back(step.seconds);
    const double median = Quantile(seconds, 0.5), error = (r.iteration_seconds - median) / median;
    predicted.push_back(r.iteration_seconds);
    measured.push_back(median);
    errors.push_back(std::abs(error));
    const double other_error = (other.iteration_seconds - median) / median;
    others_errors.push_back(std::abs(other_error));
    // The step whose time is the median, task by task.
    const TracedStep& typical = *std::min_element(v.steps.begin(), v.steps.end(), [&](const auto& a, const auto& b) {
      return std::abs(a.seconds - median) < std::abs(b.seconds - median);
    });
    LOOM_ASSIGN_OR_RETURN(const SimulationResult replay,
                          Simulate(v.tasks, *machine, MeasuredCost(typical.task_seconds), {.peak_memory = false}));
    double communication = 0, simulated_communication = 0;
    for (const Task& t : v.tasks.tasks) {
      if (t.kind == TaskKind::kCompute) continue;
      communication += typical.task_seconds[static_cast<size_t>(t.id)];
      simulated_communication += r.tasks[static_cast<size_t>(t.id)].end - r.tasks[static_cast<size_t>(t.id)].start;
    }
    std::printf("%-10s %12.3f %10.3f (%5.2f-%6.2f) %+7.1f%% %9.3f %9.3f %8.3f %8.3f/%8.3f %11.3f %8.3f %+6.1f%%%s\n",
                v.name.c_str(), r.iteration_seconds * 1e3, median * 1e3, Quantile(seconds, 0.1) * 1e3,
                Quantile(seconds, 0.9) * 1e3, 100 * error, typical.makespan * 1e3, replay.iteration_seconds * 1e3,
                typical.waits * 1e3, communication * 1e3, simulated_communication * 1e3,
                roof.iteration_seconds * 1e3, other.iteration_seconds * 1e3, 100 * other_error,
                cost.misses() > 0 ? "  (some kernels not in the profile)" : "");
    notes.push_back(OpTable(v.name, v.tasks, typical.task_seconds, cost));
  }
  std::printf("\nmedian |error| %.1f%%, largest %.1f%%; Kendall tau of the order %.2f; from the others' "
              "profiles: median |error| %.1f%%\n",
              100 * Quantile(errors, 0.5), 100 * *std::max_element(errors.begin(), errors.end()),
              KendallTau(predicted, measured), 100 * Quantile(others_errors, 0.5));
  std::printf("\ntasks: the median step's tasks, first start to last end (the rest of the step is feeding, "
              "outputs and writebacks);\nreplay: the simulator given each task's measured time in that step; "
              "waits: time the device threads sat\nidle past a task's dependencies and their previous task "
              "(wake-ups, charged as the machine's dependency latency); comm: the\nmedian step's transfers and all-reduces, "
              "measured and as predicted; from others: the prediction from the other strategies'\nprofiles and "
              "the roofline calibrated on them (simulator/cost_model.h) for the kernels they did not run.\n");
  for (const std::string& n : notes) std::printf("\n%s", n.c_str());
  return Status::Ok();
}

}  // namespace loom::tools
