#include "train/config/train_config.h"

#include <catch2/catch.hpp>

#include <filesystem>

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
  CHECK(Error("model { name: \"rnntc\" }\ndata {\n  dataset: \"synthetic\"\n  sequence_length: 8\n  text_target: "
              "\"reversed\"\n}") ==
        "cfg.pbtxt:5: field data.text_target: unknown value 'reversed' (expected one of: class, next)");
  CHECK(Error("model { name: \"mlp\" }\ndata {\n  dataset: \"synthetic\"\n  num_classes: 4\n}") ==
        "cfg.pbtxt: field data.input_shape: is required for the synthetic dataset (or data.sequence_length for tokens)");
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

TEST_CASE("a directory given as the config file is named as such") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "train_config_test_dir.pbtxt";
  std::filesystem::create_directories(dir);
  auto c = LoadTrainConfig(dir.string());
  std::filesystem::remove(dir);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == dir.string() + ": is a directory, not a config file");
}

TEST_CASE("threads, random_crop_padding and crop_size have upper bounds") {
  const std::string base = "model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\n";
  const std::string threads = Error(base + "threads: 100000");
  CHECK_THAT(threads, Catch::StartsWith("cfg.pbtxt:3: field threads: must be <= 1024 (this machine has "));
  CHECK_THAT(threads, Catch::EndsWith(" hardware threads), got 100000"));
  CHECK(Error(base + "threads: -1") == "cfg.pbtxt:3: field threads: must be >= 0, got -1");
  CHECK(ParseTrainConfig(base + "threads: 1024", "cfg.pbtxt").ok());
  CHECK(Error("model { name: \"mlp\" }\ndata {\n  dataset: \"mnist\"\n  augment { random_crop_padding: 100000 }\n}") ==
        "cfg.pbtxt:4: field data.augment.random_crop_padding: must be in [0, 64] (pixels on each side), got 100000");
  CHECK(ParseTrainConfig("model { name: \"mlp\" }\ndata { dataset: \"mnist\" augment { random_crop_padding: 64 } }",
                         "cfg.pbtxt").ok());
  CHECK(Error("model { name: \"dcgan\" }\ndata {\n  dataset: \"mnist\"\n  augment { crop_size: 100000 }\n}") ==
        "cfg.pbtxt:4: field data.augment.crop_size: must be in [0, 1024] (pixels), got 100000");
  CHECK(Error("model { name: \"dcgan\" }\ndata {\n  dataset: \"mnist\"\n  augment { crop_size: -1 }\n}") ==
        "cfg.pbtxt:4: field data.augment.crop_size: must be in [0, 1024] (pixels), got -1");
}

TEST_CASE("long values are cut in messages") {
  CHECK(Excerpt("fashion_mnist") == "fashion_mnist");
  CHECK(Excerpt(std::string(64, 'x')) == std::string(64, 'x'));
  CHECK(Excerpt(std::string(1000, 'x')) == std::string(64, 'x') + "... (1000 bytes)");
  // Not inside a UTF-8 sequence: 63 x and a 2-byte "é" straddling byte 64.
  CHECK(Excerpt(std::string(63, 'x') + "\xc3\xa9" + std::string(100, 'y')) == std::string(63, 'x') + "... (165 bytes)");
  const std::string message = Error("model { name: \"mlp\" }\ndata { dataset: \"" + std::string(50 << 20, 'd') + "\" }");
  CHECK(message == "cfg.pbtxt:2: field data.dataset: unknown value '" + std::string(64, 'd') +
                       "... (52428800 bytes)' (expected one of: cifar10, fashion_mnist, mnist, point_clouds, synthetic, "
                       "text, text_classes)");
}


TEST_CASE("device names a CPU or a CUDA device and may change on resume") {
  const std::string base = "model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\n";
  CHECK(Error(base + "device: \"tpu:0\"") ==
        "cfg.pbtxt:3: field device: unknown device 'tpu:0' (expected cpu[:N] or cuda[:N])");
  CHECK(Error(base + "device: \"cuda:x\"") == "cfg.pbtxt:3: field device: bad device index in 'cuda:x'");
  auto cuda = ParseTrainConfig(base + "device: \"cuda:1\"", "cfg.pbtxt");
  REQUIRE(cuda.ok());
  CHECK(RunDevice(*cuda).value() == Device::Cuda(1));
  auto cpu = ParseTrainConfig(base, "cfg.pbtxt");
  REQUIRE(cpu.ok());
  CHECK(RunDevice(*cpu).value() == Device::Cpu());
  // Checkpoints hold host tensors: a run saved on one device resumes on another.
  CHECK(RunDifferences(*cpu, *cuda).empty());
}

TEST_CASE("precision is f32, bf16 or fp16; loss_scale belongs to fp16 and is checked; neither may change on resume") {
  const std::string base = "model { name: \"mlp\" }\ndata { dataset: \"mnist\" }\n";
  CHECK(Error(base + "precision: \"fp32\"") ==
        "cfg.pbtxt:3: field precision: unknown value 'fp32' (expected one of: bf16, f32, fp16)");
  CHECK(Error(base + "precision: \"bf16\"\nloss_scale { init_scale: 8 }") ==
        "cfg.pbtxt:4: field loss_scale: is for precision: fp16 only (bf16 and f32 need no loss scaling)");
  CHECK(Error(base + "precision: \"fp16\"\nloss_scale {\n  backoff_factor: 1.5\n}") ==
        "cfg.pbtxt:5: field loss_scale.backoff_factor: must be in (0, 1), got 1.5");
  CHECK(Error(base + "precision: \"fp16\"\nloss_scale { init_scale: 0 }") ==
        "cfg.pbtxt:4: field loss_scale.init_scale: must be finite and > 0, got 0");
  CHECK(Error(base + "precision: \"fp16\"\nloss_scale { growth_interval: 0 }") ==
        "cfg.pbtxt:4: field loss_scale.growth_interval: must be in [1, 16777216], got 0");
  auto f32 = ParseTrainConfig(base, "cfg.pbtxt");
  auto bf16 = ParseTrainConfig(base + "precision: \"bf16\"", "cfg.pbtxt");
  auto fp16 = ParseTrainConfig(base + "precision: \"fp16\"\nloss_scale { init_scale: 1024 growth_interval: 10 }",
                               "cfg.pbtxt");
  REQUIRE(f32.ok());
  REQUIRE(bf16.ok());
  REQUIRE(fp16.ok());
  CHECK(RunPrecision(*f32) == DType::kF32);
  CHECK(RunPrecision(*bf16) == DType::kBF16);
  CHECK(RunPrecision(*fp16) == DType::kF16);
  const LossScaling s = RunLossScaling(*fp16);
  CHECK(s.init_scale == 1024);
  CHECK(s.growth_interval == 10);
  CHECK(s.growth_factor == 2);    // GradScaler's defaults for the rest
  CHECK(s.backoff_factor == 0.5);
  CHECK(RunLossScaling(*f32).init_scale == 65536);
  CHECK(!RunDifferences(*f32, *bf16).empty());
}

}  // namespace
}  // namespace loom
