// CIFAR-10, synthetic and text datasets, on files the tests write.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "train/data/cifar.h"
#include "train/data/synthetic.h"
#include "train/data/test_files.h"
#include "train/data/text.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;
using testing::ErrorOf;
using testing::TempPath;
using testing::WriteFile;

// CIFAR-10 records whose label is i % 10 and whose pixel p of record i is
// (i + p) % 256.
std::vector<uint8_t> CifarRecords(int first, int count) {
  std::vector<uint8_t> b;
  for (int i = first; i < first + count; ++i) {
    b.push_back(static_cast<uint8_t>(i % 10));
    for (int p = 0; p < 3072; ++p) b.push_back(static_cast<uint8_t>((i + p) % 256));
  }
  return b;
}

TEST_CASE("CIFAR-10 binary batches load in order") {
  const std::string dir = TempPath("cifar");
  std::filesystem::create_directories(dir);
  for (int f = 1; f <= 5; ++f)
    WriteFile(dir + "/data_batch_" + std::to_string(f) + ".bin", CifarRecords(3 * (f - 1), 3));
  WriteFile(dir + "/test_batch.bin", CifarRecords(100, 2));

  auto train = LoadCifar10(dir, "train");
  REQUIRE(train.status().ToString() == "OK");
  const ByteImageDataset& ds = **train;
  CHECK(ds.size() == 15);
  CHECK(ds.input_spec() == ExampleSpec{Shape{3, 32, 32}, DType::kF32});
  CHECK(ds.num_classes() == 10);
  // Record 7 sits in data_batch_3 and keeps its place.
  std::vector<float> image(3072);
  int64_t label = -1;
  ds.Get(7, image.data(), &label);
  CHECK(label == 7);
  CHECK(image[0] == Approx(7 / 255.0f));
  CHECK(image[1024] == Approx(((7 + 1024) % 256) / 255.0f));  // the first green pixel
  CHECK(ds.pixels(14)[3071] == (14 + 3071) % 256);

  auto test = LoadCifar10(dir, "test");
  REQUIRE(test.ok());
  CHECK(test.value()->size() == 2);
  CHECK(test.value()->label(1) == 1);
  CHECK_THAT(ErrorOf(LoadCifar10(dir, "valid")), Contains("split must be 'train' or 'test', got 'valid'"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("CIFAR-10 errors name the file and the problem") {
  const std::string path = TempPath("cifar_bad.bin");
  CHECK_THAT(ErrorOf(LoadCifar10Files({path + ".none"})), Contains(path + ".none: no such file"));

  std::vector<uint8_t> bytes = CifarRecords(0, 2);
  bytes.resize(bytes.size() - 100);
  WriteFile(path, bytes);
  CHECK_THAT(ErrorOf(LoadCifar10Files({path})),
             Contains(path + ": size 6046 bytes is not a multiple of the CIFAR-10 record size 3073 (1 records and 2973 "
                             "bytes left over"));

  WriteFile(path, {});
  CHECK_THAT(ErrorOf(LoadCifar10Files({path})), Contains(path + ": empty file"));

  bytes = CifarRecords(0, 3);
  bytes[2 * kCifar10RecordBytes] = 10;
  WriteFile(path, bytes);
  CHECK_THAT(ErrorOf(LoadCifar10Files({path})), Contains(path + ": label 10 of record 2 (byte offset 6146)"));
  CHECK_THAT(ErrorOf(LoadCifar10Files({})), Contains("no files"));
  std::remove(path.c_str());
}

TEST_CASE("ByteImageDataset checks sizes and labels") {
  CHECK_THAT(ErrorOf(ByteImageDataset::Create(Shape{1, 2, 2}, std::vector<uint8_t>(7), {0, 1}, 10)),
             Contains("2 labels need 2 images of [1, 2, 2] (8 bytes), got 7 bytes"));
  CHECK_THAT(ErrorOf(ByteImageDataset::Create(Shape{1, 2, 2}, std::vector<uint8_t>(8), {0, 3}, 3)),
             Contains("label 3 of example 1 is not in [0, 3)"));
  CHECK_THAT(ErrorOf(ByteImageDataset::Create(Shape{4}, std::vector<uint8_t>(8), {0, 1}, 3)),
             Contains("[C, H, W], got [4]"));
}

TEST_CASE("ByteImageDataset sizes that overflow int64 are errors") {
  // 3 x 2^62 wraps to a negative numel; 4 images of 2^62 + 16 bytes wrap to 64.
  CHECK_THAT(ErrorOf(ByteImageDataset::Create(Shape{1, 3, int64_t{1} << 62}, {}, {}, 10)),
             Contains("images of [1, 3, 4611686018427387904] have more than 2^63 bytes each"));
  CHECK_THAT(ErrorOf(ByteImageDataset::Create(Shape{1, 1073807362, 4294705160}, std::vector<uint8_t>(64),
                                              {0, 1, 2, 3}, 10)),
             Contains("4 labels need 4 images of [1, 1073807362, 4294705160] (more than 2^63 bytes), got 64 bytes"));
}

TEST_CASE("A slice of a dataset is a dataset of its examples") {
  auto base = ByteImageDataset::Create(Shape{1, 1, 2}, {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3}, 4).value();
  auto slice = SliceDataset(base, 1, 3);
  REQUIRE(slice.ok());
  const Dataset& ds = **slice;
  CHECK(ds.size() == 2);
  CHECK(ds.input_spec() == base->input_spec());
  CHECK(ds.target_spec() == base->target_spec());
  CHECK(ds.num_classes() == 4);
  float pixels[2];
  int64_t label = -1;
  ds.Get(1, pixels, &label);  // base example 2
  CHECK(label == 2);
  CHECK(pixels[1] == Approx(5 / 255.0f));
  CHECK_THAT(ErrorOf(SliceDataset(base, 2, 5)),
             Contains("examples [2, 5) are not a non-empty part of a dataset of 4 examples"));
  CHECK_THAT(ErrorOf(SliceDataset(base, 2, 2)), Contains("examples [2, 2) are not"));
  CHECK_THAT(ErrorOf(SliceDataset(base, -1, 2)), Contains("examples [-1, 2) are not"));
  CHECK_THAT(ErrorOf(SliceDataset(nullptr, 0, 1)), Contains("no dataset"));
}

TEST_CASE("Channel statistics of a byte image dataset") {
  // Two 2-channel 1x2 images: channel 0 holds 0 and 255 (mean 1/2, std 1/2),
  // channel 1 is all 51 (0.2, std 0).
  auto ds = ByteImageDataset::Create(Shape{2, 1, 2}, {0, 255, 51, 51, 255, 0, 51, 51}, {0, 1}, 2);
  REQUIRE(ds.ok());
  auto stats = ComputeChannelStats(**ds);
  REQUIRE(stats.ok());
  CHECK(stats->mean[0] == Approx(0.5));
  CHECK(stats->std[0] == Approx(0.5));
  CHECK(stats->mean[1] == Approx(0.2));
  CHECK(stats->std[1] == Approx(0.0).margin(1e-6));

  SyntheticOptions tokens;
  tokens.input = {Shape{8}, DType::kI64};
  CHECK_THAT(ErrorOf(ComputeChannelStats(*SyntheticDataset::Create(tokens).value())),
             Contains("need f32 images [C, H, W], the dataset's inputs are [8] i64"));
}

TEST_CASE("Synthetic token examples: next tokens, or one class per example") {
  SyntheticOptions o;
  o.input = {Shape{6}, DType::kI64};
  o.num_classes = 5;
  o.seed = 3;
  auto next = SyntheticDataset::Create(o).value();
  o.class_target = true;
  auto classes = SyntheticDataset::Create(o).value();
  CHECK(next->target_spec() == ExampleSpec{Shape{6}, DType::kI64});
  CHECK(classes->target_spec() == ExampleSpec{Shape{}, DType::kI64});
  std::vector<int64_t> x(6), y(6), targets(6);
  int64_t label = -1;
  next->Get(2, x.data(), targets.data());
  classes->Get(2, y.data(), &label);
  CHECK(x == y);  // the same tokens
  for (size_t t = 0; t + 1 < x.size(); ++t) CHECK(targets[t] == x[t + 1]);
  CHECK(label == targets.back());
  CHECK((label >= 0 && label < 5));
  o.input = {Shape{1, 4, 4}, DType::kF32};
  CHECK_THAT(ErrorOf(SyntheticDataset::Create(o)), Contains("a class target per example is for token inputs"));
}

TEST_CASE("Synthetic images are a pure function of seed and index") {
  SyntheticOptions o;
  o.size = 100;
  o.input = {Shape{3, 5, 7}, DType::kF32};
  o.num_classes = 4;
  o.seed = 11;
  auto a = SyntheticDataset::Create(o).value();
  auto b = SyntheticDataset::Create(o).value();
  o.seed = 12;
  auto c = SyntheticDataset::Create(o).value();
  CHECK(a->target_spec() == ExampleSpec{Shape{}, DType::kI64});
  std::vector<float> x(105), y(105), z(105);
  int64_t lx, ly, lz;
  std::vector<int> label_counts(4, 0);
  for (int64_t i = 0; i < a->size(); ++i) {
    a->Get(i, x.data(), &lx);
    b->Get(i, y.data(), &ly);
    REQUIRE(x == y);
    REQUIRE(lx == ly);
    REQUIRE(lx >= 0);
    REQUIRE(lx < 4);
    label_counts[lx]++;
    for (float v : x) REQUIRE((v >= 0 && v <= 1));
  }
  for (int n : label_counts) CHECK(n > 10);  // every class drawn
  a->Get(3, x.data(), &lx);
  a->Get(4, y.data(), &ly);
  c->Get(3, z.data(), &lz);
  CHECK(x != y);  // examples differ
  CHECK(x != z);  // seeds differ
}

TEST_CASE("Synthetic tokens have next-token targets") {
  SyntheticOptions o;
  o.input = {Shape{16}, DType::kI64};
  o.num_classes = 50;
  auto ds = SyntheticDataset::Create(o).value();
  CHECK(ds->target_spec() == ExampleSpec{Shape{16}, DType::kI64});
  std::vector<int64_t> in(16), target(16);
  ds->Get(9, in.data(), target.data());
  for (int t = 0; t + 1 < 16; ++t) CHECK(target[t] == in[t + 1]);
  for (int t = 0; t < 16; ++t) CHECK((in[t] >= 0 && in[t] < 50 && target[t] >= 0 && target[t] < 50));

  o.input = {Shape{2, 8}, DType::kI64};
  CHECK_THAT(ErrorOf(SyntheticDataset::Create(o)), Contains("token inputs are i64 [T], got [2, 8] i64"));
  o.input = {Shape{8}, DType::kI32};
  CHECK_THAT(ErrorOf(SyntheticDataset::Create(o)), Contains("f32 or i64 tokens, got [8] i32"));
  o.input = {Shape{8}, DType::kI64};
  o.size = 0;
  CHECK_THAT(ErrorOf(SyntheticDataset::Create(o)), Contains("size must be >= 1, got 0"));
}

TEST_CASE("Text windows: character vocabulary and shifted targets") {
  const std::string path = TempPath("text.txt");
  // "héllo wörld\n" x 3: é and ö are two UTF-8 bytes each.
  std::string text;
  for (int i = 0; i < 3; ++i) text += "h\xc3\xa9llo w\xc3\xb6rld\n";
  WriteFile(path, std::vector<uint8_t>(text.begin(), text.end()));

  TextDatasetOptions o;
  o.seq_len = 5;
  auto ds = TokenStreamDataset::FromFile(path, o);
  REQUIRE(ds.status().ToString() == "OK");
  const Vocabulary& vocab = (*ds)->vocabulary();
  // Sorted code points: \n, ' ', d, h, l, o, r, w, é, ö.
  CHECK(vocab.size() == 10);
  CHECK(vocab.symbol(0) == U'\n');
  CHECK(vocab.symbol(8) == U'é');
  CHECK((*ds)->num_classes() == 10);
  CHECK((*ds)->input_spec() == ExampleSpec{Shape{5}, DType::kI64});
  CHECK((*ds)->target_spec() == ExampleSpec{Shape{5}, DType::kI64});
  // 36 characters, windows of 5 at stride 5 with one token after: (36 - 6) / 5 + 1.
  CHECK((*ds)->tokens().size() == 36);
  CHECK((*ds)->size() == 7);

  std::vector<int64_t> in(5), target(5);
  (*ds)->Get(1, in.data(), target.data());  // characters 5..9, targets 6..10
  CHECK(vocab.Decode(in).value() == " w\xc3\xb6rl");
  CHECK(vocab.Decode(target).value() == "w\xc3\xb6rld");
  CHECK(vocab.Encode("dh\xc3\xa9").value() == std::vector<int64_t>{2, 3, 8});
  CHECK_THAT(ErrorOf(vocab.Encode("hex")), Contains("character U+65 at byte offset 1 is not in the vocabulary"));
  CHECK_THAT(ErrorOf(vocab.Decode({3, 10})), Contains("token id 10 at position 1 is not in the vocabulary [0, 10)"));

  // Overlapping windows.
  o.stride = 1;
  auto dense = TokenStreamDataset::FromFile(path, o).value();
  CHECK(dense->size() == 31);
  dense->Get(30, in.data(), target.data());
  CHECK(vocab.Decode(target).value() == "\xc3\xb6rld\n");
  std::remove(path.c_str());
}

TEST_CASE("Text splits share the file's vocabulary") {
  const std::string path = TempPath("split.txt");
  const std::string text = "abcdefghijklmnopqrstuvwxyz0123456789xyz!";  // 40 characters, '!' only in the tail
  WriteFile(path, std::vector<uint8_t>(text.begin(), text.end()));
  TextDatasetOptions o;
  o.seq_len = 3;
  o.end_fraction = 0.75;
  auto train = TokenStreamDataset::FromFile(path, o).value();
  o.begin_fraction = 0.75;
  o.end_fraction = 1;
  auto valid = TokenStreamDataset::FromFile(path, o).value();
  CHECK(train->num_classes() == 37);
  CHECK(valid->num_classes() == 37);
  CHECK(train->tokens().size() == 30);
  CHECK(valid->tokens().size() == 10);
  CHECK(valid->vocabulary().Decode({valid->tokens().begin(), valid->tokens().end()}).value() == "456789xyz!");
  CHECK(train->size() == 9);  // (30 - 4) / 3 + 1
  CHECK(valid->size() == 3);  // (10 - 4) / 3 + 1

  o.seq_len = 10;
  CHECK_THAT(
      ErrorOf(TokenStreamDataset::FromFile(path, o)),
      Contains(path + ": tokens [30, 40) of 40 (fractions [0.75, 1)) are 10, too few for one window of seq_len 10"));
  o.begin_fraction = 0.5;
  o.end_fraction = 0.5;
  CHECK_THAT(ErrorOf(TokenStreamDataset::FromFile(path, o)), Contains("need 0 <= begin_fraction < end_fraction <= 1"));
  std::remove(path.c_str());
}

TEST_CASE("Text errors and byte-level reading") {
  const std::string path = TempPath("bytes.bin");
  CHECK_THAT(ErrorOf(TokenStreamDataset::FromFile(path + ".none", {})), Contains(path + ".none: no such file"));
  WriteFile(path, {});
  CHECK_THAT(ErrorOf(TokenStreamDataset::FromFile(path, {})), Contains(path + ": empty file"));

  // 0xff is never valid UTF-8; an overlong '/' (c0 af) and a lone
  // continuation byte are not either.
  for (const std::vector<uint8_t>& bad :
       {std::vector<uint8_t>{'a', 'b', 0xff, 'c'}, std::vector<uint8_t>{'a', 'b', 0xc0, 0xaf},
        std::vector<uint8_t>{'a', 'b', 0x80, 'c'}, std::vector<uint8_t>{'a', 'b', 0xe2, 0x82}}) {
    WriteFile(path, bad);
    CHECK_THAT(ErrorOf(TokenStreamDataset::FromFile(path, {})),
               Contains(path + ": invalid UTF-8 at byte offset 2 (TextLevel::kByte reads any file)"));
  }

  // Byte level reads anything: ids are the byte values.
  WriteFile(path, {'a', 'b', 0xff, 'c', 0x00, 'd'}, /*gzip=*/true);
  TextDatasetOptions o;
  o.level = TextLevel::kByte;
  o.seq_len = 2;
  auto ds = TokenStreamDataset::FromFile(path, o);
  REQUIRE(ds.status().ToString() == "OK");
  CHECK((*ds)->num_classes() == 256);
  CHECK((*ds)->size() == 2);
  std::vector<int64_t> in(2), target(2);
  (*ds)->Get(1, in.data(), target.data());
  CHECK(in == std::vector<int64_t>{0xff, 'c'});
  CHECK(target == std::vector<int64_t>{'c', 0});
  std::remove(path.c_str());
}

}  // namespace
}  // namespace loom
