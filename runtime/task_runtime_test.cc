// The task runtime against one device: every strategy, on CPU devices of
// this process, must give the losses and parameters that one Executor
// gives after the same steps (f64: 1e-9 relative).
#include "runtime/task_runtime.h"

#include <catch2/catch.hpp>

#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "graph/builder.h"
#include "graph/model.h"
#include "graph/task_graph.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "runtime/comm/local_communicator.h"
#include "tests/parallel_check.h"

namespace loom {
namespace {

using testing::FirstMismatch;
using testing::StepCase;
using testing::StepResults;

constexpr int kSteps = 3;
constexpr int64_t kBatch = 8;
constexpr uint64_t kSeed = 3;


StepResults OneDevice(const StepCase& c) {
  auto r = testing::RunOneDevice(c, kSteps, kSeed);
  if (!r.ok()) FAIL(r.status().ToString());
  return *r;
}

StatusOr<TaskGraph> Lower(const StepCase& c, const std::string& strategy) { return testing::LowerStrategy(c, strategy); }

// A sequence model's step (its graph reads "input" [steps, kBatch, 6], time
// major, and "target" [kBatch] of 4 classes), fed from `seed`.
StepCase SequenceCase(const Graph& graph, int64_t steps, uint64_t seed,
                      const std::optional<FusionOptions>& fusion = std::nullopt) {
  std::mt19937_64 rng(seed);
  Tensor xs = Tensor::Zeros({steps, kBatch, 6}, DType::kF64), y = Tensor::Zeros({kBatch}, DType::kI64);
  for (int64_t i = 0; i < xs.numel(); ++i) xs.data<double>()[i] = static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = testing::MakeStepCase(graph, fusion, {{"input", xs}, {"target", y}});
  if (!c.ok()) FAIL(c.status().ToString());
  return *c;
}

void ExpectSame(const StepCase& c, const StepResults& want, const std::string& strategy) {
  INFO(strategy);
  auto got = testing::RunOnDevices(c, strategy, kSteps, kSeed);
  if (!got.ok()) FAIL(got.status().ToString());
  CHECK(FirstMismatch(want, *got, 1e-9) == "");
}

TEST_CASE("mlp: data, model and parameter parallel match one device") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const StepResults want = OneDevice(c);
  for (const std::string& s : {
           std::string("devices: 1\n"),
           std::string("devices: 2\ndefault_split { sample: 2 }\n"),
           std::string("devices: 4\ndefault_split { sample: 4 }\n"),
           std::string("devices: 2\nlayer { layer: \"*fc1*\" devices: 1 }\n"),
           std::string("devices: 2\ndefault_split { parameter: 2 }\n"),
           std::string("devices: 4\ndefault_split { sample: 2 parameter: 2 }\n"),
       }) {
    ExpectSame(c, want, s);
  }
}

TEST_CASE("cnn: data, model, parameter and attribute parallel match one device") {
  const StepCase c = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  const StepResults want = OneDevice(c);
  for (const std::string& s : {
           std::string("devices: 2\ndefault_split { sample: 2 }\n"),
           std::string("devices: 3\ndefault_split { sample: 2 devices: 1 devices: 2 }\n"),
           std::string("devices: 2\ndefault_split { parameter: 2 }\n"),
           std::string("devices: 2\nlayer { layer: \"*conv\" attribute: 2 }\n"),
           std::string("devices: 4\ndefault_split { sample: 2 }\nlayer { layer: \"*conv\" sample: 2 attribute: 2 }\n"),
           std::string("devices: 2\nlayer { layer: \"stage1/*\" devices: 1 }\n"),
       }) {
    ExpectSame(c, want, s);
  }
}

TEST_CASE("fused mlp: 4 replicas over 2 devices match one device") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "16"}}, {64}, 4);
  const StepResults want = OneDevice(c);
  for (const std::string& s : {
           std::string("devices: 2\ndefault_split { replica: 2 }\n"),
           std::string("devices: 2\ndefault_split { sample: 2 }\n"),
           std::string("devices: 4\ndefault_split { sample: 2 replica: 2 }\n"),
       }) {
    ExpectSame(c, want, s);
  }
}

TEST_CASE("fused cnn: replicas of grouped convolutions over 2 devices match one device") {
  const StepCase c = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8}, 4);
  const StepResults want = OneDevice(c);
  for (const std::string& s : {
           std::string("devices: 2\ndefault_split { replica: 2 }\n"),
           std::string("devices: 2\ndefault_split { sample: 2 }\n"),
       }) {
    ExpectSame(c, want, s);
  }
}

// A fused array's weights reach its layers through reshapes that read
// parameters alone ("stage2/conv/param1/stacked"). Data parallelism runs
// them on every device, as it keeps every parameter there; they ran whole
// on device 0 before, so every step sent the stacked weights from device 0
// to the others and their gradients back.
TEST_CASE("data parallelism runs a fused array's weight reshapes on every device: no weight moves") {
  const StepCase c = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8}, 4);
  const std::string strategy = "devices: 2\ndefault_split { sample: 2 }\n";
  auto tg = Lower(c, strategy);
  REQUIRE(tg.ok());
  INFO(tg->ToString());
  int stacked = 0;
  for (const Task& t : tg->tasks) {
    if (t.kind == TaskKind::kCompute && tg->graph.node(t.node).name.find("/stacked") != std::string::npos) ++stacked;
    if (t.kind != TaskKind::kTransfer) continue;
    const std::string& value = tg->graph.value(tg->pieces[static_cast<size_t>(t.sources[0])].value).name;
    CHECK(value.find("/param") == std::string::npos);
    CHECK(value.find("/weight") == std::string::npos);
  }
  CHECK(stacked > 0);
  ExpectSame(c, OneDevice(c), strategy);
}

// A node of no layer follows the split that wrote most of its inputs. The
// gradient norm of a fused array (its divergence check) reads every
// gradient; it followed the first split one, the classifier's here (a
// split the others do not share), so the gradients of every other layer
// moved to the norm's parts each step. (A fused ResNet-18 sweep's exact
// strategy ran its norm whole on device 0 this way.)
TEST_CASE("the gradient norm follows the split that wrote most of the gradients") {
  const StepCase c = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8}, 4);
  const std::string strategy =
      "devices: 4\ndefault_split { sample: 2 replica: 2 }\n"
      "layer { layer: \"classifier\" replica: 2 parameter: 2 }\n";
  auto tg = Lower(c, strategy);
  REQUIRE(tg.ok());
  INFO(tg->ToString());
  const auto norm = tg->graph.FindNode("grad_clip/squared_norm");
  REQUIRE(norm);
  const std::vector<ValueId>& gradients = tg->graph.node(*norm).inputs;
  int moved = 0;
  for (const Task& t : tg->tasks) {
    if (t.kind != TaskKind::kTransfer) continue;
    const ValueId v = tg->pieces[static_cast<size_t>(t.sources[0])].value;
    if (std::find(gradients.begin(), gradients.end(), v) == gradients.end()) continue;
    ++moved;
    // Of the gradients, only the classifier's move (to the norm's parts).
    CHECK(tg->graph.node(tg->graph.value(v).producer).name.rfind("classifier/", 0) == 0);
  }
  CHECK(moved > 0);
  ExpectSame(c, OneDevice(c), strategy);
}

// Sample splits of a training BatchNorm expand (statistics summed across
// the parts, then applied by each) and Dropout's parts draw the whole's
// mask: no task of either runs whole, and the results are one device's.
TEST_CASE("batch norm and dropout split along the batch match one device") {
  const StepCase c = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8});
  const StepCase fused = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8}, 4);
  REQUIRE(!c.step.NodesWithOp("Dropout").empty());
  REQUIRE(!c.step.NodesWithOp("BatchNorm").empty());
  for (const StepCase* sc : {&c, &fused}) {
    const StepResults want = OneDevice(*sc);
    for (const std::string& s : {
             std::string("devices: 2\ndefault_split { sample: 2 }\n"),
             std::string("devices: 4\ndefault_split { sample: 4 }\n"),
             std::string("devices: 4\ndefault_split { sample: 2 }\nlayer { layer: \"*bn\" sample: 4 }\n"),
         }) {
      ExpectSame(*sc, want, s);
      auto tg = Lower(*sc, s);
      REQUIRE(tg.ok());
      std::map<std::string, std::set<int64_t>> devices;  // op -> devices its tasks ran on
      for (const Task& t : tg->tasks)
        if (t.kind == TaskKind::kCompute) devices[tg->graph.node(t.node).op].insert(t.device);
      INFO(s);
      CHECK(devices.count("BatchNorm") == 0);
      CHECK(devices.count("BatchNormBackward") == 0);
      CHECK(devices["BatchNormStats"].size() >= 2);
      CHECK(devices["BatchNormApply"].size() >= 2);
      CHECK(devices["BatchNormBackwardApply"].size() >= 2);
      INFO(tg->ToString());
      CHECK(devices["Dropout"].size() >= 2);
      if (sc == &c) CHECK(devices["CrossEntropy"].size() >= 2);
      if (sc == &c) CHECK(devices["CrossEntropyBackward"].size() >= 2);
    }
  }
  // Fused replicas over devices too: the parts keep their replicas' seeds.
  ExpectSame(fused, OneDevice(fused), "devices: 4\ndefault_split { sample: 2 replica: 2 }\n");
}

// A training BatchNorm split by batch and by channels (a parameter split,
// or a fused array's replicas): the ops of its expansion split the channels
// too, so each half of the channels sums its statistics among the devices
// that hold it and reads x where it was made. They split the batch alone
// before: the channel split became a second batch split, every part read x
// from the devices of the other channels, and the statistics of every
// channel were all-reduced over all four devices.
TEST_CASE("a training BatchNorm split by batch and channels sums each half's statistics among its own devices") {
  const StepCase cnn = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  const StepCase fused = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8}, 4);
  for (const auto& [c, strategy] : std::vector<std::pair<const StepCase*, std::string>>{
           {&cnn, "devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"*bn\" sample: 2 parameter: 2 }\n"},
           {&fused, "devices: 4\ndefault_split { sample: 2 replica: 2 }\n"}}) {
    INFO(strategy);
    auto tg = Lower(*c, strategy);
    REQUIRE(tg.ok());
    INFO(tg->ToString());
    int statistics = 0;
    for (const Task& t : tg->tasks) {
      if (t.kind == TaskKind::kCompute) continue;
      const Piece& source = tg->pieces[static_cast<size_t>(t.sources[0])];
      const ValueId v = source.value;
      const std::string& op = tg->graph.node(tg->graph.value(v).producer).op;
      if (op == "BatchNormPivot" || op == "BatchNormStats" || op == "BatchNormBackwardStats") {
        ++statistics;
        CHECK(t.kind == TaskKind::kAllReduce);
        CHECK(t.group.size() == 2);
        CHECK(source.region.numel() * 2 == tg->graph.type(v).shape.numel());
      }
      // A fused BatchNorm reads x where its replicas' layer made it.
      if (t.kind == TaskKind::kTransfer) CHECK(tg->graph.value(v).name.find("merge_replicas") == std::string::npos);
    }
    CHECK(statistics > 0);
    ExpectSame(*c, OneDevice(*c), strategy);
  }
}

// NLL, MSE and BCEWithLogits (mean and sum; BCE with a pos_weight that has
// the batch's rows) split along the batch: the losses are partial sums, a
// mean's divisor the whole batch's; 3 steps match one device.
TEST_CASE("NLL, MSE and BCEWithLogits split along the batch match one device") {
  struct LossCase {
    std::string loss, reduction;
  };
  for (const LossCase& lc : std::vector<LossCase>{{"NLL", "mean"}, {"NLL", "sum"}, {"MSE", "mean"}, {"MSE", "sum"},
                                                  {"BCEWithLogits", "mean"}, {"BCEWithLogits", "sum"},
                                                  {"BCEWithLogits pos_weight", "mean"}}) {
    INFO(lc.loss << " " << lc.reduction);
    Model m(DType::kF64);
    const Sym x = m.input("input", {kBatch, 6});
    const Sym logits = m.linear(m.relu(m.linear(x, 8, {}, "fc1")), 4, {}, "fc2");
    std::mt19937_64 rng(9);
    auto uniform = [&](const Shape& shape, double lo, double hi) {
      Tensor t = Tensor::Zeros(shape, DType::kF64);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = lo + (hi - lo) * static_cast<double>(rng() % 1001) / 1000.0;
      return t;
    };
    std::map<std::string, Tensor> feeds = {{"input", uniform({kBatch, 6}, -1, 1)}};
    const AttrMap reduction{{"reduction", lc.reduction}};
    Sym loss;
    if (lc.loss == "NLL") {
      Tensor y = Tensor::Zeros({kBatch}, DType::kI64);
      for (int64_t i = 0; i < kBatch; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
      feeds["target"] = y;
      loss = m.op1("NLL", {m.log_softmax(logits), m.input("target", {kBatch}, DType::kI64)}, reduction, "loss");
    } else if (lc.loss == "MSE") {
      feeds["target"] = uniform({kBatch, 4}, -1, 1);
      loss = m.op1("MSE", {logits, m.input("target", {kBatch, 4})}, reduction, "loss");
    } else {
      feeds["target"] = uniform({kBatch, 4}, 0, 1);
      std::vector<Sym> in = {logits, m.input("target", {kBatch, 4})};
      if (lc.loss == "BCEWithLogits pos_weight") {
        feeds["pos_weight"] = uniform({kBatch, 4}, 0.5, 2);
        in.push_back(m.input("pos_weight", {kBatch, 4}));
      }
      loss = m.op1("BCEWithLogits", in, reduction, "loss");
    }
    m.set_output("loss", loss);
    REQUIRE(m.status().ok());
    auto c = testing::MakeStepCase(m.graph(), std::nullopt, feeds);
    REQUIRE(c.status().ToString() == "OK");
    const StepResults want = OneDevice(*c);
    for (const std::string& s : {std::string("devices: 2\ndefault_split { sample: 2 }\n"),
                                 std::string("devices: 4\ndefault_split { sample: 4 }\n"),
                                 std::string("devices: 4\ndefault_split { sample: 2 parameter: 2 }\n")}) {
      ExpectSame(*c, want, s);
      auto tg = Lower(*c, s);
      REQUIRE(tg.ok());
      std::set<int64_t> loss_devices, backward_devices;
      const std::string op = lc.loss.substr(0, lc.loss.find(' '));
      for (const Task& t : tg->tasks) {
        if (t.kind != TaskKind::kCompute) continue;
        if (tg->graph.node(t.node).op == op) loss_devices.insert(t.device);
        if (tg->graph.node(t.node).op == (op == "NLL" ? "NLLBackward" : op + "Backward")) backward_devices.insert(t.device);
      }
      INFO(s);
      CHECK(loss_devices.size() >= 2);
      CHECK(backward_devices.size() >= 2);
    }
  }
}

// A padded 3x3 convolution of 8x8 images (its outputs of both signs), then
// `pool` named "pool", a Linear and the loss.
StepCase PoolCase(const std::function<Sym(Model&, Sym)>& pool) {
  Model m(DType::kF64);
  const Sym x = m.input("input", {kBatch, 1, 8, 8});
  Conv2dOptions conv;
  conv.padding = {1, 1};
  const Sym h = pool(m, m.conv2d(x, 3, {3, 3}, conv, "conv"));
  const Sym logits = m.linear(m.flatten(h, 1), 4, {}, "fc");
  m.set_output("loss", m.cross_entropy(logits, m.input("target", {kBatch}, DType::kI64)));
  REQUIRE(m.status().ok());
  std::mt19937_64 rng(6);
  Tensor in = Tensor::Zeros({kBatch, 1, 8, 8}, DType::kF64), y = Tensor::Zeros({kBatch}, DType::kI64);
  for (int64_t i = 0; i < in.numel(); ++i) in.data<double>()[i] = static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = testing::MakeStepCase(m.graph(), std::nullopt, {{"input", in}, {"target", y}});
  REQUIRE(c.status().ToString() == "OK");
  return *c;
}

// `c`'s pool (op `op`) split along its rows in 2 and 4, and with the
// convolution in 2 x 2 (sample x rows), matches one device, its parts on
// different devices.
void ExpectRowSplitsMatch(const StepCase& c, const std::string& op) {
  const StepResults want = OneDevice(c);
  for (const std::string& s : {std::string("devices: 2\nlayer { layer: \"pool\" attribute: 2 }\n"),
                               std::string("devices: 4\nlayer { layer: \"pool\" attribute: 4 }\n"),
                               std::string("devices: 4\nlayer { layer: \"conv\" sample: 2 attribute: 2 }\n"
                                           "layer { layer: \"pool\" sample: 2 attribute: 2 }\n")}) {
    ExpectSame(c, want, s);
    auto tg = Lower(c, s);
    REQUIRE(tg.ok());
    std::set<int64_t> devices;
    for (const Task& t : tg->tasks)
      if (t.kind == TaskKind::kCompute && tg->graph.node(t.node).op == op) devices.insert(t.device);
    CHECK(devices.size() >= 2);
  }
}

// Average pooling split along its output rows: each part reads its rows'
// halo, the padding rows as zeros. A ceil-mode pool whose last window
// reaches past the input divides that window by the rows it covers, which
// a part reading zeros there would not: such a pool has no row split (a
// split of it once lowered and trained to other losses).
TEST_CASE("average pooling split along rows, padded, matches one device; an overhanging ceil-mode pool refuses") {
  auto make = [](const Pool2dOptions& pool) {
    return PoolCase([&](Model& m, Sym x) { return m.avg_pool2d(x, {3, 3}, pool, "pool"); });
  };
  Pool2dOptions padded;  // 3x3 windows every 2 rows, 1 row of zeros each side: 4 x 4 out
  padded.stride = {2, 2};
  padded.padding = {1, 1};
  ExpectRowSplitsMatch(make(padded), "AvgPool2d");

  Pool2dOptions overhang;  // 8 rows, ceil mode: windows at rows 0, 2, 4 and 6-8, the last 2 rows high
  overhang.stride = {2, 2};
  overhang.ceil_mode = true;
  auto refused = Lower(make(overhang), "devices: 2\nlayer { layer: \"pool\" attribute: 2 }\n");
  CHECK_THAT(refused.status().ToString(), Catch::Matchers::Contains("layer 'pool' (AvgPool2d)"));
  Pool2dOptions uncounted = padded;  // padding left out of the divisor
  uncounted.count_include_pad = false;
  refused = Lower(make(uncounted), "devices: 2\nlayer { layer: \"pool\" attribute: 2 }\n");
  CHECK_THAT(refused.status().ToString(), Catch::Matchers::Contains("layer 'pool' (AvgPool2d)"));
}

// Max pooling split along its output rows: each part reads only the rows
// inside the plane, pads itself with -inf where its windows reach past it
// (the convolution's outputs below zero show a zero-padded part), and
// counts its indices from the plane's first row, which the backward (run
// whole) scatters by. Padded (ResNet's stem), dilated, and in ceil mode
// with a last window past the input.
TEST_CASE("max pooling split along rows matches one device: padded, dilated, ceil mode") {
  Pool2dOptions stem;  // 3x3 every 2 rows, padding 1: 4 x 4 out
  stem.stride = {2, 2};
  stem.padding = {1, 1};
  Pool2dOptions overhang;  // ceil mode: windows at rows 0, 2, 4 and 6-8 of 8
  overhang.stride = {2, 2};
  overhang.ceil_mode = true;
  const std::vector<std::pair<std::string, Pool2dOptions>> pools = {{"stem", stem}, {"ceil", overhang}};
  for (const auto& [name, pool] : pools) {
    INFO(name);
    ExpectRowSplitsMatch(PoolCase([&](Model& m, Sym x) { return m.max_pool2d(x, {3, 3}, pool, "pool"); }),
                         "MaxPool2d");
  }
  // 2 taps 2 rows apart, padding 1: windows at rows (-1, 1), (0, 2) ... (6, 8) of 8.
  INFO("dilated");
  const AttrMap dilated{
      {"kernel", int64_t{2}}, {"stride", int64_t{1}}, {"padding", int64_t{1}}, {"dilation", int64_t{2}}};
  ExpectRowSplitsMatch(PoolCase([&](Model& m, Sym x) { return m.op("MaxPool2d", {x}, dilated, "pool")[0]; }),
                       "MaxPool2d");
}

// A row-split stack of convolutions keeps its ReLUs and residual sum split
// along the rows too (element-wise ops on images split their rows), so no
// layer between the convolutions and the pool gathers its rows.
TEST_CASE("ReLU and residual adds split along image rows with the convolutions, matching one device") {
  const StepCase c = PoolCase([](Model& m, Sym x) {
    Conv2dOptions same;
    same.padding = {1, 1};
    const Sym h = m.relu(x);
    const Sym sum = m.add(m.conv2d(h, 3, {3, 3}, same, "conv2"), h);
    Pool2dOptions pool;
    pool.stride = {2, 2};
    return m.max_pool2d(m.relu(sum), {2, 2}, pool, "pool");
  });
  const StepResults want = OneDevice(c);
  for (const std::string& s : {std::string("devices: 2\ndefault_split { attribute: 2 }\n"),
                               std::string("devices: 4\ndefault_split { sample: 2 attribute: 2 }\n")}) {
    ExpectSame(c, want, s);
    auto tg = Lower(c, s);
    REQUIRE(tg.ok());
    std::map<std::string, std::set<int64_t>> devices;  // by op
    for (const Task& t : tg->tasks)
      if (t.kind == TaskKind::kCompute) devices[tg->graph.node(t.node).op].insert(t.device);
    INFO(s);
    CHECK(devices["ReLU"].size() >= 2);
    CHECK(devices["Add"].size() >= 2);
  }
}

// Embedding split along the batch (its table's gradient a partial sum),
// along the embedding dimension and along the vocabulary (each part looks
// up the rows it holds; the output a partial sum), with a padding row.
TEST_CASE("embedding split along the batch, the embedding dimension and the vocabulary matches one device") {
  Model m(DType::kF64);
  const Sym ids = m.input("input", {kBatch, 5}, DType::kI64);
  const Sym e = m.embedding(ids, 10, 6, /*padding_idx=*/0, "embed");
  const Sym logits = m.linear(m.mean(e, {1}), 4, {}, "fc");
  m.set_output("loss", m.cross_entropy(logits, m.input("target", {kBatch}, DType::kI64)));
  REQUIRE(m.status().ok());
  std::mt19937_64 rng(4);
  Tensor x = Tensor::Zeros({kBatch, 5}, DType::kI64), y = Tensor::Zeros({kBatch}, DType::kI64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<int64_t>()[i] = static_cast<int64_t>(rng() % 10);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = testing::MakeStepCase(m.graph(), std::nullopt, {{"input", x}, {"target", y}});
  REQUIRE(c.status().ToString() == "OK");
  const StepResults want = OneDevice(*c);
  const std::string vocabulary = " parameter_split: \"vocabulary\"";
  for (const std::string& s :
       {std::string("devices: 2\ndefault_split { sample: 2 }\n"),
        std::string("devices: 2\nlayer { layer: \"embed\" parameter: 2 }\n"),
        std::string("devices: 4\nlayer { layer: \"embed\" sample: 2 parameter: 2 }\n"),
        "devices: 2\nlayer { layer: \"embed\" parameter: 2" + vocabulary + " }\n",
        "devices: 5\nlayer { layer: \"embed\" parameter: 5" + vocabulary + " devices: [4, 2, 0, 1, 3] }\n",
        "devices: 4\ndefault_split { sample: 2 }\nlayer { layer: \"embed\" sample: 2 parameter: 2" + vocabulary +
            " }\n"}) {
    ExpectSame(*c, want, s);
    auto tg = Lower(*c, s);
    REQUIRE(tg.ok());
    std::set<int64_t> forward, backward;
    for (const Task& t : tg->tasks) {
      if (t.kind != TaskKind::kCompute) continue;
      if (tg->graph.node(t.node).op == "Embedding") forward.insert(t.device);
      if (tg->graph.node(t.node).op == "EmbeddingBackward") backward.insert(t.device);
    }
    INFO(s << tg->ToString());
    CHECK(forward.size() >= 2);
    CHECK(backward.size() >= 2);
    if (s.find(vocabulary) == std::string::npos) continue;
    // The table stays split by rows: its parts' homes hold rows, its
    // gradient is written by rows where they are, and neither moves.
    const auto table = tg->graph.FindNode("embed/weight");
    REQUIRE(table);
    for (int h : tg->homes.at(tg->graph.node(*table).outputs[0]))
      CHECK(tg->pieces[static_cast<size_t>(h)].region.hi[1] - tg->pieces[static_cast<size_t>(h)].region.lo[1] == 6);
    for (const Task& t : tg->tasks) {
      if (t.kind == TaskKind::kCompute || t.sources.empty()) continue;
      const std::string& value = tg->graph.value(tg->pieces[static_cast<size_t>(t.sources[0])].value).name;
      CHECK(value.rfind("embed/weight", 0) != 0);
      CHECK(value.find("grad/embed/weight") == std::string::npos);
    }
  }
}

// Time-major tensors between batch-major data (rnnlm, nmt): ops label as
// their sample split their output's axis 0, which is time in [T, B, H];
// data parallelism follows the batch through the transposes instead, so
// no layer runs whole on one device, and a dropout part along the batch
// draws its runs of the whole's mask. (A reduction and a concatenation
// along other axes split along the batch too.)
TEST_CASE("data parallelism follows the batch through time-major layers and matches one device") {
  constexpr int64_t kTime = 5;
  Model m(DType::kF64);
  const Sym ids = m.input("input", {kBatch, kTime}, DType::kI64);
  const Sym x = m.dropout(m.embedding(m.transpose(ids, {1, 0}), 11, 6, -1, "embed"), 0.5, "drop");  // [T, B, 6]
  const Sym h = m.lstm(x, 8, {}, "lstm");                                                          // [T, B, 8]
  const Sym last = m.reshape(m.slice(h, 0, kTime - 1, kTime), {kBatch, 8});                        // [B, 8]
  const Sym y = m.transpose(h, {1, 0, 2});                                                         // [B, T, 8]
  const Sym attended = m.concat({y, m.softmax(y, 1)}, 2);                                          // [B, T, 16]
  const Sym logits = m.linear(m.reshape(attended, {kBatch * kTime, 16}), 4, {}, "fc");
  const Sym targets = m.reshape(m.input("target", {kBatch, kTime}, DType::kI64), {kBatch * kTime});
  const Sym peaks = m.op1("ReduceMax", {last}, AttrMap{{"axes", std::vector<int64_t>{1}}, {"keepdims", false}});  // [B]
  m.set_output("loss", m.add(m.cross_entropy(logits, targets), m.mean(peaks)));
  REQUIRE(m.status().ok());
  std::mt19937_64 rng(8);
  Tensor xs = Tensor::Zeros({kBatch, kTime}, DType::kI64), ys = Tensor::Zeros({kBatch, kTime}, DType::kI64);
  for (int64_t i = 0; i < xs.numel(); ++i) xs.data<int64_t>()[i] = static_cast<int64_t>(rng() % 11);
  for (int64_t i = 0; i < ys.numel(); ++i) ys.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = testing::MakeStepCase(m.graph(), std::nullopt, {{"input", xs}, {"target", ys}});
  REQUIRE(c.status().ToString() == "OK");
  const StepResults want = OneDevice(*c);
  for (const int64_t devices : {2, 4}) {
    const std::string s = StrCat("devices: ", devices, "\ndefault_split { sample: ", devices, " }\n");
    ExpectSame(*c, want, s);
    auto tg = Lower(*c, s);
    REQUIRE(tg.ok());
    std::map<std::string, std::set<int64_t>> devices_of;  // forward layers' devices
    for (const Task& t : tg->tasks)
      if (t.kind == TaskKind::kCompute) devices_of[tg->graph.node(t.node).name].insert(t.device);
    for (const Node& n : c->forward.nodes()) {
      // (Not the LSTM's zero states, nor the scalar loss terms.)
      if (IsSourceOp(n.op) || n.op == "Fill" || c->forward.type(n.outputs[0]).shape.rank() == 0) continue;
      INFO(s << n.name << " (" << n.op << ")");
      CHECK(devices_of[n.name].size() == static_cast<size_t>(devices));
    }
  }
}

// A MatMul split along its reduction: each part multiplies a run of K, the
// output a partial sum that an all-reduce combines.
// x [kBatch, 12] -> MatMul "mm" by [12, 4] (then "mm2" by [4, 4] with
// `second`) -> cross-entropy over 4 classes, in f64, fed from seed 7.
StepCase MatMulCase(bool second) {
  Model m(DType::kF64);
  const AttrMap init{{"init", "uniform"}, {"low", -0.5}, {"high", 0.5}};
  Sym y = m.op1("MatMul", {m.input("input", {kBatch, 12}), m.parameter("w", {12, 4}, init)}, {}, "mm");
  if (second) y = m.op1("MatMul", {y, m.parameter("w2", {4, 4}, init)}, {}, "mm2");
  m.set_output("loss", m.cross_entropy(y, m.input("target", {kBatch}, DType::kI64)));
  if (!m.status().ok()) FAIL(m.status().ToString());
  std::mt19937_64 rng(7);
  Tensor xs = Tensor::Zeros({kBatch, 12}, DType::kF64), t = Tensor::Zeros({kBatch}, DType::kI64);
  for (int64_t i = 0; i < xs.numel(); ++i) xs.data<double>()[i] = static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = testing::MakeStepCase(m.graph(), std::nullopt, {{"input", xs}, {"target", t}});
  if (!c.ok()) FAIL(c.status().ToString());
  return *c;
}

TEST_CASE("a matmul split along its reduction matches one device") {
  const StepCase c = MatMulCase(false);
  const StepResults want = OneDevice(c);
  for (const std::string& s : {std::string("devices: 3\nlayer { layer: \"mm\" parameter: 3 parameter_split: "
                                           "\"reduction\" }\n"),
                               std::string("devices: 4\ndefault_split { sample: 2 }\nlayer { layer: \"mm\" sample: 2 "
                                           "parameter: 2 parameter_split: \"reduction\" }\n")}) {
    ExpectSame(c, want, s);
    auto tg = Lower(c, s);
    REQUIRE(tg.ok());
    INFO(s << tg->ToString());
    const auto mm = tg->graph.FindNode("mm");
    REQUIRE(mm);
    int reduced = 0;
    for (const Task& task : tg->tasks)
      if (task.kind == TaskKind::kAllReduce &&
          tg->pieces[static_cast<size_t>(task.sources[0])].value == tg->graph.node(*mm).outputs[0])
        ++reduced;
    CHECK(reduced >= 1);
  }
}

// LSTM split along the batch (its weight gradients partial sums) and
// attention, causal or not, along the batch, the heads and the query
// sequence (each part reading every key; a causal part keeps its rows' key
// positions, and dk, dv are partial sums).
TEST_CASE("LSTM and attention split along the batch, the heads and the sequence match one device") {
  constexpr int64_t kSteps = 4;
  for (const bool causal : {true, false}) {
    INFO("causal " << causal);
    Model m(DType::kF64);
    const Sym x = m.input("input", {kSteps, kBatch, 6});  // time-major
    const Sym h = m.transpose(m.lstm(x, 8, {}, "lstm"), {1, 0, 2});
    AttentionOptions options;
    options.causal = causal;
    const Sym a = m.multi_head_attention(h, h, 2, options, {}, "attn");
    const Sym logits = m.linear(m.mean(a, {1}), 4, {}, "fc");
    m.set_output("loss", m.cross_entropy(logits, m.input("target", {kBatch}, DType::kI64)));
    REQUIRE(m.status().ok());
    const StepCase c = SequenceCase(m.graph(), kSteps, 6);
    const StepResults want = OneDevice(c);
    for (const std::string& s :
         {std::string("devices: 2\ndefault_split { sample: 2 }\n"),
          std::string("devices: 2\nlayer { layer: \"*sdpa*\" parameter: 2 }\n"),
          std::string("devices: 4\ndefault_split { sample: 2 }\n"
                      "layer { layer: \"*sdpa*\" sample: 2 parameter: 2 }\n"),
          std::string("devices: 2\nlayer { layer: \"*sdpa*\" attribute: 2 }\n"),
          std::string("devices: 4\nlayer { layer: \"*sdpa*\" attribute: 4 devices: 3 devices: 1 devices: 0 devices: 2 }\n"),
          std::string("devices: 4\ndefault_split { sample: 2 }\n"
                      "layer { layer: \"*sdpa*\" sample: 2 attribute: 2 }\n")}) {
      ExpectSame(c, want, s);
      auto tg = Lower(c, s);
      REQUIRE(tg.ok());
      std::map<std::string, std::set<int64_t>> devices;
      for (const Task& t : tg->tasks)
        if (t.kind == TaskKind::kCompute) devices[tg->graph.node(t.node).op].insert(t.device);
      INFO(s);
      CHECK(devices["ScaledDotProductAttention"].size() >= 2);
      CHECK(devices["ScaledDotProductAttentionBackward"].size() >= 2);
      if (s.find("default_split") != std::string::npos) {
        CHECK(devices["LSTM"].size() >= 2);
        CHECK(devices["LSTMBackward"].size() >= 2);
      }
    }
  }
}

// Two stacked LSTM layers "lstm/l0", "lstm/l1" (hidden 5) over a
// time-major input [steps, kBatch, 6], their mean over time classified into
// 4 classes; fused as `fusion` says.
StepCase StackedLstmCase(int64_t steps, const std::optional<FusionOptions>& fusion = std::nullopt) {
  Model m(DType::kF64);
  const Sym x = m.input("input", {steps, kBatch, 6});
  LstmOptions options;
  options.num_layers = 2;
  const Sym h = m.transpose(m.lstm(x, 5, options, "lstm"), {1, 0, 2});
  const Sym logits = m.linear(m.mean(h, {1}), 4, {}, "fc");
  m.set_output("loss", m.cross_entropy(logits, m.input("target", {kBatch}, DType::kI64)));
  if (!m.status().ok()) FAIL(m.status().ToString());
  return SequenceCase(m.graph(), steps, 9, fusion);
}

// Two stacked LSTMs split along the sequence: each layer's chunks chain on
// their devices (chunk j on part j's device, from chunk j - 1's state), the
// backward from the last chunk; a split along the sequence and the batch at
// once is refused by name.
TEST_CASE("stacked LSTMs split along the sequence match one device") {
  constexpr int64_t kSteps = 8;
  const StepCase c = StackedLstmCase(kSteps);
  const StepResults want = OneDevice(c);
  for (const std::string& s :
       {std::string("devices: 2\nlayer { layer: \"lstm/l?\" attribute: 2 }\n"),
        std::string("devices: 4\nlayer { layer: \"lstm/l?\" attribute: 4 devices: [3, 1, 0, 2] }\n"),
        std::string("devices: 2\ndefault_split { sample: 2 }\nlayer { layer: \"lstm/l0\" attribute: 2 }\n"),
        std::string("devices: 2\nlayer { layer: \"lstm/l1\" attribute: 2 }\n")}) {
    ExpectSame(c, want, s);
    auto tg = Lower(c, s);
    REQUIRE(tg.ok());
    INFO(s << tg->ToString());
    // A split layer's chunks run on the devices of its parts, none of them
    // the whole sequence.
    auto split = [&](const std::string& layer) {
      return s.find(layer) != std::string::npos || s.find("lstm/l?") != std::string::npos;
    };
    std::map<std::string, std::set<int64_t>> forward, backward;
    for (const Task& t : tg->tasks) {
      if (t.kind != TaskKind::kCompute) continue;
      const Node& n = tg->graph.node(t.node);
      const std::string layer = n.name.substr(0, 7);  // "lstm/l0"
      if (n.op != "LSTM" && n.op != "LSTMBackward") continue;
      (n.op == "LSTM" ? forward : backward)[layer].insert(t.device);
      if (split(layer)) CHECK(t.inputs[0].region.shape()[0] < kSteps);
    }
    for (const std::string layer : {"lstm/l0", "lstm/l1"}) {
      if (!split(layer)) continue;
      CHECK(forward[layer].size() >= 2);
      CHECK(backward[layer].size() >= 2);
    }
  }
  auto both = Lower(c, "devices: 4\nlayer { layer: \"lstm/l0\" sample: 2 attribute: 2 }\n");
  REQUIRE(!both.ok());
  CHECK_THAT(both.status().message(),
             Catch::Matchers::Contains("layer 'lstm/l0' (LSTM): sample 2 x attribute 2 on devices 0,1,2,3: its split "
                                       "along attribute chains its parts and combines with no other dimension"));
}

// The same stacked LSTMs fused as 3 replicas (one LSTM node a layer, every
// tensor [R, ...]): split along the sequence (axis 1 of x), the batch and
// the replicas (each part its own replica count), as on one device.
TEST_CASE("fused stacked LSTMs split along the sequence, the batch and the replicas match one device") {
  constexpr int64_t kSteps = 6;
  FusionOptions fusion;
  fusion.replicas = 3;
  fusion.seeds = {7, 8, 9};
  const StepCase c = StackedLstmCase(kSteps, fusion);
  REQUIRE(c.forward.NodesWithOp("LSTM").size() == 2);
  const StepResults want = OneDevice(c);
  for (const std::string& s :
       {std::string("devices: 2\nlayer { layer: \"lstm/l?\" attribute: 2 }\n"),
        std::string("devices: 3\nlayer { layer: \"lstm/l?\" attribute: 3 devices: [2, 0, 1] }\n"),
        std::string("devices: 2\ndefault_split { sample: 2 }\n"),
        std::string("devices: 3\ndefault_split { replica: 3 }\n"),
        std::string("devices: 4\nlayer { layer: \"lstm/l0\" sample: 2 }\nlayer { layer: \"lstm/l1\" attribute: 2 }\n")}) {
    ExpectSame(c, want, s);
    auto tg = Lower(c, s);
    REQUIRE(tg.ok());
    INFO(s << tg->ToString());
    std::map<std::string, std::set<int64_t>> devices;
    for (const Task& t : tg->tasks) {
      if (t.kind != TaskKind::kCompute) continue;
      const Node& n = tg->graph.node(t.node);
      if (n.op != "LSTM" && n.op != "LSTMBackward") continue;
      devices[n.name.substr(0, 7) + " " + n.op].insert(t.device);
      if (s.find("attribute") != std::string::npos && s.find("lstm/l?") != std::string::npos)
        CHECK(t.inputs[0].region.shape()[1] < kSteps);  // x [R, T, N, I]: a chunk of the steps
    }
    for (const auto& [layer, on] : devices) {
      INFO(layer);
      CHECK(on.size() >= 2);
    }
  }
}

// Random per-layer splits (tests/parallel_check.h) over 4 devices.
TEST_CASE("the state set after steps is the state the next step reads; results a caller holds stay as they were") {
  // Homes take the new values' tensors after each step (no copy), so a
  // SetState must not write into one that another home or a result shares.
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const StepResults want = OneDevice(c);  // kSteps steps
  for (const std::string& strategy :
       {std::string("devices: 2\ndefault_split { sample: 2 }\n"), std::string("devices: 2\ndefault_split { parameter: 2 }\n")}) {
    INFO(strategy);
    auto tasks = Lower(c, strategy);
    REQUIRE(tasks.ok());
    auto runtime = TaskRuntime::Create(std::move(*tasks));
    REQUIRE(runtime.ok());
    REQUIRE((*runtime)->InitializeState(kSeed + 1).ok());  // another state, replaced below
    std::vector<std::map<std::string, Tensor>> held;         // what the caller keeps of each step
    std::vector<std::map<std::string, std::vector<double>>> at_the_time;
    for (int step = 0; step < kSteps; ++step) {
      if (step == 0) {
        // The one-device run's initial state, set into homes the runtime
        // has already replaced once (after a step from the other state).
        REQUIRE((*runtime)->Run(c.feeds).ok());
        auto fresh = Executor::Create(c.step);
        REQUIRE(fresh.ok());
        REQUIRE((*fresh)->InitializeState(kSeed).ok());
        for (const std::string& name : (*fresh)->StateNames()) {
          auto value = (*fresh)->GetState(name);
          REQUIRE(value.ok());
          REQUIRE((*runtime)->SetState(name, *value).ok());
        }
      }
      auto out = (*runtime)->Run(c.feeds);
      REQUIRE(out.ok());
      std::map<std::string, std::vector<double>> values;
      for (const auto& [name, t] : *out) values[name] = t.ToDoubleVector();
      held.push_back(*out);
      at_the_time.push_back(values);
    }
    for (int step = 0; step < kSteps; ++step)
      for (const auto& [name, t] : held[static_cast<size_t>(step)]) {
        INFO("step " << step << " output " << name);
        CHECK(t.ToDoubleVector() == at_the_time[static_cast<size_t>(step)][name]);  // unchanged since
      }
    StepResults got{held, {}};
    for (const std::string& name : (*runtime)->StateNames()) got.state[name] = *(*runtime)->GetState(name);
    CHECK(FirstMismatch(want, got, 1e-9) == "");
  }
}

TEST_CASE("random valid strategies match one device") {
  const StepCase mlp = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const StepCase cnn = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  const StepCase fused = testing::ClassifierCase("mlp", {{"hidden", "16"}}, {64}, 4);
  std::mt19937_64 rng(11);
  for (const StepCase* c : {&mlp, &cnn, &fused}) {
    const StepResults want = OneDevice(*c);
    int found = 0;
    for (int attempt = 0; found < 10 && attempt < 200; ++attempt) {
      const std::string text = testing::RandomStrategy(c->forward, 4, rng);
      if (!Lower(*c, text).ok()) continue;  // a split some layer's shapes cannot take
      ++found;
      ExpectSame(*c, want, text);
    }
    CHECK(found == 10);
  }
}

// Each device in a process of its own (threads joined by local
// communicators, as MPI ranks are by the MPI communicator): every rank
// gets the in-process runtime's outputs and state, bit for bit.
TEST_CASE("devices as processes match the in-process runtime bit for bit") {
  const StepCase cnn = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8});
  const StepCase fused = testing::ClassifierCase("mlp", {{"hidden", "16"}}, {64}, 4);
  std::mt19937_64 rng(5);
  const std::vector<std::pair<const StepCase*, std::string>> cases = {
      {&cnn, "devices: 2\ndefault_split { sample: 2 }\n"},
      {&cnn, "devices: 3\ndefault_split { sample: 2 devices: 1 devices: 2 }\n"},
      {&cnn, "devices: 2\nlayer { layer: \"*conv\" attribute: 2 }\n"},
      {&cnn, "devices: 2\nlayer { layer: \"stage1/*\" devices: 1 }\n"},
      {&cnn, "devices: 4\ndefault_split { sample: 2 parameter: 2 }\n"},
      {&cnn, "devices: 2\ndefault_split { sample: 2 }\nlayer { layer: \"fc\" parameter: 2 }\n"},  // sums parts
      {&fused, "devices: 2\ndefault_split { replica: 2 }\n"},
      {&fused, testing::RandomStrategy(fused.forward, 3, rng)},
  };
  for (const auto& [c, text] : cases) {
    INFO(text);
    if (!Lower(*c, text).ok()) continue;  // a random split the shapes cannot take
    auto in_process = testing::RunOnDevices(*c, text, kSteps, kSeed);
    REQUIRE(in_process.status().ToString() == "OK");
    auto ranks = testing::RunAsProcesses(*c, text, kSteps, kSeed);
    REQUIRE(ranks.status().ToString() == "OK");
    for (size_t r = 0; r < ranks->size(); ++r) {
      INFO("rank " << r);
      CHECK(FirstMismatch(*in_process, (*ranks)[r], 0.0) == "");
    }
  }
}

// Several devices per process: 4 devices over 2 ranks (devices 0, 1 on rank
// 0), 6 over 3; exchanges inside a rank are copies, across ranks messages.
TEST_CASE("several devices per process match the in-process runtime bit for bit") {
  const StepCase cnn = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}, {"dropout", "0.5"}}, {1, 8, 8});
  const StepCase fused = testing::ClassifierCase("mlp", {{"hidden", "16"}}, {64}, 4);
  std::mt19937_64 rng(8);
  const std::vector<std::tuple<const StepCase*, std::string, int>> cases = {
      {&cnn, "devices: 4\ndefault_split { sample: 4 }\n", 2},
      {&cnn, "devices: 4\ndefault_split { sample: 2 parameter: 2 }\n", 2},
      {&cnn, "devices: 4\nlayer { layer: \"stage1/*\" devices: 3 }\nlayer { layer: \"*fc*\" devices: 1 }\n", 2},
      {&cnn, "devices: 6\ndefault_split { sample: 2 devices: 1 devices: 4 }\nlayer { layer: \"*conv\" sample: 2 "
             "attribute: 2 devices: 0 devices: 2 devices: 3 devices: 5 }\n", 3},
      {&fused, "devices: 4\ndefault_split { sample: 2 replica: 2 }\n", 2},
      {&fused, testing::RandomStrategy(fused.forward, 4, rng), 2},
      {&cnn, testing::RandomStrategy(cnn.forward, 4, rng), 2},
  };
  int ran = 0;
  for (const auto& [c, text, ranks] : cases) {
    INFO(text << "over " << ranks << " ranks");
    if (!Lower(*c, text).ok()) continue;  // a random split the shapes cannot take
    ++ran;
    auto in_process = testing::RunOnDevices(*c, text, kSteps, kSeed);
    REQUIRE(in_process.status().ToString() == "OK");
    auto results = testing::RunAsProcesses(*c, text, kSteps, kSeed, ranks);
    REQUIRE(results.status().ToString() == "OK");
    REQUIRE(results->size() == static_cast<size_t>(ranks));
    for (size_t r = 0; r < results->size(); ++r) {
      INFO("rank " << r);
      CHECK(FirstMismatch(*in_process, (*results)[r], 0.0) == "");
    }
  }
  CHECK(ran >= 5);
}

TEST_CASE("a rank that fails makes the others fail instead of waiting") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const std::string text = "devices: 2\ndefault_split { sample: 2 }\n";
  std::vector<std::unique_ptr<Communicator>> comms = MakeLocalCommunicators(2);
  std::vector<Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto tasks = Lower(c, text);
      TaskRuntimeOptions o;
      o.communicator = comms[static_cast<size_t>(r)].get();
      auto runtime = TaskRuntime::Create(std::move(*tasks), o);
      if (!runtime.ok()) {
        status[static_cast<size_t>(r)] = runtime.status();
        return;
      }
      std::map<std::string, Tensor> feeds = c.feeds;
      if (r == 1) feeds.erase("input");  // rank 1 fails before its first task
      status[static_cast<size_t>(r)] = (*runtime)->Run(feeds).status();
      if (r == 1) comms[1]->Abort(status[1]);  // as the training loop's failure path does
    });
  for (std::thread& t : threads) t.join();
  CHECK_THAT(status[1].message(), Catch::Contains("input 'input' was not fed"));
  REQUIRE_FALSE(status[0].ok());
  CHECK_THAT(status[0].ToString(), Catch::Contains("rank 1"));
}

TEST_CASE("processes need the same number of devices each") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  std::vector<std::unique_ptr<Communicator>> comms = MakeLocalCommunicators(3);
  auto tasks = Lower(c, "devices: 2\ndefault_split { sample: 2 }\n");
  REQUIRE(tasks.ok());
  TaskRuntimeOptions o;
  o.communicator = comms[0].get();
  auto runtime = TaskRuntime::Create(std::move(*tasks), o);
  REQUIRE_FALSE(runtime.ok());
  CHECK_THAT(runtime.status().message(), Catch::Contains("2 devices, not a multiple of the communicator's 3 ranks"));
}

TEST_CASE("the devices a task graph runs on: as many as it has, of one kind") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const std::string dp = "devices: 2\ndefault_split { sample: 2 }\n";
  const auto refused = [&](const TaskRuntimeOptions& o) {
    auto tasks = Lower(c, dp);
    REQUIRE(tasks.ok());
    auto runtime = TaskRuntime::Create(std::move(*tasks), o);
    REQUIRE_FALSE(runtime.ok());
    return runtime.status().message();
  };
  TaskRuntimeOptions three;
  three.devices.assign(3, Device::Cpu());
  CHECK_THAT(refused(three), Catch::Contains("the task graph has 2 devices, but 3 were given"));
  TaskRuntimeOptions mixed;
  mixed.devices = {Device::Cpu(), Device::Cuda(0)};
  CHECK_THAT(refused(mixed), Catch::Contains("devices of one kind, got cpu:0 and cuda:0"));
  // A device list of CPUs is the default.
  TaskRuntimeOptions cpus;
  cpus.devices.assign(2, Device::Cpu());
  auto got = testing::RunOnDevices(c, dp, kSteps, kSeed, {}, cpus);
  REQUIRE(got.ok());
  CHECK(testing::FirstMismatch(OneDevice(c), *got, 1e-9) == "");
}

// Collectives instead of transfers (LoweringOptions): no more bytes move,
// and the results are the transfers' bit for bit, in one process and over
// ranks (an all-gather copies; a reduce-scatter or an all-reduce of a part
// adds the partial sums in the order the one-device sums do).
TEST_CASE("all-gathers and reduce-scatters give the transfers' results bit for bit, in one process and over ranks") {
  const StepCase mlp = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const StepCase cnn = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  const LoweringOptions collectives{.collective_min_group = 3};
  std::mt19937_64 rng(17);
  const std::vector<std::pair<const StepCase*, std::string>> cases = {
      {&mlp, "devices: 4\ndefault_split { parameter: 4 }\n"},
      {&mlp, "devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"*fc*\" parameter: 4 }\n"},  // OWT
      {&cnn, "devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"*fc*\" parameter: 4 }\n"},
      {&cnn, "devices: 4\ndefault_split { sample: 2 parameter: 2 }\n"},
      // Each half of the convolution's weight gradient, read by 4 devices: an all-reduce of the half.
      {&cnn, "devices: 8\ndefault_split { sample: 8 }\nlayer { layer: \"stage1/conv\" sample: 4 parameter: 2 }\n"},
      {&mlp, testing::RandomStrategy(mlp.forward, 4, rng)},
      {&cnn, testing::RandomStrategy(cnn.forward, 4, rng)},
  };
  std::map<TaskKind, int> made;
  for (const auto& [c, text] : cases) {
    INFO(text);
    auto plain = Lower(*c, text);
    if (!plain.ok()) continue;  // a random split the shapes cannot take
    auto gathered = testing::LowerStrategy(*c, text, collectives);
    REQUIRE(gathered.status().ToString() == "OK");
    for (const Task& t : gathered->tasks) ++made[t.kind];
    CHECK(gathered->tasks.size() <= plain->tasks.size());
    // As many bytes (an all-gather, a reduce-scatter), or fewer (an all-reduce of a part: a share each).
    CHECK(gathered->TransferBytes() <= plain->TransferBytes() * (1 + 1e-12));
    auto want = testing::RunOnDevices(*c, text, kSteps, kSeed);
    auto got = testing::RunOnDevices(*c, text, kSteps, kSeed, collectives);
    REQUIRE(want.status().ToString() == "OK");
    REQUIRE(got.status().ToString() == "OK");
    CHECK(FirstMismatch(*want, *got, 0.0) == "");
    for (int ranks : {static_cast<int>(plain->devices), 2}) {
      auto results = testing::RunAsProcesses(*c, text, kSteps, kSeed, ranks, collectives);
      REQUIRE(results.status().ToString() == "OK");
      for (size_t r = 0; r < results->size(); ++r) {
        INFO(ranks << " ranks, rank " << r);
        CHECK(FirstMismatch(*want, (*results)[r], 0.0) == "");
      }
    }
  }
  CHECK(made[TaskKind::kAllGather] > 0);
  CHECK(made[TaskKind::kReduceScatter] > 0);
  CHECK(made[TaskKind::kAllToAll] > 0);
}

TEST_CASE("OWT on 4 devices moves every value by collectives: gathers, scatters and all-to-alls, no transfers") {
  const StepCase mlp = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  const std::string text = "devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"*fc*\" parameter: 4 }\n";
  auto plain = Lower(mlp, text);
  auto gathered = testing::LowerStrategy(mlp, text, LoweringOptions{.collective_min_group = 3});
  REQUIRE(plain.status().ToString() == "OK");
  REQUIRE(gathered.status().ToString() == "OK");
  std::map<TaskKind, int> before, after;
  for (const Task& t : plain->tasks) ++before[t.kind];
  for (const Task& t : gathered->tasks) ++after[t.kind];
  // fc1 and fc2 read the whole of their inputs, which the data-parallel
  // layers before them hold by rows: an all-gather each. Each ReLU reads
  // its rows of the Linear's columns, and each Linear's backward its
  // columns of the ReLU gradient's rows: an all-to-all each. fc2's input
  // gradient, partial sums each part of the ReLU before it reads a
  // quarter of: a reduce-scatter (fc1's input, the data, needs none).
  // Each replaces 4 x 3 transfers; the reduce-scatter 4 sums too.
  CHECK(after[TaskKind::kAllGather] == 2);
  CHECK(after[TaskKind::kAllToAll] == 4);
  CHECK(after[TaskKind::kReduceScatter] == 1);
  CHECK(before[TaskKind::kTransfer] == 7 * 12);
  CHECK(after[TaskKind::kTransfer] == 0);
  CHECK(before[TaskKind::kAllReduce] - after[TaskKind::kAllReduce] == 4);
  // Groups smaller than the option's minimum move by transfers.
  auto five = testing::LowerStrategy(mlp, text, LoweringOptions{.collective_min_group = 5});
  REQUIRE(five.ok());
  CHECK(five->tasks.size() == plain->tasks.size());
}

// A matmul split along its reduction writes partial sums of all of its
// output; the next one, split sample x parameter, reads each half of the
// rows on two devices. The first reader of a half sums it; the other
// copies that sum (before, every reader summed every partial sum again).
// (Convolutions split sample x parameter used to make this case of their
// weight gradients; their backward ops now split the parameter as the
// forward does.)
TEST_CASE("devices that read the same part of a partial sum copy its sum instead of summing it again") {
  const StepCase c = MatMulCase(true);
  const std::string text = "devices: 4\nlayer { layer: \"mm\" parameter: 2 parameter_split: \"reduction\" }\n"
                           "layer { layer: \"mm2\" sample: 2 parameter: 2 }\n";
  auto tasks = Lower(c, text);
  REQUIRE(tasks.status().ToString() == "OK");
  INFO(tasks->ToString());
  int transfers = 0;
  std::multiset<int64_t> sums;  // by the first row of the half summed
  for (const Task& task : tasks->tasks) {
    if (task.name.rfind("mm ", 0) != 0 && task.name.rfind("mm:", 0) != 0) continue;
    if (task.kind == TaskKind::kTransfer) ++transfers;
    if (task.kind == TaskKind::kAllReduce)
      sums.insert(tasks->pieces[static_cast<size_t>(task.outputs[0])].region.lo[0]);
  }
  CHECK(sums == std::multiset<int64_t>{0, kBatch / 2});  // one sum per half
  // Half 0: device 1's partial sum to device 0, the sum to device 1; half 1:
  // both partial sums to device 2, the sum to device 3.
  CHECK(transfers == 2 + 3);
  ExpectSame(c, OneDevice(c), text);
}

// A small MLP's step lowered data parallel on 2 devices.
StepCase DataParallelMlp(TaskGraph* tg) {
  StepCase c = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  auto lowered = Lower(c, "devices: 2\ndefault_split { sample: 2 }\n");
  REQUIRE(lowered.ok());
  *tg = std::move(*lowered);
  return c;
}

// The parameters' gradients of a step.
std::set<ValueId> GradientsOf(const StepCase& c) {
  std::set<ValueId> gradients;
  for (const auto& [param, grad] : c.step.gradients()) gradients.insert(grad);
  return gradients;
}

TEST_CASE("data parallel all-reduces each parameter's gradient once, and else only the loss's sum and count") {
  TaskGraph tg;
  const StepCase c = DataParallelMlp(&tg);
  INFO(tg.ToString());
  std::multiset<ValueId> reduced;
  for (const Task& t : tg.tasks)
    if (t.kind == TaskKind::kAllReduce) reduced.insert(tg.pieces[static_cast<size_t>(t.sources[0])].value);
  const std::set<ValueId> gradients = GradientsOf(c);
  std::multiset<std::string> others;  // the ops that wrote what else is reduced
  for (ValueId v : reduced) {
    if (gradients.count(v)) continue;
    const Node& n = tg.graph.node(tg.graph.value(v).producer);
    others.insert(n.op + " " + n.attrs.Str("reduction", "-"));
  }
  for (ValueId g : gradients) CHECK(reduced.count(g) == 1);
  // The mean loss's expansion: its sum, and its count in the forward and
  // the backward pass.
  CHECK(others == std::multiset<std::string>{"CrossEntropy sum", "CountTargets -", "CountTargets -"});
}

// A gradient's all-reduce comes in the task order soon after the backward
// pass makes the gradient (two backward steps later), so each device's
// queue and each link reach it while the earlier layers are still being
// differentiated, as DDP overlaps them; before, every all-reduce came with
// its update after the whole backward pass, the first layer's first.
TEST_CASE("data parallel all-reduces each gradient as the backward pass makes it, not after the pass") {
  TaskGraph tg;
  const StepCase c = DataParallelMlp(&tg);
  INFO(tg.ToString());
  const std::set<ValueId> gradients = GradientsOf(c);
  std::vector<std::pair<int, int>> reduces;  // (the all-reduce, the task that wrote its first partial sum)
  for (const Task& t : tg.tasks) {
    if (t.kind != TaskKind::kAllReduce) continue;
    const Piece& source = tg.pieces[static_cast<size_t>(t.sources[0])];
    if (gradients.count(source.value)) reduces.emplace_back(t.id, source.producer);
  }
  REQUIRE(reduces.size() == gradients.size());
  // In the order the gradients are made, the last layer's first.
  for (size_t i = 1; i < reduces.size(); ++i) CHECK(reduces[i - 1].second < reduces[i].second);
  // The last layer's gradients are summed before the first layer's are made.
  CHECK(reduces.front().first < reduces.back().second);
}

// OWT: the ReLU after fc2 runs data parallel, so fc2's gradient arrives
// split along the batch; its backward must still read fc2's weight as
// fc2's parameter split holds it (the reduction split, an all-reduce of the
// input's gradient) rather than the whole weight on every device, which
// would be written back to every device after every step. The same with
// fc2 split 2 x 2 among layers split 4 ways along the batch: its weight
// gradient is summed over the batch (nested in the 4-way split) rather
// than cut into quarters that move to where the halves are read.
TEST_CASE("a parameter-split layer's weight stays split: no copies of it move") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "32,32"}}, {64});
  for (const auto& [strategy, half] : std::vector<std::pair<std::string, int64_t>>{
           {"devices: 2\ndefault_split { sample: 2 }\nlayer { layer: \"fc2\" parameter: 2 }\n", 32 * 32 / 2},
           {"devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"fc2\" sample: 2 parameter: 2 }\n", 32 * 32 / 2}}) {
    auto tg = Lower(c, strategy);
    REQUIRE(tg.ok());
    INFO(strategy << tg->ToString());
    for (const Task& t : tg->tasks) {
      if (t.kind != TaskKind::kTransfer) continue;
      const std::string& value = tg->graph.value(tg->pieces[static_cast<size_t>(t.sources[0])].value).name;
      CHECK(value.rfind("fc2/weight", 0) != 0);
    }
    const auto weight = tg->graph.FindNode("fc2/weight");
    REQUIRE(weight);
    for (int h : tg->homes.at(tg->graph.node(*weight).outputs[0]))
      CHECK(tg->pieces[static_cast<size_t>(h)].region.numel() == half);
    auto one = testing::RunOneDevice(c, 2, 5);
    auto split = testing::RunOnDevices(c, strategy, 2, 5);
    REQUIRE(one.ok());
    REQUIRE(split.ok());
    CHECK(testing::FirstMismatch(*one, *split, 1e-12) == "");
  }
}

// fc1 -> ReLU -> fc2 -> ReLU -> flatten -> fc3 -> cross entropy, fc1 and
// fc2 on sequences [kBatch, 3, 6] (their backward starts with a Reshape of
// the incoming gradient to rows).
StepCase SequenceLinearCase() {
  Model m(DType::kF64);
  const Sym x = m.input("input", {kBatch, 3, 6});
  const Sym h = m.relu(m.linear(m.relu(m.linear(x, 8, {}, "fc1")), 8, {}, "fc2"));
  const Sym logits = m.linear(m.flatten(h), 4, {}, "fc3");
  m.set_output("loss", m.cross_entropy(logits, m.input("target", {kBatch}, DType::kI64)));
  if (!m.status().ok()) FAIL(m.status().ToString());
  std::mt19937_64 rng(3);
  Tensor xs = Tensor::Zeros({kBatch, 3, 6}, DType::kF64), y = Tensor::Zeros({kBatch}, DType::kI64);
  for (int64_t i = 0; i < xs.numel(); ++i) xs.data<double>()[i] = static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
  for (int64_t i = 0; i < kBatch; ++i) y.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
  auto c = testing::MakeStepCase(m.graph(), std::nullopt, {{"input", xs}, {"target", y}});
  if (!c.ok()) FAIL(c.status().ToString());
  return *c;
}

// fc2 split sample x parameter among layers split 4 ways along the batch:
// the gradient arrives split by rows only, and the backward's first
// Reshape took the first rule that matched nothing, the batch, so the
// parameter dimension ran as a second batch split (every part reading the
// whole weight and making a partial sum of the whole weight gradient).
// The backward reads the gradient as the forward wrote the output instead.
TEST_CASE("a sequence Linear split sample x parameter keeps its backward split by the output features") {
  const StepCase c = SequenceLinearCase();
  const std::string strategy = "devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"fc2\" sample: 2 parameter: 2 }\n";
  auto tg = Lower(c, strategy);
  REQUIRE(tg.ok());
  INFO(tg->ToString());
  const auto weight = tg->graph.FindNode("fc2/weight");
  REQUIRE(weight);
  const ValueId w = tg->graph.node(*weight).outputs[0];
  for (const Task& t : tg->tasks) {
    if (t.kind == TaskKind::kCompute) {
      // Each part of the weight gradient's MatMul makes its own half of the rows.
      if (t.outputs.size() == 1 && tg->pieces[static_cast<size_t>(t.outputs[0])].value == tg->graph.gradients().at(w))
        CHECK(tg->pieces[static_cast<size_t>(t.outputs[0])].region.numel() * 2 == tg->graph.type(w).shape.numel());
      continue;
    }
    CHECK(tg->pieces[static_cast<size_t>(t.sources[0])].value != w);
  }
  ExpectSame(c, OneDevice(c), strategy);
}

// fc2 split by its output features among layers split 4 ways along the
// batch: its weight gradient reads the input whole, as the forward did,
// from the copies the forward gathered (its Reshape ran split along the
// batch, as the input arrived, and every part gathered the reshaped
// input again), and the input gradient's partial sums are summed where
// the parts of its Reshape read them, by rows (they were all-reduced
// whole on every device, every part then reshaping all of it).
TEST_CASE("a parameter-split sequence Linear reads its input once and sums its input gradient by rows") {
  const StepCase c = SequenceLinearCase();
  const std::string strategy = "devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"fc2\" parameter: 4 }\n";
  auto tg = Lower(c, strategy);
  REQUIRE(tg.ok());
  INFO(tg->ToString());
  int sums = 0;
  for (const Task& t : tg->tasks) {
    if (t.kind == TaskKind::kCompute) continue;
    const Piece& source = tg->pieces[static_cast<size_t>(t.sources[0])];
    const Node& producer = tg->graph.node(tg->graph.value(source.value).producer);
    CHECK(!(producer.op == "Reshape" && producer.name.rfind("fc2/grad/", 0) == 0));
    if (t.kind == TaskKind::kAllReduce && producer.name.rfind("fc2/grad/MatMul", 0) == 0 && source.partial) {
      ++sums;  // a quarter of the input gradient, summed where a part reads it
      CHECK(tg->pieces[static_cast<size_t>(t.outputs[0])].region.numel() * 4 ==
            tg->graph.type(source.value).shape.numel());
    }
  }
  CHECK(sums > 0);
  ExpectSame(c, OneDevice(c), strategy);
}

// The same for convolutions: their backward ops split the output channels
// as the forward does (a part's weight gradient is its own rows, its input
// gradient a partial sum, or with groups its own run of groups), so the
// weight neither moves to every device after the update nor comes back
// from them as partial sums of the whole. They only split the batch before.
TEST_CASE("a parameter-split convolution's weight stays split: no copies of it move") {
  const auto check = [](const StepCase& c, const std::string& strategy, const std::string& weight_name) {
    INFO(strategy);
    auto tg = Lower(c, strategy);
    REQUIRE(tg.ok());
    INFO(tg->ToString());
    const auto weight = tg->graph.FindNode(weight_name);
    REQUIRE(weight);
    const ValueId w = tg->graph.node(*weight).outputs[0];
    const int64_t half = tg->graph.type(w).shape.numel() / 2;
    for (const Task& t : tg->tasks) {
      for (int p : t.sources) {
        const Piece& piece = tg->pieces[static_cast<size_t>(p)];
        const std::string& value = tg->graph.value(piece.value).name;
        // Neither the weight nor its update's result moves; its gradient
        // is summed over its own rows only (an all-reduce of a half).
        if (t.kind == TaskKind::kTransfer) CHECK(value.rfind(weight_name, 0) != 0);
        if (tg->graph.type(piece.value).shape == tg->graph.type(w).shape && value.find("/grad/") != std::string::npos)
          CHECK(piece.region.numel() == half);
      }
    }
    for (int h : tg->homes.at(w)) CHECK(tg->pieces[static_cast<size_t>(h)].region.numel() == half);
    ExpectSame(c, OneDevice(c), strategy);
  };
  const StepCase cnn = testing::ClassifierCase("cnn", {{"channels", "4,6"}, {"hidden", "8"}}, {1, 8, 8});
  check(cnn, "devices: 2\ndefault_split { sample: 2 }\nlayer { layer: \"stage2/conv\" parameter: 2 }\n",
        "stage2/conv/weight");
  check(cnn, "devices: 4\ndefault_split { sample: 4 }\nlayer { layer: \"stage2/conv\" sample: 2 parameter: 2 }\n",
        "stage2/conv/weight");
}

// One weird trick on the MLP: fc2 split along its outputs between
// batch-split layers. Its input gradient is a partial sum per part, and each
// device reads only its half of the batch: each half is summed where it is
// read (the other device's half of it transferred), as in a reduce-scatter,
// rather than all-reduced whole to both.
TEST_CASE("a partial sum each device reads a part of is summed where it is read, not all-reduced") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "32,32"}}, {64});
  const std::string strategy = "devices: 2\ndefault_split { sample: 2 }\nlayer { layer: \"fc2\" parameter: 2 }\n";
  auto tg = Lower(c, strategy);
  REQUIRE(tg.ok());
  INFO(tg->ToString());
  const auto piece = [&](int p) -> const Piece& { return tg->pieces[static_cast<size_t>(p)]; };
  std::set<int64_t> summed_on;
  for (const Task& t : tg->tasks) {
    if (t.kind != TaskKind::kAllReduce) continue;
    const std::string& value = tg->graph.value(piece(t.sources[0]).value).name;
    if (value.find("fc2/grad") == std::string::npos) continue;
    const Shape& shape = tg->graph.type(piece(t.sources[0]).value).shape;
    if (shape != Shape({kBatch, 32})) continue;  // fc2's input gradient [batch, 32], not its weight's
    CHECK(t.group.size() == 1);  // not all-reduced whole
    summed_on.insert(t.device);
    CHECK(piece(t.outputs[0]).region.numel() == shape.numel() / 2);
    CHECK(t.sources.size() == 2);
  }
  CHECK(summed_on == std::set<int64_t>{0, 1});
  const StepResults want = OneDevice(c);
  ExpectSame(c, want, strategy);
}

TEST_CASE("the task graph prints bytes exactly") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "4096"}}, {64});
  auto tg = Lower(c, "devices: 2\ndefault_split { sample: 2 }\n");
  REQUIRE(tg.ok());
  // fc1's weight gradient, [64, 4096] f64, all-reduced (was "2.09715e+06").
  CHECK_THAT(tg->ToJson(), Catch::Contains("\"bytes\": 2097152,"));
  CHECK_THAT(tg->ToString(), Catch::Contains("bytes 2097152\n"));
}

// An expanded node leaves the graph: its name is free for the expansions
// after it, as BatchNorm "bn/pivot"'s (expanded first) is for bn's pivot.
TEST_CASE("an expansion takes the name of a node expanded before it") {
  Graph g;
  GraphBuilder b(&g);
  ValueId x = b.Input("input", {Shape{kBatch, 4}, DType::kF64});
  for (const std::string name : {"bn/pivot", "bn"}) {
    std::vector<ValueId> inputs = {x};
    for (const char* state : {"weight", "bias", "running_mean", "running_var"})
      inputs.push_back(b.Parameter(name + "/" + state, {Shape{4}, DType::kF64}, {{"init", "ones"}}));
    auto y = b.Add("BatchNorm", inputs, {{"training", true}}, name);
    REQUIRE(y.ok());
    x = y->at(0);
  }
  g.outputs()["y"] = x;
  LayerSplit halves;
  halves.degree = {2, 1, 1, 1};
  halves.devices = {0, 1};
  auto tg = BuildTaskGraph(g, {{"bn/pivot", halves}, {"bn", halves}}, 2);
  REQUIRE(tg.ok());
  INFO(tg->graph.ToString());
  CHECK(tg->graph.NodesWithOp("BatchNorm").empty());
  for (const auto& [name, op] : {std::pair<std::string, std::string>{"bn/pivot/pivot", "BatchNormPivot"},
                                 {"bn/pivot", "BatchNormPivot"}, {"bn/apply", "BatchNormApply"}}) {
    INFO(name);
    REQUIRE(tg->graph.FindNode(name));
    CHECK(tg->graph.node(*tg->graph.FindNode(name)).op == op);
  }
}

TEST_CASE("a split no rule realises is an error naming the layer") {
  const StepCase c = testing::ClassifierCase("mlp", {{"hidden", "16,8"}}, {64});
  auto tg = Lower(c, "devices: 2\nlayer { layer: \"fc1\" replica: 2 }\n");
  REQUIRE(!tg.ok());
  CHECK_THAT(tg.status().message(), Catch::Contains("strategy.pbtxt:2: layer 'fc1' (Linear): replica 2"));
}

}  // namespace
}  // namespace loom
