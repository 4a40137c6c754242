#include "tools/bench_data.h"

#include <Eigen/Core>
#include <cstring>
#include <fstream>

#include "core/half.h"
#include "core/rng.h"
#include "graph/model.h"
#include "graph/task_graph.h"
#include "runtime/executor.h"
#include "runtime/task_runtime.h"
#include "train/data/loader.h"
#include "train/run_parts.h"

namespace loom::tools {

Spread Spread::Of(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const auto rank = [&](double q) {
    return samples[static_cast<size_t>(q * static_cast<double>(samples.size() - 1) + 0.5)];
  };
  return {rank(0.5), rank(0.1), rank(0.9)};
}

StatusOr<std::vector<std::vector<double>>> InterleavedSeconds(int rounds,
                                                              const std::vector<std::function<Status()>>& variants) {
  std::vector<std::vector<double>> seconds(variants.size());
  for (int r = 0; r <= rounds; ++r)  // round 0 warms up
    for (size_t k = 0; k < variants.size(); ++k) {
      const size_t v = r % 2 == 0 ? k : variants.size() - 1 - k;
      const auto start = std::chrono::steady_clock::now();
      LOOM_RETURN_IF_ERROR(variants[v]());
      if (r > 0) seconds[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  return seconds;
}

// Feeds for every Input of `graph`: those in `data` (a real batch) as
// given, the rest random (f32 uniform in [-1, 1], i64 in [0, 10): only the
// kernel benchmarks' own graphs have such inputs); "lr" 1e-3, "step" 1.
std::map<std::string, Tensor> RandomFeeds(const Graph& graph, const std::map<std::string, Tensor>& data) {
  std::map<std::string, Tensor> feeds;
  Rng rng(7);
  for (const Node& n : graph.nodes()) {
    if (n.op != kInputOp) continue;
    if (auto it = data.find(n.name); it != data.end()) {
      feeds[n.name] = it->second;
      continue;
    }
    const TensorType& t = graph.type(n.outputs[0]);
    Tensor x = Tensor::Zeros(t.shape, t.dtype);
    if (t.dtype == DType::kF32) {
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
    } else if (t.dtype == DType::kBF16) {
      for (int64_t i = 0; i < x.numel(); ++i) x.data<BFloat16>()[i] = ToBFloat16(static_cast<float>(rng.Uniform(-1, 1)));
    } else if (t.dtype == DType::kI64) {
      for (int64_t i = 0; i < x.numel(); ++i) x.data<int64_t>()[i] = rng.UniformInt(10);
    }
    feeds[n.name] = x;
  }
  if (feeds.count("lr")) feeds["lr"].Fill(1e-3);
  if (feeds.count("step")) feeds["step"].Fill(1);
  return feeds;
}

StatusOr<BenchData> LoadBenchData(const proto::TrainConfig& config) {
  LOOM_ASSIGN_OR_RETURN(train::Datasets data, train::LoadDatasets(config.data()));
  BenchData out;
  out.spec = train::DataSpecOf(*data.train);
  DataLoaderOptions o = train::LoaderOptions(config, data, true);
  o.shuffle = false;
  o.drop_last = false;  // a dataset smaller than a batch is padded, not refused
  o.prefetch = 0;
  LOOM_ASSIGN_OR_RETURN(auto loader, DataLoader::Create(data.train, o));
  LOOM_RETURN_IF_ERROR(loader->Start(0));
  Batch b;
  LOOM_ASSIGN_OR_RETURN(bool got, loader->Next(&b));
  if (!got) return FailedPrecondition("data.dataset '", config.data().dataset(), "' has no training examples");
  out.feeds["input"] = b.input;
  out.feeds["target"] = b.target;
  return out;
}

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string CpuVectorFeatures() {
  std::string features;
  auto add = [&](bool has, const char* name) {
    if (has) features += (features.empty() ? "" : " ") + std::string(name);
  };
  add(__builtin_cpu_supports("avx2"), "AVX2");
  add(__builtin_cpu_supports("fma"), "FMA");
  add(__builtin_cpu_supports("avx512f"), "AVX-512F");
  add(__builtin_cpu_supports("avx512bw"), "AVX-512BW");
  add(__builtin_cpu_supports("avx512vl"), "AVX-512VL");
  return features.empty() ? "none of AVX2, FMA, AVX-512" : features;
}

template <typename T>
double EigenGemmFlops(int reps) {
  const int n = 1024;
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  Matrix a = Matrix::Random(n, n), b = Matrix::Random(n, n), c(n, n);
  const double secs = BestSeconds(reps, [&] { c.noalias() = a * b; });
  return 2.0 * n * n * n / secs;
}
template double EigenGemmFlops<float>(int);
template double EigenGemmFlops<double>(int);

double MemcpyBytesPerSecond(int reps) {
  const size_t bytes = size_t{64} << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  const double secs = BestSeconds(reps, [&] { std::memcpy(to.data(), from.data(), bytes); });
  return static_cast<double>(bytes) / secs;
}

StatusOr<TaskOverhead> MeasureTaskOverhead(int reps) {
  Model m;
  Sym x = m.input("x", {});
  Sym y = x;
  for (int i = 0; i < TaskOverhead::kTasks; ++i) y = m.add(y, x);
  m.set_output("y", y);
  LOOM_RETURN_IF_ERROR(m.status());
  LOOM_ASSIGN_OR_RETURN(auto exec, Executor::Create(m.graph()));
  LOOM_ASSIGN_OR_RETURN(TaskGraph tasks, BuildTaskGraph(m.graph(), {}, 1));
  LOOM_ASSIGN_OR_RETURN(auto runtime, TaskRuntime::Create(std::move(tasks)));
  const std::map<std::string, Tensor> feeds = {{"x", Tensor::FromVector<float>({}, {1.0f})}};
  Status status;
  auto step = [&](StepRunner& runner) {
    const Status s = runner.Run(feeds).status();
    if (!s.ok()) status = s;
  };
  TaskOverhead o;
  o.executor_s = BestSeconds(reps, [&] { step(*exec); }) / TaskOverhead::kTasks;
  o.runtime_s = BestSeconds(reps, [&] { step(*runtime); }) / TaskOverhead::kTasks;
  // The same chain with its adds alternating between two devices: each
  // hand-over is a transfer task and a wake-up of the other device's thread.
  std::map<std::string, LayerSplit> alternate;
  int64_t k = 0;
  for (const Node& n : m.graph().nodes())
    if (!IsSourceOp(n.op)) alternate[n.name].devices = {k++ % 2};
  LOOM_ASSIGN_OR_RETURN(TaskGraph hops, BuildTaskGraph(m.graph(), alternate, 2));
  const double hop_tasks = static_cast<double>(hops.tasks.size());
  LOOM_ASSIGN_OR_RETURN(auto two, TaskRuntime::Create(std::move(hops)));
  const double chain = BestSeconds(reps, [&] { step(*two); });
  o.wake_s = std::max(0.0, (chain - hop_tasks * o.runtime_s) / TaskOverhead::kTasks);
  {
    Model one;
    Sym a = one.input("x", {});
    one.set_output("y", one.add(a, a));
    LOOM_RETURN_IF_ERROR(one.status());
    LOOM_ASSIGN_OR_RETURN(TaskGraph single, BuildTaskGraph(one.graph(), {}, 1));
    LOOM_ASSIGN_OR_RETURN(auto runtime_of_one, TaskRuntime::Create(std::move(single)));
    o.step_s = std::max(0.0, BestSeconds(reps * 20, [&] { step(*runtime_of_one); }) - o.runtime_s);
  }
  LOOM_RETURN_IF_ERROR(status);
  return o;
}

}  // namespace loom::tools
