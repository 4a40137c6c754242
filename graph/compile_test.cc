#include "graph/compile.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "graph/model.h"

namespace loom {
namespace {

Graph SmallMlp() {
  Model m;
  Sym x = m.input("input", {4, 6});
  Sym y = m.input("target", {4}, DType::kI64);
  Sym h = m.relu(m.linear(x, 5, {}, "fc1"));
  m.set_output("loss", m.cross_entropy(m.linear(h, 3, {}, "fc2"), y));
  return m.graph();
}

FusionOptions TwoReplicas() {
  FusionOptions f;
  f.replicas = 2;
  f.seeds = {1, 2};
  return f;
}

TEST_CASE("Compile builds what fusion and the training graph build by hand") {
  const Graph model = SmallMlp();
  StepOptimizer sgd;
  sgd.config.set_momentum(0.9);

  CompileOptions single;
  single.optimizers = {sgd};
  auto step = Compile(model, Program::kTrainingStep, single);
  REQUIRE(step.ok());
  auto by_hand = BuildTrainingGraph(model, "loss", sgd);
  REQUIRE(by_hand.ok());
  CHECK(step->ToString() == by_hand->ToString());

  CompileOptions fused;
  fused.fusion = TwoReplicas();
  fused.optimizers = {sgd, sgd};
  auto fused_step = Compile(model, Program::kTrainingStep, fused);
  REQUIRE(fused_step.ok());
  auto fused_forward = FuseReplicas(model, TwoReplicas());
  REQUIRE(fused_forward.ok());
  auto fused_by_hand = BuildFusedTrainingGraph(*fused_forward, "loss", {sgd, sgd}, true);
  REQUIRE(fused_by_hand.ok());
  CHECK(fused_step->ToString() == fused_by_hand->ToString());
  // The step's own values carry the replica layout: one row per replica.
  auto layout_of = [&](const std::string& node) {
    return fused_step->value(fused_step->node(*fused_step->FindNode(node)).outputs[0]).replica_layout;
  };
  CHECK(layout_of(kLearningRateInput) == ReplicaLayout::Axis(0));
  CHECK(layout_of(kReplicaMaskInput) == ReplicaLayout::Axis(0));
  CHECK(layout_of(kStepInput) == ReplicaLayout::Shared());
  CHECK(layout_of("fc1/weight/momentum_buffer") == ReplicaLayout::Axis(0));
  CHECK(layout_of("fc1/weight/update") == ReplicaLayout::Axis(0));

  auto forward = Compile(model, Program::kForward, fused);
  REQUIRE(forward.ok());
  CHECK(forward->ToString() == fused_forward->ToString());
}

TEST_CASE("Compile dumps the graph after each pass") {
  const std::filesystem::path dir = std::filesystem::path(std::getenv("TEST_TMPDIR")) / "dumps";
  CompileOptions o;
  o.fusion = TwoReplicas();
  o.optimizers.resize(2);
  o.name = "train";
  o.dump_dir = dir.string();
  REQUIRE(Compile(SmallMlp(), Program::kTrainingStep, o).ok());
  for (const char* file : {"train.01.fuse-replicas.txt", "train.02.training-step.txt"}) {
    std::ifstream in(dir / file);
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    CHECK(text.str().find("fc2") != std::string::npos);
  }
}

TEST_CASE("Compile errors name the pipeline and the pass") {
  CompileOptions o;
  o.name = "train";
  o.fusion = TwoReplicas();
  o.optimizers.resize(1);
  auto wrong_count = Compile(SmallMlp(), Program::kTrainingStep, o);
  REQUIRE(!wrong_count.ok());
  CHECK_THAT(wrong_count.status().message(), Catch::Contains("2 fused replicas needs 2 optimizer configs, got 1"));

  o.optimizers.resize(2);
  o.loss_output = "no_such_output";
  auto no_loss = Compile(SmallMlp(), Program::kTrainingStep, o);
  REQUIRE(!no_loss.ok());
  CHECK_THAT(no_loss.status().message(), Catch::Contains("pass 'training-step'"));

  o.loss_output = "loss";
  o.fusion->seeds = {1};  // one seed for two replicas
  auto bad_fusion = Compile(SmallMlp(), Program::kForward, o);
  REQUIRE(!bad_fusion.ok());
  CHECK_THAT(bad_fusion.status().message(), Catch::Contains("pass 'fuse-replicas'"));

  // A graph that breaks an invariant never reaches the first pass.
  Graph broken = SmallMlp();
  broken.outputs()["dangling"] = 12345;
  auto invalid = Compile(broken, Program::kForward, CompileOptions{});
  REQUIRE(!invalid.ok());
  CHECK_THAT(invalid.status().message(), Catch::Contains("invalid graph before the first pass"));
}

}  // namespace
}  // namespace loom
