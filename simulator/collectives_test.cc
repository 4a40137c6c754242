#include "simulator/collectives.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <string>

namespace loom {
namespace {

Machine MachineOf(int64_t nodes, int64_t per_node, bool nccl, bool shared, proto::Interconnect kind) {
  proto::Machine m;
  m.set_name("test");
  m.set_nodes(nodes);
  m.set_devices_per_node(per_node);
  m.mutable_device()->set_peak_flops_f32(1e12);
  m.mutable_device()->set_memory_bandwidth(1e12);
  m.mutable_device()->set_memory_bytes(1e10);
  m.mutable_intra_node()->set_latency_s(2e-6);
  m.mutable_intra_node()->set_bandwidth(100e9);
  m.mutable_intra_node()->set_shared(shared);
  m.mutable_intra_node()->set_kind(kind);
  m.mutable_inter_node()->set_latency_s(5e-6);
  m.mutable_inter_node()->set_bandwidth(25e9);
  m.mutable_inter_node()->set_kind(proto::NETWORK);
  m.set_nccl(nccl);
  auto machine = Machine::FromProto(m, "test");
  REQUIRE(machine.status().ToString() == "OK");
  return *machine;
}

std::vector<int64_t> FirstDevices(int64_t n) {
  std::vector<int64_t> group(static_cast<size_t>(n));
  std::iota(group.begin(), group.end(), 0);
  return group;
}

double TotalBytes(const std::vector<LinkTraffic>& traffic) {
  double total = 0;
  for (const LinkTraffic& t : traffic) total += t.bytes;
  return total;
}

TEST_CASE("a plain ring: 2(n-1) steps of the slowest hop's latency and bytes / n over the busiest link") {
  const Machine m = MachineOf(1, 8, false, false, proto::INTERCONNECT_UNSPECIFIED);
  std::vector<LinkTraffic> traffic;
  const CollectiveCost c = CollectiveModel(m, FirstDevices(8)).AllReduce(8e6, &traffic);
  CHECK(std::string(c.algorithm) == "ring");
  CHECK(c.seconds == Approx(14 * (2e-6 + 1e6 / 100e9)));
  CHECK(traffic.size() == 8);  // one resource per ring hop
  CHECK(TotalBytes(traffic) == Approx(8 * 14 * 1e6));
  // One member: nothing to do.
  std::vector<LinkTraffic> none;
  CHECK(CollectiveModel(m, {3}).AllReduce(8e6, &none).seconds == 0);
  CHECK(none.empty());
}

TEST_CASE("a ring on a shared link: the members' messages of a step queue on it") {
  const Machine unshared = MachineOf(1, 4, false, false, proto::INTERCONNECT_UNSPECIFIED);
  const Machine shared = MachineOf(1, 4, false, true, proto::INTERCONNECT_UNSPECIFIED);
  std::vector<LinkTraffic> a, b;
  const double bytes = 4e8;  // large: bandwidth dominates
  const double fast = CollectiveModel(unshared, FirstDevices(4)).AllReduce(bytes, &a).seconds;
  const double slow = CollectiveModel(shared, FirstDevices(4)).AllReduce(bytes, &b).seconds;
  CHECK(slow == Approx(6 * (2e-6 + 4 * 1e8 / 100e9)));
  CHECK(slow > 3.9 * fast);
  CHECK(b.size() == 1);
  CHECK(TotalBytes(a) == Approx(TotalBytes(b)));
}

TEST_CASE("NCCL on one node: LL for small messages, the Simple ring for large ones, by NCCL's formulas") {
  const Machine m = MachineOf(1, 8, true, false, proto::NVLINK);
  const CollectiveModel model(m, FirstDevices(8));
  std::vector<LinkTraffic> traffic;
  // 1 KB: latency-bound; the LL ring: 3.6 us + 14 NVLink hops of 0.47 us, a quarter of the bandwidth.
  const CollectiveCost small = model.AllReduce(1024, &traffic);
  CHECK(std::string(small.algorithm) == "ring LL");
  CHECK(small.seconds == Approx((3.6 + 14 * 0.47) * 1e-6 + 4 * 14 * 128 / 100e9));
  // 1 GB: bandwidth-bound; the Simple ring: 8.4 us + 14 hops of 3.4 us + 2(n-1)/n bytes / bandwidth.
  const CollectiveCost large = model.AllReduce(1e9, &traffic);
  CHECK(std::string(large.algorithm) == "ring");
  CHECK(large.seconds == Approx((8.4 + 14 * 3.4) * 1e-6 + 2.0 * 7 / 8 * 1e9 / 100e9));
  // NCCL's bus bandwidth: bytes * 2(n-1)/n over the time tends to the link's.
  CHECK(1e9 * 2 * 7 / 8 / large.seconds == Approx(100e9).epsilon(0.01));
}

TEST_CASE("NCCL across nodes: the tree (chains in nodes, a tree between them) where its latency wins") {
  const Machine m = MachineOf(8, 8, true, false, proto::NVLINK);
  const CollectiveModel model(m, FirstDevices(64));
  std::vector<LinkTraffic> traffic;
  // 64 KB over 64 GPUs: the ring pays 2 * 63 hops, the tree 2 (7 + log2 8);
  // a node's network link out carries the chain's messages up and down.
  const CollectiveCost mid = model.AllReduce(65536, &traffic);
  CHECK(std::string(mid.algorithm) == "tree LL");
  CHECK(mid.seconds == Approx((4.4 + 2 * (7 * 0.52 * 1.8 + 3 * 5.0)) * 1e-6 + 3.8 * 2 * 65536 * 2 / 25e9 / 0.9));
  // Large: the ring, its 2(n-1)/n bytes through each node's network link.
  traffic.clear();
  const CollectiveCost large = model.AllReduce(1e9, &traffic);
  CHECK(std::string(large.algorithm) == "ring");
  const double steps = 126, inter_steps = 14;
  const double ring_us = 1.9 * (8.4 + (steps - inter_steps) * 3.4 + inter_steps * 9.6);
  CHECK(large.seconds == Approx(ring_us * 1e-6 + steps * (1e9 / 64) / 25e9));
  double network = 0;
  for (const LinkTraffic& t : traffic)
    if (m.ResourceName(t.resource).find("out") != std::string::npos) network += t.bytes;
  CHECK(network == Approx(8 * steps * 1e9 / 64));  // each node's link out: one hop per step
}

TEST_CASE("an all-gather is the ring's second half: n-1 steps of bytes / n") {
  const Machine plain = MachineOf(1, 8, false, false, proto::INTERCONNECT_UNSPECIFIED);
  std::vector<LinkTraffic> gather, reduce;
  const CollectiveModel ring(plain, FirstDevices(8));
  const CollectiveCost c = ring.AllGather(8e6, &gather);
  CHECK(std::string(c.algorithm) == "ring");
  CHECK(c.seconds == Approx(7 * (2e-6 + 1e6 / 100e9)));
  CHECK(TotalBytes(gather) == Approx(8 * 7 * 1e6));  // each member receives the 7 parts it lacks
  ring.AllReduce(8e6, &reduce);
  CHECK(TotalBytes(reduce) == Approx(2 * TotalBytes(gather)));
  std::vector<LinkTraffic> none;
  CHECK(CollectiveModel(plain, {5}).AllGather(8e6, &none).seconds == 0);
  CHECK(none.empty());
  // NCCL, 1 GB over 8 GPUs of one node: the Simple ring, 7 hops, (n-1)/n bytes over the bandwidth.
  const Machine nvlink = MachineOf(1, 8, true, false, proto::NVLINK);
  std::vector<LinkTraffic> traffic;
  const CollectiveCost large = CollectiveModel(nvlink, FirstDevices(8)).AllGather(1e9, &traffic);
  CHECK(std::string(large.algorithm) == "ring");
  CHECK(large.seconds == Approx((8.4 + 7 * 3.4) * 1e-6 + 7.0 / 8 * 1e9 / 100e9));
  // 64 GPUs on 8 nodes, 1 KB: latency-bound, the LL ring; 7 of its 63 steps cross nodes.
  const Machine nodes = MachineOf(8, 8, true, false, proto::NVLINK);
  const CollectiveCost small = CollectiveModel(nodes, FirstDevices(64)).AllGather(1024, &traffic);
  CHECK(std::string(small.algorithm) == "ring LL");
  CHECK(small.seconds == Approx((3.6 + 56 * 0.47 * 1.8 + 7 * 2.7) * 1e-6 + 4 * 63 * 16 / 25e9));
}

TEST_CASE("an nccl machine names its links' kind") {
  auto bad = Machine::Parse("name: \"x\" nodes: 1 devices_per_node: 2 nccl: true\n"
                            "device { peak_flops_f32: 1 memory_bandwidth: 1 memory_bytes: 1 }\n"
                            "intra_node { latency_s: 1e-6 bandwidth: 1e9 }\n",
                            "m.pbtxt");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("m.pbtxt") && Catch::Contains("NVLINK or PCIE"));
}

}  // namespace
}  // namespace loom
