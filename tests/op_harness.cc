#include "tests/op_harness.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/rng.h"
#include "core/thread_pool.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/dce.h"
#include "runtime/executor.h"

namespace loom::testing {

Tensor ZerosF64(const Shape& shape) { return Tensor::Zeros(shape, DType::kF64); }

namespace {

struct OpGraph {
  Graph graph;
  std::vector<ValueId> inputs, outputs;
};

OpGraph BuildOpGraph(const OpCase& c, DType float_dtype) {
  OpGraph g;
  GraphBuilder b(&g.graph);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    DType dt = s.kind == InputSpec::Kind::kIndex ? s.index_dtype : float_dtype;
    g.inputs.push_back(b.Input("in" + std::to_string(i), {s.shape, dt}));
  }
  auto outs = b.Add(c.op, g.inputs, c.attrs, "op");
  INFO("case '" << c.name << "': building the op");
  REQUIRE(outs.status().ToString() == "OK");
  g.outputs = *outs;
  for (size_t i = 0; i < g.outputs.size(); ++i) g.graph.outputs()["out" + std::to_string(i)] = g.outputs[i];
  return g;
}

// Inputs drawn once in f64; f32 runs get the same values rounded.
std::vector<Tensor> MakeInputs(const OpCase& c) {
  Rng rng(c.seed);
  std::vector<Tensor> ins;
  for (const InputSpec& s : c.inputs) {
    if (s.kind == InputSpec::Kind::kIndex) {
      Tensor t = Tensor::Zeros(s.shape, s.index_dtype);
      for (int64_t i = 0; i < t.numel(); ++i) {
        int64_t v = rng.UniformInt(s.num_classes);
        if (s.index_dtype == DType::kI64) t.data<int64_t>()[i] = v;
        else t.data<int32_t>()[i] = static_cast<int32_t>(v);
      }
      ins.push_back(t);
    } else {
      Tensor t = ZerosF64(s.shape);
      for (int64_t i = 0; i < t.numel(); ++i) At(t, i) = rng.Uniform(s.low, s.high);
      ins.push_back(t);
    }
  }
  return ins;
}

std::map<std::string, Tensor> Feeds(const OpCase& c, const std::vector<Tensor>& ins, DType float_dtype) {
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < ins.size(); ++i) {
    bool is_float = c.inputs[i].kind != InputSpec::Kind::kIndex;
    feeds["in" + std::to_string(i)] = is_float ? ins[i].Cast(float_dtype).value() : ins[i];
  }
  return feeds;
}

std::vector<Tensor> RunForward(const OpCase& c, const std::vector<Tensor>& ins, DType float_dtype, Device device) {
  OpGraph g = BuildOpGraph(c, float_dtype);
  ExecutorOptions opts;
  opts.device = device;
  opts.seed = c.seed;
  auto exec = Executor::Create(g.graph, opts);
  INFO("case '" << c.name << "' on " << device.ToString());
  REQUIRE(exec.status().ToString() == "OK");
  auto result = (*exec)->Run(Feeds(c, ins, float_dtype));
  REQUIRE(result.status().ToString() == "OK");
  std::vector<Tensor> outs;
  for (size_t i = 0; i < g.outputs.size(); ++i) outs.push_back((*result)["out" + std::to_string(i)]);
  return outs;
}

void CompareTensors(const std::string& what, const Tensor& expected, const Tensor& actual, double tolerance) {
  INFO(what);
  REQUIRE(expected.shape() == actual.shape());
  int bad = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    double e = expected.ScalarAt(i), a = actual.ScalarAt(i);
    // Equal infinities and NaN against NaN match (e.g. an empty max window).
    bool ok = (std::isnan(e) && std::isnan(a)) || e == a || std::abs(e - a) <= tolerance * std::max(1.0, std::abs(e));
    if (!ok && bad++ < 3) {
      INFO("element " << i << " of " << expected.shape().ToString() << ": expected " << e << ", got " << a);
      CHECK(ok);
    }
  }
  CHECK(bad == 0);
}

std::vector<int> Indices(const std::vector<int>& given, size_t n) {
  if (!given.empty()) return given;
  std::vector<int> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = static_cast<int>(i);
  return all;
}

void CheckForward(const OpCase& c, const std::vector<Tensor>& ins) {
  std::vector<Tensor> out64 = RunForward(c, ins, DType::kF64, Device::Cpu());
  std::vector<Tensor> out32 = RunForward(c, ins, DType::kF32, Device::Cpu());
  // The reference sees the attributes as the node holds them, defaults filled.
  AttrMap attrs = c.attrs;
  REQUIRE(CanonicalizeAttrs(*OpRegistry::Global().GetOp(c.op).value(), &attrs).ToString() == "OK");
  std::vector<Tensor> expected = c.reference(ins, attrs, out64);
  for (int k : Indices(c.checked_outputs, out64.size())) {
    REQUIRE(k < static_cast<int>(expected.size()));
    CompareTensors("case '" + c.name + "' output " + std::to_string(k) + " f64 vs reference", expected[k], out64[k],
                   c.f64_tolerance);
    CompareTensors("case '" + c.name + "' output " + std::to_string(k) + " f32 vs reference", expected[k], out32[k],
                   c.f32_tolerance);
  }
}

// The op's graph plus loss = sum_k sum(out_k * w_k) with fixed random
// weights w_k, so every output element carries a distinct weight; `feeds`
// holds the inputs and weights in `float_dtype`.
struct LossGraph {
  OpGraph op;
  ValueId loss = kNoValue;
  std::map<std::string, Tensor> feeds;
  std::vector<std::string> wrt;  // the differentiable inputs
};

LossGraph BuildLossGraph(const OpCase& c, const std::vector<Tensor>& ins, DType float_dtype) {
  LossGraph lg{BuildOpGraph(c, float_dtype)};
  OpGraph& g = lg.op;
  GraphBuilder b(&g.graph);
  std::vector<int> loss_outputs = c.loss_outputs;
  if (loss_outputs.empty())
    for (size_t k = 0; k < g.outputs.size(); ++k)
      if (IsFloating(g.graph.type(g.outputs[k]).dtype)) loss_outputs.push_back(static_cast<int>(k));
  REQUIRE_FALSE(loss_outputs.empty());
  Rng rng(c.seed + 1000);
  lg.feeds = Feeds(c, ins, float_dtype);
  for (int k : loss_outputs) {
    const TensorType& t = g.graph.type(g.outputs[k]);
    std::string wname = "w" + std::to_string(k);
    ValueId w = b.Input(wname, t);
    Tensor wt = ZerosF64(t.shape);
    for (int64_t i = 0; i < wt.numel(); ++i) At(wt, i) = rng.Uniform(-1, 1);
    lg.feeds[wname] = wt.Cast(float_dtype).value();
    ValueId term = b.Add1("SumToShape", {b.Add1("Mul", {g.outputs[k], w}, {}, "").value()},
                          AttrMap{{"shape", std::vector<int64_t>{}}}, "")
                       .value();
    lg.loss = lg.loss == kNoValue ? term : b.Add1("Add", {lg.loss, term}, {}, "").value();
  }
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.inputs[i].differentiable) lg.wrt.push_back("in" + std::to_string(i));
  return lg;
}

void CheckGradient(const OpCase& c, const std::vector<Tensor>& ins) {
  LossGraph lg = BuildLossGraph(c, ins, DType::kF64);
  if (lg.wrt.empty()) return;
  CheckGraphGradients(lg.op.graph, lg.loss, lg.feeds, lg.wrt, c.grad_tolerance, c.seed, "case '" + c.name + "'");
}

// The loss and the input gradients of the case's loss graph in f32 on
// `device` (the backward ops are whatever the op's gradient rule emits).
std::map<std::string, Tensor> RunBackward(const OpCase& c, const std::vector<Tensor>& ins, Device device) {
  LossGraph lg = BuildLossGraph(c, ins, DType::kF32);
  std::vector<ValueId> wrt;
  for (const std::string& name : lg.wrt) wrt.push_back(lg.op.inputs.at(std::stoi(name.substr(2))));
  auto grads = BuildGradients(&lg.op.graph, lg.loss, wrt);
  INFO("case '" << c.name << "': autodiff");
  REQUIRE(grads.status().ToString() == "OK");
  Graph& graph = lg.op.graph;
  graph.outputs().clear();
  graph.outputs()["loss"] = lg.loss;
  for (size_t j = 0; j < wrt.size(); ++j) graph.outputs()["grad_" + lg.wrt[j]] = grads->at(wrt[j]);
  ExecutorOptions opts;
  opts.device = device;
  opts.seed = c.seed;
  // A forward op with a CUDA kernel must have CUDA kernels for its backward
  // ops too: this fails naming the op that lacks one.
  auto exec = Executor::Create(graph, opts);
  INFO("case '" << c.name << "' backward on " << device.ToString());
  REQUIRE(exec.status().ToString() == "OK");
  auto result = (*exec)->Run(lg.feeds);
  REQUIRE(result.status().ToString() == "OK");
  return *result;
}

void CheckCudaAgainstCpu(const OpCase& c, const std::vector<Tensor>& ins) {
  if (!GpuAvailable()) return;  // skipped: no GPU here
  if (!OpRegistry::Global().SupportsOp(c.op, DeviceType::kCuda)) return;
  std::vector<Tensor> cpu = RunForward(c, ins, DType::kF32, Device::Cpu());
  std::vector<Tensor> gpu = RunForward(c, ins, DType::kF32, Device::Cuda(0));
  for (int k : Indices(c.checked_outputs, cpu.size()))
    CompareTensors("case '" + c.name + "' output " + std::to_string(k) + " cuda vs cpu", cpu[k], gpu[k],
                   c.f32_tolerance);
  if (!c.check_gradient) return;
  bool any_differentiable = false;
  for (const InputSpec& s : c.inputs) any_differentiable |= s.differentiable;
  if (!any_differentiable) return;
  // Gradients sum over more terms than the forward: a looser bound.
  std::map<std::string, Tensor> cpu_grads = RunBackward(c, ins, Device::Cpu());
  std::map<std::string, Tensor> gpu_grads = RunBackward(c, ins, Device::Cuda(0));
  for (const auto& [name, expected] : cpu_grads)
    CompareTensors("case '" + c.name + "' " + name + " cuda vs cpu", expected, gpu_grads.at(name),
                   4 * c.f32_tolerance);
}

}  // namespace

void CheckBitwiseEqual(const std::string& what, const Tensor& expected, const Tensor& actual) {
  INFO(what);
  REQUIRE(expected.shape() == actual.shape());
  REQUIRE(expected.dtype() == actual.dtype());
  const auto* a = static_cast<const unsigned char*>(expected.raw_data());
  const auto* b = static_cast<const unsigned char*>(actual.raw_data());
  size_t first = 0;
  while (first < expected.nbytes() && a[first] == b[first]) ++first;
  INFO("first differing element: " << first / DTypeSize(expected.dtype()) << " of " << expected.numel());
  CHECK(first == expected.nbytes());
}

bool GpuAvailable() {
  static const Status present = GetAllocator(Device::Cuda(0)).status();
  if (present.ok()) return true;
  const char* required = std::getenv("LOOM_REQUIRE_CUDA");
  if (required && std::string(required) == "1") FAIL("LOOM_REQUIRE_CUDA=1 but cuda:0 is unusable: " << present.ToString());
  static const bool logged = [] {
    std::fprintf(stderr, "no GPU: CUDA comparisons skipped (%s)\n", present.ToString().c_str());
    return true;
  }();
  (void)logged;
  return false;
}

std::vector<Device> TestDevices() {
  std::vector<Device> devices = {Device::Cpu()};
  if (GpuAvailable()) devices.push_back(Device::Cuda(0));
  return devices;
}

void CheckGraphGradients(Graph graph, ValueId loss, const std::map<std::string, Tensor>& feeds,
                         const std::vector<std::string>& wrt_nodes, double tolerance, uint64_t seed,
                         const std::string& label) {
  std::vector<ValueId> wrt;
  for (const std::string& name : wrt_nodes) {
    auto id = graph.FindNode(name);
    INFO(label << ": no node named '" << name << "'");
    REQUIRE(id.has_value());
    REQUIRE(graph.node(*id).outputs.size() == 1);
    wrt.push_back(graph.node(*id).outputs[0]);
  }
  auto grads = BuildGradients(&graph, loss, wrt);
  INFO(label << ": autodiff");
  REQUIRE(grads.status().ToString() == "OK");
  graph.outputs()["loss"] = loss;
  for (size_t j = 0; j < wrt.size(); ++j) graph.outputs()["grad" + std::to_string(j)] = grads->at(wrt[j]);

  ExecutorOptions opts;
  opts.seed = seed;
  auto exec = Executor::Create(graph, opts);
  REQUIRE(exec.status().ToString() == "OK");
  REQUIRE((*exec)->InitializeState(seed).ok());
  std::map<std::string, Tensor> state = (*exec)->state();  // kept fixed: the step's updates are undone
  std::map<std::string, Tensor> f = feeds;
  auto loss_and_grads = [&]() {
    for (const auto& [name, t] : state) REQUIRE((*exec)->SetState(name, t).ok());
    (*exec)->SetStep(0);  // the same random stream every evaluation
    auto r = (*exec)->Run(f);
    REQUIRE(r.status().ToString() == "OK");
    return *r;
  };
  for (auto& [name, t] : state) t = t.To(Device::Cpu()).value();  // private copies
  std::map<std::string, Tensor> analytic = loss_and_grads();

  // The finite differences need the loss alone: the same graph without the
  // backward pass (a third of the work for a convolution). Its loss at the
  // unperturbed point must be the full graph's, bit for bit (the same
  // kernels; random streams are keyed by node name).
  Graph forward = graph;
  forward.outputs() = {{"loss", loss}};
  forward.state_updates().clear();  // the state is reset before every evaluation
  forward.gradients().clear();
  REQUIRE(DeadCodeElimination().Run(&forward).ok());
  auto loss_exec = Executor::Create(forward, opts);
  REQUIRE(loss_exec.status().ToString() == "OK");
  auto loss_at = [&]() {
    for (const auto& [name, t] : state) REQUIRE((*loss_exec)->SetState(name, t).ok());
    (*loss_exec)->SetStep(0);
    auto r = (*loss_exec)->Run(f);
    REQUIRE(r.status().ToString() == "OK");
    return r->at("loss").ScalarAt(0);
  };
  {
    INFO(label << ": the loss without the backward pass");
    const double alone = loss_at(), full = analytic["loss"].ScalarAt(0);
    REQUIRE((alone == full || (std::isnan(alone) && std::isnan(full))));
  }

  const double eps = 1e-6;
  for (size_t j = 0; j < wrt.size(); ++j) {
    const std::string& name = wrt_nodes[j];
    Tensor& x = f.count(name) ? f[name] : state.at(name);
    REQUIRE(x.dtype() == DType::kF64);
    const Tensor& grad = analytic["grad" + std::to_string(j)];
    // Check every element of small tensors, an even spread of 48 in big ones.
    int64_t n = x.numel(), step = std::max<int64_t>(1, n / 48);
    int bad = 0;
    for (int64_t e = 0; e < n; e += step) {
      double orig = At(x, e);
      At(x, e) = orig + eps;
      double up = loss_at();
      At(x, e) = orig - eps;
      double down = loss_at();
      At(x, e) = orig;
      double numeric = (up - down) / (2 * eps), got = grad.ScalarAt(e);
      bool ok = std::abs(numeric - got) <= tolerance * std::max(1.0, std::abs(numeric));
      if (!ok && bad++ < 3) {
        INFO(label << " d loss / d " << name << "[" << e << "]: finite difference " << numeric << ", backprop " << got);
        CHECK(ok);
      }
    }
    INFO(label << " gradient of " << name);
    CHECK(bad == 0);
  }
}

std::string InferError(const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& inputs) {
  auto r = InferOpTypes(*OpRegistry::Global().GetOp(op).value(), attrs, inputs);
  REQUIRE_FALSE(r.ok());
  return r.status().message();
}

void CheckSameAcrossThreads(const OpCase& c, const std::vector<int>& threads) {
  std::vector<Tensor> ins = MakeInputs(c);
  std::vector<Tensor> first_outputs;
  std::map<std::string, Tensor> first_grads;
  for (size_t i = 0; i < threads.size(); ++i) {
    ThreadPool::SetDefaultThreads(threads[i]);
    std::vector<Tensor> outputs = RunForward(c, ins, DType::kF32, Device::Cpu());
    std::map<std::string, Tensor> grads;
    if (c.check_gradient) grads = RunBackward(c, ins, Device::Cpu());
    if (i == 0) {
      first_outputs = std::move(outputs);
      first_grads = std::move(grads);
      continue;
    }
    const std::string against = " on " + std::to_string(threads[i]) + " threads against " +
                                std::to_string(threads[0]);
    for (size_t k = 0; k < outputs.size(); ++k)
      CheckBitwiseEqual("case '" + c.name + "' output " + std::to_string(k) + against, first_outputs[k], outputs[k]);
    for (const auto& [name, grad] : grads)
      CheckBitwiseEqual("case '" + c.name + "' " + name + against, first_grads.at(name), grad);
  }
  ThreadPool::SetDefaultThreads(0);
}

void RunOpCase(const OpCase& c) {
  std::vector<Tensor> ins = MakeInputs(c);
  CheckForward(c, ins);
  if (c.check_gradient) CheckGradient(c, ins);
  CheckCudaAgainstCpu(c, ins);
}

}  // namespace loom::testing
