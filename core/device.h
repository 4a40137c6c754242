// Where a tensor lives and a kernel runs.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace loom {

enum class DeviceType : int { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device Cpu() { return {DeviceType::kCpu, 0}; }
  static Device Cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  std::string ToString() const;  // "cpu:0", "cuda:1"
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

StatusOr<Device> ParseDevice(const std::string& name);

// The devices of a parallel run, at most 64:
//   "cpu:N"           N CPU devices of this process;
//   "cuda:0,1"        two GPUs;
//   "cuda:0x4"        four devices on GPU 0 (a stream each);
//   "cuda:0x2,1x2"    two on each of two GPUs.
StatusOr<std::vector<Device>> ParseDevices(const std::string& text);

}  // namespace loom
