// The cost of an all-reduce or an all-gather among devices with copy
// engines (GPUs), for the simulator (docs/simulator.md#collectives).
//
// Plain machines: a ring over the members in group order, 2(n-1) steps of
// bytes / n per member (an all-gather or a reduce-scatter: n-1 steps),
// each step paying the slowest hop's latency and the busiest link
// resource's load over its bandwidth (two members whose hops share a link,
// as on a PCIe switch or a node's network link, slow the step).
//
// Machines with `nccl` set: NCCL's own cost model (src/graph/tuning.cc,
// ncclTopoTuneModel), whose tuner picks the fastest of
//   - ring, bus bandwidth factor 2(n-1)/n: a base latency plus a per-step
//     hop latency, by protocol and by what the hop crosses (NVLink, PCIe,
//     network);
//   - tree: chains inside nodes and a binary tree between them (NCCL's
//     hierarchical algorithm), algorithm bandwidth half the bus's at 90%,
//     latency 2((n/nodes - 1) intra hops + log2(nodes) network hops);
// each with the Simple protocol (full bandwidth) or LL (low latency, a
// quarter of the ring's bandwidth, 1/3.8 of the tree's). An all-gather is
// a ring, n-1 steps (bus bandwidth factor (n-1)/n). Left out: LL128
// (on by default on few GPUs), the per-size tree correction factors, the
// per-GPU bandwidth caps, NVLS/CollNet.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "simulator/machine.h"

namespace loom {

// Bytes a task puts on a link resource (Machine::resources()).
struct LinkTraffic {
  int64_t resource = 0;
  double bytes = 0;
};

struct CollectiveCost {
  double seconds = 0;
  const char* algorithm = "none";  // "ring", "tree", "ring LL", "tree LL"; "none" for one member
};

// Collectives over one group of devices: what their cost does not owe to
// their size, worked out once (a data-parallel step has one all-reduce per
// parameter over the same group).
class CollectiveModel {
 public:
  // `group`: distinct devices of `machine`, in ring order.
  CollectiveModel(const Machine& machine, const std::vector<int64_t>& group);
  // An all-reduce of `bytes`; appends the bytes it puts on each link
  // resource (each named once) to `traffic`.
  CollectiveCost AllReduce(double bytes, std::vector<LinkTraffic>* traffic) const;
  // An all-gather of a region of `bytes` (each member ends with all of
  // it), likewise.
  CollectiveCost AllGather(double bytes, std::vector<LinkTraffic>* traffic) const;
  // A reduce-scatter of partial sums of `bytes` (each member ends with its
  // part of the sum): the ring's first half, costed as the all-gather (so
  // does NCCL).
  CollectiveCost ReduceScatter(double bytes, std::vector<LinkTraffic>* traffic) const {
    return AllGather(bytes, traffic);
  }

 private:
  // How many of a pass's messages, all in flight at once, cross each link
  // resource.
  struct Crossings {
    std::vector<std::pair<int64_t, int>> counts;  // by resource
    double latency = 0;                           // the slowest message's
    double seconds_per_byte = 0;                  // of each message on the busiest resource
  };
  Crossings Cross(const std::vector<std::pair<int64_t, int64_t>>& messages) const;

  const Machine& machine_;
  double members_ = 0, nodes_ = 0, per_node_ = 0;
  Crossings ring_, tree_;
};

}  // namespace loom
