// `loom plan --config FILE [--memory SIZE] [--device NAME] [--max-replicas N]`:
// how many fused replicas of a config's model fit in a device's memory,
// from the graph and the static memory plan (runtime/step_memory.h), not by
// running steps. For R = 1, 2, 4, ... the fused training step is built as
// `loom bench fusion` builds it and its peak estimated (train/replica_plan.h,
// shared with `loom sweep`); between the last
// power of two that fits and the first that does not, a binary search finds
// the largest R that fits. docs/fusion_tools.md.
#include <cmath>
#include <cstdio>
#include <map>

#include "core/file_util.h"
#include "graph/compile.h"
#include "train/config/train_config.h"
#include "runtime/step_memory.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/replica_plan.h"
#include "train/training_run.h"

namespace loom::tools {
namespace {

constexpr double kMiB = 1048576.0;

// Devices by name: memory as marketed (decimal GB; the usable memory that
// nvidia-smi reports is a little more for most of them, and the CUDA context
// takes some of it back). "cpu" is this machine's physical memory.
struct KnownDevice {
  const char* name;
  double gigabytes;  // 0: this machine's physical memory
  const char* what;
};
constexpr KnownDevice kDevices[] = {
    {"h200", 141, "NVIDIA H200, 141 GB HBM3e"},
    {"h100", 80, "NVIDIA H100, 80 GB HBM3"},
    {"a100", 80, "NVIDIA A100, 80 GB HBM2e"},
    {"a100-80gb", 80, "NVIDIA A100, 80 GB HBM2e"},
    {"a100-40gb", 40, "NVIDIA A100, 40 GB HBM2"},
    {"v100", 16, "NVIDIA V100, 16 GB HBM2"},
    {"v100-32gb", 32, "NVIDIA V100, 32 GB HBM2"},
    {"t4", 16, "NVIDIA T4, 16 GB GDDR6"},
    {"rtx4090", 24, "NVIDIA GeForce RTX 4090, 24 GB GDDR6X"},
    {"cpu", 0, "this machine's physical memory"},
};

std::string KnownDeviceNames() {
  std::string s;
  for (const KnownDevice& d : kDevices) s += std::string(s.empty() ? "" : ", ") + d.name;
  return s;
}

// "64 MiB", "141 GB", "7.61 GiB".
std::string FormatBytes(uint64_t b) {
  char s[64];
  const uint64_t kGiB = uint64_t{1} << 30, kMiBi = uint64_t{1} << 20;
  if (b % kGiB == 0) {
    std::snprintf(s, sizeof(s), "%llu GiB", static_cast<unsigned long long>(b / kGiB));
  } else if (b % 1000000000 == 0) {
    std::snprintf(s, sizeof(s), "%llu GB", static_cast<unsigned long long>(b / 1000000000));
  } else if (b % kMiBi == 0) {
    std::snprintf(s, sizeof(s), "%llu MiB", static_cast<unsigned long long>(b / kMiBi));
  } else if (b >= kGiB) {
    std::snprintf(s, sizeof(s), "%.2f GiB", static_cast<double>(b) / static_cast<double>(kGiB));
  } else if (b >= kMiBi) {
    std::snprintf(s, sizeof(s), "%.2f MiB", static_cast<double>(b) / kMiB);
  } else {
    std::snprintf(s, sizeof(s), "%llu bytes", static_cast<unsigned long long>(b));
  }
  return s;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char u[8];
      std::snprintf(u, sizeof(u), "\\u%04x", c);
      out += u;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Status Plan(const Flags& flags) {
  if (!flags.Has("config")) return InvalidArgument("loom plan needs --config FILE");
  const std::string config_path = flags.Str("config", "");
  LOOM_ASSIGN_OR_RETURN(proto::TrainConfig config, LoadTrainConfig(config_path));
  LOOM_ASSIGN_OR_RETURN(int64_t max_replicas, flags.Int("max-replicas", 1024));
  if (max_replicas < 1 || max_replicas > (int64_t{1} << 20))
    return InvalidArgument("--max-replicas must be in [1, 1048576], got ", max_replicas);

  // The device: its memory (unless --memory) and whether the host's copies
  // land on it (cpu) or not (the GPUs).
  const std::string device_name = flags.Str("device", "cpu");
  const KnownDevice* device = nullptr;
  for (const KnownDevice& d : kDevices)
    if (device_name == d.name) device = &d;
  if (!device) return InvalidArgument("unknown device '", device_name, "' (known: ", KnownDeviceNames(), ")");
  const bool is_cpu = device->gigabytes == 0;
  uint64_t memory = 0;
  if (flags.Has("memory")) {
    LOOM_ASSIGN_OR_RETURN(memory, train::ParseMemorySize(flags.Str("memory", ""), "--memory"));
  } else if (is_cpu) {
    memory = train::PhysicalMemory();
    if (memory == 0) return FailedPrecondition("cannot read this machine's physical memory; give --memory SIZE");
  } else {
    memory = static_cast<uint64_t>(device->gigabytes * 1e9);
  }
  const Device accounting = is_cpu ? Device::Cpu() : Device::Cuda(0);
  const int64_t batch = config.data().batch_size();
  const StepOptimizer opt = StepOptimizer{config.optimizer()};
  // loom train also keeps an executor of the evaluation graph (BatchNorm and
  // Dropout in eval mode, at eval_batch_size) with its own state tensors.
  const bool with_eval = flags.Bool("with-eval");
  LOOM_ASSIGN_OR_RETURN(const train::ReplicaPlan plan,
                        train::PlanReplicas(config, memory, accounting, max_replicas, with_eval));
  const auto& rows = plan.rows;
  const int64_t lo = plan.largest_fitting;
  const int64_t hi = plan.limited_by_max_replicas ? 0 : 1;

  if (flags.Has("json")) {
    std::string json = StrCat("{\"config\": ", JsonString(config_path), ", \"model\": ", JsonString(config.model().name()),
                              ", \"batch\": ", batch, ", \"device\": \"", device->name,
                              "\", \"memory_bytes\": ", memory, ", \"with_eval\": ", with_eval ? "true" : "false", ", \"largest_fitting\": ", lo,
                              ", \"limited_by_max_replicas\": ", hi == 0 ? "true" : "false", ", \"rows\": [");
    bool first = true;
    for (const auto& [r, row] : rows) {
      const StepMemory& s = row.memory;
      json += StrCat(first ? "" : ", ", "{\"replicas\": ", r, ", \"state_bytes\": ", s.state_bytes,
                     ", \"arena_bytes\": ", s.arena_bytes, ", \"input_bytes\": ", s.input_bytes,
                     ", \"transient_bytes\": ", s.transient_bytes, ", \"step_bytes\": ", s.total(),
                     ", \"eval_bytes\": ", row.eval_bytes, ", \"total_bytes\": ", row.total(),
                     ", \"fits\": ", row.fits ? "true" : "false", "}");
      first = false;
    }
    json += "]}\n";
    const std::string path = flags.Str("json", "");
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(path, json));
  }
  const std::string size = FormatBytes(memory);
  std::printf("%s: model %s, batch %lld, optimizer %s; fused training step of R replicas\n", config_path.c_str(),
              config.model().name().c_str(), static_cast<long long>(batch), opt.config.type().c_str());
  std::printf("%8s %12s %16s %12s%s %12s %6s\n", "R", "state MiB", "activations MiB", "other MiB",
              with_eval ? "     eval MiB" : "", "total MiB", "fits");
  for (const auto& [r, row] : rows) {
    const StepMemory& s = row.memory;
    char eval[32] = "";
    if (with_eval) std::snprintf(eval, sizeof(eval), " %12.2f", row.eval_bytes / kMiB);
    std::printf("%8lld %12.2f %16.2f %12.2f%s %12.2f %6s\n", static_cast<long long>(r), s.state_bytes / kMiB,
                s.arena_bytes / kMiB, (s.input_bytes + s.transient_bytes) / kMiB, eval, row.total() / kMiB,
                row.fits ? "yes" : "no");
  }
  std::printf("largest R that fits in %s (%s): %lld%s\n", size.c_str(), device->name, static_cast<long long>(lo),
              hi == 0 ? " (the --max-replicas limit; more may fit)" : "");
  std::printf("(state: parameters, buffers and optimizer slots; activations: the step's arena; other: the fed "
              "batch and %s%s)\n",
              is_cpu ? "the largest host copy (initial state, outputs) or kernel scratch"
                     : "the next step's copy of a feed or kernel scratch",
              with_eval ? "; eval: the evaluation executor's parameters, buffers, arena and batch"
                        : "; not counted: the evaluation executor of loom train (--with-eval counts it)");
  std::printf("estimated from loom's own memory plan (the same arena on CPU and CUDA); CUDA library workspaces "
              "such as cuBLAS's and the CUDA context are not counted\n");

  return Status::Ok();
}

}  // namespace

Status PlanCommand(const std::vector<std::string>& args) {
  Flags flags({{"config", "the training config whose model, batch and optimizer to fuse"},
               {"memory", "the memory to fit in: 16GiB, 80GB, 512MiB, 1.5TiB or bytes (default: the device's)"},
               {"device", StrCat("whose memory (unless --memory) and accounting: ", KnownDeviceNames(),
                                 " (default cpu: this machine)")},
               {"max-replicas", "the most replicas to consider (default 1024)"},
               {"with-eval?", "also count the evaluation executor that loom train keeps (its own parameters and "
                              "buffers, an arena at eval_batch_size)"},
               {"json", "also write the rows and the answer as JSON to this file"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: loom plan --config FILE [--memory SIZE] [--device NAME] [--max-replicas N] [--with-eval] [--json FILE]\n%s",
                flags.Help().c_str());
    return Status::Ok();
  }
  return Plan(flags);
}

}  // namespace loom::tools
