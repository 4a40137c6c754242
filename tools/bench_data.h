// What the benchmarks and profiles feed a config's training step
// (loom bench, loom profile): the config's real first batch and random
// values for the step's other inputs.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/ir.h"
#include "models/zoo.h"
#include "train/config/train_config.h"

namespace loom::tools {

// The fastest of `reps` calls after one warm-up. The machines are shared
// VMs whose neighbours steal cycles; the best time is the estimate that
// repeats, and roof and kernels are measured the same way.
template <typename Fn>
double BestSeconds(int reps, Fn&& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto s = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
  }
  return *std::min_element(t.begin(), t.end());
}

// A sample's median and its spread (the 10th and 90th percentiles, the
// nearest ranks): what the benchmarks that compare variants report.
struct Spread {
  double median = 0, p10 = 0, p90 = 0;
  static Spread Of(std::vector<double> samples);  // samples non-empty
};

// Times each of `variants` once per round, in turn, for `rounds` rounds
// after a warm-up round, alternating the order every round: a neighbour
// that steals cycles for a while slows every variant alike, so the ratio
// of two variants in one round repeats where their best times do not.
// Returns each variant's seconds, one per round; stops at the first error.
StatusOr<std::vector<std::vector<double>>> InterleavedSeconds(int rounds,
                                                              const std::vector<std::function<Status()>>& variants);

// Eigen's GEMM 1024^3 on one thread (the roof the kernels are measured
// against), in FLOP/s: T float or double.
template <typename T>
double EigenGemmFlops(int reps);

// Host memory copy rate, bytes copied per second (memcpy of 64 MiB).
double MemcpyBytesPerSecond(int reps);

// "model name" of /proc/cpuinfo: benchmarks say which CPU they ran on.
std::string CpuModelName();
// The vector instruction sets the CPU has, of those loom's kernels could use
// ("AVX2 FMA AVX-512F"): beside what the build runs (GemmInstructionSets).
std::string CpuVectorFeatures();

// The runtime's own cost: a chain of kTasks scalar additions run as one
// Executor step and as a task graph on one device (no transfers), the
// best of `reps`, per node and per task.
struct TaskOverhead {
  static constexpr int kTasks = 2000;
  double executor_s = 0, runtime_s = 0;
  // A task of the task runtime that waits for another device's task starts
  // this long after it ends (a thread wake-up), beyond the tasks' own cost:
  // from a chain of tasks alternating between two devices.
  double wake_s = 0;
  // The task runtime's cost of a step beyond its tasks: a one-task step's
  // time less the task's.
  double step_s = 0;
};
StatusOr<TaskOverhead> MeasureTaskOverhead(int reps);

// Feeds for every Input of `graph`: those in `data` (a real batch) as
// given, the rest random (f32 uniform in [-1, 1], i64 in [0, 10): only the
// kernel benchmarks' own graphs have such inputs); "lr" 1e-3, "step" 1.
std::map<std::string, Tensor> RandomFeeds(const Graph& graph, const std::map<std::string, Tensor>& data = {});

// What a config's model is benchmarked on: the spec of its training data
// (as loom train builds the model) and the first batch of that data, as loom
// train's loader gives it (normalised, augmented; in order, not shuffled),
// fed as "input" and "target" to every timed step. Real data keeps every
// feed valid: token ids below the vocabulary, targets below the classes.
struct BenchData {
  models::DataSpec spec;
  std::map<std::string, Tensor> feeds;  // "input", "target"
};

StatusOr<BenchData> LoadBenchData(const proto::TrainConfig& config);

}  // namespace loom::tools
