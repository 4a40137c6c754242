#include "train/checkpoint/data_spec.h"

#include <catch2/catch.hpp>

#include "tests/temp_files.h"

namespace loom {
namespace {

RecordedData Images() {
  RecordedData d;
  d.spec = models::DataSpec{Shape{3, 32, 32}, DType::kF32, Shape{}, 10, 0};
  d.mean = {0.4914f, 0.4822f, 1.0f / 3.0f};  // 1/3 needs all 9 digits to read back exactly
  d.std = {0.2470f, 0.2435f, 0.2616f};
  return d;
}

void RequireSame(const RecordedData& a, const RecordedData& b) {
  CHECK(a.spec.input == b.spec.input);
  CHECK(a.spec.input_dtype == b.spec.input_dtype);
  CHECK(a.spec.target == b.spec.target);
  CHECK(a.spec.num_classes == b.spec.num_classes);
  CHECK(a.spec.vocabulary == b.spec.vocabulary);
  CHECK(a.mean == b.mean);  // exact
  CHECK(a.std == b.std);
}

TEST_CASE("data spec: recorded values read back exactly through a checkpoint file") {
  const auto dir = testing::FreshTempDir("data_spec_roundtrip");
  Checkpoint c;
  c.tensors["w"] = Tensor::Zeros({2}, DType::kF32);
  RecordDataSpec(Images(), &c);
  REQUIRE(SaveCheckpoint((dir / "c.loom").string(), c).ok());
  auto back = LoadCheckpoint((dir / "c.loom").string());
  REQUIRE(back.ok());
  auto read = ReadDataSpec(*back);
  REQUIRE(read.ok());
  REQUIRE(read->has_value());
  RequireSame(**read, Images());
  CHECK(back->string_values.at("data/input_shape") == "3,32,32");
  CHECK(back->string_values.at("data/input_dtype") == "f32");
  CHECK(back->string_values.at("data/target_shape") == "");
}

TEST_CASE("data spec: tokens with per-position targets and no normalisation") {
  RecordedData d;
  d.spec = models::DataSpec{Shape{64}, DType::kI64, Shape{64}, 97, 97};
  Checkpoint c;
  RecordDataSpec(d, &c);
  CHECK(c.string_values.at("data/input_dtype") == "i64");
  CHECK(c.string_values.at("data/target_shape") == "64");
  CHECK(c.string_values.at("data/normalize_mean") == "");
  auto read = ReadDataSpec(c);
  REQUIRE(read.ok());
  REQUIRE(read->has_value());
  RequireSame(**read, d);
}

TEST_CASE("data spec: a checkpoint without the keys has none") {
  Checkpoint c;
  c.string_values["replica_0/status"] = "running";
  auto read = ReadDataSpec(c);
  REQUIRE(read.ok());
  CHECK(!read->has_value());
}

TEST_CASE("data spec: missing and malformed keys are DataLoss naming the file and key") {
  Checkpoint base;
  base.source = "runs/x/ckpt-5.loom";
  RecordDataSpec(Images(), &base);
  auto message = [](const Checkpoint& c) {
    auto read = ReadDataSpec(c);
    REQUIRE(!read.ok());
    CHECK(read.status().code() == StatusCode::kDataLoss);
    return read.status().message();
  };
  Checkpoint c = base;
  c.int_values.erase("data/num_classes");
  CHECK(message(c) == "runs/x/ckpt-5.loom: records the data spec but not int value 'data/num_classes'");
  c = base;
  c.string_values["data/input_shape"] = "1,x,28";
  CHECK(message(c) == "runs/x/ckpt-5.loom: data/input_shape: '1,x,28' is not a list of sizes >= 1 (item 'x')");
  c = base;
  c.string_values["data/input_shape"] = "";
  CHECK(message(c) == "runs/x/ckpt-5.loom: data/input_shape: empty (an example needs a shape)");
  c = base;
  c.string_values["data/input_dtype"] = "bf16";
  CHECK(message(c) == "runs/x/ckpt-5.loom: data/input_dtype: 'bf16', expected f32 or i64");
  c = base;
  c.string_values["data/normalize_std"] = "0.2,nan,0.3";
  CHECK(message(c) == "runs/x/ckpt-5.loom: data/normalize_std: '0.2,nan,0.3' is not a list of finite numbers (item 'nan')");
  c = base;
  c.string_values["data/normalize_std"] = "0.2";
  CHECK(message(c) == "runs/x/ckpt-5.loom: 3 normalisation means but 1 standard deviations");
  c = base;
  c.int_values["data/num_classes"] = 0;
  CHECK(message(c) == "runs/x/ckpt-5.loom: data/num_classes: 0, expected >= 1");
}

}  // namespace
}  // namespace loom
