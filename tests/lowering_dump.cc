// Writes everything BuildTaskGraph produces (every task, piece, home,
// writeback and output, and the lowered graph with its ids) for the zoo's
// models under the standard strategies and random ones, one file per case,
// into $LOWERING_DUMP_DIR. A change to the lowering that must not change
// its result (a faster one) is checked by diffing the dumps of a build
// before it and one after:
//
//   LOWERING_DUMP_DIR=/tmp/before bazel-bin/tests/lowering_dump   # built before the change
//   LOWERING_DUMP_DIR=/tmp/after bazel-bin/tests/lowering_dump    # and after
//   diff -r /tmp/before /tmp/after
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>

#include "graph/model.h"
#include "graph/strategy.h"
#include "models/zoo.h"
#include "search/baselines.h"
#include "tests/parallel_check.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

template <typename List>
std::string Ints(const List& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += StrCat(i ? "," : "", static_cast<int64_t>(v[i]));
  return s;
}

std::string Dump(const Graph& g) {
  std::ostringstream s;
  s << g.ToString();
  for (const Node& n : g.nodes()) {
    s << "node " << n.id << " " << n.name << " in " << Ints(n.inputs) << " out " << Ints(n.outputs) << "\n";
    for (ValueId v : n.outputs) {
      const Value& x = g.value(v);
      s << "  value " << x.id << " " << x.name << " " << x.type.ToString() << " producer " << x.producer << ":"
        << x.output_index << " " << x.replica_layout.ToString() << "\n";
    }
  }
  return s.str();
}

std::string Dump(const Operand& o) { return StrCat(o.value, " ", o.region.ToString(), " pieces ", Ints(o.pieces)); }

std::string Dump(const StatusOr<TaskGraph>& lowered) {
  if (!lowered.ok()) return "error " + lowered.status().ToString() + "\n";
  const TaskGraph& tg = *lowered;
  std::ostringstream s;
  s.precision(17);
  s << "devices " << tg.devices << "\n" << tg.ToString();
  for (const Task& t : tg.tasks) {
    s << "task " << t.id << " node " << t.node << " part " << t.part << " attrs " << (t.attrs ? *t.attrs : AttrMap()).ToString() << " sources "
      << Ints(t.sources) << " src " << t.src_device << " group " << Ints(t.group) << " outputs " << Ints(t.outputs)
      << "\n";
    for (const Operand& o : t.inputs) s << "  input " << Dump(o) << "\n";
  }
  for (size_t i = 0; i < tg.pieces.size(); ++i) {
    const Piece& p = tg.pieces[i];
    s << "piece " << i << " value " << p.value << " on " << p.device << " " << p.region.ToString() << " partial "
      << p.partial << " " << p.partial_index << " producer " << p.producer << "\n";
  }
  for (const auto& [v, homes] : tg.homes) s << "homes " << v << " " << Ints(homes) << "\n";
  for (const auto& [home, from] : tg.writebacks) s << "writeback " << home << " <- " << Dump(from) << "\n";
  for (const auto& [name, o] : tg.outputs) s << "output " << name << " " << Dump(o) << "\n";
  s << Dump(tg.graph);
  return s.str();
}

// Writes "<name>.txt" into $LOWERING_DUMP_DIR: the strategy and what the
// step case's lowering under it is (or the error).
void Write(const std::string& name, const testing::StepCase& c, const std::string& strategy) {
  const char* dir = std::getenv("LOWERING_DUMP_DIR");
  if (dir == nullptr) FAIL("set LOWERING_DUMP_DIR to the directory to write the dumps to");
  std::ofstream out(std::string(dir) + "/" + name + ".txt");
  out << strategy << "\n" << Dump(testing::LowerStrategy(c, strategy));
  REQUIRE(out.good());
}

TEST_CASE("dump the lowering of the zoo's models under standard and random strategies") {
  std::mt19937_64 rng(23);
  testing::ForEachZooStepCase([&](const std::string& model, const testing::StepCase& c) {
    for (int64_t devices : {1, 2, 4}) {
      for (const char* kind : {"dp", "owt", "model", "replica"}) {
        if ((std::string(kind) == "replica") != c.forward.fused()) continue;
        auto strategy = MakeStandardStrategy(c.forward, *ParseStandardStrategy(kind), devices);
        if (!strategy.ok()) continue;
        Write(StrCat(model, ".", kind, ".", devices), c, StrategyToText(*strategy));
      }
      for (int i = 0; devices > 1 && i < 3; ++i)
        Write(StrCat(model, ".random", i, ".", devices), c, testing::RandomStrategy(c.forward, devices, rng));
    }
  });
}

// What `loom bench simulator --speed` lowers: full-size ResNets.
TEST_CASE("dump the lowering of the simulator benchmark's ResNets") {
  for (const auto& [name, width, devices] :
       {std::tuple<std::string, std::string, int64_t>{"resnet18", "64", 4}, {"resnet101", "16", 16}}) {
    Model m(DType::kF32);
    REQUIRE(models::BuildClassifier(m, name, {{"stem", "cifar"}, {"width", width}}, Shape{3, 32, 32}, 64, 10).ok());
    auto c = testing::MakeStepCase(m.graph(), std::nullopt, {});
    REQUIRE(c.ok());
    for (const char* kind : {"dp", "owt", "model"}) {
      auto strategy = MakeStandardStrategy(c->forward, *ParseStandardStrategy(kind), devices);
      REQUIRE(strategy.ok());
      Write(StrCat(name, ".full.", kind, ".", devices), *c, StrategyToText(*strategy));
    }
  }
}

}  // namespace
}  // namespace loom
