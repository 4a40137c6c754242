// A machine the execution simulator predicts for (core/proto/machine.proto,
// docs/simulator.md): `nodes` nodes of `devices_per_node` identical
// devices; device d is on node d / devices_per_node. Messages between two
// devices of a node cross the intra-node link, between nodes the senders'
// and receivers' inter-node links. Links are resources that carry one
// message at a time: a shared intra-node link one per node, an unshared one
// one per ordered pair of devices, and every node one inter-node link out
// and one in.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/proto/machine.pb.h"
#include "core/status.h"

namespace loom {

class Machine {
 public:
  // A text proto file (simulator/machines/*.pbtxt); errors name FILE:LINE.
  static StatusOr<Machine> Load(const std::string& path);
  static StatusOr<Machine> Parse(const std::string& text, const std::string& origin);
  static StatusOr<Machine> FromProto(const proto::Machine& machine, const std::string& origin);

  const proto::Machine& proto() const { return proto_; }
  const proto::DeviceSpec& device() const { return proto_.device(); }
  const std::string& name() const { return proto_.name(); }
  int64_t devices() const { return proto_.nodes() * proto_.devices_per_node(); }
  int64_t NodeOf(int64_t device) const { return device / proto_.devices_per_node(); }
  // FLOP/s for `dtype` (integer work counts as f32).
  double PeakFlops(DType dtype) const;

  // What a message from `src` to `dst` (different devices) crosses: the
  // link and the resources it holds while it moves.
  // (At most two resources: a route is built for every message the
  // simulator schedules, so it allocates nothing.)
  struct Route {
    const proto::LinkSpec* link = nullptr;
    int64_t resources[2] = {-1, -1};
    int count = 0;
    const int64_t* begin() const { return resources; }
    const int64_t* end() const { return resources + count; }
  };
  Route RouteOf(int64_t src, int64_t dst) const;
  // Seconds a message of `bytes` takes on `route`'s link.
  static double MessageSeconds(const Route& route, double bytes);
  int64_t resources() const;
  // The inter-node link resource out of `node`.
  int64_t LinkOut(int64_t node) const;
  // The link a resource belongs to.
  const proto::LinkSpec& LinkOf(int64_t resource) const;
  std::string ResourceName(int64_t resource) const;  // "node 0 link", "0->1", "node 1 out", ...

 private:
  Status Check(const std::string& origin, const std::string& where_nodes) const;
  int64_t IntraResources() const;  // resources [0, IntraResources()) are intra-node
  proto::Machine proto_;
};

}  // namespace loom
