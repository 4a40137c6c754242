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

StatusOr<std::vector<Device>> ParseDevices(const std::string& text) {
  constexpr int64_t kMaxDevices = 64;
  const auto number = [](const std::string& s, int64_t* out) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = std::stoll(s);
    return true;
  };
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("expected cpu:N or cuda:LIST (cuda:0,1 for two GPUs, cuda:0x4 for four devices on GPU 0), ",
                           "with at most ", kMaxDevices, " devices: ", why, " in '", text, "'");
  };
  std::vector<Device> devices;
  if (text.rfind("cpu:", 0) == 0) {
    int64_t n = 0;
    if (!number(text.substr(4), &n) || n < 1 || n > kMaxDevices) return bad("N must be in [1, 64]");
    devices.assign(static_cast<size_t>(n), Device::Cpu());
    return devices;
  }
  if (text.rfind("cuda:", 0) != 0) return bad("unknown kind");
  std::string rest = text.substr(5);
  while (true) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    const size_t x = item.find('x');
    int64_t gpu = 0, copies = 1;
    if (!number(item.substr(0, x), &gpu) || (x != std::string::npos && (!number(item.substr(x + 1), &copies) || copies < 1)))
      return bad("'" + item + "' is not a GPU index (I) or I x streams (IxK)");
    if (static_cast<int64_t>(devices.size()) + copies > kMaxDevices) return bad("too many devices");
    devices.insert(devices.end(), static_cast<size_t>(copies), Device::Cuda(static_cast<int>(gpu)));
    if (comma == std::string::npos) break;
    rest = rest.substr(comma + 1);
  }
  return devices;
}

}  // namespace loom
