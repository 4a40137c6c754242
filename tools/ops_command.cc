// `loom ops`: the op catalogue of this build, with how each op fuses across
// replicas (graph/fusion.h: fused, fused or per replica, per replica) and the
// devices that have a kernel for it (a backend may support a subset).
#include <cstdio>

#include "ops/op.h"
#include "tools/commands.h"

namespace loom::tools {

Status OpsCommand(const std::vector<std::string>& args) {
  if (!args.empty()) return InvalidArgument("loom ops takes no arguments");
  const OpRegistry& registry = OpRegistry::Global();
  std::printf("%-32s %-22s %s\n", "op", "fusion", "kernels");
  for (const std::string& name : registry.OpNames()) {
    std::string devices;
    if (registry.SupportsOp(name, DeviceType::kCpu)) devices += "cpu";
    if (registry.SupportsOp(name, DeviceType::kCuda)) devices += devices.empty() ? "cuda" : " cuda";
    if (devices.empty()) devices = "- (bound by the executor)";
    const char* fusion = FusionKindName(registry.FindOp(name)->fusion_kind());
    std::printf("%-32s %-22s %s\n", name.c_str(), fusion, devices.c_str());
  }
  return Status::Ok();
}

}  // namespace loom::tools
