#include "simulator/collectives.h"

#include <algorithm>
#include <cmath>

namespace loom {
namespace {

enum Algorithm { kRing, kTree };
enum Protocol { kSimple, kLL };

// NCCL's latencies in microseconds (src/graph/tuning.cc: baseLat, hwLat),
// [algorithm][protocol]: a call's base, and one step's hop by what it
// crosses.
constexpr double kBaseUs[2][2] = {{8.4, 3.6}, {0.0, 4.4}};
constexpr double kHopUs[3][2][2] = {
    {{3.4, 0.47}, {28.0, 0.52}},  // NVLink
    {{5.7, 1.0}, {28.0, 1.0}},    // PCIe
    {{9.6, 2.7}, {50.0, 5.0}},    // network
};

int HopKind(proto::Interconnect kind) {
  switch (kind) {
    case proto::PCIE: return 1;
    case proto::NETWORK: return 2;
    default: return 0;
  }
}

// NCCL's ring latency in microseconds: its base and one hop per step, by
// what the hop crosses (`inter_steps` of the `steps` cross nodes); LL's
// hops inside a node are slower in a call that crosses nodes, and Simple's
// plateaus above 64 KiB a member.
double RingMicroseconds(Protocol p, double steps, double inter_steps, int intra, double members, double nodes,
                        double bytes) {
  const double slower = nodes > 1 && p == kLL ? 1.8 : 1.0;
  double us = kBaseUs[kRing][p] + (steps - inter_steps) * kHopUs[intra][kRing][p] * slower +
              inter_steps * kHopUs[HopKind(proto::NETWORK)][kRing][p];
  if (p == kSimple && nodes > 1 && bytes >= members / 16 * 65536) us *= 1.9;
  return us;
}

}  // namespace

CollectiveModel::Crossings CollectiveModel::Cross(const std::vector<std::pair<int64_t, int64_t>>& messages) const {
  Crossings c;
  for (const auto& [src, dst] : messages) {
    const Machine::Route route = machine_.RouteOf(src, dst);
    c.latency = std::max(c.latency, route.link->latency_s());
    for (int64_t r : route) c.counts.push_back({r, 1});
  }
  std::sort(c.counts.begin(), c.counts.end());
  size_t out = 0;
  for (const auto& entry : c.counts) {
    if (out > 0 && c.counts[out - 1].first == entry.first) {
      c.counts[out - 1].second += entry.second;
    } else {
      c.counts[out++] = entry;
    }
  }
  c.counts.resize(out);
  for (const auto& [r, count] : c.counts)
    c.seconds_per_byte = std::max(c.seconds_per_byte, count / machine_.LinkOf(r).bandwidth());
  return c;
}

CollectiveModel::CollectiveModel(const Machine& m, const std::vector<int64_t>& group) : machine_(m) {
  const size_t n = group.size();
  members_ = static_cast<double>(n);
  if (n < 2) return;
  // The ring: every member sends a chunk to the next at each step.
  std::vector<std::pair<int64_t, int64_t>> messages;
  for (size_t i = 0; i < n; ++i) messages.push_back({group[i], group[(i + 1) % n]});
  ring_ = Cross(messages);
  // The tree: a chain in group order, reducing up it and broadcasting down,
  // pipelined (both passes in flight at once).
  messages.clear();
  for (size_t i = 0; i + 1 < n; ++i) {
    messages.push_back({group[i + 1], group[i]});
    messages.push_back({group[i], group[i + 1]});
  }
  tree_ = Cross(messages);
  // Nodes spanned, and members on the fullest.
  std::vector<int64_t> nodes;
  for (int64_t d : group) nodes.push_back(m.NodeOf(d));
  std::sort(nodes.begin(), nodes.end());
  for (size_t i = 0; i < n;) {
    const size_t j = static_cast<size_t>(std::upper_bound(nodes.begin(), nodes.end(), nodes[i]) - nodes.begin());
    per_node_ = std::max(per_node_, static_cast<double>(j - i));
    nodes_ += 1;
    i = j;
  }
}

CollectiveCost CollectiveModel::AllReduce(double bytes, std::vector<LinkTraffic>* traffic) const {
  if (members_ < 2) return {};
  const double chunk = bytes / members_, steps = 2 * (members_ - 1);
  const double ring_bandwidth_s = steps * chunk * ring_.seconds_per_byte;
  auto add_traffic = [&](const Crossings& c, double bytes_per_crossing) {
    for (const auto& [r, count] : c.counts) traffic->push_back({r, count * bytes_per_crossing});
  };
  if (!machine_.proto().nccl()) {
    add_traffic(ring_, steps * chunk);
    return {steps * ring_.latency + ring_bandwidth_s, "ring"};
  }

  const double inter_steps = 2 * (nodes_ - 1);
  const int intra = HopKind(machine_.proto().intra_node().kind()), net = HopKind(proto::NETWORK);
  const double tree_bandwidth_s = 2 * bytes * tree_.seconds_per_byte / 0.9;
  CollectiveCost best{0, ""};
  for (Protocol p : {kSimple, kLL}) {
    const double slower = nodes_ > 1 && p == kLL ? 1.8 : 1.0;
    const double ring_us = RingMicroseconds(p, steps, inter_steps, intra, members_, nodes_, bytes);
    const double tree_us = kBaseUs[kTree][p] + 2 * ((per_node_ - 1) * kHopUs[intra][kTree][p] * slower +
                                                    std::floor(std::log2(nodes_)) * kHopUs[net][kTree][p]);
    const CollectiveCost candidates[2] = {
        {ring_us * 1e-6 + ring_bandwidth_s * (p == kLL ? 4.0 : 1.0), p == kLL ? "ring LL" : "ring"},
        {tree_us * 1e-6 + tree_bandwidth_s * (p == kLL ? 3.8 : 1.0), p == kLL ? "tree LL" : "tree"},
    };
    for (const CollectiveCost& c : candidates)
      if (best.algorithm[0] == '\0' || c.seconds < best.seconds) best = c;
  }
  if (best.algorithm[0] == 'r') {
    add_traffic(ring_, steps * chunk);
  } else {
    add_traffic(tree_, bytes);
  }
  return best;
}

CollectiveCost CollectiveModel::AllGather(double bytes, std::vector<LinkTraffic>* traffic) const {
  if (members_ < 2) return {};
  const double chunk = bytes / members_, steps = members_ - 1;
  const double ring_bandwidth_s = steps * chunk * ring_.seconds_per_byte;
  for (const auto& [r, count] : ring_.counts) traffic->push_back({r, count * steps * chunk});
  if (!machine_.proto().nccl()) return {steps * ring_.latency + ring_bandwidth_s, "ring"};
  const int intra = HopKind(machine_.proto().intra_node().kind());
  const double simple = RingMicroseconds(kSimple, steps, nodes_ - 1, intra, members_, nodes_, bytes) * 1e-6 +
                        ring_bandwidth_s;
  const double ll =
      RingMicroseconds(kLL, steps, nodes_ - 1, intra, members_, nodes_, bytes) * 1e-6 + 4 * ring_bandwidth_s;
  return ll < simple ? CollectiveCost{ll, "ring LL"} : CollectiveCost{simple, "ring"};
}

}  // namespace loom
