// The checkpoint file format and run directories: bit-exact round trips,
// refusal of damaged files, atomic saves, keep-last-K.
#include "train/checkpoint/checkpoint.h"

#include <catch2/catch.hpp>

#include "tests/temp_files.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/crc32c.h"
#include "train/checkpoint/run_dir.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;
namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) { return testing::FreshTempDir("checkpoint_test_" + name); }
using testing::ReadBytes;
using testing::WriteBytes;

std::string Bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.raw_data()), t.nbytes()); }

// A tensor whose bytes are a pattern that no conversion would preserve.
Tensor Patterned(const Shape& shape, DType dtype, unsigned seed) {
  Tensor t = Tensor::Zeros(shape, dtype);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  uint32_t x = seed;
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>((x = x * 1664525u + 1013904223u) >> 24);
  return t;
}

Checkpoint Sample() {
  Checkpoint c;
  // Special float values whose bits a text or float round trip could change.
  c.tensors["a/weight"] = Tensor::FromVector<float>(
      {2, 3}, {0.1f, -0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
               std::nanf("0x123"), -1e30f});
  c.tensors["a/bias"] = Tensor::FromVector<double>({3}, {1.0 / 3.0, -0.0, std::nan("0xbeef")});
  c.tensors["counts"] = Tensor::FromVector<int32_t>({4}, {0, -1, 2147483647, -2147483647 - 1});
  c.tensors["ids"] = Tensor::FromVector<int64_t>({2}, {std::numeric_limits<int64_t>::min(), 42});
  c.tensors["half"] = Patterned({5}, DType::kF16, 1);
  c.tensors["brain"] = Patterned({3, 3}, DType::kBF16, 2);
  c.tensors["mask"] = Patterned({7}, DType::kBool, 3);
  c.tensors["scalar"] = Tensor::FromVector<float>({}, {2.5f});
  c.tensors["empty"] = Tensor::Zeros({0, 4}, DType::kF32);
  c.position = {/*global_step=*/1200, /*epoch=*/3, /*batch_in_epoch=*/17, /*executor_step=*/1250};
  c.seeds = {{"init", 7}, {"shuffle", 0xFFFFFFFFFFFFFFFFull}};
  c.int_values = {{"schedule/step", 1200}, {"early_stop/bad_epochs", -2}};
  c.float_values = {{"early_stop/best_loss", 0.1}, {"tiny", 5e-324}};
  c.string_values = {{"note", std::string("line 1\nline 2\0nul", 17)}};
  c.config_text = "model: \"mlp\"\noptimizer { type: \"sgd\" momentum: 0.9 }\n";
  c.model_fingerprint = "a/bias\tf64 [3]\n";
  return c;
}

void RequireSame(const Checkpoint& got, const Checkpoint& want) {
  REQUIRE(got.tensors.size() == want.tensors.size());
  for (const auto& [name, t] : want.tensors) {
    INFO("tensor " << name);
    REQUIRE(got.tensors.count(name) == 1);
    const Tensor& g = got.tensors.at(name);
    CHECK(g.dtype() == t.dtype());
    CHECK(g.shape() == t.shape());
    CHECK(g.device().is_cpu());
    CHECK(Bytes(g) == Bytes(t));
  }
  CHECK(got.position == want.position);
  CHECK(got.seeds == want.seeds);
  CHECK(got.int_values == want.int_values);
  REQUIRE(got.float_values.size() == want.float_values.size());
  for (const auto& [key, v] : want.float_values) {
    INFO("float value " << key);
    REQUIRE(got.float_values.count(key) == 1);
    CHECK(std::memcmp(&got.float_values.at(key), &v, sizeof(double)) == 0);
  }
  CHECK(got.string_values == want.string_values);
  CHECK(got.config_text == want.config_text);
  CHECK(got.model_fingerprint == want.model_fingerprint);
}

TEST_CASE("A checkpoint round-trips bit for bit") {
  fs::path dir = TempDir("round_trip");
  const std::string path = (dir / "c.loom").string();
  Checkpoint c = Sample();
  REQUIRE(SaveCheckpoint(path, c).ToString() == "OK");
  StatusOr<Checkpoint> back = LoadCheckpoint(path);
  REQUIRE(back.status().ToString() == "OK");
  RequireSame(*back, c);
  CHECK(back->source == path);

  // Nothing but the file itself is left in the directory.
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  // The same checkpoint always gives the same bytes.
  const std::string again = (dir / "again.loom").string();
  REQUIRE(SaveCheckpoint(again, c).ok());
  CHECK(ReadBytes(path) == ReadBytes(again));

  // Saving over an existing checkpoint replaces it.
  c.position.global_step = 1300;
  c.tensors["a/weight"].data<float>()[0] = 7.0f;
  REQUIRE(SaveCheckpoint(path, c).ok());
  StatusOr<Checkpoint> replaced = LoadCheckpoint(path);
  REQUIRE(replaced.ok());
  RequireSame(*replaced, c);
}

TEST_CASE("An empty checkpoint round-trips") {
  const std::string path = (TempDir("empty") / "c.loom").string();
  REQUIRE(SaveCheckpoint(path, Checkpoint()).ok());
  StatusOr<Checkpoint> back = LoadCheckpoint(path);
  REQUIRE(back.ok());
  RequireSame(*back, Checkpoint());
}

TEST_CASE("Tensor bytes are stored raw, not encoded in the header") {
  const std::string path = (TempDir("raw") / "c.loom").string();
  Checkpoint c;
  c.tensors["big"] = Patterned({512, 512}, DType::kF32, 9);  // 1 MiB
  REQUIRE(SaveCheckpoint(path, c).ok());
  const std::string file = ReadBytes(path);
  CHECK(file.size() < (size_t{1} << 20) + 256);
  // The bytes appear verbatim at a 64-byte aligned offset.
  size_t at = file.find(Bytes(c.tensors["big"]));
  REQUIRE(at != std::string::npos);
  CHECK(at % 64 == 0);
  StatusOr<Checkpoint> back = LoadCheckpoint(path);
  REQUIRE(back.ok());
  CHECK(Bytes(back->tensors.at("big")) == Bytes(c.tensors["big"]));
}

TEST_CASE("Saving refuses undefined tensors and unwritable paths, naming them") {
  fs::path dir = TempDir("save_errors");
  Checkpoint c;
  c.tensors["w"] = Tensor();
  Status s = SaveCheckpoint((dir / "c.loom").string(), c);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Contains("c.loom") && Contains("tensor 'w' is undefined"));

  s = SaveCheckpoint((dir / "missing" / "c.loom").string(), Sample());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK_THAT(s.message(), Contains("missing/c.loom") && Contains("No such file or directory"));
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 0);  // no temporary left
}

// Saves Sample() and returns the file's bytes.
std::string SavedSample(const fs::path& path) {
  REQUIRE(SaveCheckpoint(path.string(), Sample()).ok());
  return ReadBytes(path);
}

Status LoadStatus(const fs::path& path) { return LoadCheckpoint(path.string()).status(); }

TEST_CASE("Truncated checkpoints are refused, naming the file") {
  fs::path dir = TempDir("truncated");
  fs::path path = dir / "c.loom";
  const std::string good = SavedSample(path);
  // Cut inside the magic, the prelude, the header, the data, and the trailer.
  for (size_t keep : {size_t{0}, size_t{5}, size_t{20}, size_t{40}, good.size() / 2, good.size() - 1}) {
    INFO("kept " << keep << " of " << good.size() << " bytes");
    WriteBytes(path, good.substr(0, keep));
    Status s = LoadStatus(path);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Contains(path.string()) && Contains("truncated"));
  }
  // Bytes appended after the trailer are refused too.
  WriteBytes(path, good + "x");
  Status s = LoadStatus(path);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Contains(path.string()) && Contains("1 more than its prelude describes"));
}

TEST_CASE("Any single flipped byte is refused, naming the file") {
  fs::path path = TempDir("flipped") / "c.loom";
  const std::string good = SavedSample(path);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    WriteBytes(path, bad);
    Status s = LoadStatus(path);
    INFO("byte " << i << " of " << good.size() << ": " << s.ToString());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Contains(path.string()));
  }
  // In the tensor data, the checksum is what notices.
  std::string bad = good;
  size_t at = good.find(Bytes(Sample().tensors["counts"]));
  REQUIRE(at != std::string::npos);
  bad[at + 3] ^= 0x40;
  WriteBytes(path, bad);
  Status s = LoadStatus(path);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Contains(path.string()) && Contains("is corrupt") && Contains("CRC32C"));
}

TEST_CASE("Files that are not checkpoints, or of another version, are refused clearly") {
  fs::path dir = TempDir("magic");
  fs::path path = dir / "c.loom";
  const std::string good = SavedSample(path);

  std::string bad = good;
  bad.replace(0, 8, "LOOMGRPH");
  WriteBytes(path, bad);
  Status s = LoadStatus(path);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Contains(path.string()) && Contains("is not a loom checkpoint"));

  WriteBytes(path, "graph {\n}\n");
  CHECK_THAT(LoadStatus(path).message(), Contains("is not a loom checkpoint"));

  bad = good;
  bad[8] = 2;  // format version 2
  WriteBytes(path, bad);
  s = LoadStatus(path);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Contains(path.string()) && Contains("format version 2") && Contains("reads version 1"));

  s = LoadStatus(dir / "nope.loom");
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK_THAT(s.message(), Contains("nope.loom") && Contains("No such file"));

  s = LoadStatus(dir);
  CHECK_FALSE(s.ok());
  CHECK_THAT(s.message(), Contains(dir.string()));
}

// Replaces `from` by `to` (same length) in the header and re-seals the file
// with a correct CRC, as a buggy writer would have produced it.
void PatchHeader(const fs::path& path, const std::string& from, const std::string& to) {
  std::string bytes = ReadBytes(path);
  size_t at = bytes.find(from);
  REQUIRE(at != std::string::npos);
  REQUIRE(from.size() == to.size());
  bytes.replace(at, from.size(), to);
  const uint32_t crc = Crc32c(bytes.data(), bytes.size() - 4);
  for (int i = 0; i < 4; ++i) bytes[bytes.size() - 4 + i] = static_cast<char>(crc >> (8 * i));
  WriteBytes(path, bytes);
}

TEST_CASE("A checksummed but inconsistent header is refused, saying what is wrong") {
  fs::path path = TempDir("header") / "c.loom";
  Checkpoint c;
  c.tensors["w"] = Tensor::FromVector<float>({2}, {1.0f, 2.0f});
  REQUIRE(SaveCheckpoint(path.string(), c).ok());
  PatchHeader(path, "f32", "f64");  // 2 f64 are 16 bytes, the file holds 8
  Status s = LoadStatus(path);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Contains(path.string()) && Contains("inconsistent header") &&
                              Contains("tensor 'w' is [2] f64 (16 bytes) but records 8 bytes"));

  REQUIRE(SaveCheckpoint(path.string(), c).ok());
  PatchHeader(path, "f32", "q32");
  CHECK_THAT(LoadStatus(path).message(), Contains("inconsistent header") && Contains("unknown dtype 'q32'"));
}

// --- run directories

Checkpoint AtStep(int64_t step) {
  Checkpoint c;
  c.position.global_step = step;
  c.tensors["w"] = Tensor::FromVector<int64_t>({1}, {step});
  return c;
}

std::vector<int64_t> Steps(const std::string& dir) {
  StatusOr<std::vector<CheckpointFile>> files = ListCheckpoints(dir);
  REQUIRE(files.ok());
  std::vector<int64_t> steps;
  for (const CheckpointFile& f : *files) steps.push_back(f.step);
  return steps;
}

TEST_CASE("A run directory keeps the last K checkpoints, by step") {
  const std::string dir = (TempDir("keep") / "run").string();  // created by the first save
  WriteBytes(TempDir("keep") / "unrelated", "");
  for (int64_t step : {8, 9, 10, 11}) {
    StatusOr<std::string> path = SaveCheckpointToRunDir(dir, AtStep(step), /*keep_last=*/3);
    REQUIRE(path.status().ToString() == "OK");
    CHECK(*path == (fs::path(dir) / CheckpointFileName(step)).string());
  }
  // Numeric order: ckpt-10 and ckpt-11 are newer than ckpt-9.
  CHECK(Steps(dir) == std::vector<int64_t>{9, 10, 11});
  REQUIRE(SaveCheckpointToRunDir(dir, AtStep(12), /*keep_last=*/2).ok());
  CHECK(Steps(dir) == std::vector<int64_t>{11, 12});
  // Files that only look similar are neither listed nor deleted.
  for (const char* name : {"ckpt-012.loom", "ckpt-.loom", "ckpt-5.loom.bak", "notes.txt"})
    WriteBytes(fs::path(dir) / name, "x");
  REQUIRE(SaveCheckpointToRunDir(dir, AtStep(13), /*keep_last=*/1).ok());
  CHECK(Steps(dir) == std::vector<int64_t>{13});
  for (const char* name : {"ckpt-012.loom", "ckpt-.loom", "ckpt-5.loom.bak", "notes.txt"})
    CHECK(fs::exists(fs::path(dir) / name));
  // keep_last 0 keeps everything.
  REQUIRE(SaveCheckpointToRunDir(dir, AtStep(14), /*keep_last=*/0).ok());
  CHECK(Steps(dir) == std::vector<int64_t>{13, 14});

  StatusOr<CheckpointFile> latest = FindLatestCheckpoint(dir);
  REQUIRE(latest.ok());
  CHECK(latest->step == 14);
  StatusOr<Checkpoint> c = LoadCheckpoint(latest->path);
  REQUIRE(c.ok());
  CHECK(c->tensors.at("w").data<int64_t>()[0] == 14);

  CHECK_THAT(PruneCheckpoints(dir, 0).message(), Contains("keep_last must be at least 1"));
  CHECK_THAT(SaveCheckpointToRunDir(dir, AtStep(15), -1).status().message(), Contains("keep_last"));
}

TEST_CASE("An interrupted save leaves the previous checkpoint loadable") {
  const std::string dir = TempDir("interrupted").string();
  REQUIRE(SaveCheckpointToRunDir(dir, AtStep(3), /*keep_last=*/2).ok());
  // A crash while step 6 was being written leaves a partial temporary.
  const std::string full = ReadBytes(fs::path(dir) / CheckpointFileName(3));
  const fs::path temp = fs::path(dir) / (CheckpointFileName(6) + ".tmp-4242-0");
  WriteBytes(temp, full.substr(0, full.size() / 2));

  CHECK(Steps(dir) == std::vector<int64_t>{3});
  StatusOr<CheckpointFile> latest = FindLatestCheckpoint(dir);
  REQUIRE(latest.ok());
  CHECK(latest->step == 3);
  StatusOr<Checkpoint> c = LoadCheckpoint(latest->path);
  REQUIRE(c.status().ToString() == "OK");
  CHECK(c->tensors.at("w").data<int64_t>()[0] == 3);

  // The next successful save clears the leftover.
  REQUIRE(SaveCheckpointToRunDir(dir, AtStep(6), /*keep_last=*/2).ok());
  CHECK_FALSE(fs::exists(temp));
  CHECK(Steps(dir) == std::vector<int64_t>{3, 6});
}

TEST_CASE("A run directory refuses to save behind a newer checkpoint, and reports missing checkpoints") {
  const std::string dir = TempDir("fork").string();
  StatusOr<CheckpointFile> none = FindLatestCheckpoint(dir);
  CHECK(none.status().code() == StatusCode::kNotFound);
  CHECK_THAT(none.status().message(), Contains(dir) && Contains("holds no checkpoint"));
  none = FindLatestCheckpoint(dir + "/absent");
  CHECK(none.status().code() == StatusCode::kNotFound);
  CHECK_THAT(none.status().message(), Contains("absent' does not exist"));

  REQUIRE(SaveCheckpointToRunDir(dir, AtStep(10), 0).ok());
  Status s = SaveCheckpointToRunDir(dir, AtStep(4), 0).status();
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Contains("cannot save step 4") && Contains("ckpt-10.loom") && Contains("new run directory"));
  CHECK(Steps(dir) == std::vector<int64_t>{10});
  // The same step again replaces the file.
  REQUIRE(SaveCheckpointToRunDir(dir, AtStep(10), 0).ok());
  CHECK(Steps(dir) == std::vector<int64_t>{10});
}

}  // namespace
}  // namespace loom
