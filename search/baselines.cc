#include "search/baselines.h"

#include <filesystem>

#include <algorithm>
#include <numeric>
#include <vector>

#include "graph/cost.h"
#include "graph/strategy.h"

namespace loom {
namespace {

// The replica count of a fused graph: the largest of its nodes' outputs'
// (0 when unfused).
int64_t ReplicaCount(const Graph& g) {
  int64_t r = 0;
  for (const Node& n : g.nodes())
    for (ValueId id : n.outputs) r = std::max(r, ReplicasOf(g.value(id)));
  return r;
}

// Contiguous runs of the layers (node order) of about equal forward FLOPs:
// layer i goes to the device whose share of the running total it starts in.
void PlaceByFlops(const Graph& g, int64_t devices, proto::Strategy* s) {
  std::vector<const Node*> layers;
  std::vector<double> flops;
  double total = 0;
  for (const Node& n : g.nodes()) {
    if (IsSourceOp(n.op)) continue;
    layers.push_back(&n);
    flops.push_back(NodeCost(g, n).flops);
    total += flops.back();
  }
  double before = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t device =
        total > 0 ? std::min<int64_t>(devices - 1, static_cast<int64_t>(before / total * static_cast<double>(devices)))
                  : static_cast<int64_t>(i * static_cast<size_t>(devices) / layers.size());
    before += flops[i];
    proto::LayerSplit* e = s->add_layer();
    e->set_layer(layers[i]->name);
    e->add_devices(device);
  }
}

}  // namespace

StatusOr<StandardStrategy> ParseStandardStrategy(const std::string& kind) {
  if (kind == "dp") return StandardStrategy::kDataParallel;
  if (kind == "replica") return StandardStrategy::kReplicaParallel;
  if (kind == "model") return StandardStrategy::kModelParallel;
  if (kind == "owt") return StandardStrategy::kOneWeirdTrick;
  return InvalidArgument("unknown strategy kind '", kind, "' (expected dp, replica, model or owt)");
}

StatusOr<proto::Strategy> MakeStandardStrategy(const Graph& graph, StandardStrategy kind, int64_t devices) {
  if (devices < 1) return InvalidArgument("a strategy needs at least one device, got ", devices);
  proto::Strategy s;
  s.set_devices(devices);
  switch (kind) {
    case StandardStrategy::kDataParallel: s.mutable_default_split()->set_sample(devices); break;
    case StandardStrategy::kReplicaParallel: {
      // The replicas over as many groups of devices as both counts allow
      // (8 replicas on 16 devices: 8 pairs), each group splitting its
      // replicas' batch on adjacent devices (PlaceGroupedByReplica): with
      // each pair 8 devices apart instead, ResNet-18's sweep over 16 P100s
      // simulated 37.3 ms a step against 22.7.
      const int64_t r = ReplicaCount(graph);
      if (r == 0) return InvalidArgument("replica parallelism needs a fused model (a config with replicas or a sweep)");
      const int64_t groups = std::gcd(r, devices), per_group = devices / groups;
      if (groups == 1 && devices > 1)
        return InvalidArgument("replica parallelism: ", r, " replicas and ", devices,
                               " devices have no common divisor above 1 to split the replicas by");
      proto::LayerSplit* split = s.mutable_default_split();
      split->set_replica(groups);
      if (per_group > 1) {
        split->set_sample(per_group);
        LayerSplit placed;
        placed.degree[static_cast<size_t>(SplitDim::kSample)] = per_group;
        placed.degree[static_cast<size_t>(SplitDim::kReplica)] = groups;
        placed.PlaceGroupedByReplica(0);
        for (int64_t d : placed.devices) split->add_devices(d);
      }
      break;
    }
    case StandardStrategy::kModelParallel: PlaceByFlops(graph, devices, &s); break;
    case StandardStrategy::kOneWeirdTrick: {
      s.mutable_default_split()->set_sample(devices);
      for (const Node& n : graph.nodes()) {
        if (n.op != "Linear") continue;
        const Shape& y = graph.type(n.outputs[0]).shape;
        if (y.rank() == 0 || y[y.rank() - 1] % devices != 0) continue;  // stays data parallel
        proto::LayerSplit* e = s.add_layer();
        e->set_layer(n.name);
        e->set_parameter(devices);
      }
      break;
    }
  }
  LOOM_ASSIGN_OR_RETURN(const Strategy checked, Strategy::FromProto(s, "the standard strategy"));
  LOOM_RETURN_IF_ERROR(checked.Resolve(graph).status());
  return s;
}

StatusOr<Strategy> LoadOrMakeStrategy(const std::string& name, const Graph& forward, int64_t devices,
                                      const std::string& what) {
  if (StatusOr<StandardStrategy> kind = ParseStandardStrategy(name); kind.ok()) {
    LOOM_ASSIGN_OR_RETURN(proto::Strategy s, MakeStandardStrategy(forward, *kind, devices));
    return Strategy::FromProto(s, "strategy " + name);
  }
  if (!std::filesystem::exists(name))
    return NotFound(what, ": '", name, "' is neither a standard strategy (dp, replica, model or owt) nor a strategy file");
  LOOM_ASSIGN_OR_RETURN(Strategy strategy, Strategy::Load(name));
  if (strategy.devices() != devices)
    return InvalidArgument(name, ": the strategy places parts on ", strategy.devices(), " devices, the run has ",
                           devices);
  return strategy;
}

}  // namespace loom
