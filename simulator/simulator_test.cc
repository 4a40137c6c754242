#include "simulator/simulator.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "simulator/profile.h"
#include "tests/parallel_check.h"

namespace loom {
namespace {

// Every compute task takes `seconds`.
class FixedCost final : public CostModel {
 public:
  explicit FixedCost(double seconds) : seconds_(seconds) {}
  double ComputeSeconds(const TaskGraph&, const Task&) const override { return seconds_; }

 private:
  double seconds_;
};

Machine TestMachine(int64_t nodes, int64_t per_node, bool copies_on_device, bool shared = false) {
  proto::Machine m;
  m.set_name("test");
  m.set_nodes(nodes);
  m.set_devices_per_node(per_node);
  m.mutable_device()->set_peak_flops_f32(1e9);
  m.mutable_device()->set_memory_bandwidth(1e9);
  m.mutable_device()->set_memory_bytes(1e9);
  m.mutable_device()->set_copies_on_device(copies_on_device);
  m.mutable_intra_node()->set_latency_s(1e-3);
  m.mutable_intra_node()->set_bandwidth(1e6);
  m.mutable_intra_node()->set_shared(shared);
  m.mutable_inter_node()->set_latency_s(2e-3);
  m.mutable_inter_node()->set_bandwidth(1e5);
  auto machine = Machine::FromProto(m, "test");
  REQUIRE(machine.status().ToString() == "OK");
  return *machine;
}

TaskGraph Lowered(const std::string& strategy) {
  static const testing::StepCase mlp = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  auto tg = testing::LowerStrategy(mlp, strategy);
  REQUIRE(tg.status().ToString() == "OK");
  return *tg;
}

// What every schedule must satisfy: a task starts after its dependencies
// end; tasks on one device do not overlap; the step ends with the last.
void CheckSchedule(const TaskGraph& g, const SimulationResult& r) {
  double last = 0;
  for (const Task& t : g.tasks) {
    const SimulatedTask& s = r.tasks[static_cast<size_t>(t.id)];
    CHECK(s.end >= s.start);
    for (int d : t.deps) CHECK(s.start >= r.tasks[static_cast<size_t>(d)].end);
    last = std::max(last, s.end);
  }
  CHECK(r.iteration_seconds == last);
  for (int64_t d = 0; d < g.devices; ++d) {
    double busy_until = 0;
    for (const Task& t : g.tasks) {
      const SimulatedTask& s = r.tasks[static_cast<size_t>(t.id)];
      if (s.row != d) continue;
      CHECK(s.start >= busy_until);
      busy_until = s.end;
    }
    CHECK(r.device_busy_seconds[static_cast<size_t>(d)] <= r.iteration_seconds + 1e-12);
  }
}

TEST_CASE("the shipped machines load") {
  for (const auto& [file, devices] : std::vector<std::pair<std::string, int64_t>>{
           {"h200_1", 1}, {"h200_8_nvswitch", 8}, {"dgx_h100_4x8", 32}, {"p100_4x4", 16}, {"k80_16x4", 64},
           {"cpu_local", 2}, {"cpu_local_np2", 2}}) {
    INFO(file);
    auto m = Machine::Load("simulator/machines/" + file + ".pbtxt");
    REQUIRE(m.status().ToString() == "OK");
    CHECK(m->name() == file);
    CHECK(m->devices() == devices);
  }
}

TEST_CASE("a bad machine file is an error naming its place") {
  auto bad = Machine::Parse("name: \"x\"\nnodes: 0\ndevices_per_node: 2\n", "m.pbtxt");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("m.pbtxt:2") && Catch::Contains("nodes >= 1"));
  auto typo = Machine::Parse("nodes: 1\ndevice_per_node: 2\n", "m.pbtxt");
  REQUIRE_FALSE(typo.ok());
  CHECK_THAT(typo.status().message(), Catch::Contains("m.pbtxt:2"));
  auto no_link = Machine::Parse("nodes: 2\ndevices_per_node: 1\ndevice { peak_flops_f32: 1 memory_bandwidth: 1 "
                                "memory_bytes: 1 }\n",
                                "m.pbtxt");
  REQUIRE_FALSE(no_link.ok());
  CHECK_THAT(no_link.status().message(), Catch::Contains("inter_node"));
}

TEST_CASE("routes: pairs of a node on their own or a shared link, nodes through their links out and in") {
  const Machine unshared = TestMachine(2, 2, false);
  auto resources = [](const Machine::Route& r) { return std::vector<int64_t>(r.begin(), r.end()); };
  CHECK(resources(unshared.RouteOf(0, 1)) == std::vector<int64_t>{1});  // node 0, pair (0, 1)
  CHECK(resources(unshared.RouteOf(1, 0)) == std::vector<int64_t>{2});
  CHECK(unshared.ResourceName(2) == "1->0");
  CHECK(resources(unshared.RouteOf(1, 2)) == std::vector<int64_t>{8, 11});  // node 0 out, node 1 in
  CHECK(unshared.ResourceName(8) == "node 0 out");
  CHECK(unshared.ResourceName(11) == "node 1 in");
  const Machine shared = TestMachine(2, 2, false, true);
  CHECK(resources(shared.RouteOf(0, 1)) == resources(shared.RouteOf(1, 0)));
  CHECK(Machine::MessageSeconds(shared.RouteOf(0, 1), 1000) == Approx(1e-3 + 1e-3));
}

TEST_CASE("one device runs every compute task back to back") {
  const TaskGraph g = Lowered("devices: 1\n");
  auto r = Simulate(g, TestMachine(1, 1, false), FixedCost(1e-3));
  REQUIRE(r.status().ToString() == "OK");
  CheckSchedule(g, *r);
  CHECK(r->iteration_seconds == Approx(1e-3 * static_cast<double>(g.tasks.size())));
  CHECK(r->device_busy_seconds[0] == Approx(r->iteration_seconds));
  CHECK(r->fits);
  double state = 0;  // the parameters and the momenta are held all step
  for (const auto& [v, homes] : g.homes)
    if (g.graph.node(g.graph.value(v).producer).op != kInputOp)
      state += static_cast<double>(g.graph.type(v).shape.numel() * 8);
  CHECK(r->peak_memory_bytes[0] >= state);
}

TEST_CASE("data parallelism: halves of the work at once, gradients in rings on the links") {
  const TaskGraph one = Lowered("devices: 1\n");
  const TaskGraph dp = Lowered("devices: 4\ndefault_split { sample: 4 }\n");
  const Machine machine = TestMachine(1, 4, false);
  auto r1 = Simulate(one, machine, FixedCost(1e-3));
  auto r4 = Simulate(dp, machine, FixedCost(1e-3));
  REQUIRE(r4.status().ToString() == "OK");
  CheckSchedule(dp, *r4);
  // Each all-reduce: 2(n - 1) ring steps of latency + bytes / n / bandwidth.
  int reduces = 0;
  for (const Task& t : dp.tasks) {
    if (t.kind != TaskKind::kAllReduce) continue;
    ++reduces;
    const double n = static_cast<double>(t.group.size());
    const SimulatedTask& s = r4->tasks[static_cast<size_t>(t.id)];
    CHECK(s.end - s.start == Approx(2 * (n - 1) * (1e-3 + t.bytes / n / 1e6)));
    CHECK(s.row >= dp.devices);  // on the links, not a device
  }
  CHECK(reduces > 0);
  double moved = 0;
  for (double b : r4->resource_bytes) moved += b;
  CHECK(moved > 0);
  // Every device computes its quarter of each layer: its busy time is its
  // compute tasks only.
  for (int64_t d = 0; d < 4; ++d) {
    double compute = 0;
    for (const Task& t : dp.tasks)
      if (t.kind == TaskKind::kCompute && t.device == d) compute += 1e-3;
    CHECK(r4->device_busy_seconds[static_cast<size_t>(d)] == Approx(compute));
  }
  CHECK(r1->iteration_seconds > 0);
}

TEST_CASE("collectives on copy engines: a ring's half for all-gathers and reduce-scatters, all-to-alls at once") {
  static const testing::StepCase mlp = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const Machine machine = TestMachine(1, 4, false);
  auto g = testing::LowerStrategy(mlp, "devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"*fc*\" parameter: 4 }\n",
                                  LoweringFor(machine));
  REQUIRE(g.status().ToString() == "OK");
  auto r = Simulate(*g, machine, FixedCost(1e-3));
  REQUIRE(r.status().ToString() == "OK");
  CheckSchedule(*g, *r);
  std::map<TaskKind, int> seen;
  for (const Task& t : g->tasks) {
    const SimulatedTask& s = r->tasks[static_cast<size_t>(t.id)];
    const double n = static_cast<double>(t.group.size());
    if (t.kind == TaskKind::kAllGather || t.kind == TaskKind::kReduceScatter) {
      CHECK(s.end - s.start == Approx((n - 1) * (1e-3 + t.bytes / n / 1e6)));
    } else if (t.kind == TaskKind::kAllToAll) {
      // Every pair's message on its own link at once: one latency and the
      // largest message (links join each ordered pair).
      double largest = 0;
      for (int out : t.outputs)
        for (int src : t.sources)
          largest = std::max(largest, AllToAllMessageBytes(g->pieces[static_cast<size_t>(src)],
                                                           g->pieces[static_cast<size_t>(out)]));
      CHECK(largest > 0);
      CHECK(s.end - s.start == Approx(1e-3 + largest / 1e6));
    } else {
      continue;
    }
    CHECK(s.row >= g->devices);  // on the links
    ++seen[t.kind];
  }
  CHECK(seen[TaskKind::kAllGather] > 0);
  CHECK(seen[TaskKind::kReduceScatter] > 0);
  CHECK(seen[TaskKind::kAllToAll] > 0);
  // Devices that copy lower without collectives.
  CHECK(LoweringFor(TestMachine(1, 4, true)).collective_min_group == 0);
}

TEST_CASE("devices that make their own copies run transfers and all-reduces in their queues") {
  const TaskGraph dp = Lowered("devices: 2\ndefault_split { sample: 2 }\n");
  auto r = Simulate(dp, TestMachine(1, 2, true), FixedCost(1e-3));
  REQUIRE(r.status().ToString() == "OK");
  CheckSchedule(dp, *r);
  for (const Task& t : dp.tasks) {
    const SimulatedTask& s = r->tasks[static_cast<size_t>(t.id)];
    CHECK(s.row == t.device);
    if (t.kind != TaskKind::kAllReduce) continue;
    // The first member receives the other's partial sum, adds, sends it back.
    const double message = 1e-3 + t.bytes / 1e6, add = 3 * t.bytes / 1e9, keep = 2 * t.bytes / 1e9;
    CHECK(s.end - s.start == Approx(message + add + keep + message));
  }
}

// The spans of the tasks that hold device d's queue (run there, or on
// another device as a message that d's process joins), in graph order.
std::vector<std::pair<double, double>> HeldSpans(const TaskGraph& g, const Machine& m, const SimulationResult& r,
                                                 int64_t d) {
  std::vector<std::pair<double, double>> spans;
  for (const Task& t : g.tasks) {
    bool holds = t.device == d;
    if (t.kind == TaskKind::kTransfer) holds = holds || (t.src_device == d && m.NodeOf(d) != m.NodeOf(t.device));
    if (t.kind == TaskKind::kAllReduce)
      for (int p : t.sources) holds = holds || g.pieces[static_cast<size_t>(p)].device == d;
    if (holds) spans.push_back({r.tasks[static_cast<size_t>(t.id)].start, r.tasks[static_cast<size_t>(t.id)].end});
  }
  return spans;
}

TEST_CASE("processes (nodes of devices that copy) join each message on a device of each, one message at a time") {
  // One device per process: a message holds the sender's device too.
  const Machine processes = TestMachine(2, 1, true);
  for (const std::string& strategy :
       {"devices: 2\ndefault_split { sample: 2 }\n", "devices: 2\nlayer { layer: \"*fc2*\" devices: 1 }\n"}) {
    INFO(strategy);
    const TaskGraph g = Lowered(strategy);
    auto r = Simulate(g, processes, FixedCost(1e-3));
    auto threads = Simulate(g, TestMachine(1, 2, true), FixedCost(1e-3));
    REQUIRE(r.ok());
    REQUIRE(threads.ok());
    CheckSchedule(g, *r);
    int messages = 0;
    for (const Task& t : g.tasks) messages += t.kind != TaskKind::kCompute;
    CHECK(messages > 0);
    for (int64_t d = 0; d < 2; ++d) {
      double busy_until = 0;
      for (const auto& [start, end] : HeldSpans(g, processes, *r, d)) {
        CHECK(start >= busy_until);  // what holds a device's queue runs one at a time
        busy_until = end;
      }
    }
    // Both sides of every message are busy: more busy time than in threads.
    double busy = 0, busy_threads = 0;
    for (int64_t d = 0; d < 2; ++d) {
      busy += r->device_busy_seconds[static_cast<size_t>(d)];
      busy_threads += threads->device_busy_seconds[static_cast<size_t>(d)];
    }
    CHECK(busy > busy_threads);
  }
  // Two devices per process: a process's messages go one at a time.
  const Machine pairs = TestMachine(2, 2, true);
  const TaskGraph dp = Lowered("devices: 4\ndefault_split { sample: 4 }\n");
  auto r = Simulate(dp, pairs, FixedCost(1e-3));
  REQUIRE(r.ok());
  CheckSchedule(dp, *r);
  for (int64_t node = 0; node < 2; ++node) {
    std::vector<std::pair<double, double>> spans;
    for (const Task& t : dp.tasks) {
      if (t.kind == TaskKind::kCompute) continue;
      std::set<int64_t> nodes;
      for (int p : t.sources) nodes.insert(pairs.NodeOf(dp.pieces[static_cast<size_t>(p)].device));
      for (int p : t.outputs) nodes.insert(pairs.NodeOf(dp.pieces[static_cast<size_t>(p)].device));
      if (t.kind == TaskKind::kTransfer) nodes = {pairs.NodeOf(t.src_device), pairs.NodeOf(t.device)};
      if (nodes.size() < 2 || !nodes.count(node)) continue;
      spans.push_back({r->tasks[static_cast<size_t>(t.id)].start, r->tasks[static_cast<size_t>(t.id)].end});
    }
    CHECK(spans.size() > 1);
    double busy_until = 0;
    for (const auto& [start, end] : spans) {
      CHECK(start >= busy_until);
      busy_until = end;
    }
  }
}

TEST_CASE("a task waiting for another queue's task starts the dependency latency after it") {
  const TaskGraph g = Lowered("devices: 2\nlayer { layer: \"*fc2*\" devices: 1 }\n");
  proto::Machine spec = TestMachine(1, 2, true).proto();
  auto plain = Simulate(g, *Machine::FromProto(spec, "plain"), FixedCost(1e-3));
  spec.mutable_device()->set_dependency_latency_s(0.5);
  auto waking = Simulate(g, *Machine::FromProto(spec, "waking"), FixedCost(1e-3));
  REQUIRE(plain.ok());
  REQUIRE(waking.ok());
  CheckSchedule(g, *waking);
  int crossings = 0;
  for (const Task& t : g.tasks) {
    const SimulatedTask& s = waking->tasks[static_cast<size_t>(t.id)];
    for (int d : t.deps) {
      const SimulatedTask& dep = waking->tasks[static_cast<size_t>(d)];
      if (dep.row == s.row) continue;
      ++crossings;
      CHECK(s.start >= dep.end + 0.5);
    }
  }
  CHECK(crossings > 0);
  CHECK(waking->iteration_seconds >= plain->iteration_seconds + 0.5);
}

TEST_CASE("a step costs the runtime's overhead and the copies of the inputs' slices beyond its tasks") {
  const TaskGraph dp = Lowered("devices: 2\ndefault_split { sample: 2 }\n");
  proto::Machine spec = TestMachine(1, 2, true).proto();
  auto plain = Simulate(dp, *Machine::FromProto(spec, "plain"), FixedCost(1e-3));
  spec.set_step_overhead_s(0.25);
  spec.set_copies_feeds(true);
  auto full = Simulate(dp, *Machine::FromProto(spec, "full"), FixedCost(1e-3));
  REQUIRE(plain.ok());
  REQUIRE(full.ok());
  double sliced = 0;  // the input pieces that are halves of their value
  for (const auto& [v, homes] : dp.homes) {
    if (dp.graph.node(dp.graph.value(v).producer).op != kInputOp) continue;
    for (int h : homes)
      if (dp.pieces[static_cast<size_t>(h)].region.shape() != dp.graph.type(v).shape)
        sliced += dp.pieces[static_cast<size_t>(h)].bytes;
  }
  CHECK(sliced > 0);
  CHECK(full->iteration_seconds == Approx(plain->iteration_seconds + 0.25 + 2 * sliced / 1e9));
  for (size_t i = 0; i < dp.tasks.size(); ++i) CHECK(full->tasks[i].start == plain->tasks[i].start);
}

TEST_CASE("a step that does not fit is marked") {
  proto::Machine small = TestMachine(1, 1, false).proto();
  small.mutable_device()->set_memory_bytes(1000);
  auto m = Machine::FromProto(small, "small");
  REQUIRE(m.ok());
  auto r = Simulate(Lowered("devices: 1\n"), *m, FixedCost(1e-3));
  REQUIRE(r.ok());
  CHECK_FALSE(r->fits);
  CHECK(r->peak_memory_bytes[0] > 1000);
}

TEST_CASE("without the peak memory, fits is still exact") {
  const TaskGraph g = Lowered("devices: 1\n");
  const proto::Machine spec = TestMachine(1, 1, false).proto();
  auto peak = Simulate(g, TestMachine(1, 1, false), FixedCost(1e-3));
  REQUIRE(peak.ok());
  double all_pieces = 0;  // the bound: every piece held at once
  for (const Piece& p : g.pieces)
    all_pieces += static_cast<double>(p.region.numel() * static_cast<int64_t>(DTypeSize(g.graph.type(p.value).dtype)));
  const double held = peak->peak_memory_bytes[0];
  REQUIRE(held < all_pieces);
  for (const auto& [memory, fits] : std::vector<std::pair<double, bool>>{
           {all_pieces, true}, {(held + all_pieces) / 2, true}, {held, true}, {held * 0.99, false}}) {
    proto::Machine sized = spec;
    sized.mutable_device()->set_memory_bytes(memory);
    auto r = Simulate(g, *Machine::FromProto(sized, "sized"), FixedCost(1e-3), {.peak_memory = false});
    REQUIRE(r.ok());
    CHECK(r->fits == fits);
    CHECK(r->peak_memory_bytes.empty());
  }
}

TEST_CASE("the analytical model is the roofline") {
  const Machine m = TestMachine(1, 1, false);
  const TaskGraph g = Lowered("devices: 1\n");
  const AnalyticalCostModel model(m);
  for (const Task& t : g.tasks) {
    if (t.kind != TaskKind::kCompute) continue;
    // f64 work: no f64 rate given, so f32's (1 GFLOP/s); memory at 1 GB/s.
    CHECK(model.ComputeSeconds(g, t) == Approx(std::max(t.flops / 1e9, t.bytes / 1e9)));
  }
}

TEST_CASE("more devices than the machine has is an error") {
  auto r = Simulate(Lowered("devices: 2\ndefault_split { sample: 2 }\n"), TestMachine(1, 1, false), FixedCost(1));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("2 devices, machine test has 1"));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST_CASE("a profile keeps means without interruptions, round-trips its file and refuses bad lines") {
  Profile p;
  for (double s : {3.0, 1.0, 2.0}) p.Add("A (x)", s);
  for (double s : {4.0, 1.0}) p.Add("B (y)", s);
  CHECK(*p.Seconds("A (x)") == 2.0);
  CHECK(*p.Seconds("B (y)") == 2.5);
  for (double s : {1.0, 1.0, 2.0, 30.0}) p.Add("C (z)", s);  // 30: over 3x the median, an interruption
  CHECK(*p.Seconds("C (z)") == Approx(4.0 / 3));
  CHECK_FALSE(p.Seconds("C").has_value());
  auto back = Profile::Parse(p.ToText(), "p.txt");
  REQUIRE(back.status().ToString() == "OK");
  CHECK(back->size() == 3);
  CHECK(*back->Seconds("A (x)") == 2.0);
  CHECK_THAT(back->ToText(), Catch::Contains("2\t3\tA (x)") && Catch::Contains("2.5\t2\tB (y)"));
  auto bad = Profile::Parse("# c\n1e-3\t2\tok\nfast\t1\tX\n", "p.txt");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("p.txt:3"));
  CHECK_THAT(Profile::Parse("1\t0\tX\n", "p.txt").status().message(), Catch::Contains("p.txt:1"));
  CHECK_THAT(Profile::Parse("1\t1\tX\n2\t1\tX\n", "p.txt").status().message(), Catch::Contains("p.txt:2: a second"));
}

TEST_CASE("a profile keeps a compute task's work, round-trips it and refuses a bad one") {
  const TaskGraph g = Lowered("devices: 1\n");
  Profile p;
  for (const Task& t : g.tasks) p.AddTask(g, t, 1e-3);
  const std::vector<WorkSample> samples = p.WorkSamples();
  REQUIRE(!samples.empty());
  auto back = Profile::Parse(p.ToText(), "p.txt");
  REQUIRE(back.status().ToString() == "OK");
  const std::vector<WorkSample> again = back->WorkSamples();
  REQUIRE(again.size() == samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    CHECK(again[i].op == samples[i].op);
    CHECK(again[i].work.flops == samples[i].work.flops);
    CHECK(again[i].work.bytes == samples[i].work.bytes);
    CHECK(again[i].work.dtype == DType::kF64);
  }
  CHECK_THAT(Profile::Parse("1\t1\tX\t1\t2\n", "p.txt").status().message(), Catch::Contains("p.txt:1: expected"));
  CHECK_THAT(Profile::Parse("1\t1\tX\t1\t2\tq16\n", "p.txt").status().message(),
             Catch::Contains("p.txt:1: FLOPS and BYTES"));
}

TEST_CASE("the calibrated roofline: each op's measured efficiency, interpolated in size, the median for the rest") {
  const Machine m = TestMachine(1, 1, false);  // 1 GFLOP/s, 1 GB/s, no launch overhead
  // MatMul reaches half the roof on small tasks and all of it on large ones;
  // Add a quarter everywhere.
  const std::vector<WorkSample> samples = {
      {"MatMul", {1e6, 0, DType::kF32}, 2e-3},  // roof 1 ms
      {"MatMul", {1e8, 0, DType::kF32}, 1e-1},  // roof 100 ms
      {"Add", {0, 1e6, DType::kF32}, 4e-3},     // roof 1 ms
      {"Add", {0, 1e6, DType::kF32}, 4e-3},
  };
  const CalibratedCostModel model(m, samples);
  CHECK(model.Efficiency("MatMul", 1e-3) == Approx(0.5));
  CHECK(model.Efficiency("MatMul", 1e-1) == Approx(1.0));
  CHECK(model.Efficiency("MatMul", 1e-2) == Approx(0.75));  // halfway in log size
  CHECK(model.Efficiency("MatMul", 1.0) == Approx(1.0));    // held beyond the samples
  CHECK(model.Efficiency("Add", 1e-5) == Approx(0.25));
  CHECK(model.Efficiency("Conv2d", 1e-3) == Approx(0.5));   // unseen: the median sample (0.25 0.25 [0.5] 1)
  const TaskGraph g = Lowered("devices: 1\n");
  const AnalyticalCostModel roof(m);
  for (const Task& t : g.tasks) {
    if (t.kind != TaskKind::kCompute) continue;
    const double r = roof.ComputeSeconds(g, t);
    const double e = model.Efficiency(g.graph.node(t.node).op, r);
    CHECK(model.ComputeSeconds(g, t) == Approx(r > 0 ? r / e : 0));
  }
}

TEST_CASE("the profiled model takes the profile's time where it has the task, else the fallback's") {
  const TaskGraph g = Lowered("devices: 2\ndefault_split { sample: 2 }\n");
  Profile p;
  const Task* first = nullptr;
  for (const Task& t : g.tasks)
    if (t.kind == TaskKind::kCompute) {
      first = &t;
      break;
    }
  REQUIRE(first != nullptr);
  p.Add(TaskSignature(g, *first), 0.25);
  const FixedCost fallback(1e-3);
  const ProfiledCostModel model(p, fallback);
  CHECK(model.ComputeSeconds(g, *first) == 0.25);
  int64_t computes = 0, same = 0;
  for (const Task& t : g.tasks) {
    if (t.kind != TaskKind::kCompute) continue;
    ++computes;
    const bool profiled = TaskSignature(g, t) == TaskSignature(g, *first);
    same += profiled;
    CHECK(model.ComputeSeconds(g, t) == (profiled ? 0.25 : 1e-3));
  }
  CHECK(same >= 2);  // the other device's part of the same layer: the same kernel
  CHECK(model.hits() == 1 + same);
  CHECK(model.misses() == computes - same);
  CHECK_THAT(TaskSignature(g, *first), Catch::Contains(") -> (") && Catch::Contains("f64"));
}

TEST_CASE("a profile's transfer and all-reduce times replace the links' model; they still hold the links") {
  const TaskGraph g = Lowered("devices: 2\nlayer { layer: \"*fc2*\" devices: 1 }\ndefault_split { sample: 2 }\n");
  Profile p;
  int transfers = 0, reduces = 0;
  for (const Task& t : g.tasks) {
    if (t.kind == TaskKind::kCompute) continue;
    (t.kind == TaskKind::kTransfer ? transfers : reduces)++;
    p.Add(TaskSignature(g, t), t.kind == TaskKind::kTransfer ? 0.5 : 0.25);
  }
  REQUIRE(transfers > 0);
  REQUIRE(reduces > 0);
  const FixedCost fallback(1e-3);
  const ProfiledCostModel model(p, fallback);
  for (bool copies : {true, false}) {
    auto r = Simulate(g, TestMachine(1, 2, copies), model);
    REQUIRE(r.ok());
    CheckSchedule(g, *r);
    double moved = 0;
    for (double b : r->resource_bytes) moved += b;
    CHECK(moved > 0);
    for (const Task& t : g.tasks) {
      const SimulatedTask& s = r->tasks[static_cast<size_t>(t.id)];
      if (t.kind == TaskKind::kTransfer) CHECK(s.end - s.start == 0.5);
      if (t.kind == TaskKind::kAllReduce) CHECK(s.end - s.start == 0.25);
    }
  }
  CHECK_THAT(TaskSignature(g, g.tasks.back()), Catch::Contains("f64"));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The fields of two results, compared bit for bit.
bool SameResult(const SimulationResult& a, const SimulationResult& b) {
  if (a.iteration_seconds != b.iteration_seconds || a.tasks.size() != b.tasks.size() || a.fits != b.fits ||
      a.device_busy_seconds != b.device_busy_seconds || a.resource_bytes != b.resource_bytes ||
      a.peak_memory_bytes != b.peak_memory_bytes)
    return false;
  for (size_t i = 0; i < a.tasks.size(); ++i)
    if (a.tasks[i].start != b.tasks[i].start || a.tasks[i].end != b.tasks[i].end || a.tasks[i].row != b.tasks[i].row)
      return false;
  return true;
}

// The per-layer lines of a random strategy, by layer name.
std::map<std::string, std::string> LayerLines(const std::string& text) {
  std::map<std::string, std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t q = line.find("layer: \"");
    if (q == std::string::npos) continue;
    const size_t start = q + 8;
    lines[line.substr(start, line.find('"', start) - start)] = line;
  }
  return lines;
}

TEST_CASE("delta simulation equals full simulation on 10,000 random one-layer changes") {
  const testing::StepCase mlp = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  proto::Machine spec = TestMachine(2, 2, false).proto();
  spec.mutable_device()->set_launch_overhead_s(1e-6);
  const Machine machine = *Machine::FromProto(spec, "test");
  const AnalyticalCostModel cost(machine);
  DeltaSimulator delta(machine, cost);
  std::mt19937_64 rng(21);
  std::map<std::string, std::string> lines = LayerLines(testing::RandomStrategy(mlp.forward, 4, rng));
  REQUIRE(lines.size() >= 4);
  int checked = 0;
  int64_t rescheduled = 0, costed = 0, tasks = 0;
  for (int change = 0; change < 10000; ++change) {
    // One layer gets the split of a fresh random strategy.
    std::map<std::string, std::string> next = lines;
    const auto fresh = LayerLines(testing::RandomStrategy(mlp.forward, 4, rng));
    auto layer = next.begin();
    std::advance(layer, static_cast<long>(rng() % next.size()));
    if (fresh.count(layer->first)) layer->second = fresh.at(layer->first);
    std::string text = "devices: 4\n";
    for (const auto& [name, line] : next) text += line + "\n";
    auto tg = testing::LowerStrategy(mlp, text);
    if (!tg.ok()) continue;  // a split this layer's shapes cannot take
    lines = next;
    auto full = Simulate(*tg, machine, cost);
    auto incremental = delta.Simulate(*tg);
    REQUIRE(full.ok());
    REQUIRE(incremental.ok());
    if (!SameResult(*full, **incremental)) FAIL("change " << change << " differs:\n" << text);
    ++checked;
    rescheduled += delta.rescheduled();
    costed += delta.costed();
    tasks += static_cast<int64_t>(tg->tasks.size());
  }
  CHECK(checked >= 5000);
  CHECK(rescheduled < tasks);  // later changes keep a prefix of the schedule
  CHECK(costed < rescheduled / 2);  // and most rescheduled tasks keep their costs
}

// The analytical model, counting the compute tasks it is asked for.
class CountingCost final : public CostModel {
 public:
  explicit CountingCost(const Machine& machine) : roofline_(machine) {}
  double ComputeSeconds(const TaskGraph& g, const Task& t) const override {
    ++calls;
    return roofline_.ComputeSeconds(g, t);
  }
  mutable int64_t calls = 0;

 private:
  AnalyticalCostModel roofline_;
};

TEST_CASE("delta simulation costs only the tasks the last graph did not have, wherever the others moved") {
  const Machine machine = TestMachine(1, 4, false);
  const CountingCost cost(machine);
  DeltaSimulator delta(machine, cost);
  const TaskGraph dp = Lowered("devices: 4\ndefault_split { sample: 4 }\n");
  // The first layer on device 0 alone: every later task moves in the order.
  const TaskGraph moved = Lowered("devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"fc1\" devices: 0 }\n");
  REQUIRE(delta.Simulate(dp).ok());
  int64_t compute_tasks = 0;
  for (const Task& t : moved.tasks) compute_tasks += t.kind == TaskKind::kCompute;
  for (const TaskGraph* g : {&moved, &dp, &moved}) {
    cost.calls = 0;
    auto r = delta.Simulate(*g);
    REQUIRE(r.ok());
    const int64_t calls = cost.calls;
    CHECK(SameResult(*Simulate(*g, machine, cost), **r));
    CHECK(delta.rescheduled() > static_cast<int64_t>(g->tasks.size()) / 2);
    CHECK(delta.costed() < delta.rescheduled() / 4);
    CHECK(calls <= delta.costed());  // (the rest of those costed are transfers and all-reduces)
    CHECK(calls < compute_tasks / 4);
  }
}

TEST_CASE("the lowering lays the dependencies out flat; a graph without them is refused") {
  TaskGraph g = Lowered("devices: 2\ndefault_split { sample: 2 }\n");
  std::vector<int> flat;
  for (size_t i = 0; i < g.tasks.size(); ++i) {
    flat.insert(flat.end(), g.tasks[i].deps.begin(), g.tasks[i].deps.end());
    REQUIRE(g.dependency_end[i] == flat.size());
  }
  CHECK(g.dependencies == flat);
  const Machine machine = TestMachine(1, 2, false);
  g.dependency_end.clear();
  auto r = Simulate(g, machine, FixedCost(1e-3));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().ToString().find("lowering") != std::string::npos);
}

TEST_CASE("delta simulation of an unchanged graph keeps its schedule") {
  const Machine machine = TestMachine(1, 4, false);
  const FixedCost cost(1e-3);
  DeltaSimulator delta(machine, cost);
  const TaskGraph g = Lowered("devices: 4\ndefault_split { sample: 4 }\n");
  auto first = delta.Simulate(g);
  REQUIRE(first.ok());
  const SimulationResult kept = **first;
  CHECK(delta.rescheduled() == static_cast<int64_t>(g.tasks.size()));
  auto again = delta.Simulate(g);
  REQUIRE(again.ok());
  CHECK(SameResult(kept, **again));
  CHECK(delta.rescheduled() < static_cast<int64_t>(g.tasks.size()));
  CHECK(delta.rescheduled() <= 64);  // from the last snapshot
}

}  // namespace
}  // namespace loom
