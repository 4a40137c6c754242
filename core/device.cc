#include "core/device.h"

#include <cstdlib>

namespace loom {

std::string Device::ToString() const { return std::string(is_cpu() ? "cpu:" : "cuda:") + std::to_string(index); }

StatusOr<Device> ParseDevice(const std::string& name) {
  std::string kind = name, index = "0";
  if (auto colon = name.find(':'); colon != std::string::npos) {
    kind = name.substr(0, colon);
    index = name.substr(colon + 1);
  }
  char* end = nullptr;
  long i = std::strtol(index.c_str(), &end, 10);
  if (index.empty() || *end != '\0' || i < 0) return InvalidArgument("bad device index in '", name, "'");
  if (kind == "cpu") return Device{DeviceType::kCpu, static_cast<int>(i)};
  if (kind == "cuda" || kind == "gpu") return Device{DeviceType::kCuda, static_cast<int>(i)};
  return InvalidArgument("unknown device '", name, "' (expected cpu[:N] or cuda[:N])");
}

}  // namespace loom
