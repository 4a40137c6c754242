#include "models/model_test_util.h"
#include "models/zoo.h"

#include <catch2/catch.hpp>

namespace loom::models {
namespace {

using testing::ParameterCount;

TEST_CASE("zoo models build with torch's parameter counts") {
  {
    Model m;
    REQUIRE(BuildClassifier(m, "mlp", {}, {1, 28, 28}, 4, 10).ok());
    // nn.Sequential(Flatten, Linear(784,256), ReLU, Linear(256,128), ReLU, Linear(128,10))
    CHECK(ParameterCount(m.graph()) == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  }
  {
    Model m;
    REQUIRE(BuildClassifier(m, "cnn", {}, {1, 28, 28}, 4, 10).ok());
    // conv(1->32, 3x3, no bias) + BN(32) + conv(32->64) + BN(64) + Linear(64*7*7, 128) + Linear(128, 10)
    CHECK(ParameterCount(m.graph()) == 32 * 9 + 64 + 64 * 32 * 9 + 128 + 3136 * 128 + 128 + 1290);
    CHECK(m.graph().type(m.graph().outputs().at("logits")).shape == Shape({4, 10}));
  }
}

TEST_CASE("zoo errors list what exists") {
  Model m;
  Status unknown = BuildClassifier(m, "resnet9000", {}, {1, 28, 28}, 4, 10);
  std::string names;
  for (const ZooEntry& e : Zoo()) names += (names.empty() ? "" : ", ") + e.name;
  CHECK(names.rfind("mlp, cnn, resnet18", 0) == 0);
  CHECK(unknown.message() == "unknown model 'resnet9000' (the zoo has: " + names + ")");
  Model m2;
  Status typo = BuildClassifier(m2, "mlp", {{"hiden", "64"}}, {1, 28, 28}, 4, 10);
  CHECK(typo.message() == "model mlp has no argument 'hiden' (its arguments: dropout, hidden)");
  Model m3;
  Status bad = BuildClassifier(m3, "cnn", {{"channels", "32,x"}}, {1, 28, 28}, 4, 10);
  CHECK(bad.message() == "argument channels: '32,x' is not a comma-separated list of integers");
}

TEST_CASE("list arguments: none is the empty list; an empty list or item is an error") {
  Model linear;
  REQUIRE(BuildClassifier(linear, "mlp", {{"hidden", "none"}}, {1, 28, 28}, 2, 10).ok());
  CHECK(ParameterCount(linear.graph()) == 784 * 10 + 10);
  const std::string expected = " (expected comma-separated integers such as 256,128, or none)";
  const std::pair<const char*, std::string> cases[] = {
      {"", "argument hidden: '' is empty" + expected},
      {"128,,64", "argument hidden: '128,,64' has an empty item" + expected},
      {",64", "argument hidden: ',64' has an empty item" + expected},
      {"128,", "argument hidden: '128,' has an empty item" + expected},
      {"128,0", "argument hidden: '128,0': items must be >= 1, got 0"},
      {"128,-4", "argument hidden: '128,-4': items must be >= 1, got -4"},
      {"128,99999999999999999999",
       "argument hidden: '128,99999999999999999999': 99999999999999999999 is out of range (at most "
       "9223372036854775807)"},
  };
  for (const auto& [value, message] : cases) {
    INFO("hidden '" << value << "'");
    Model m;
    CHECK(BuildClassifier(m, "mlp", {{"hidden", value}}, {1, 28, 28}, 2, 10).message() == message);
  }
  Model cnn;
  CHECK(BuildClassifier(cnn, "cnn", {{"channels", "none"}}, {1, 28, 28}, 2, 10).message() ==
        "argument channels: needs at least one stage");
}

TEST_CASE("every zoo model builds at its reference data") {
  for (const ZooEntry& e : Zoo()) {
    INFO(e.name);
    Model m;
    const Status built = e.gan ? BuildGanStep(m, e.name, {}, e.reference.input, 2, GanStep::kDiscriminator)
                               : BuildSupervised(m, e.name, {},
                                                 ExpectedData(e, e.reference.input, e.reference.num_classes), 2);
    CHECK(built.ToString() == "OK");
    CHECK((e.gan ? e.reference.num_classes == 0 : e.reference.num_classes >= 2));
  }
}

TEST_CASE("a long model name is cut in the message") {
  Model m;
  const std::string message = BuildClassifier(m, std::string(50 << 20, 'n'), {}, {1, 28, 28}, 2, 10).message();
  CHECK_THAT(message, Catch::StartsWith("unknown model '" + std::string(64, 'n') + "... (52428800 bytes)' (the zoo has: mlp"));
}

TEST_CASE("a long argument value is cut in the message") {
  Model m;
  const std::string message =
      BuildClassifier(m, "resnet18", {{"stem", std::string(1000, 's')}}, {3, 32, 32}, 2, 10).message();
  CHECK(message == "argument stem: '" + std::string(64, 's') + "... (1000 bytes)' is not a ResNet stem (imagenet, cifar)");
}

}  // namespace
TEST_CASE("the zoo's mobilenets have torchvision's parameter counts") {
  const std::pair<const char*, int64_t> expected[] = {
      {"mobilenet_v2", 3504872}, {"mobilenet_v3_small", 2542856}, {"mobilenet_v3_large", 5483032}};
  for (const auto& [name, count] : expected) {
    INFO(name);
    Model m;
    REQUIRE(BuildClassifier(m, name, {}, {3, 224, 224}, 1, 1000).ok());
    CHECK(ParameterCount(m.graph()) == count);
  }
  Model m;
  Status bad = BuildClassifier(m, "mobilenet_v2", {{"width_mult", "0"}}, {3, 32, 32}, 1, 10);
  CHECK(bad.message() == "argument width_mult: must be > 0, got 0");
}

}  // namespace loom::models
