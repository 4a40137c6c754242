#include "simulator/machine.h"

#include "core/text_proto.h"

namespace loom {

StatusOr<Machine> Machine::Load(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path, "machine file"));
  return Parse(text, path);
}

StatusOr<Machine> Machine::Parse(const std::string& text, const std::string& origin) {
  proto::Machine m;
  LOOM_ASSIGN_OR_RETURN(TextLocations where, ParseTextProto(text, origin, &m));
  Machine machine;
  machine.proto_ = m;
  const std::string at = where.Where("nodes");
  LOOM_RETURN_IF_ERROR(machine.Check(origin, at.empty() ? origin : at));
  return machine;
}

StatusOr<Machine> Machine::FromProto(const proto::Machine& m, const std::string& origin) {
  Machine machine;
  machine.proto_ = m;
  LOOM_RETURN_IF_ERROR(machine.Check(origin, origin));
  return machine;
}

Status Machine::Check(const std::string& origin, const std::string& where_nodes) const {
  const proto::Machine& m = proto_;
  if (m.nodes() < 1 || m.devices_per_node() < 1)
    return InvalidArgument(where_nodes, ": a machine needs nodes >= 1 and devices_per_node >= 1, got ", m.nodes(),
                           " and ", m.devices_per_node());
  const proto::DeviceSpec& d = m.device();
  if (!(d.peak_flops_f32() > 0) || !(d.memory_bandwidth() > 0) || !(d.memory_bytes() > 0))
    return InvalidArgument(origin, ": device: peak_flops_f32, memory_bandwidth and memory_bytes must be > 0");
  if (d.launch_overhead_s() < 0) return InvalidArgument(origin, ": device.launch_overhead_s must be >= 0");
  auto check_link = [&](const proto::LinkSpec& l, const char* name) -> Status {
    if (!(l.bandwidth() > 0) || l.latency_s() < 0)
      return InvalidArgument(origin, ": ", name, ": bandwidth must be > 0 and latency_s >= 0");
    return Status::Ok();
  };
  if (m.devices_per_node() > 1 || d.copies_on_device()) LOOM_RETURN_IF_ERROR(check_link(m.intra_node(), "intra_node"));
  if (m.nccl() && m.devices_per_node() > 1 && m.intra_node().kind() == proto::INTERCONNECT_UNSPECIFIED)
    return InvalidArgument(origin, ": intra_node: an nccl machine needs the link's kind (NVLINK or PCIE)");
  if (m.nodes() > 1) LOOM_RETURN_IF_ERROR(check_link(m.inter_node(), "inter_node"));
  return Status::Ok();
}

double Machine::PeakFlops(DType dtype) const {
  const proto::DeviceSpec& d = device();
  double peak = 0;
  switch (dtype) {
    case DType::kF64: peak = d.peak_flops_f64(); break;
    case DType::kBF16: peak = d.peak_flops_bf16(); break;
    case DType::kF16: peak = d.peak_flops_f16(); break;
    default: break;
  }
  return peak > 0 ? peak : d.peak_flops_f32();  // a type with no rate of its own runs at f32's
}

// Resources: [0, nodes) the shared intra-node links, or nodes * n * n
// ordered pairs; then the nodes' inter-node links out, then in.
int64_t Machine::IntraResources() const {
  const int64_t n = proto_.devices_per_node(), nodes = proto_.nodes();
  return proto_.intra_node().shared() ? nodes : nodes * n * n;
}

int64_t Machine::resources() const { return IntraResources() + 2 * proto_.nodes(); }

int64_t Machine::LinkOut(int64_t node) const { return IntraResources() + node; }

const proto::LinkSpec& Machine::LinkOf(int64_t resource) const {
  return resource < IntraResources() ? proto_.intra_node() : proto_.inter_node();
}

Machine::Route Machine::RouteOf(int64_t src, int64_t dst) const {
  const int64_t n = proto_.devices_per_node(), nodes = proto_.nodes(), intra = IntraResources();
  Route r;
  if (NodeOf(src) == NodeOf(dst)) {
    r.link = &proto_.intra_node();
    r.resources[0] = proto_.intra_node().shared() ? NodeOf(src) : NodeOf(src) * n * n + (src % n) * n + dst % n;
    r.count = 1;
  } else {
    r.link = &proto_.inter_node();
    r.resources[0] = LinkOut(NodeOf(src));
    r.resources[1] = intra + nodes + NodeOf(dst);
    r.count = 2;
  }
  return r;
}

double Machine::MessageSeconds(const Route& route, double bytes) {
  return route.link->latency_s() + bytes / route.link->bandwidth();
}

std::string Machine::ResourceName(int64_t r) const {
  const int64_t n = proto_.devices_per_node(), nodes = proto_.nodes(), intra = IntraResources();
  if (r < intra) {
    if (proto_.intra_node().shared()) return StrCat("node ", r, " link");
    const int64_t node = r / (n * n), src = (r % (n * n)) / n, dst = r % n;
    return StrCat(node * n + src, "->", node * n + dst);
  }
  if (r < intra + nodes) return StrCat("node ", r - intra, " out");
  return StrCat("node ", r - intra - nodes, " in");
}

}  // namespace loom
