// IncrementalLowering (graph/task_graph.h) against BuildTaskGraph: the zoo's
// models, fused and not, under chains of random one-layer changes as a
// search proposes them (the search space's configurations).
#include <catch2/catch.hpp>

#include <random>
#include <sstream>

#include "graph/task_graph.h"
#include "search/baselines.h"
#include "search/space.h"
#include "simulator/simulator.h"
#include "tests/parallel_check.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

// Everything of a task graph but ids of the graph's nodes and values: those
// are named (an incremental lowering's expansions may have other ids).
std::string Describe(const TaskGraph& tg) {
  std::ostringstream s;
  s.precision(17);
  auto value = [&](ValueId v) { return tg.graph.value(v).name; };
  auto ints = [](const auto& list) {
    std::string out;
    for (auto x : list) out += std::to_string(x) + ",";
    return out;
  };
  auto operand = [&](const Operand& o) { return value(o.value) + " " + o.region.ToString() + " " + ints(o.pieces); };
  s << tg.ToString();
  for (size_t i = 0; i < tg.tasks.size(); ++i) {
    const Task& t = tg.tasks[i];
    s << "task " << t.id << " fingerprint " << tg.fingerprints[i] << " part " << t.part << " dtype "
      << DTypeName(t.dtype) << " sources " << ints(t.sources) << " outputs " << ints(t.outputs);
    if (t.kind == TaskKind::kCompute)
      s << " node " << tg.graph.node(t.node).name << " " << tg.graph.node(t.node).op << " attrs "
        << t.attrs->ToString();
    s << "\n";
    for (const Operand& o : t.inputs) s << "  input " << operand(o) << "\n";
  }
  for (size_t i = 0; i < tg.pieces.size(); ++i) {
    const Piece& p = tg.pieces[i];
    s << "piece " << i << " " << value(p.value) << " on " << p.device << " " << p.region.ToString() << " partial "
      << p.partial << " " << p.partial_index << " producer " << p.producer << " bytes " << p.bytes << "\n";
  }
  for (const auto& [v, homes] : tg.homes) s << "homes " << value(v) << " " << ints(homes) << "\n";
  for (const auto& [home, from] : tg.writebacks) s << "writeback " << home << " <- " << operand(from) << "\n";
  for (const auto& [name, o] : tg.outputs) s << "output " << name << " " << operand(o) << "\n";
  s << "piece bytes " << ints(tg.piece_bytes) << "\n";
  return s.str();
}

Machine FourDevices() {
  auto machine = Machine::Load("simulator/machines/p100_4x4.pbtxt");
  REQUIRE(machine.status().ToString() == "OK");
  return *machine;
}

// `changes` proposals from data parallelism, each one layer's split
// changed, accepted at random (a rejected proposal is the next one's
// starting point, as in the search's chain): every incremental lowering
// equals BuildTaskGraph's, and so does its simulation, to the bit.
// Returns the nodes planned per proposal, on average.
double CheckChain(const testing::StepCase& c, int64_t devices, int changes, std::mt19937_64& rng,
                  const LoweringOptions& options = {}) {
  auto space = SearchSpace::Build(c.forward, devices);
  REQUIRE(space.status().ToString() == "OK");
  auto dp = MakeStandardStrategy(c.forward, StandardStrategy::kDataParallel, devices);
  REQUIRE(dp.ok());
  auto strategy = Strategy::FromProto(*dp, "dp");
  REQUIRE(strategy.ok());
  auto start = space->ChoiceOf(*strategy);
  REQUIRE(start.status().ToString() == "OK");
  Choice current = *start;
  const Machine machine = FourDevices();
  const AnalyticalCostModel cost(machine);
  IncrementalLowering incremental(c.step, devices, options);
  int64_t planned = 0;
  for (int i = 0; i <= changes; ++i) {
    Choice next = current;
    if (i > 0) {
      const size_t layer = rng() % next.size();
      next[layer] = static_cast<int>(rng() % space->layers()[layer].configs.size());
    }
    const auto layers = space->Splits(next);
    auto fresh = BuildTaskGraph(c.step, layers, devices, options);
    auto reused = incremental.Lower(layers);
    REQUIRE(fresh.status().ToString() == "OK");
    REQUIRE(reused.status().ToString() == "OK");
    INFO("proposal " << i);
    REQUIRE(Describe(**reused) == Describe(*fresh));
    REQUIRE((*reused)->fingerprints == fresh->fingerprints);
    REQUIRE((*reused)->cost_keys == fresh->cost_keys);
    REQUIRE((*reused)->dependencies == fresh->dependencies);
    REQUIRE((*reused)->dependency_end == fresh->dependency_end);
    auto a = Simulate(**reused, machine, cost), b = Simulate(*fresh, machine, cost);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(a->iteration_seconds == b->iteration_seconds);
    REQUIRE(a->peak_memory_bytes == b->peak_memory_bytes);
    if (i > 0) planned += incremental.planned();
    if (rng() % 2) current = next;
  }
  return static_cast<double>(planned) / changes;
}

TEST_CASE("an incremental lowering equals BuildTaskGraph's under random one-layer changes") {
  std::mt19937_64 rng(5);
  testing::ForEachZooStepCase([&](const std::string& name, const testing::StepCase& c) {
    INFO(name);
    CheckChain(c, 4, 8, rng);
  });
}

TEST_CASE("an incremental lowering with collectives equals BuildTaskGraph's") {
  std::mt19937_64 rng(9);
  testing::ForEachZooStepCase([&](const std::string& name, const testing::StepCase& c) {
    INFO(name);
    CheckChain(c, 4, 4, rng, LoweringOptions{.collective_min_group = 3});
  });
}

TEST_CASE("a one-layer change plans that layer's nodes and their neighbours', not the graph") {
  std::mt19937_64 rng(11);
  const testing::StepCase c = testing::ClassifierCase("resnet18", {{"stem", "cifar"}, {"width", "8"}}, {3, 16, 16});
  const double planned = CheckChain(c, 4, 40, rng);
  const int64_t nodes = c.step.num_nodes();
  INFO(planned << " of " << nodes << " nodes planned per change");
  CHECK(planned < 0.1 * static_cast<double>(nodes));
}

}  // namespace
}  // namespace loom
