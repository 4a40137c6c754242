// The model API example from docs/model_api.md: a small residual CNN built
// from reusable blocks, trained for a few steps on random data. Built by CI
// and run by //docs/examples:residual_cnn_test.
#include <cstdio>

#include "graph/model.h"
#include "graph/compile.h"
#include "runtime/executor.h"

using namespace loom;

// A reusable block: conv-bn-relu twice with a skip connection. Its layers are
// named "<name>/conv1", "<name>/bn1", ... through the scope.
Sym ResidualBlock(Model& m, Sym x, int64_t channels, const std::string& name) {
  auto scope = m.scope(name);
  Conv2dOptions same;
  same.padding = {1, 1};
  same.bias = false;
  Sym h = m.relu(m.batch_norm(m.conv2d(x, channels, {3, 3}, same, "conv1"), {}, "bn1"));
  h = m.batch_norm(m.conv2d(h, channels, {3, 3}, same, "conv2"), {}, "bn2");
  return m.relu(m.add(h, x));
}

int main() {
  const int64_t batch = 8;
  Model m;
  Sym image = m.input("image", {batch, 1, 28, 28});
  Sym label = m.input("label", {batch}, DType::kI64);
  Conv2dOptions stem;
  stem.padding = {1, 1};
  Sym h = m.relu(m.conv2d(image, 16, {3, 3}, stem, "stem"));
  h = ResidualBlock(m, h, 16, "block1");
  h = m.max_pool2d(h, {2, 2});
  h = ResidualBlock(m, h, 16, "block2");
  h = m.adaptive_avg_pool2d(h, {1, 1});
  Sym logits = m.linear(m.flatten(h), 10, {}, "classifier");
  m.set_output("logits", logits);
  m.set_output("loss", m.cross_entropy(logits, label));
  if (!m.status().ok()) {
    std::fprintf(stderr, "model error: %s\n", m.status().ToString().c_str());
    return 1;
  }

  // Parameters by layer.
  int64_t total = 0;
  for (const Node& n : m.graph().nodes()) {
    if (n.op != kParameterOp) continue;
    const Shape& s = m.graph().type(n.outputs[0]).shape;
    std::printf("%-24s %s\n", n.name.c_str(), s.ToString().c_str());
    total += s.numel();
  }
  std::printf("parameters: %lld\n", static_cast<long long>(total));

  // One graph per training step: forward, backward and SGD update.
  StepOptimizer sgd;
  sgd.config.set_momentum(0.9);
  StatusOr<Graph> train = Compile(m.graph(), Program::kTrainingStep, StepOptions(sgd));
  if (!train.ok()) return std::fprintf(stderr, "%s\n", train.status().ToString().c_str()), 1;
  auto exec = Executor::Create(*train);
  if (!exec.ok() || !(*exec)->InitializeState(/*seed=*/0).ok()) return 1;

  // A fixed random batch: the loss must fall as the model fits it.
  Rng rng(1);
  Tensor images = Tensor::Zeros({batch, 1, 28, 28});
  for (int64_t i = 0; i < images.numel(); ++i) images.data<float>()[i] = static_cast<float>(rng.Normal());
  Tensor labels = Tensor::Zeros({batch}, DType::kI64);
  for (int64_t i = 0; i < batch; ++i) labels.data<int64_t>()[i] = rng.UniformInt(10);
  Tensor lr = Tensor::FromVector<float>({}, {0.05f});
  double first = 0, last = 0;
  for (int step = 1; step <= 20; ++step) {
    Tensor step_t = Tensor::FromVector<float>({}, {static_cast<float>(step)});
    auto out = (*exec)->Run({{"image", images}, {"label", labels}, {"lr", lr}, {"step", step_t}});
    if (!out.ok()) return std::fprintf(stderr, "%s\n", out.status().ToString().c_str()), 1;
    last = (*out)["loss"].ScalarAt(0);
    if (step == 1) first = last;
    if (step % 5 == 0) std::printf("step %2d  loss %.4f\n", step, last);
  }
  std::printf("activation arena %zu bytes (one buffer per value would take %zu)\n",
              (*exec)->memory_plan().arena_bytes, (*exec)->memory_plan().unplanned_bytes);
  if (!(last < first / 4)) {
    std::fprintf(stderr, "loss did not fall: %.4f -> %.4f\n", first, last);
    return 1;
  }
  return 0;
}
