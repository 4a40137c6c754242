// `loom bench kernels`, `loom bench profile` and `loom bench fusion`.
//
// `loom bench kernels`: GEMM, Conv2d and a full MLP training step, each as a
// rate (GFLOP/s from the ops' cost formulas) and as a fraction of the roof:
// Eigen's own single-precision GEMM, 1024^3, on one thread, measured in the
// same run (before and after the kernels; the better is kept), times the
// thread count, i.e. Eigen's best kernel scaled perfectly to every core.
#include <Eigen/Core>
#include <algorithm>
#include <filesystem>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "core/file_util.h"
#include "core/parse.h"
#include "ops/gemm.h"
#include "core/thread_pool.h"
#include "graph/autodiff.h"
#include "graph/cost.h"
#include "graph/compile.h"
#include "graph/model.h"
#include "models/mlp.h"
#include "models/zoo.h"
#include "train/config/train_config.h"
#include "train/data/loader.h"
#include "runtime/executor.h"
#include "runtime/task_runtime.h"
#include "graph/strategy.h"
#include "graph/task_graph.h"
#include "search/baselines.h"
#include "tools/bench_data.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "train/run_parts.h"
#include "train/training_run.h"

namespace loom::tools {
namespace {

using Clock = std::chrono::steady_clock;

double EigenGemmGflops(int reps) { return EigenGemmFlops<float>(reps) / 1e9; }

// The memory-bandwidth roof: a streaming multiply-add y = y + a * x over
// two 64 MiB arrays (far past any cache) on every thread of the default
// pool, in GB/s of bytes read and written (12 per element).
double StreamGbps(int reps) {
  const int64_t n = int64_t{16} << 20;
  std::vector<float> x(static_cast<size_t>(n), 1.0f), y(static_cast<size_t>(n), 2.0f);
  ThreadPool& pool = ThreadPool::Default();
  const double secs = BestSeconds(reps, [&] {
    pool.ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] += 0.5f * x[i];
    });
  });
  return 12.0 * static_cast<double>(n) / secs / 1e9;
}

struct Row {
  std::string name;
  double gflops;
  double gbps;  // the graph's bytes read and written (its ops' cost formulas) per second
  double seconds;
};

// Times one step of `graph` with random feeds, its kernels without copies
// of its outputs (Executor::RunInPlace); rates from its cost.
StatusOr<Row> TimeGraph(const std::string& name, const Graph& graph, int reps) {
  LOOM_ASSIGN_OR_RETURN(auto exec, Executor::Create(graph));
  LOOM_RETURN_IF_ERROR(exec->InitializeState(1));
  std::map<std::string, Tensor> feeds = RandomFeeds(graph);
  Status status;
  double secs = BestSeconds(reps, [&] {
    if (Status s = exec->RunInPlace(feeds); !s.ok()) status = s;
  });
  LOOM_RETURN_IF_ERROR(status);
  const OpCost cost = GraphCost(graph);
  return Row{name, cost.flops / secs / 1e9, (cost.bytes_read + cost.bytes_written) / secs / 1e9, secs};
}

// `--profile`: where a row's time goes, node by node (an executor that times
// each kernel, `reps` runs after a warm-up), with each node's own rates.
Status PrintNodeProfile(const Graph& graph, int reps) {
  ExecutorOptions eo;
  eo.profile = true;
  LOOM_ASSIGN_OR_RETURN(auto exec, Executor::Create(graph, eo));
  LOOM_RETURN_IF_ERROR(exec->InitializeState(1));
  std::map<std::string, Tensor> feeds = RandomFeeds(graph);
  LOOM_RETURN_IF_ERROR(exec->RunInPlace(feeds));
  exec->ResetProfile();
  for (int i = 0; i < reps; ++i) LOOM_RETURN_IF_ERROR(exec->RunInPlace(feeds));
  double total = 0;
  for (const NodeProfile& p : exec->profile()) total += p.seconds;
  const Graph& ran = exec->graph();  // the executor's (folded) graph, whose nodes the profile lists
  for (size_t i = 0; i < exec->profile().size(); ++i) {
    const NodeProfile& p = exec->profile()[i];
    if (p.calls == 0) continue;
    const OpCost c = NodeCost(ran, ran.nodes()[i]);
    const double secs = p.seconds / static_cast<double>(p.calls);
    std::printf("  %-38s %12.3f %12.1f %9.1f%% %10.1f\n", (p.op + " " + p.node).substr(0, 38).c_str(), secs * 1e3,
                c.flops / secs / 1e9, total > 0 ? 100.0 * p.seconds / total : 0.0,
                (c.bytes_read + c.bytes_written) / secs / 1e9);
  }
  return Status::Ok();
}

StatusOr<Graph> MatMulGraph(int64_t n, DType dtype = DType::kF32) {
  Model m;
  Sym a = m.input("a", {n, n}, dtype);
  Sym b = m.input("b", {n, n}, dtype);
  m.set_output("c", m.op("MatMul", {a, b})[0]);
  if (!m.status().ok()) return m.status();
  return m.graph();
}

// One Linear layer without bias: x [rows, in] -> [rows, out], y = x W^T.
StatusOr<Graph> LinearGraph(int64_t rows, int64_t in, int64_t out) {
  Model m;
  Sym x = m.input("x", {rows, in});
  LinearOptions opts;
  opts.bias = false;
  m.set_output("y", m.linear(x, out, opts, "fc"));
  if (!m.status().ok()) return m.status();
  return m.graph();
}

// The first Linear of `batch` fused models on their shared x [rows, in]:
// weights [batch, out, in], y [batch, rows, out] (ops/matmul_ops.cc).
StatusOr<Graph> SharedInputLinearGraph(int64_t rows, int64_t in, int64_t out, int64_t batch) {
  Model m;
  Sym x = m.input("x", {rows, in});
  Sym w = m.parameter("fc/weight", {batch, out, in}, InitNormal(0, 0.05));
  m.set_output("y", m.op("Linear", {x, w})[0]);
  if (!m.status().ok()) return m.status();
  return m.graph();
}

// A layer y of input x for a kernel row: y alone, or with_backward the loss
// sum(y * w) for an input w and its gradients with respect to x and every
// parameter (a training step's work for the layer).
StatusOr<Graph> LayerGraph(Model& m, Sym x, Sym y, bool with_backward) {
  Sym w = m.input("w", m.shape(y));
  Sym loss = m.op("SumToShape", {m.mul(y, w)}, AttrMap{{"shape", std::vector<int64_t>{}}})[0];
  m.set_output(with_backward ? "loss" : "y", with_backward ? loss : y);
  if (!m.status().ok()) return m.status();
  Graph g = m.graph();
  if (with_backward) {
    std::vector<ValueId> wrt = {x.id};
    for (NodeId id : g.NodesWithOp(kParameterOp)) wrt.push_back(g.node(id).outputs[0]);
    LOOM_ASSIGN_OR_RETURN(auto grads, BuildGradients(&g, loss.id, wrt));
    int i = 0;
    for (const auto& [v, gv] : grads) g.outputs()["grad" + std::to_string(i++)] = gv;
  }
  return g;
}

// A Linear layer with its bias, forward and backward.
StatusOr<Graph> LinearStepGraph(int64_t rows, int64_t in, int64_t out) {
  Model m;
  Sym x = m.input("x", {rows, in});
  return LayerGraph(m, x, m.linear(x, out, LinearOptions(), "fc"), /*with_backward=*/true);
}

// One conv layer of c -> o channels (groups: 1, or c for a depthwise one);
// with_backward adds d/dx and d/dweight (a training step's work).
StatusOr<Graph> ConvGraph(int64_t n, int64_t c, int64_t o, int64_t hw, int64_t k, int64_t groups, bool with_backward,
                          int64_t stride = 1) {
  Model m;
  Sym x = m.input("x", {n, c, hw, hw});
  Conv2dOptions opts;
  opts.stride = {stride, stride};
  opts.padding = {k / 2, k / 2};
  opts.groups = groups;
  opts.bias = false;
  return LayerGraph(m, x, m.conv2d(x, o, {k, k}, opts, "conv"), with_backward);
}

// A training BatchNorm over [n, c, hw, hw] and its gradients (input, scale
// and shift): MobileNetV3's small late planes and its large early ones.
StatusOr<Graph> BatchNormGraph(int64_t n, int64_t c, int64_t hw) {
  Model m;
  Sym x = m.input("x", {n, c, hw, hw});
  return LayerGraph(m, x, m.batch_norm(x, {}, "bn"), /*with_backward=*/true);
}

StatusOr<Graph> MlpStepGraph(int64_t batch) {
  Model m;
  Sym image = m.input("input", {batch, 1, 28, 28});
  Sym label = m.input("target", {batch}, DType::kI64);
  Sym logits = models::Mlp(m, image);
  m.set_output("loss", m.cross_entropy(logits, label));
  if (!m.status().ok()) return m.status();
  StepOptimizer opt;
  opt.config.set_momentum(0.9);
  return Compile(m.graph(), Program::kTrainingStep, StepOptions(opt));
}

Status BenchKernels(const Flags& flags) {
  LOOM_ASSIGN_OR_RETURN(int64_t threads, flags.Int("threads", std::thread::hardware_concurrency()));
  LOOM_ASSIGN_OR_RETURN(int64_t reps, flags.Int("reps", 5));
  if (reps < 1) return InvalidArgument("--reps must be at least 1, got ", reps);
  ThreadPool::SetDefaultThreads(static_cast<int>(threads));
  std::vector<std::pair<std::string, StatusOr<Graph>>> cases;
  cases.emplace_back("matmul 1024x1024x1024", MatMulGraph(1024));
  cases.emplace_back("matmul 256x256x256", MatMulGraph(256));
  // bf16 operands, f32 sums (the bf16 GEMM where the CPU has AVX512_BF16,
  // else widened to f32): against the same f32 roof.
  cases.emplace_back("matmul bf16 1024x1024x1024", MatMulGraph(1024, DType::kBF16));
  cases.emplace_back("matmul bf16 256x256x256", MatMulGraph(256, DType::kBF16));
  // The MLP's first layer alone, and fused as 16 (16 products of one
  // model's shape reading the same x; the fused weights leave L2).
  cases.emplace_back("linear fwd 128x784 -> 256", LinearGraph(128, 784, 256));
  cases.emplace_back("linear fwd 128x784 -> 16x256 (fused)", SharedInputLinearGraph(128, 784, 256, 16));
  // MobileNetV3's classifier: few rows against a 4.9 MB weight.
  cases.emplace_back("linear fwd+bwd 32x960 -> 1280", LinearStepGraph(32, 960, 1280));
  // PointNet's fc1 at its batch of 16: dy W reads the weight's rows of 4 KiB.
  cases.emplace_back("linear fwd+bwd 16x1024 -> 512", LinearStepGraph(16, 1024, 512));
  cases.emplace_back("conv2d fwd 32x64x28x28 k3", ConvGraph(32, 64, 64, 28, 3, 1, false));
  cases.emplace_back("conv2d fwd+bwd 32x64x28x28 k3", ConvGraph(32, 64, 64, 28, 3, 1, true));
  cases.emplace_back("conv2d fwd 32x128x14x14 k3", ConvGraph(32, 128, 128, 14, 3, 1, false));
  cases.emplace_back("conv2d fwd+bwd 32x128x14x14 k3", ConvGraph(32, 128, 128, 14, 3, 1, true));
  // ResNet-18's stages at CIFAR sizes: 32x32 and 16x16 planes, then small
  // planes with wide weights.
  cases.emplace_back("conv2d fwd+bwd 32x64x32x32 k3", ConvGraph(32, 64, 64, 32, 3, 1, true));
  cases.emplace_back("conv2d fwd+bwd 32x128x16x16 k3", ConvGraph(32, 128, 128, 16, 3, 1, true));
  cases.emplace_back("conv2d fwd+bwd 32x256x8x8 k3", ConvGraph(32, 256, 256, 8, 3, 1, true));
  cases.emplace_back("conv2d fwd+bwd 32x512x4x4 k3", ConvGraph(32, 512, 512, 4, 3, 1, true));
  // MobileNetV3-Large's layer kinds at bench/configs/mobilenet_v3_large.pbtxt's
  // sizes: memory-bound, read against the bandwidth roof.
  cases.emplace_back("depthwise fwd 32x72x16x16 k3", ConvGraph(32, 72, 72, 16, 3, 72, false));
  cases.emplace_back("depthwise fwd+bwd 32x72x16x16 k3", ConvGraph(32, 72, 72, 16, 3, 72, true));
  cases.emplace_back("depthwise fwd+bwd 32x120x8x8 k5", ConvGraph(32, 120, 120, 8, 5, 120, true));
  cases.emplace_back("depthwise fwd+bwd 32x480x4x4 k3", ConvGraph(32, 480, 480, 4, 3, 480, true));
  cases.emplace_back("depthwise fwd+bwd 32x960x2x2 k5", ConvGraph(32, 960, 960, 2, 5, 960, true));
  // Its stride-2 layers (features.2, .4 and .7): planes halved.
  cases.emplace_back("depthwise fwd+bwd 32x64x32x32 k3 s2", ConvGraph(32, 64, 64, 32, 3, 64, true, 2));
  cases.emplace_back("depthwise fwd+bwd 32x72x16x16 k5 s2", ConvGraph(32, 72, 72, 16, 5, 72, true, 2));
  cases.emplace_back("depthwise fwd+bwd 32x240x8x8 k3 s2", ConvGraph(32, 240, 240, 8, 3, 240, true, 2));
  cases.emplace_back("pointwise fwd+bwd 32x16x32x32 -> 64", ConvGraph(32, 16, 64, 32, 1, 1, true));
  cases.emplace_back("pointwise fwd+bwd 32x24x16x16 -> 72", ConvGraph(32, 24, 72, 16, 1, 1, true));
  cases.emplace_back("pointwise fwd+bwd 32x40x8x8 -> 120", ConvGraph(32, 40, 120, 8, 1, 1, true));
  cases.emplace_back("pointwise fwd+bwd 32x112x4x4 -> 672", ConvGraph(32, 112, 672, 4, 1, 1, true));
  cases.emplace_back("pointwise fwd+bwd 32x240x1x1 -> 960", ConvGraph(32, 240, 960, 1, 1, 1, true));
  // BatchNorm in training, forward and backward: per plane sums and passes
  // on large planes, many short planes late in MobileNetV3.
  cases.emplace_back("batchnorm fwd+bwd 32x64x32x32", BatchNormGraph(32, 64, 32));
  cases.emplace_back("batchnorm fwd+bwd 32x120x8x8", BatchNormGraph(32, 120, 8));
  cases.emplace_back("batchnorm fwd+bwd 32x672x4x4", BatchNormGraph(32, 672, 4));
  cases.emplace_back("batchnorm fwd+bwd 32x960x2x2", BatchNormGraph(32, 960, 2));
  cases.emplace_back("mlp train step b128 784-256-128-10", MlpStepGraph(128));
  cases.emplace_back("mlp train step b512 784-256-128-10", MlpStepGraph(512));

  const std::string only = flags.Str("only", "");
  cases.erase(std::remove_if(cases.begin(), cases.end(),
                             [&](const auto& c) { return c.first.find(only) == std::string::npos; }),
              cases.end());
  if (cases.empty()) return InvalidArgument("--only '", only, "': no kernel's name contains it");
  const bool profile = flags.Bool("profile");
  // The roofs are bests of at most 10 runs: more moves them little, and a
  // profile of many kernel repetitions would be mostly roof.
  const int roof_reps = static_cast<int>(std::min<int64_t>(reps, 10));
  const double roof1_before = EigenGemmGflops(roof_reps);
  std::vector<Row> rows;
  for (auto& [name, graph] : cases) {
    LOOM_RETURN_IF_ERROR(graph.status().WithContext(name));
    LOOM_ASSIGN_OR_RETURN(Row r, TimeGraph(name, *graph, static_cast<int>(reps)));
    rows.push_back(r);
  }
  const double roof1 = std::max(roof1_before, EigenGemmGflops(roof_reps));
  const double roof = roof1 * static_cast<double>(threads);
  const double bandwidth = StreamGbps(roof_reps);
  // Which instructions ran: the same binary runs on AVX2 and AVX-512
  // machines, and the vector width it was built for decides its speed.
  std::printf("cpu: %s (%s); kernels: %s\n", CpuModelName().c_str(), CpuVectorFeatures().c_str(),
              GemmInstructionSets().c_str());
  std::printf("roof: Eigen sgemm 1024^3 on 1 thread %.1f GFLOP/s; x %lld threads = %.1f GFLOP/s\n", roof1,
              static_cast<long long>(threads), roof);
  std::printf("bandwidth roof: y += a * x over 2 x 64 MiB on %lld threads, %.1f GB/s\n",
              static_cast<long long>(threads), bandwidth);
  // The k3 rows run Winograd F(2x2, 3x3) (ops/conv_winograd.h), 4/9 of the
  // direct product's multiplies: their rates can pass the roof.
  std::printf("conv2d k3 rows: Winograd F(2x2, 3x3) where C * O / (C + O) >= 32; GFLOP/s count the direct "
              "product's multiply-adds\n");
  std::printf("%-40s %12s %12s %10s %10s %10s\n", "kernel", "time (ms)", "GFLOP/s", "of roof", "GB/s", "of bw roof");
  std::string json = "{\"cpu\": " + JsonQuoted(CpuModelName()) + ", \"cpu_features\": " +
                     JsonQuoted(CpuVectorFeatures()) + ", \"kernels\": " + JsonQuoted(GemmInstructionSets()) +
                     ", \"threads\": " + std::to_string(threads) + ", \"roof_gflops\": " + std::to_string(roof) +
                     ", \"roof_1thread_gflops\": " + std::to_string(roof1) +
                     ", \"bandwidth_roof_gbps\": " + std::to_string(bandwidth) + ", \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("%-40s %12.3f %12.1f %9.1f%% %10.1f %9.1f%%\n", r.name.c_str(), r.seconds * 1e3, r.gflops,
                100.0 * r.gflops / roof, r.gbps, 100.0 * r.gbps / bandwidth);
    if (profile) LOOM_RETURN_IF_ERROR(PrintNodeProfile(*cases[i].second, static_cast<int>(reps)));
    json += std::string(i ? ", " : "") + "{\"name\": \"" + r.name + "\", \"seconds\": " + std::to_string(r.seconds) +
            ", \"gflops\": " + std::to_string(r.gflops) + ", \"fraction_of_roof\": " + std::to_string(r.gflops / roof) +
            ", \"gbps\": " + std::to_string(r.gbps) +
            ", \"fraction_of_bandwidth_roof\": " + std::to_string(r.gbps / bandwidth) + "}";
  }
  json += "]}\n";
  if (flags.Has("json")) {
    const std::string path = flags.Str("json", "");
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(path, json));
    std::printf("wrote %s\n", path.c_str());
  }
  return Status::Ok();
}

// --precision f32|bf16|fp16 over the config's `precision`.
Status ApplyPrecisionFlag(const Flags& flags, proto::TrainConfig* config) {
  if (!flags.Has("precision")) return Status::Ok();
  const std::string p = flags.Str("precision", "");
  if (p != "f32" && p != "bf16" && p != "fp16")
    return InvalidArgument("--precision: unknown value '", p, "' (expected f32, bf16 or fp16)");
  config->set_precision(p);
  return Status::Ok();
}

// The step options of a benchmark: the config's precision (and fp16 loss
// scaler), as `loom train` compiles it.
CompileOptions BenchStepOptions(const StepOptimizer& opt, const proto::TrainConfig& config,
                                std::optional<FusionOptions> fusion = std::nullopt) {
  CompileOptions o = StepOptions(opt, std::move(fusion));
  o.precision = RunPrecision(config);
  o.loss_scaling = RunLossScaling(config);
  return o;
}

std::string PrecisionName(const proto::TrainConfig& config) {
  return config.precision().empty() ? "f32" : config.precision();
}

// `loom bench profile`: where a training step's time goes, per op type and
// per node, for the model and batch of a config (its data's first batch).
Status BenchProfile(const Flags& flags) {
  if (!flags.Has("config")) return InvalidArgument("loom bench profile needs --config FILE");
  LOOM_ASSIGN_OR_RETURN(proto::TrainConfig config, LoadTrainConfig(flags.Str("config", "")));
  if (flags.Has("device")) config.set_device(flags.Str("device", ""));
  LOOM_RETURN_IF_ERROR(ApplyPrecisionFlag(flags, &config));
  LOOM_ASSIGN_OR_RETURN(const Device device, RunDevice(config));
  LOOM_ASSIGN_OR_RETURN(int64_t steps, flags.Int("steps", 20));
  LOOM_ASSIGN_OR_RETURN(int64_t threads, flags.Int("threads", config.threads()));
  if (threads > 0) ThreadPool::SetDefaultThreads(static_cast<int>(threads));
  LOOM_ASSIGN_OR_RETURN(const BenchData data, LoadBenchData(config));
  Model m;
  LOOM_RETURN_IF_ERROR(train::BuildConfigModel(m, config, data.spec, config.data().batch_size()));
  LOOM_ASSIGN_OR_RETURN(int64_t replicas, flags.Int("replicas", 0));
  const StepOptimizer opt = StepOptimizer{config.optimizer()};
  std::optional<FusionOptions> fusion;
  if (replicas > 0) {  // the fused step of that many replicas
    fusion.emplace();
    fusion->replicas = static_cast<int>(replicas);
    for (int64_t i = 0; i < replicas; ++i) fusion->seeds.push_back(static_cast<uint64_t>(i + 1));
  }
  LOOM_ASSIGN_OR_RETURN(Graph train, Compile(m.graph(), Program::kTrainingStep, BenchStepOptions(opt, config, fusion)));
  ExecutorOptions eo;
  eo.profile = true;
  eo.device = device;
  LOOM_ASSIGN_OR_RETURN(auto exec, Executor::Create(train, eo));
  LOOM_RETURN_IF_ERROR(exec->InitializeState(0));
  std::map<std::string, Tensor> feeds = RandomFeeds(train, data.feeds);
  if (feeds.count(kReplicaMaskInput)) feeds[kReplicaMaskInput].Fill(1);
  LOOM_RETURN_IF_ERROR(exec->Run(feeds).status());  // warm-up, not profiled below
  exec->ResetProfile();
  auto start = Clock::now();
  for (int64_t i = 0; i < steps; ++i) LOOM_RETURN_IF_ERROR(exec->Run(feeds).status());
  const double total = std::chrono::duration<double>(Clock::now() - start).count();

  std::map<std::string, std::pair<double, double>> by_op;  // seconds, FLOPs
  double kernel_total = 0;
  const Graph& ran = exec->graph();  // the executor's (folded) graph, whose nodes the profile lists
  for (size_t i = 0; i < exec->profile().size(); ++i) {
    const NodeProfile& p = exec->profile()[i];
    by_op[p.op].first += p.seconds;
    by_op[p.op].second += NodeCost(ran, ran.nodes()[i]).flops * static_cast<double>(steps);
    kernel_total += p.seconds;
  }
  std::vector<std::pair<std::string, std::pair<double, double>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  const int64_t batch = config.data().batch_size() * std::max<int64_t>(1, replicas);
  const std::string where =
      device.is_cpu() ? StrCat(ThreadPool::Default().num_threads(), " threads") : device.ToString();
  std::printf("%s: %lld steps of batch %lld, %.2f ms/step, %.0f samples/s, %.1f GFLOP/s (%s)\n",
              config.model().name().c_str(), static_cast<long long>(steps), static_cast<long long>(batch),
              1e3 * total / steps, steps * batch / total, GraphCost(train).flops * steps / total / 1e9, where.c_str());
  std::printf("%-34s %10s %8s %10s\n", "op", "ms/step", "share", "GFLOP/s");
  for (const auto& [op, v] : rows) {
    if (v.first <= 0) continue;
    std::printf("%-34s %10.3f %7.1f%% %10.1f\n", op.c_str(), 1e3 * v.first / steps, 100 * v.first / total,
                v.first > 0 ? v.second / v.first / 1e9 : 0.0);
  }
  std::printf("%-34s %10.3f %7.1f%%\n", "(executor outside kernels)", 1e3 * (total - kernel_total) / steps,
              100 * (total - kernel_total) / total);
  LOOM_ASSIGN_OR_RETURN(const int64_t top, flags.Int("nodes", 0));
  if (top > 0) {
    // The costliest nodes, with the rate their op's cost model gives them:
    // bytes read and written per second, against the bandwidth roof.
    std::vector<size_t> order(exec->profile().size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return exec->profile()[a].seconds > exec->profile()[b].seconds;
    });
    std::printf("\n%-44s %-20s %10s %8s %10s %8s\n", "node", "output", "ms/step", "share", "GFLOP/s", "GB/s");
    for (size_t k = 0; k < order.size() && k < static_cast<size_t>(top); ++k) {
      const NodeProfile& p = exec->profile()[order[k]];
      const Node& n = ran.nodes()[order[k]];
      const OpCost c = NodeCost(ran, n);
      const std::string shape = n.outputs.empty() ? "" : ran.type(n.outputs[0]).shape.ToString();
      std::printf("%-44s %-20s %10.3f %7.1f%% %10.1f %8.1f\n", (p.op + " " + p.node).substr(0, 44).c_str(),
                  shape.substr(0, 20).c_str(), 1e3 * p.seconds / steps, 100 * p.seconds / total,
                  p.seconds > 0 ? c.flops * steps / p.seconds / 1e9 : 0.0,
                  p.seconds > 0 ? (c.bytes_read + c.bytes_written) * steps / p.seconds / 1e9 : 0.0);
    }
  }
  return Status::Ok();
}

// `loom bench fusion`: for each replica count R, R copies of a config's
// model trained fused (one graph, graph/fusion.h) against the same R models
// trained one after another, on the first batch of the config's training
// data (every replica reads the same batch, as in a fused run without
// per-replica data). Rates are samples/s counted over all replicas (R *
// batch per step): the fused step and the R serial steps alternate for
// `reps` rounds (InterleavedSeconds), and each rate is the median round's
// with the spread of the rounds; the speed-up is the median of the rounds'
// own ratios. The roof is Eigen's 1-thread SGEMM times the threads,
// measured in the same run.
struct FusionRow {
  int64_t replicas = 0;
  Spread fused, serial;  // samples/s
  Spread speedup;        // fused over serial, per round
  double fused_gflops = 0;  // the R models' own training FLOPs per second, at the median
  size_t fused_peak_bytes = 0, serial_peak_bytes = 0;
};

// Rates (`work` / seconds) of timed rounds: the median and spread of the
// rates, so p10 comes from the slowest rounds.
Spread RatesOf(const std::vector<double>& seconds, double work) {
  std::vector<double> rates;
  for (double t : seconds) rates.push_back(work / t);
  return Spread::Of(std::move(rates));
}

Status BenchFusion(const Flags& flags) {
  if (!flags.Has("config")) return InvalidArgument("loom bench fusion needs --config FILE");
  LOOM_ASSIGN_OR_RETURN(proto::TrainConfig config, LoadTrainConfig(flags.Str("config", "")));
  if (flags.Has("device")) config.set_device(flags.Str("device", ""));
  LOOM_RETURN_IF_ERROR(ApplyPrecisionFlag(flags, &config));
  LOOM_ASSIGN_OR_RETURN(const Device device, RunDevice(config));
  ExecutorOptions eo;
  eo.device = device;
  LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> replica_counts, flags.PositiveInts("replicas", {1, 2, 4, 8, 16}));
  LOOM_ASSIGN_OR_RETURN(int64_t reps, flags.Int("reps", 11));
  if (reps < 1) return InvalidArgument("--reps must be at least 1, got ", reps);
  LOOM_ASSIGN_OR_RETURN(int64_t threads, flags.Int("threads", config.threads()));
  if (threads > 0) ThreadPool::SetDefaultThreads(static_cast<int>(threads));
  threads = ThreadPool::Default().num_threads();
  LOOM_ASSIGN_OR_RETURN(const BenchData data, LoadBenchData(config));
  const int64_t batch = config.data().batch_size();
  Model m;
  LOOM_RETURN_IF_ERROR(train::BuildConfigModel(m, config, data.spec, config.data().batch_size()));
  const StepOptimizer opt = StepOptimizer{config.optimizer()};
  LOOM_ASSIGN_OR_RETURN(Graph single, Compile(m.graph(), Program::kTrainingStep, BenchStepOptions(opt, config)));
  const double single_flops = GraphCost(single).flops;
  // Layers left unfused (run once per replica): the config's, or --unfused.
  const std::vector<std::string> unfused =
      flags.List("unfused", {config.fusion().unfused_layers().begin(), config.fusion().unfused_layers().end()});
  // The Eigen roof is the CPU's; on a GPU the column says nothing and is left out.
  const bool with_roof = device.is_cpu() && !flags.Bool("no-roof");
  const double roof1_before = with_roof ? EigenGemmGflops(static_cast<int>(reps)) : 0.0;

  std::vector<FusionRow> rows;
  for (int64_t r : replica_counts) {
    FusionRow row;
    row.replicas = r;
    FusionOptions fo;
    fo.replicas = static_cast<int>(r);
    fo.unfused_layers = unfused;
    for (int64_t i = 0; i < r; ++i) fo.seeds.push_back(static_cast<uint64_t>(i + 1));
    LOOM_ASSIGN_OR_RETURN(Graph fused, Compile(m.graph(), Program::kTrainingStep, BenchStepOptions(opt, config, fo)));
    LOOM_ASSIGN_OR_RETURN(auto exec, Executor::Create(fused, eo));
    LOOM_RETURN_IF_ERROR(exec->InitializeState(1));
    std::map<std::string, Tensor> feeds = RandomFeeds(fused, data.feeds);
    feeds[kReplicaMaskInput].Fill(1);
    // The same R models, one after another.
    std::vector<std::unique_ptr<Executor>> serial;
    for (int64_t i = 0; i < r; ++i) {
      LOOM_ASSIGN_OR_RETURN(auto e, Executor::Create(single, eo));
      LOOM_RETURN_IF_ERROR(e->InitializeState(static_cast<uint64_t>(i + 1)));
      serial.push_back(std::move(e));
    }
    const std::map<std::string, Tensor> single_feeds = RandomFeeds(single, data.feeds);
    LOOM_ASSIGN_OR_RETURN(
        const std::vector<std::vector<double>> seconds,
        InterleavedSeconds(static_cast<int>(reps),
                           {[&] { return exec->Run(feeds).status(); },
                            [&]() -> Status {
                              for (auto& e : serial) LOOM_RETURN_IF_ERROR(e->Run(single_feeds).status());
                              return Status::Ok();
                            }}));
    row.fused_peak_bytes = exec->PeakStepBytes();
    row.serial_peak_bytes = serial[0]->PeakStepBytes();
    const double samples = static_cast<double>(r * batch);
    row.fused = RatesOf(seconds[0], samples);
    row.serial = RatesOf(seconds[1], samples);
    std::vector<double> ratios;
    for (size_t k = 0; k < seconds[0].size(); ++k) ratios.push_back(seconds[1][k] / seconds[0][k]);
    row.speedup = Spread::Of(std::move(ratios));
    row.fused_gflops = static_cast<double>(r) * single_flops * row.fused.median / samples / 1e9;
    rows.push_back(row);
  }
  const double roof1 = with_roof ? std::max(roof1_before, EigenGemmGflops(static_cast<int>(reps))) : 0.0;
  const double roof = roof1 * static_cast<double>(threads);

  std::string unfused_note;
  for (const std::string& l : unfused) unfused_note += (unfused_note.empty() ? ", unfused: " : ",") + l;
  if (with_roof) {
    std::printf("%s, batch %lld, %s, %s%s, %lld threads; roof: Eigen sgemm 1024^3 %.1f GFLOP/s x %lld = %.1f GFLOP/s\n",
                config.model().name().c_str(), static_cast<long long>(batch), PrecisionName(config).c_str(),
                opt.config.type().c_str(), unfused_note.c_str(), static_cast<long long>(threads), roof1,
                static_cast<long long>(threads), roof);
  } else if (device.is_cpu()) {
    std::printf("%s, batch %lld, %s, %s%s, %lld threads; no roof (--no-roof)\n", config.model().name().c_str(),
                static_cast<long long>(batch), PrecisionName(config).c_str(), opt.config.type().c_str(),
                unfused_note.c_str(), static_cast<long long>(threads));
  } else {
    std::printf("%s, batch %lld, %s, %s%s, on %s (each step: inputs host -> device, outputs back)\n",
                config.model().name().c_str(), static_cast<long long>(batch), PrecisionName(config).c_str(),
                opt.config.type().c_str(), unfused_note.c_str(), device.ToString().c_str());
  }
  std::printf("%lld rounds, fused and serial interleaved: medians, (p10-p90) across rounds\n",
              static_cast<long long>(reps));
  std::printf("%8s %22s %22s %20s %9s %8s %10s %10s\n", "replicas", "fused smp/s", "serial smp/s", "speedup",
              "GFLOP/s", "of roof", "fused MiB", "serial MiB");
  const auto with_spread = [](const Spread& x, const char* format) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, x.median, x.p10, x.p90);
    return std::string(buf);
  };
  const auto json_dims = [](const Shape& shape) {
    std::string out = "[";
    for (int i = 0; i < shape.rank(); ++i) out += (i ? ", " : "") + std::to_string(shape.dim(i));
    return out + "]";
  };
  // The data spec, so that another framework's side builds the same model.
  std::string json = "{\"model\": \"" + config.model().name() + "\", \"batch\": " + std::to_string(batch) +
                     ", \"input_shape\": " + json_dims(data.spec.input) + ", \"input_dtype\": \"" +
                     (data.spec.input_dtype == DType::kI64 ? "i64" : "f32") + "\", \"target_shape\": " +
                     json_dims(data.spec.target) + ", \"num_classes\": " + std::to_string(data.spec.num_classes) +
                     ", \"vocabulary\": " + std::to_string(data.spec.vocabulary) +
                     ", \"single_step_flops\": " + std::to_string(single_flops) + ", \"reps\": " +
                     std::to_string(reps) + ", \"threads\": " + std::to_string(threads) + ", \"device\": \"" +
                     device.ToString() + "\", \"precision\": \"" + PrecisionName(config) + "\"" +
                     ", \"roof_gflops\": " + std::to_string(roof) + ", \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const FusionRow& r = rows[i];
    std::printf("%8lld %22s %22s %20s %9.1f %7.1f%% %10.1f %10.1f\n", static_cast<long long>(r.replicas),
                with_spread(r.fused, "%.0f (%.0f-%.0f)").c_str(), with_spread(r.serial, "%.0f (%.0f-%.0f)").c_str(),
                with_spread(r.speedup, "%.2fx (%.2f-%.2f)").c_str(), r.fused_gflops,
                roof > 0 ? 100 * r.fused_gflops / roof : 0.0, r.fused_peak_bytes / 1048576.0,
                r.serial_peak_bytes / 1048576.0);
    const auto json_spread = [](const std::string& name, const Spread& x) {
      return ", \"" + name + "\": " + std::to_string(x.median) + ", \"" + name + "_p10\": " + std::to_string(x.p10) +
             ", \"" + name + "_p90\": " + std::to_string(x.p90);
    };
    json += std::string(i ? ", " : "") + "{\"replicas\": " + std::to_string(r.replicas) +
            json_spread("fused_samples_per_s", r.fused) + json_spread("serial_samples_per_s", r.serial) +
            json_spread("speedup", r.speedup) + ", \"fused_gflops\": " + std::to_string(r.fused_gflops) +
            ", \"fraction_of_roof\": " + std::to_string(roof > 0 ? r.fused_gflops / roof : 0.0) +
            ", \"fused_peak_bytes\": " + std::to_string(r.fused_peak_bytes) +
            ", \"serial_peak_bytes\": " + std::to_string(r.serial_peak_bytes) + "}";
  }
  json += "]}\n";
  if (flags.Has("json")) {
    const std::string path = flags.Str("json", "");
    LOOM_RETURN_IF_ERROR(WriteFileAtomically(path, json));
    std::printf("wrote %s\n", path.c_str());
  }
  return Status::Ok();
}

}  // namespace

// The runtime's own cost per task (tools/bench_data.h).
Status BenchTaskOverhead(int reps) {
  LOOM_ASSIGN_OR_RETURN(const TaskOverhead o, MeasureTaskOverhead(reps));
  std::printf("runtime overhead: %d scalar tasks on 1 device: %.2f us per task (Executor: %.2f us per node)\n\n",
              TaskOverhead::kTasks, o.runtime_s * 1e6, o.executor_s * 1e6);
  return Status::Ok();
}

// One training step of the config on one device (one thread) against each
// strategy on `devices` CPU devices (one thread each), interleaved, `reps`
// steps each: the median step time with its spread, the speed-up, and the
// bytes each step moves between devices; and the roof of data parallelism
// here: `devices` independent steps of the batch's share at once. With a
// device list (`--devices cuda:0x2`), the strategies run on those devices
// and the one-device step on the first of them (no roof).
//
// Under `mpirun -np K`, the devices are shared out among the K processes
// (exchanging through MPI): rank 0 also runs the one-device step, alone,
// and prints; the roof (threads of one process) is left to a run without
// mpirun.
Status BenchParallel(const Flags& flags) {
  if (!flags.Has("config")) return InvalidArgument("loom bench parallel needs --config FILE");
  LOOM_ASSIGN_OR_RETURN(const proto::TrainConfig config, LoadTrainConfig(flags.Str("config", "")));
  Communicator* world = ProcessCommunicator();
  if (world != nullptr && world->size() == 1) world = nullptr;
  const bool speaks = world == nullptr || world->rank() == 0;
  LOOM_ASSIGN_OR_RETURN(const std::vector<Device> device_list, flags.Devices("devices", world ? world->size() : 2));
  const int64_t devices = static_cast<int64_t>(device_list.size());
  const Device first = device_list[0];
  LOOM_ASSIGN_OR_RETURN(const int64_t reps, flags.Int("reps", 20));
  if (reps < 1) return InvalidArgument("--reps must be >= 1");
  if (world && devices % world->size() != 0)
    return InvalidArgument("--devices ", devices, " under mpirun -np ", world->size(),
                           ": each process runs as many devices (a multiple of ", world->size(), ")");
  if (speaks) LOOM_RETURN_IF_ERROR(BenchTaskOverhead(static_cast<int>(reps)));
  LOOM_ASSIGN_OR_RETURN(const ConfigPrograms programs, BuildConfigPrograms(config));
  LOOM_ASSIGN_OR_RETURN(BenchData data, LoadBenchData(config));
  const std::map<std::string, Tensor> feeds = RandomFeeds(programs.step, data.feeds);

  struct Variant {
    std::string name;
    std::vector<std::unique_ptr<StepRunner>> runners;  // one; the roof: one per device, run at once
    double bytes = 0;
    size_t tasks = 0;
  };
  std::vector<Variant> variants;
  ThreadPool one_thread(1);
  ExecutorOptions eo;
  eo.pool = &one_thread;
  eo.device = first;
  LOOM_ASSIGN_OR_RETURN(auto exec, Executor::Create(programs.step, eo));
  // The strategies lower the step as this executor runs it (folded on CPU devices).
  const Graph executed = exec->graph();
  variants.push_back({"1 device", {}});
  if (speaks) variants.back().runners.push_back(std::move(exec));
  for (const std::string& kind_name : SplitCommas(flags.Str("strategies", "dp,owt,model"))) {
    LOOM_ASSIGN_OR_RETURN(const Strategy strategy,
                          LoadOrMakeStrategy(kind_name, programs.forward, devices, "--strategies"));
    LOOM_ASSIGN_OR_RETURN(TaskGraph tasks, LowerToTaskGraph(executed, strategy, programs.forward));
    const std::string where =
        first.is_cuda() ? flags.Str("devices", "")
        : !world        ? StrCat("cpu:", devices)
                        : StrCat(world->size(), " procs", devices > world->size() ? StrCat(" x ", devices / world->size()) : "");
    const bool standard = ParseStandardStrategy(kind_name).ok();
    Variant v{StrCat(standard ? kind_name : std::filesystem::path(kind_name).stem().string(), " on ", where), {},
              tasks.TransferBytes(), tasks.tasks.size()};
    TaskRuntimeOptions o;
    o.communicator = world;
    o.devices = device_list;
    LOOM_ASSIGN_OR_RETURN(auto runtime, TaskRuntime::Create(std::move(tasks), o));
    v.runners.push_back(std::move(runtime));
    variants.push_back(std::move(v));
  }
  // The roof of data parallelism on this machine: `devices` independent
  // one-thread steps of batch / devices at once, nothing exchanged.
  std::vector<std::unique_ptr<ThreadPool>> roof_pools;
  std::map<std::string, Tensor> roof_feeds;
  if (world == nullptr && first.is_cpu() && config.data().batch_size() % devices == 0) {
    proto::TrainConfig part = config;
    part.mutable_data()->set_batch_size(static_cast<int>(config.data().batch_size() / devices));
    LOOM_ASSIGN_OR_RETURN(const ConfigPrograms part_programs, BuildConfigPrograms(part));
    LOOM_ASSIGN_OR_RETURN(BenchData part_data, LoadBenchData(part));
    roof_feeds = RandomFeeds(part_programs.step, part_data.feeds);
    Variant roof{StrCat(devices, " x 1/", devices, " batch")};
    for (int64_t d = 0; d < devices; ++d) {
      roof_pools.push_back(std::make_unique<ThreadPool>(1));
      ExecutorOptions o;
      o.pool = roof_pools.back().get();
      LOOM_ASSIGN_OR_RETURN(auto e, Executor::Create(part_programs.step, o));
      roof.runners.push_back(std::move(e));
    }
    variants.push_back(std::move(roof));
  }
  for (Variant& v : variants)
    for (auto& runner : v.runners) LOOM_RETURN_IF_ERROR(runner->InitializeState(config.seed()));
  std::vector<std::function<Status()>> steps;
  for (Variant& v : variants)
    steps.push_back([&]() -> Status {
      if (v.runners.empty()) return Status::Ok();  // rank > 0: the one-device step is rank 0's
      if (v.runners.size() == 1) return v.runners[0]->Run(feeds).status();
      std::vector<Status> status(v.runners.size());
      std::vector<std::thread> threads;
      for (size_t d = 0; d < v.runners.size(); ++d)
        threads.emplace_back([&, d] { status[d] = v.runners[d]->Run(roof_feeds).status(); });
      for (std::thread& t : threads) t.join();
      for (const Status& s : status) LOOM_RETURN_IF_ERROR(s);
      return Status::Ok();
    });
  LOOM_ASSIGN_OR_RETURN(const std::vector<std::vector<double>> seconds,
                        InterleavedSeconds(static_cast<int>(reps), steps));
  if (!speaks) return Status::Ok();
  const double base = Spread::Of(seconds[0]).median;
  std::printf("%s, batch %lld, %lld steps each, interleaved; %s%s (%s)\n\n", flags.Str("config", "").c_str(),
              static_cast<long long>(config.data().batch_size()), static_cast<long long>(reps),
              first.is_cpu() ? "1 thread per device" : StrCat("1 device: ", first.ToString()).c_str(),
              world ? ", one device per MPI process" : "", CpuModelName().c_str());
  std::printf("%-16s  %10s  %18s  %8s  %6s  %14s\n", "", "median ms", "spread (p10-p90)", "speed-up", "tasks",
              "bytes moved");
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    const Spread t = Spread::Of(seconds[i]);
    std::printf("%-16s  %10.2f  %8.2f - %7.2f  %7.2fx  %6zu  %14.0f\n", v.name.c_str(), t.median * 1e3, t.p10 * 1e3,
                t.p90 * 1e3, base / t.median, v.tasks, v.bytes);
  }
  return Status::Ok();
}

Status BenchCommand(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "simulator") return BenchSimulator(std::vector<std::string>(args.begin() + 1, args.end()));
  if (!args.empty() && args[0] == "parallel") {
    Flags flags({{"config", "the training config whose step to split"},
                 {"devices", "CPU devices (default 2), one thread each; or a list: cuda:0x2, cuda:0,1"},
                 {"strategies", "standard strategies or strategy files to measure (default dp,owt,model)"},
                 {"reps", "timed steps of each variant, interleaved (default 20)"}});
    LOOM_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(args.begin() + 1, args.end())));
    if (flags.help_requested()) {
      std::printf("usage: loom bench parallel --config FILE [flags]\n%s", flags.Help().c_str());
      return Status::Ok();
    }
    return BenchParallel(flags);
  }
  if (!args.empty() && args[0] == "fusion") {
    Flags flags({{"config", "the training config whose model, batch and optimizer to fuse"},
                 {"replicas", "replica counts to measure, e.g. 1,2,4,8,16 (the default)"},
                 {"unfused", "layers to leave unfused, e.g. fc1,fc2 (default: the config's fusion.unfused_layers)"},
                 {"reps", "rounds of fused and serial steps, interleaved; medians reported (default 11)"},
                 {"threads", "CPU threads (default: the config's)"},
                 {"no-roof?", "leave out the GEMM roof (its 1024^3 GEMMs dominate a run under valgrind)"},
                 {"device", "cpu (default) or cuda[:i]: where both the fused and the serial steps run"},
                 {"precision", "f32, bf16 or fp16 (default: the config's): mixed precision as loom train runs it"},
                 {"json", "also write the results as JSON to this file"}});
    LOOM_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(args.begin() + 1, args.end())));
    if (flags.help_requested()) {
      std::printf("usage: loom bench fusion --config FILE [flags]\n%s", flags.Help().c_str());
      return Status::Ok();
    }
    return BenchFusion(flags);
  }
  if (!args.empty() && args[0] == "profile") {
    Flags flags({{"config", "the training config whose model and batch to profile"},
                 {"steps", "profiled steps (default 20)"},
                 {"nodes", "also list this many of the costliest nodes, each with its GFLOP/s and GB/s"},
                 {"replicas", "profile the fused step of this many replicas (batch = replicas x the config's)"},
                 {"threads", "CPU threads (default: the config's)"},
                 {"device", "cpu (default) or cuda[:i]; on a GPU each kernel is timed to completion"},
                 {"precision", "f32, bf16 or fp16 (default: the config's)"}});
    LOOM_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(args.begin() + 1, args.end())));
    if (flags.help_requested()) {
      std::printf("usage: loom bench profile --config FILE [flags]\n%s", flags.Help().c_str());
      return Status::Ok();
    }
    return BenchProfile(flags);
  }
  if (args.empty() || args[0] != "kernels")
    return InvalidArgument("usage: loom bench kernels [--threads T] [--reps N] [--only TEXT] [--profile]\n"
                           "                          [--json FILE]\n"
                           "       loom bench profile --config FILE [--steps N]\n"
                           "       loom bench fusion --config FILE [--replicas 1,2,4,8,16] [--json FILE]\n"
                           "       loom bench parallel --config FILE [--devices 2] [--strategies dp,owt,model,FILE]");
  Flags flags({{"threads", "threads for loom and for the roof (default: all cores)"},
               {"reps", "timed repetitions per case; the fastest is reported (default 5; the roofs take at most 10)"},
               {"only", "only the kernels whose name contains this text (\"depthwise\", \"matmul 256\")"},
               {"profile?", "after each row, its nodes: ms per run, GFLOP/s, share of the row, GB/s"},
               {"json", "also write the results as JSON to this file"}});
  LOOM_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(args.begin() + 1, args.end())));
  if (flags.help_requested()) {
    std::printf("usage: loom bench kernels [flags]\n%s", flags.Help().c_str());
    return Status::Ok();
  }
  return BenchKernels(flags);
}

}  // namespace loom::tools
