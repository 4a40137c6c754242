#include "runtime/config/train_config.h"

#include <catch2/catch.hpp>

namespace loom {
namespace {

std::string Error(const std::string& text) {
  auto c = ParseTrainConfig(text, "cfg.pbtxt");
  REQUIRE_FALSE(c.ok());
  return c.status().message();
}

TEST_CASE("a valid config parses and gets its defaults") {
  auto c = ParseTrainConfig(R"(
    model { name: "mlp" args { key: "hidden" value: "256,128" } }
    data { dataset: "fashion_mnist" batch_size: 64 }
    optimizer { type: "adam" }
    epochs: 3
  )", "cfg.pbtxt");
  REQUIRE(c.status().ToString() == "OK");
  CHECK(c->model().args().at("hidden") == "256,128");
  CHECK(c->data().batch_size() == 64);
  CHECK(c->data().eval_batch_size() == 64);
  CHECK(c->data().shuffle());
  CHECK(c->optimizer().lr() == 1e-3);  // torch's Adam default
  CHECK(c->schedule().type() == "constant");
  CHECK(c->epochs() == 3);
  CHECK(c->tensorboard());
  // The resolved text parses back to the same config.
  auto again = ParseTrainConfig(TrainConfigToText(*c), "resolved");
  REQUIRE(again.ok());
  CHECK(TrainConfigToText(*again) == TrainConfigToText(*c));
}

TEST_CASE("config errors name the file, the line and the field") {
  CHECK(Error("model { name: \"mlp\" }\ndata { dataset: \"fashion_mnist\" batchsize: 3 }") ==
        "cfg.pbtxt:2:42: Message type \"loom.proto.DataConfig\" has no field named \"batchsize\".");
  CHECK(Error("model { name: \"mlp\" }\ndata {\n  dataset: \"fashion_mnist\"\n  batch_size: \"many\"\n}")
            .find("cfg.pbtxt:4:") == 0);
  CHECK(Error("model { name: \"mlp\" }\ndata {\n  dataset: \"fashion_mnist\"\n  batch_size: 0\n}") ==
        "cfg.pbtxt:4: field data.batch_size: must be >= 1, got 0");
  CHECK(Error("model { name: \"mlp\" }\ndata { dataset: \"imagenet\" }") ==
        "cfg.pbtxt:2: field data.dataset: unknown value 'imagenet' (expected one of: cifar10, fashion_mnist, mnist, point_clouds, "
        "synthetic, text, text_classes)");
  CHECK(Error("data { dataset: \"mnist\" }") ==
        "cfg.pbtxt: field model.name: is required (a model of the zoo, e.g. \"mlp\")");
  CHECK(Error("model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\noptimizer {\n  type: \"sgd\"\n  momentum: 1.5\n}") ==
        "cfg.pbtxt:5: field optimizer.momentum: must be in [0, 1), got 1.5");
  CHECK(Error("model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\nschedule { type: \"multistep\" milestones: [5, 3] }") ==
        "cfg.pbtxt:3: field schedule.milestones: must be strictly increasing");
  CHECK(Error("model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\nepochs: -2") ==
        "cfg.pbtxt:3: field epochs: must be >= 1, got -2");
}

TEST_CASE("optimizer and schedule scalars have presence; defaults are as before") {
  auto c = ParseTrainConfig(R"(
    model { name: "mlp" }
    data { dataset: "fashion_mnist" }
    optimizer { type: "sgd" momentum: 0 }
    schedule { warmup_steps: 0 }
  )", "cfg.pbtxt");
  REQUIRE(c.ok());
  CHECK(c->optimizer().has_momentum());  // an explicit 0 is kept ...
  CHECK_FALSE(c->optimizer().has_dampening());
  CHECK(c->optimizer().lr() == 1e-3);  // ... and unset fields get the same defaults
  CHECK(c->schedule().has_warmup_steps());
  CHECK(c->schedule().gamma() == 0.1);
  CHECK_FALSE(c->has_fusion());  // a single model gets no fusion block
  const std::string text = TrainConfigToText(*c);
  CHECK(text.find("momentum: 0") != std::string::npos);
  auto again = ParseTrainConfig(text, "resolved");
  REQUIRE(again.ok());
  CHECK(TrainConfigToText(*again) == text);
  // An lr of 0 written in the file is still an error, as before.
  CHECK(Error("model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\noptimizer { lr: 0 }") ==
        "cfg.pbtxt:3: field optimizer.lr: must be > 0, got 0");
}

TEST_CASE("a missing config file is a clear error") {
  auto c = LoadTrainConfig("/nonexistent/cfg.pbtxt");
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "/nonexistent/cfg.pbtxt: cannot open the config file");
}

}  // namespace
}  // namespace loom
