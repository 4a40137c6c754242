#include "search/baselines.h"

#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "graph/fusion.h"
#include "graph/model.h"
#include "graph/strategy.h"
#include "models/zoo.h"

namespace loom {
namespace {

Graph Cnn() {
  Model m;
  REQUIRE(models::BuildClassifier(m, "cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8}, 6, 4).ok());
  return m.graph();
}

std::map<std::string, std::string> Splits(const Graph& g, StandardStrategy kind, int64_t devices) {
  auto p = MakeStandardStrategy(g, kind, devices);
  if (!p.ok()) FAIL(p.status().ToString());
  auto s = Strategy::FromProto(*p, "standard");
  REQUIRE(s.ok());
  auto resolved = s->Resolve(g);
  REQUIRE(resolved.ok());
  std::map<std::string, std::string> out;
  for (const auto& [id, split] : *resolved) out[g.node(id).name] = split.ToString();
  return out;
}

TEST_CASE("the standard strategies: dp, owt, model and replica") {
  const Graph g = Cnn();
  const auto dp = Splits(g, StandardStrategy::kDataParallel, 2);
  CHECK(dp.at("stage1/conv") == "sample 2 on devices 0,1");
  CHECK(dp.at("fc") == "sample 2 on devices 0,1");
  CHECK(dp.at("stage1/bn") == "sample 2 on devices 0,1");
  CHECK(dp.at("stage1/max_pool2d") == "sample 2 on devices 0,1");
  CHECK(dp.at("flatten") == "sample 2 on devices 0,1");

  const auto owt = Splits(g, StandardStrategy::kOneWeirdTrick, 2);
  CHECK(owt.at("stage2/conv") == "sample 2 on devices 0,1");
  CHECK(owt.at("fc") == "parameter 2 on devices 0,1");
  CHECK(owt.at("classifier") == "parameter 2 on devices 0,1");
  // 4 classes over 3 devices do not divide: the classifier stays data parallel.
  CHECK(Splits(g, StandardStrategy::kOneWeirdTrick, 3).at("classifier") == "sample 3 on devices 0,1,2");

  // Layers in order over the devices, each whole, the device never going back.
  const auto model = Splits(g, StandardStrategy::kModelParallel, 2);
  CHECK(model.at("stage1/conv") == "whole on device 0");
  CHECK(model.at("classifier") == "whole on device 1");
  int last = 0;
  std::set<int> used;
  for (const Node& n : g.nodes()) {
    if (IsSourceOp(n.op)) continue;
    const int d = model.at(n.name).back() - '0';
    CHECK(d >= last);
    last = d;
    used.insert(d);
  }
  CHECK(used.size() == 2);

  auto unfused = MakeStandardStrategy(g, StandardStrategy::kReplicaParallel, 2);
  REQUIRE(!unfused.ok());
  CHECK(unfused.status().message() ==
        "replica parallelism needs a fused model (a config with replicas or a sweep)");
  auto fused = FuseReplicas(g, FusionOptions{4, {1, 2, 3, 4}, {}, {}});
  REQUIRE(fused.ok());
  CHECK(Splits(*fused, StandardStrategy::kReplicaParallel, 2).at("stage1/conv") == "replica 2 on devices 0,1");
  // More devices than replicas: each replica's batch split within a group
  // of adjacent devices.
  CHECK(Splits(*fused, StandardStrategy::kReplicaParallel, 8).at("stage1/conv") ==
        "sample 2 x replica 4 on devices 0,2,4,6,1,3,5,7");
  CHECK(Splits(*fused, StandardStrategy::kReplicaParallel, 6).at("stage1/conv") ==
        "sample 3 x replica 2 on devices 0,3,1,4,2,5");
  auto coprime = MakeStandardStrategy(*fused, StandardStrategy::kReplicaParallel, 3);
  REQUIRE(!coprime.ok());
  CHECK(coprime.status().message() ==
        "replica parallelism: 4 replicas and 3 devices have no common divisor above 1 to split the replicas by");
}

TEST_CASE("strategy kinds parse by name") {
  CHECK(*ParseStandardStrategy("owt") == StandardStrategy::kOneWeirdTrick);
  auto bad = ParseStandardStrategy("pipeline");
  REQUIRE(!bad.ok());
  CHECK(bad.status().message() == "unknown strategy kind 'pipeline' (expected dp, replica, model or owt)");
}

}  // namespace
}  // namespace loom
