#include "runtime/fold_activations.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "core/rng.h"
#include "graph/compile.h"
#include "graph/model.h"
#include "runtime/executor.h"

namespace loom {
namespace {

int Count(const Graph& g, const std::string& op) { return static_cast<int>(g.NodesWithOp(op).size()); }

bool SameBits(const Tensor& a_any, const Tensor& b_any) {
  const Tensor a = a_any.To(Device::Cpu()).value(), b = b_any.To(Device::Cpu()).value();
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A convolution, a BatchNorm and an activation (`op`: ReLU, ReLU6 or
// Hardswish), then a second BatchNorm whose activation reads it through a
// view (as a fused array's do), and a loss.
Graph ConvNet(const std::string& op = "ReLU") {
  Model m;
  auto act = [&](Sym v) { return op == "ReLU6" ? m.relu6(v) : op == "Hardswish" ? m.hardswish(v) : m.relu(v); };
  Sym x = m.input("x", {4, 3, 6, 6});
  Sym y = m.input("y", {4}, DType::kI64);
  Sym h = act(m.batch_norm(m.conv2d(x, 5, {3, 3}, {}, "conv1"), {}, "bn1"));
  Sym f = m.batch_norm(m.conv2d(h, 4, {3, 3}, {}, "conv2"), {}, "bn2");
  Sym r = act(m.reshape(f, {4, 4 * 2 * 2}));
  m.set_output("loss", m.cross_entropy(m.linear(r, 3, {}, "fc"), y));
  return m.graph();
}

Graph TrainingStep(const Graph& model, std::optional<FusionOptions> fusion = std::nullopt) {
  StepOptimizer sgd;
  sgd.config.set_momentum(0.9);
  CompileOptions o;
  o.fusion = fusion;
  o.optimizers.assign(fusion ? static_cast<size_t>(fusion->replicas) : 1, sgd);
  auto step = Compile(model, Program::kTrainingStep, o);
  REQUIRE(step.status().ToString() == "OK");
  return *step;
}

std::map<std::string, Tensor> Feeds(const Graph& g) {
  std::map<std::string, Tensor> feeds;
  Rng rng(3);
  for (const Node& n : g.nodes()) {
    if (n.op != kInputOp) continue;
    const TensorType& t = g.type(n.outputs[0]);
    Tensor v = Tensor::Zeros(t.shape, t.dtype);
    for (int64_t i = 0; i < v.numel(); ++i) {
      if (t.dtype == DType::kF32) v.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
      if (t.dtype == DType::kI64) v.data<int64_t>()[i] = rng.UniformInt(3);
    }
    feeds[n.name] = v;
  }
  if (feeds.count("lr")) feeds["lr"].Fill(0.1);
  if (feeds.count(kReplicaMaskInput)) feeds[kReplicaMaskInput].Fill(1);
  return feeds;
}

// The CPU, and the GPU where one is present (its BatchNorm kernels do the
// folded work in their own passes).
std::vector<Device> Devices() {
  std::vector<Device> devices = {Device::Cpu()};
  if (GetAllocator(Device::Cuda(0)).ok()) devices.push_back(Device::Cuda(0));
  return devices;
}

// Three steps with and without folding on `device`: the same outputs and
// state, bit for bit; `folded` activations (`op`) and as many backward ops
// are gone.
void CheckFoldedRunsAlike(const Graph& step, int folded_count, const std::string& op, Device device) {
  INFO("on " << device.ToString());
  const std::map<std::string, Tensor> feeds = Feeds(step);
  ExecutorOptions fold, plain;
  fold.device = plain.device = device;
  plain.fold_activations = false;
  auto folded = Executor::Create(step, fold);
  auto unfolded = Executor::Create(step, plain);
  REQUIRE(folded.ok());
  REQUIRE(unfolded.ok());
  CHECK(Count((*unfolded)->graph(), op) == Count(step, op));
  CHECK(Count((*folded)->graph(), op) == Count(step, op) - folded_count);
  CHECK(Count((*folded)->graph(), op + "Backward") == Count(step, op + "Backward") - folded_count);
  REQUIRE((*folded)->InitializeState(7).ok());
  REQUIRE((*unfolded)->InitializeState(7).ok());
  for (int i = 0; i < 3; ++i) {
    auto a = (*folded)->Run(feeds);
    auto b = (*unfolded)->Run(feeds);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    for (const auto& [name, t] : *b) {
      INFO("output " << name << ", step " << i);
      CHECK(SameBits(a->at(name), t));
    }
  }
  for (const std::string& name : (*unfolded)->StateNames()) {
    INFO("state " << name);
    CHECK(SameBits((*folded)->GetState(name).value(), (*unfolded)->GetState(name).value()));
  }
}

void CheckFoldedRunsAlike(const Graph& step, int folded_count, const std::string& op = "ReLU") {
  for (const Device& device : Devices()) CheckFoldedRunsAlike(step, folded_count, op, device);
}

TEST_CASE("a ReLU, ReLU6 or Hardswish that alone reads a BatchNorm, and its backward, run inside the BatchNorm's ops, with the same bits") {
  FusionOptions three;
  three.replicas = 3;
  three.seeds = {1, 2, 3};
  SECTION("one model: directly and through a view") { CheckFoldedRunsAlike(TrainingStep(ConvNet()), 2); }
  SECTION("a fused array of three") { CheckFoldedRunsAlike(TrainingStep(ConvNet(), three), 2); }
  // ReLU6's backward reads its input, which then holds the clamped values:
  // the same mask.
  SECTION("ReLU6, one model") { CheckFoldedRunsAlike(TrainingStep(ConvNet("ReLU6")), 2, "ReLU6"); }
  SECTION("ReLU6, a fused array of three") { CheckFoldedRunsAlike(TrainingStep(ConvNet("ReLU6"), three), 2, "ReLU6"); }
  // Hardswish's backward reads its input, which only the BatchNorm's
  // backward can rebuild once the forward folds: both fold or neither.
  SECTION("Hardswish, one model") { CheckFoldedRunsAlike(TrainingStep(ConvNet("Hardswish")), 2, "Hardswish"); }
  SECTION("Hardswish, a fused array of three") {
    CheckFoldedRunsAlike(TrainingStep(ConvNet("Hardswish"), three), 2, "Hardswish");
  }
}

TEST_CASE("a BatchNorm whose output is read elsewhere, or is an output, keeps its ReLU apart") {
  Model m;
  Sym x = m.input("x", {4, 3});
  Sym b = m.batch_norm(x, {}, "bn");
  m.set_output("loss", m.mse(m.add(m.relu(b), b), m.input("t", {4, 3})));  // b read twice
  Graph step = TrainingStep(m.graph());
  CHECK(FoldActivationsIntoBatchNorm(&step) == 0);

  // Outputs are what callers read: a BatchNorm's y and a ReLU's output stay as computed.
  Model n;
  Sym bn = n.batch_norm(n.input("x", {4, 3}), {}, "bn");
  n.set_output("relu", n.relu(bn));
  Graph relu_out = n.graph();
  CHECK(FoldActivationsIntoBatchNorm(&relu_out) == 0);
  Model k;
  k.set_output("relu", k.scale(k.relu(k.batch_norm(k.input("x", {4, 3}), {}, "bn")), 2.0));
  Graph y_out = k.graph();
  y_out.outputs()["y"] = y_out.node(*y_out.FindNode("bn")).outputs[0];
  CHECK(FoldActivationsIntoBatchNorm(&y_out) == 0);
  // Neither: folded, and the ReLU's reader reads the BatchNorm's y.
  Graph folded = k.graph();
  const NodeId bn_node = *folded.FindNode("bn");
  REQUIRE(FoldActivationsIntoBatchNorm(&folded) == 1);  // (a forward graph: no ReLUBackward)
  CHECK(folded.node(bn_node).attrs.Str("activation") == "relu");
  CHECK(Count(folded, "ReLU") == 0);
  CHECK(folded.node(folded.NodesWithOp("MulScalar").at(0)).inputs[0] == folded.node(bn_node).outputs[0]);
}

// Hardswish's backward reads the activation's input, which a folded
// forward would overwrite with the activated values: where its backward
// cannot fold (here its output is kept), the forward stays apart too.
TEST_CASE("a Hardswish whose backward stays apart keeps its forward apart too") {
  Graph step = TrainingStep(ConvNet("Hardswish"));
  const std::vector<NodeId> backward = step.NodesWithOp("HardswishBackward");
  REQUIRE(backward.size() == 2);
  for (NodeId id : backward) step.outputs()["dt" + std::to_string(id)] = step.node(id).outputs[0];
  CHECK(FoldActivationsIntoBatchNorm(&step) == 0);
  CHECK(Count(step, "Hardswish") == 2);
}

}  // namespace
}  // namespace loom
