// DCGAN: the example's parameter counts and names, output shapes, the
// discriminator shared between its two applications, and each GAN step
// training only its own network.
#include "models/dcgan.h"

#include <catch2/catch.hpp>

#include "graph/training.h"
#include "models/model_test_util.h"
#include "models/zoo.h"
#include "runtime/executor.h"

namespace loom::models {
namespace {

using testing::ParameterCount;
using testing::ParameterNames;
using testing::RandomInput;

int64_t CountUnder(const Graph& g, const std::string& scope) {
  int64_t n = 0;
  for (NodeId id : g.NodesWithOp(kParameterOp))
    if (g.node(id).name.rfind(scope + "/", 0) == 0) n += g.type(g.node(id).outputs[0]).shape.numel();
  return n;
}

TEST_CASE("dcgan has the PyTorch example's parameters at 64x64") {
  Model m;
  REQUIRE(BuildGanStep(m, "dcgan", {}, Shape({3, 64, 64}), 2, GanStep::kDiscriminator).ok());
  // examples/dcgan main.py: netG 3,576,704 and netD 2,765,568 parameters.
  CHECK(CountUnder(m.graph(), kGeneratorScope) == 3576704);
  CHECK(CountUnder(m.graph(), kDiscriminatorScope) == 2765568);
  CHECK(ParameterCount(m.graph()) == 3576704 + 2765568);  // the discriminator's exist once
  const std::set<std::string> names = ParameterNames(m.graph());
  for (const char* name : {"netG/main/0/weight", "netG/main/1/weight", "netG/main/1/bias", "netG/main/12/weight",
                           "netD/main/0/weight", "netD/main/3/weight", "netD/main/9/bias", "netD/main/11/weight"})
    CHECK(names.count(name) == 1);
  CHECK(names.size() == 5 + 4 * 2 + 5 + 3 * 2);  // convs and BatchNorm weight/bias pairs
}

TEST_CASE("dcgan shapes at 32x32 with one channel (padded Fashion-MNIST)") {
  Model m;
  m.set_training(false);
  DcganOptions o;
  o.channels = 1;
  o.image_size = 32;
  o.nz = 8;
  o.ngf = o.ndf = 4;
  REQUIRE(CheckDcganOptions(o).ok());
  Sym z = m.input("noise", {3, 8});
  Sym fake = DcganGenerator(m, z, o);
  DcganDiscriminator netD(m, o);
  Sym logits = netD(fake);
  REQUIRE(m.status().ok());
  CHECK(m.shape(fake) == Shape({3, 1, 32, 32}));
  CHECK(m.shape(logits) == Shape({3}));
  m.set_output("fake", fake);
  auto exec = Executor::Create(m.graph());
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(1).ok());
  auto out = (*exec)->Run({{"noise", RandomInput({3, 8}, DType::kF32, 1)}});
  REQUIRE(out.ok());
  for (double v : out->at("fake").ToDoubleVector()) CHECK(std::abs(v) <= 1.0);  // Tanh
}

TEST_CASE("dcgan options and arguments are checked") {
  DcganOptions o;
  o.image_size = 48;
  CHECK_THAT(CheckDcganOptions(o).message(), Catch::Contains("image_size must be 4 * 2^k"));
  Model m1;
  CHECK_THAT(BuildGanStep(m1, "dcgan", {}, Shape({1, 28, 28}), 2, GanStep::kGenerator).message(),
             Catch::Contains("image_size must be 4 * 2^k"));
  Model m2;
  CHECK_THAT(BuildGanStep(m2, "dcgan", {{"nzz", "10"}}, Shape({1, 32, 32}), 2, GanStep::kGenerator).message(),
             Catch::Contains("no argument 'nzz'"));
  Model m3;
  CHECK_THAT(BuildSupervised(m3, "dcgan", {}, DataSpec{Shape({1, 32, 32})}, 2).message(), Catch::Contains("is a GAN"));
  Model m4;
  CHECK_THAT(BuildGanStep(m4, "mlp", {}, Shape({1, 32, 32}), 2, GanStep::kGenerator).message(),
             Catch::Contains("is not a GAN"));
}

// One step of `step`'s training graph (SGD); returns the state before and
// after and the losses before and after.
struct StepResult {
  std::map<std::string, Tensor> before, after;
  double loss_before = 0, loss_after = 0;
};

StepResult TrainOnce(GanStep step, const std::string& scope) {
  Model m;
  const std::map<std::string, std::string> args = {{"nz", "6"}, {"ngf", "4"}, {"ndf", "4"}};
  REQUIRE(BuildGanStep(m, "dcgan", args, Shape({1, 16, 16}), 4, step).ok());
  StepOptimizer opt;
  opt.trainable_scope = scope;
  auto g = BuildTrainingGraph(m.graph(), "loss", opt);
  if (!g.ok()) FAIL(g.status().ToString());
  auto exec = Executor::Create(*g);
  REQUIRE(exec.ok());
  REQUIRE((*exec)->InitializeState(3).ok());
  std::map<std::string, Tensor> feeds = {{"noise", RandomInput({4, 6}, DType::kF32, 2)},
                                         {"lr", Tensor::FromVector<float>({}, {0.05f})},
                                         {"step", Tensor::FromVector<float>({}, {1})}};
  if (step == GanStep::kDiscriminator) feeds["real"] = RandomInput({4, 1, 16, 16}, DType::kF32, 3);
  StepResult r;
  for (const auto& [name, t] : (*exec)->state()) r.before[name] = *t.Cast(DType::kF64);
  auto first = (*exec)->Run(feeds);
  REQUIRE(first.ok());
  for (const auto& [name, t] : (*exec)->state()) r.after[name] = *t.Cast(DType::kF64);
  auto second = (*exec)->Run(feeds);
  REQUIRE(second.ok());
  r.loss_before = first->at("loss").ScalarAt(0);
  r.loss_after = second->at("loss").ScalarAt(0);
  return r;
}

bool Same(const Tensor& a, const Tensor& b) { return a.ToDoubleVector() == b.ToDoubleVector(); }

TEST_CASE("the discriminator step trains only netD and lowers its loss") {
  const StepResult r = TrainOnce(GanStep::kDiscriminator, kDiscriminatorScope);
  CHECK(r.loss_after < r.loss_before);
  int changed_d = 0;
  for (const auto& [name, t] : r.before) {
    INFO(name);
    const bool generator = name.rfind("netG/", 0) == 0;
    // The generator's BatchNorm runs in training mode in the D step too:
    // only its running statistics move, never its parameters.
    if (generator && name.find("running_") == std::string::npos) CHECK(Same(t, r.after.at(name)));
    if (name.rfind("netD/", 0) == 0 && name.find("/weight") != std::string::npos) changed_d += !Same(t, r.after.at(name));
  }
  CHECK(changed_d == 4);  // 3 convs + 1 BatchNorm weight at 16x16
}

TEST_CASE("the generator step trains only netG and lowers its loss") {
  const StepResult r = TrainOnce(GanStep::kGenerator, kGeneratorScope);
  CHECK(r.loss_after < r.loss_before);
  for (const auto& [name, t] : r.before) {
    INFO(name);
    if (name.rfind("netD/", 0) == 0 && name.find("running_") == std::string::npos) CHECK(Same(t, r.after.at(name)));
    if (name.rfind("netG/", 0) == 0 && name.find("/weight") != std::string::npos) CHECK_FALSE(Same(t, r.after.at(name)));
  }
}

TEST_CASE("the discriminator's running statistics are updated once per application, in order") {
  // D step: netD runs on the real batch, then on the fake one. Its first
  // BatchNorm's running mean after the step must be 0.9 * (0.9 * 0 + 0.1 *
  // mean_real) + 0.1 * mean_fake, i.e. not equal to one update from either.
  Model m;
  REQUIRE(BuildGanStep(m, "dcgan", {{"nz", "6"}, {"ngf", "4"}, {"ndf", "4"}}, Shape({1, 16, 16}), 4,
                       GanStep::kDiscriminator)
              .ok());
  int updates = 0;
  for (const auto& [state, value] : m.graph().state_updates()) {
    const std::string& name = m.graph().node(m.graph().value(state).producer).name;
    if (name.rfind("netD/", 0) != 0) continue;
    ++updates;
    // The update's value is the second application's BatchNorm output, whose
    // running-statistics input is the first application's output.
    const Node& second = m.graph().node(m.graph().value(value).producer);
    REQUIRE(second.op == "BatchNorm");
    const Node& first = m.graph().node(m.graph().value(second.inputs[3]).producer);
    CHECK(first.op == "BatchNorm");
  }
  CHECK(updates == 2);  // 1 BatchNorm at 16x16 x (mean, var)
}

}  // namespace
}  // namespace loom::models
