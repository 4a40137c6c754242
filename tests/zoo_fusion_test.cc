// Every zoo model, at a reduced size: one training step lowers the loss on a
// fixed batch, and the fused graph of 2 replicas (graph/fusion.h) computes
// the logits of 2 separate models started from the replicas' seeds (f64,
// 1e-9 relative: only the summation order inside products differs) and has
// the structure of the fused forms (tests/fusion_structure.h).
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "core/rng.h"
#include "graph/compile.h"
#include "graph/fusion.h"
#include "graph/training.h"
#include "graph/verifier.h"
#include "models/model_test_util.h"
#include "models/zoo.h"
#include "runtime/executor.h"
#include "tests/fusion_structure.h"
#include "tests/small_zoo.h"

namespace loom {
namespace {

using testing::Batched;
using testing::Features;
using testing::ZooBatch;
using testing::IsGan;
using testing::kClasses;
using testing::SmallModel;
using testing::SmallModels;
constexpr int64_t kBatch = testing::kZooBatch;

TEST_CASE("the zoo covers every model of this test") {
  for (const SmallModel& s : SmallModels()) CHECK(models::FindModel(s.name).ok());
  CHECK(models::Zoo().size() == SmallModels().size());  // a new zoo model needs a row here
}

TEST_CASE("one training step lowers each zoo model's loss on a fixed batch") {
  for (const SmallModel& s : SmallModels()) {
    if (IsGan(s)) continue;
    INFO(s.name);
    // Inception at this size has a steep loss (|gradient|^2 = 7.3e4 here):
    // its loss falls linearly with the step up to lr ~1e-6 (7.3e-3 at
    // 1e-7), and past ~1e-5 the step leaves that region; at the zoo's
    // 0.01 the loss after it rose or fell with rounding alone (2.152 ->
    // 2.081, 2.128 or 2.162 by the BatchNorm kernels' FMA contraction).
    const double lr = s.name == "inception_v3" ? 1e-7 : s.step_lr;
    Model m;
    {
      const Status built = models::BuildSupervised(m, s.name, s.args, s.data, kBatch);
      INFO(built.ToString());
      REQUIRE(built.ok());
    }
    auto change = models::testing::LossAcrossOneStep(m.graph(), ZooBatch(s.data, DType::kF32), lr);
    if (!change.ok()) FAIL(change.status().ToString());
    INFO("loss " << change->before << " -> " << change->after);
    CHECK(std::isfinite(change->before));
    CHECK(change->after < change->before);
  }
}

TEST_CASE("each zoo model fused as 2 replicas computes 2 separate models' logits") {
  const std::vector<uint64_t> seeds = {7, 8};
  for (const SmallModel& s : SmallModels()) {
    if (IsGan(s)) continue;
    INFO(s.name);
    Model m(DType::kF64);
    {
      const Status built = models::BuildSupervised(m, s.name, s.args, s.data, kBatch);
      INFO(built.ToString());
      REQUIRE(built.ok());
    }
    // Each replica's gamma and beta are a row that LayerNorm reads, not a
    // Mul and an Add pass each (transformer_lm's fused step ran 0.96x of
    // serial so).
    auto fused = FuseReplicas(m.graph(), FusionOptions{2, seeds, {}, {}});
    if (!fused.ok()) FAIL(fused.status().ToString());
    for (const Node& n : m.graph().nodes()) {
      if (n.op != "LayerNorm") continue;
      INFO("LayerNorm '" << n.name << "'");
      const std::map<std::string, int> ops = testing::OpsEmittedFor(*fused, m.graph(), n.name);
      CHECK(ops.count("Mul") == 0);
      CHECK(ops.count("Add") == 0);
    }
    const auto feeds = ZooBatch(s.data, DType::kF64);
    auto run = models::testing::RunFusedAndSeparate(m.graph(), seeds, feeds, feeds, "logits");
    if (!run.ok()) FAIL(run.status().ToString());
    CHECK(models::testing::FusedMismatch(*run) == "");
  }
}

// One replica is the single model with a replica axis of one: every
// Linear stays one Linear (a batch of one, its bias in the product's pass;
// a batched GEMM of one and an Add ran the fused MLP 0.94x of serial at
// R = 1), an op run once per replica (an LSTM) reads and writes
// views of its tensors, not a Slice and a Concat copy of them, and the
// logits are the single model's.
TEST_CASE("each zoo model fused as 1 replica keeps its Linears and LayerNorms and computes the single model's logits") {
  for (const SmallModel& s : SmallModels()) {
    if (IsGan(s)) continue;
    INFO(s.name);
    Model m(DType::kF64);
    REQUIRE(models::BuildSupervised(m, s.name, s.args, s.data, kBatch).ok());
    auto fused = FuseReplicas(m.graph(), FusionOptions{1, {7}, {}, {}});
    if (!fused.ok()) FAIL(fused.status().ToString());
    for (const Node& n : m.graph().nodes()) {
      if (n.op != "Linear" && n.op != "LayerNorm") continue;
      INFO(n.op << " '" << n.name << "'");
      const std::map<std::string, int> ops = testing::OpsEmittedFor(*fused, m.graph(), n.name);
      CHECK(ops.count("BatchMatMul") == 0);
      CHECK(ops.count("Mul") == 0);  // a LayerNorm's affine in its own pass
      CHECK(ops.count(n.op) == 1);
    }
    for (const char* copy : {"Slice", "Concat"}) {
      INFO(copy << " nodes, single model against one fused replica");
      CHECK(m.graph().NodesWithOp(copy).size() == fused->NodesWithOp(copy).size());
    }
    const auto feeds = ZooBatch(s.data, DType::kF64);
    auto run = models::testing::RunFusedAndSeparate(m.graph(), {7}, feeds, feeds, "logits");
    if (!run.ok()) FAIL(run.status().ToString());
    CHECK(models::testing::FusedMismatch(*run) == "");
  }
}

// Mixed precision on every zoo model (docs/mixed_precision.md): the fused
// step of 2 replicas compiles with its GEMMs and convolutions in bf16 / f16,
// runs, and its loss (computed before the update) is the f32 step's within
// the low precision's rounding. The ResNets and MobileNetV2 get larger
// images here: at the sizes above their last BatchNorms normalise 2 values
// per channel (batch 2, 1x1 maps), whose outputs are +-1 by which one is
// larger, so that any rounding may flip them and the loss with them.
// PointNet's fully connected heads normalise 2 values whatever the image
// size, and their batch-2 gradients exceed f16's range even unscaled: for
// them the loss is checked to be finite only, and an fp16 step may be
// skipped (an overflow) but not otherwise. Tolerances: 5e-2 relative for
// bf16 (8 bits of mantissa), 2e-2 for f16, twice that through ResNet-101's
// hundred layers at width 2.
TEST_CASE("each zoo model takes a fused mixed-precision step in bf16 and fp16") {
  const std::map<std::string, Shape> larger = {
      {"resnet18", {3, 32, 32}}, {"resnet101", {3, 32, 32}}, {"mobilenet_v2", {3, 64, 64}}};
  const std::set<std::string> batch_norm_on_two = {"pointnet_cls", "pointnet_seg"};
  for (SmallModel s : SmallModels()) {
    if (IsGan(s)) continue;
    INFO(s.name);
    if (auto it = larger.find(s.name); it != larger.end()) s.data = Features(it->second);
    Model m;
    REQUIRE(models::BuildSupervised(m, s.name, s.args, s.data, kBatch).ok());
    auto feeds = ZooBatch(s.data, DType::kF32);
    feeds[kLearningRateInput] = Tensor::Zeros({2}, DType::kF32);
    feeds[kLearningRateInput].Fill(s.step_lr);
    feeds[kStepInput] = Tensor::Zeros({}, DType::kF32);
    feeds[kStepInput].Fill(1);
    feeds[kReplicaMaskInput] = Tensor::Zeros({2}, DType::kF32);
    feeds[kReplicaMaskInput].Fill(1);
    std::vector<double> f32_loss;
    for (DType precision : {DType::kF32, DType::kBF16, DType::kF16}) {
      INFO(DTypeName(precision));
      CompileOptions o = StepOptions(StepOptimizer{}, FusionOptions{2, {7, 8}, {}, {}});
      o.precision = precision;
      // No overflow to skip: this step must update. Scaled down, since
      // MobileNetV3's unscaled f16 gradients reach 6.2e4 here, within 6% of
      // f16's largest value, where any rounding of the forward pass tips
      // them over.
      o.loss_scaling.init_scale = 0.125;
      auto step = Compile(m.graph(), Program::kTrainingStep, o);
      if (!step.ok()) FAIL(step.status().ToString());
      int low_nodes = 0;
      for (const Node& n : step->nodes())
        if (n.op != "Cast" && !n.outputs.empty() && step->type(n.outputs[0]).dtype == precision) ++low_nodes;
      if (precision != DType::kF32) CHECK(low_nodes > 0);
      auto exec = Executor::Create(*step);
      if (!exec.ok()) FAIL(exec.status().ToString());
      REQUIRE((*exec)->InitializeState(1).ok());
      auto out = (*exec)->Run(feeds);
      if (!out.ok()) FAIL(out.status().ToString());
      const std::vector<double> loss = out->at("loss").ToDoubleVector();
      if (precision == DType::kF32) f32_loss = loss;
      const double tol = (precision == DType::kBF16 ? 5e-2 : 2e-2) * (s.name == "resnet101" ? 2 : 1);
      const bool loose = batch_norm_on_two.count(s.name) > 0;
      for (int r = 0; r < 2; ++r) {
        INFO("replica " << r << ": loss " << loss[r] << ", f32 " << f32_loss[r]);
        CHECK(std::isfinite(loss[r]));
        if (!loose) CHECK(std::abs(loss[r] - f32_loss[r]) <= tol * std::max(1.0, std::abs(f32_loss[r])));
      }
      const std::vector<double> active = out->at(kActiveOutput).ToDoubleVector();
      for (int r = 0; r < 2; ++r) {
        if (loose && precision == DType::kF16) CHECK(active[r] == out->at(kGradsFiniteOutput).ToDoubleVector()[r]);
        else CHECK(active[r] == 1);
      }
    }
  }
}

// Fused as 2 replicas, `model` passes the verifier (with its training step),
// runs once per replica only ops that declare it, and returns those ops.
// Image classifiers, whose layers and loss all have fused forms that keep
// the replica axis where the next op wants it, run nothing per replica and
// move no activation around: fusion adds no BroadcastTo, and its only
// Transposes bring the replicas to the front for the classifier's batched
// GEMM (a Linear on a replicated input).
std::set<std::string> CheckFusedStructure(const Graph& model, bool image_classifier) {
  auto fused = FuseReplicas(model, FusionOptions{2, {7, 8}, {}, {}});
  if (!fused.ok()) FAIL(fused.status().ToString());
  CHECK(VerifyGraph(*fused).ToString() == "OK");
  auto step = BuildFusedTrainingGraph(*fused, "loss", std::vector<StepOptimizer>(2), true);
  if (!step.ok()) FAIL(step.status().ToString());
  CHECK(VerifyGraph(*step).ToString() == "OK");

  auto model_op = [&](const std::string& fused_name) {
    const std::string owner = testing::ModelNodeOf(fused_name, model);
    return owner.empty() ? std::string("(none)") : model.node(*model.FindNode(owner)).op;
  };
  // A value moves to a replica axis once, however many of its consumers
  // want it there (a transformer's q, k and v projections of one input).
  std::set<std::pair<ValueId, std::vector<int64_t>>> moves;
  for (const Node& n : fused->nodes()) {
    if (n.op != "Transpose" || n.name.find("move_replica_axis") == std::string::npos) continue;
    INFO("fusion moved the replica axis of the input of '" << n.name << "' again");
    CHECK(moves.insert({n.inputs[0], n.attrs.Ints("perm")}).second);
  }
  // A sum of two like-shaped values (a residual add) meets them at the
  // replica axis one is at and the other has already been moved to: a
  // transformer's residual adds had taken the stream's axis, and every
  // fused Linear after them moved the sum back.
  for (const Node& n : fused->nodes()) {
    if (n.op != "Transpose" || model_op(n.name) != "Add") continue;
    const Node& add = model.node(*model.FindNode(testing::ModelNodeOf(n.name, model)));
    if (model.type(add.inputs[0]).shape != model.type(add.inputs[1]).shape) continue;  // a broadcast
    FAIL_CHECK("fusion moved an operand of residual add '" << add.name << "': " << n.name);
  }
  std::set<std::string> per_replica;
  for (NodeId id : testing::PerReplicaNodes(*fused)) {
    const std::string op = model_op(fused->node(id).name);
    INFO("node " << fused->node(id).name << " runs per replica for a " << op);
    const OpDef* def = OpRegistry::Global().FindOp(op);
    REQUIRE(def != nullptr);
    CHECK(def->fusion_kind() != FusionKind::kFused);
    per_replica.insert(op);
  }
  if (image_classifier) {
    CHECK(per_replica.empty());
    for (const Node& n : fused->nodes()) {
      if (model.FindNode(n.name) || (n.op != "Transpose" && n.op != "BroadcastTo")) continue;
      INFO("fusion added " << n.op << " '" << n.name << "' for a " << model_op(n.name));
      CHECK((n.op == "Transpose" && model_op(n.name) == "Linear"));
    }
  }
  return per_replica;
}

// The MLP's first Linear reads the shared images in place for every
// replica and puts the replica axis first, where the next Linear reads it:
// its fused step moves no activation. (Its weights stacked [R*out, in] put
// the replicas beside the features, and fc2 transposed its input, and its
// input gradient back, every step.)
TEST_CASE("the fused MLP's training step has no Transpose") {
  for (const SmallModel& s : SmallModels()) {
    if (s.name != "mlp") continue;
    Model m;
    REQUIRE(models::BuildSupervised(m, s.name, s.args, s.data, kBatch).ok());
    auto fused = FuseReplicas(m.graph(), FusionOptions{3, {7, 8, 9}, {}, {}});
    if (!fused.ok()) FAIL(fused.status().ToString());
    auto step = BuildFusedTrainingGraph(*fused, "loss", std::vector<StepOptimizer>(3), true);
    if (!step.ok()) FAIL(step.status().ToString());
    for (NodeId id : step->NodesWithOp("Transpose")) FAIL_CHECK("fusion moved a value: " << step->node(id).name);
    return;
  }
  FAIL("no mlp in the small zoo");
}

TEST_CASE("each zoo model's fused graph runs per replica only the ops that declare it") {
  const std::set<std::string> image_classifiers = {"mlp",          "cnn",          "resnet18",
                                                   "resnet101",    "alexnet",      "vgg16",
                                                   "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
                                                   "inception_v3"};
  for (const SmallModel& s : SmallModels()) {
    INFO(s.name);
    if (IsGan(s)) {
      for (models::GanStep step : {models::GanStep::kDiscriminator, models::GanStep::kGenerator}) {
        Model m;
        REQUIRE(models::BuildGanStep(m, s.name, s.args, s.data.input, kBatch, step).ok());
        CHECK(CheckFusedStructure(m.graph(), false).empty());
      }
      continue;
    }
    Model m;
    REQUIRE(models::BuildSupervised(m, s.name, s.args, s.data, kBatch).ok());
    // Every supervised model's layers and loss (LSTMs and CrossEntropy
    // included) have fused forms.
    CHECK(CheckFusedStructure(m.graph(), image_classifiers.count(s.name) > 0).empty());
  }
}

// Each GAN step, in f64: one update lowers the step's loss, and the fused
// step of 2 replicas computes the losses (and the generator's images) of 2
// separate GANs started from the replicas' seeds.
TEST_CASE("each zoo GAN's steps train, and fused as 2 replicas equal 2 separate GANs") {
  const std::vector<uint64_t> seeds = {7, 8};
  for (const SmallModel& s : SmallModels()) {
    if (!IsGan(s)) continue;
    for (models::GanStep step : {models::GanStep::kDiscriminator, models::GanStep::kGenerator}) {
      const bool discriminator = step == models::GanStep::kDiscriminator;
      INFO(s.name << (discriminator ? " discriminator step" : " generator step"));
      Model m(DType::kF64);
      REQUIRE(models::BuildGanStep(m, s.name, s.args, s.data.input, kBatch, step).ok());
      const int64_t nz = m.shape(Sym{m.graph().node(*m.graph().FindNode("noise")).outputs[0]})[1];
      Rng rng(5);
      Tensor noise = Tensor::Zeros({kBatch, nz}, DType::kF64), real = Tensor::Zeros(Batched(s.data.input), DType::kF64);
      for (int64_t i = 0; i < noise.numel(); ++i) noise.data<double>()[i] = rng.Normal();
      for (int64_t i = 0; i < real.numel(); ++i) real.data<double>()[i] = rng.Uniform(-1, 1);
      std::map<std::string, Tensor> feeds = {{"noise", noise}};
      if (discriminator) feeds["real"] = real;

      StepOptimizer opt;
      opt.trainable_scope = discriminator ? models::kDiscriminatorScope : models::kGeneratorScope;
      auto change = models::testing::LossAcrossOneStep(m.graph(), feeds, 0.05, opt);
      if (!change.ok()) FAIL(change.status().ToString());
      CHECK(change->after < change->before);

      for (const char* name : {"loss", "d_fake", "fake"}) {
        if (!m.graph().outputs().count(name)) continue;
        INFO(name);
        auto run = models::testing::RunFusedAndSeparate(m.graph(), seeds, feeds, feeds, name);
        if (!run.ok()) FAIL(run.status().ToString());
        CHECK(models::testing::FusedMismatch(*run) == "");
      }
    }
  }
}

}  // namespace
}  // namespace loom
