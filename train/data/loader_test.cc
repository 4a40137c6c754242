#include "train/data/loader.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "train/data/synthetic.h"

namespace loom {
namespace {

using Catch::Matchers::Contains;

// Example i is a [C, H, W] image whose channel c holds i + 0.1 * c at
// every pixel, with label i: a batch row says which example it is.
class IndexImages : public Dataset {
 public:
  IndexImages(int64_t n, Shape shape, int64_t get_delay_us = 0) : n_(n), shape_(shape), delay_us_(get_delay_us) {}
  int64_t size() const override { return n_; }
  ExampleSpec input_spec() const override { return {shape_, DType::kF32}; }
  ExampleSpec target_spec() const override { return {Shape{}, DType::kI64}; }
  int64_t num_classes() const override { return n_; }
  void Get(int64_t index, void* input, int64_t* target) const override {
    if (delay_us_) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    const int64_t plane = shape_[1] * shape_[2];
    float* p = static_cast<float*>(input);
    for (int64_t c = 0; c < shape_[0]; ++c)
      std::fill(p + c * plane, p + (c + 1) * plane, static_cast<float>(index) + 0.1f * static_cast<float>(c));
    *target = index;
  }

 private:
  int64_t n_;
  Shape shape_;
  int64_t delay_us_;
};

// One hand-made 2-channel 2x2 image: channel 0 is [[1, 2], [3, 4]],
// channel 1 ten times that.
class TinyImage : public Dataset {
 public:
  int64_t size() const override { return 64; }
  ExampleSpec input_spec() const override { return {Shape{2, 2, 2}, DType::kF32}; }
  ExampleSpec target_spec() const override { return {Shape{}, DType::kI64}; }
  int64_t num_classes() const override { return 1; }
  void Get(int64_t, void* input, int64_t* target) const override {
    const float pixels[8] = {1, 2, 3, 4, 10, 20, 30, 40};
    std::memcpy(input, pixels, sizeof(pixels));
    *target = 0;
  }
};

std::unique_ptr<DataLoader> MakeLoader(std::shared_ptr<const Dataset> data, const DataLoaderOptions& o) {
  auto loader = DataLoader::Create(std::move(data), o);
  REQUIRE(loader.status().ToString() == "OK");
  return std::move(loader).value();
}

std::vector<Batch> Epoch(DataLoader& loader, int64_t epoch, int64_t skip = 0) {
  REQUIRE(loader.Start(epoch, skip).ok());
  std::vector<Batch> batches;
  Batch b;
  for (;;) {
    auto more = loader.Next(&b);
    REQUIRE(more.ok());
    if (!*more) break;
    batches.push_back(b);
  }
  return batches;
}

bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

bool SameBatch(const Batch& a, const Batch& b) {
  return SameTensor(a.input, b.input) && SameTensor(a.target, b.target) && a.valid == b.valid && a.epoch == b.epoch &&
         a.index == b.index && a.examples == b.examples;
}

std::vector<int64_t> Targets(const std::vector<Batch>& batches) {
  std::vector<int64_t> all;
  for (const Batch& b : batches)
    for (int64_t i = 0; i < b.valid; ++i) all.push_back(b.target.data<int64_t>()[i]);
  return all;
}

TEST_CASE("Unshuffled batches follow the dataset") {
  DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  auto loader = MakeLoader(std::make_shared<IndexImages>(12, Shape{2, 3, 3}), o);
  CHECK(loader->batches_per_epoch() == 3);
  CHECK(loader->input_shape() == Shape({4, 2, 3, 3}));
  CHECK(loader->target_shape() == Shape({4}));
  std::vector<Batch> batches = Epoch(*loader, 0);
  REQUIRE(batches.size() == 3);
  CHECK(Targets(batches) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const Batch& b = batches[1];
  CHECK(b.index == 1);
  CHECK(b.valid == 4);
  CHECK(b.examples == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(b.input.ScalarAt(2 * 18 + 9) == Approx(6.1));  // row 2, channel 1
  // The epoch is over until the next Start.
  Batch more;
  CHECK_FALSE(loader->Next(&more).value());
  CHECK_FALSE(loader->Next(&more).value());
}

TEST_CASE("Shuffled order is a pure function of seed and epoch") {
  DataLoaderOptions o;
  o.batch_size = 10;
  o.seed = 5;
  auto data = std::make_shared<IndexImages>(100, Shape{1, 1, 1});
  auto a = MakeLoader(data, o);
  auto b = MakeLoader(data, o);
  const std::vector<int64_t> epoch0 = Targets(Epoch(*a, 0));
  const std::vector<int64_t> epoch1 = Targets(Epoch(*a, 1));
  CHECK(Targets(Epoch(*b, 1)) == epoch1);  // another loader, epochs asked in another order
  CHECK(Targets(Epoch(*b, 0)) == epoch0);
  CHECK(Targets(Epoch(*a, 0)) == epoch0);  // and again
  CHECK(epoch0 != epoch1);
  CHECK(a->EpochOrder(1) == epoch1);
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i) REQUIRE(sorted[i] == i);  // a permutation
  int in_place = 0;
  for (int64_t i = 0; i < 100; ++i) in_place += epoch0[i] == i;
  CHECK(in_place < 10);

  o.seed = 6;
  CHECK(Targets(Epoch(*MakeLoader(data, o), 0)) != epoch0);
}

TEST_CASE("Start with skip_batches is the tail of the full epoch") {
  DataLoaderOptions o;
  o.batch_size = 8;
  o.crop_padding = 1;
  o.random_flip = true;
  o.drop_last = false;
  auto data = std::make_shared<IndexImages>(45, Shape{2, 4, 4});
  for (int prefetch : {0, 2}) {
    o.prefetch = prefetch;
    auto loader = MakeLoader(data, o);
    const std::vector<Batch> full = Epoch(*loader, 3);
    REQUIRE(full.size() == 6);
    for (int64_t skip : {1, 4, 5, 6}) {
      const std::vector<Batch> tail = Epoch(*loader, 3, skip);
      REQUIRE(tail.size() == full.size() - skip);
      for (size_t i = 0; i < tail.size(); ++i) CHECK(SameBatch(tail[i], full[skip + i]));
    }
  }
}

TEST_CASE("Start in mid-epoch drops the batches prepared before") {
  DataLoaderOptions o;
  o.batch_size = 4;
  o.prefetch = 3;
  // Slow examples (1 ms each), so the thread is inside a batch of epoch 0
  // when Start(2, 7) comes, and that batch must not show up in epoch 2.
  auto data = std::make_shared<IndexImages>(40, Shape{1, 2, 2}, 1000);
  auto reference = MakeLoader(data, o);
  const std::vector<Batch> epoch2 = Epoch(*reference, 2);
  auto loader = MakeLoader(data, o);
  REQUIRE(loader->Start(0).ok());
  Batch b;
  REQUIRE(loader->Next(&b).value());
  REQUIRE(loader->Next(&b).value());
  const std::vector<Batch> tail = Epoch(*loader, 2, 7);
  REQUIRE(tail.size() == 3);
  for (size_t i = 0; i < tail.size(); ++i) CHECK(SameBatch(tail[i], epoch2[7 + i]));
}

TEST_CASE("The last partial batch is dropped or padded") {
  DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  auto data = std::make_shared<IndexImages>(10, Shape{1, 2, 2});
  CHECK(Epoch(*MakeLoader(data, o), 0).size() == 2);

  o.drop_last = false;
  o.pad_target = -7;
  auto loader = MakeLoader(data, o);
  CHECK(loader->batches_per_epoch() == 3);
  std::vector<Batch> batches = Epoch(*loader, 0);
  REQUIRE(batches.size() == 3);
  const Batch& last = batches[2];
  CHECK(last.valid == 2);
  CHECK(last.examples == std::vector<int64_t>{8, 9});
  CHECK(last.input.shape() == Shape({4, 1, 2, 2}));
  CHECK(last.target.ToDoubleVector() == std::vector<double>{8, 9, -7, -7});
  for (int64_t i = 0; i < 16; ++i) CHECK(last.input.ScalarAt(i) == (i < 8 ? 8 + i / 4 : 0));

  // Token targets [B, T] pad every position.
  SyntheticOptions so;
  so.size = 3;
  so.input = {Shape{5}, DType::kI64};
  so.num_classes = 7;
  o.pad_target = -100;
  auto tokens = MakeLoader(SyntheticDataset::Create(so).value(), o);
  CHECK(tokens->input_shape() == Shape({4, 5}));
  CHECK(tokens->input_dtype() == DType::kI64);
  CHECK(tokens->target_shape() == Shape({4, 5}));
  std::vector<Batch> token_batches = Epoch(*tokens, 0);
  REQUIRE(token_batches.size() == 1);
  const Batch& tb = token_batches[0];
  CHECK(tb.valid == 3);
  for (int64_t t = 0; t < 5; ++t) {
    CHECK(tb.input.data<int64_t>()[3 * 5 + t] == 0);
    CHECK(tb.target.data<int64_t>()[3 * 5 + t] == -100);
    CHECK(tb.target.data<int64_t>()[2 * 5 + t] >= 0);
  }
}

TEST_CASE("Per-channel normalisation") {
  DataLoaderOptions o;
  o.batch_size = 2;
  o.shuffle = false;
  o.mean = {1.0f, 2.0f, 4.0f};
  o.std = {0.5f, 2.0f, 4.0f};
  auto loader = MakeLoader(std::make_shared<IndexImages>(2, Shape{3, 1, 2}), o);
  std::vector<Batch> batches = Epoch(*loader, 0);
  // Example 1: channels hold 1, 1.1, 1.2.
  const std::vector<double> got = batches[0].input.ToDoubleVector();
  const double want[] = {(1.0 - 1) / 0.5, (1.1 - 2) / 2, (1.2 - 4) / 4};
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 2; ++p) CHECK(got[6 + c * 2 + p] == Approx(want[c]));

  o.mean = {0.5f};
  o.std = {0.25f};
  batches = Epoch(*MakeLoader(std::make_shared<IndexImages>(2, Shape{3, 1, 2}), o), 0);
  CHECK(batches[0].input.ScalarAt(6 + 5) == Approx((1.2 - 0.5) / 0.25));
}

// The 9 crops of [[1, 2], [3, 4]] zero-padded by 1, by (top, left) offset.
const float kCrops[9][4] = {
    {0, 0, 0, 1}, {0, 0, 1, 2}, {0, 0, 2, 0},  // top 0
    {0, 1, 0, 3}, {1, 2, 3, 4}, {2, 0, 4, 0},  // top 1
    {0, 3, 0, 0}, {3, 4, 0, 0}, {4, 0, 0, 0},  // top 2
};

TEST_CASE("Random crop and flip give the expected pixels") {
  DataLoaderOptions o;
  o.batch_size = 64;
  o.crop_padding = 1;
  o.random_flip = true;
  o.prefetch = 0;
  auto loader = MakeLoader(std::make_shared<TinyImage>(), o);
  CHECK(loader->input_shape() == Shape({64, 2, 2, 2}));
  std::map<std::pair<int, bool>, int> seen;  // (crop, flipped) -> count
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    for (const Batch& b : Epoch(*loader, epoch)) {
      for (int64_t r = 0; r < b.valid; ++r) {
        const float* x = b.input.data<float>() + r * 8;
        int matches = 0;
        for (int k = 0; k < 9; ++k) {
          for (bool flip : {false, true}) {
            const float* c = kCrops[k];
            const float want[4] = {flip ? c[1] : c[0], flip ? c[0] : c[1], flip ? c[3] : c[2], flip ? c[2] : c[3]};
            bool same = true;
            for (int i = 0; i < 4; ++i) same = same && x[i] == want[i] && x[4 + i] == 10 * want[i];  // both channels
            if (same) {
              ++matches;
              seen[{k, flip}]++;
            }
          }
        }
        REQUIRE(matches == 1);  // each row is one of the 18 (distinct) crops
      }
    }
  }
  // 256 draws cover every offset and both flips.
  for (int k = 0; k < 9; ++k) {
    CHECK(seen[{k, false}] > 0);
    CHECK(seen[{k, true}] > 0);
  }

  // Padding wider than the crop (windows may lie wholly in the padding),
  // against a direct reading of RandomCrop: the crop of the zero-padded
  // image at some (top, left), flipped or not.
  o.crop_padding = 3;
  o.crop_height = 3;
  o.crop_width = 1;
  auto wide = MakeLoader(std::make_shared<TinyImage>(), o);
  auto padded = [](int64_t c, int64_t y, int64_t x) -> float {  // the 8x8 padded image
    const float pixels[8] = {1, 2, 3, 4, 10, 20, 30, 40};
    y -= 3;
    x -= 3;
    return y >= 0 && y < 2 && x >= 0 && x < 2 ? pixels[c * 4 + y * 2 + x] : 0.0f;
  };
  std::set<std::vector<float>> candidates;
  for (int64_t top = 0; top <= 5; ++top)
    for (int64_t left = 0; left <= 7; ++left) {  // a 1-wide crop looks the same flipped
      std::vector<float> crop;
      for (int64_t c = 0; c < 2; ++c)
        for (int64_t y = 0; y < 3; ++y) crop.push_back(padded(c, top + y, left));
      candidates.insert(crop);
    }
  std::set<std::vector<float>> got;
  for (int64_t epoch = 0; epoch < 4; ++epoch)
    for (const Batch& b : Epoch(*wide, epoch))
      for (int64_t r = 0; r < b.valid; ++r)
        got.insert(std::vector<float>(b.input.data<float>() + r * 6, b.input.data<float>() + r * 6 + 6));
  for (const std::vector<float>& crop : got) CHECK(candidates.count(crop) == 1);
  CHECK(got.size() == candidates.size());  // 256 draws find all 9 distinct crops

  // A crop smaller than the image, without padding: windows of the image.
  o.crop_padding = 0;
  o.crop_height = 1;
  o.crop_width = 2;
  o.random_flip = false;
  auto rows = MakeLoader(std::make_shared<TinyImage>(), o);
  CHECK(rows->input_shape() == Shape({64, 2, 1, 2}));
  std::set<std::vector<double>> windows;
  for (const Batch& b : Epoch(*rows, 0))
    for (int64_t r = 0; r < b.valid; ++r) {
      std::vector<double> v(b.input.data<float>() + r * 4, b.input.data<float>() + r * 4 + 4);
      windows.insert(v);
    }
  CHECK(windows == std::set<std::vector<double>>{{1, 2, 10, 20}, {3, 4, 30, 40}});
}

TEST_CASE("Augmentation is a pure function of seed, epoch and example") {
  DataLoaderOptions o;
  o.batch_size = 5;
  o.crop_padding = 2;
  o.random_flip = true;
  o.seed = 9;
  o.shuffle = false;
  // Examples as the synthetic dataset makes them: every pixel different.
  SyntheticOptions so;
  so.size = 20;
  so.input = {Shape{3, 6, 6}, DType::kF32};
  auto data = SyntheticDataset::Create(so).value();
  auto ordered = MakeLoader(data, o);
  o.shuffle = true;
  o.prefetch = 0;
  auto shuffled = MakeLoader(data, o);
  // Per example: its augmented pixels, wherever its batch and row.
  auto by_example = [](const std::vector<Batch>& batches) {
    std::map<int64_t, std::vector<double>> rows;
    for (const Batch& b : batches)
      for (int64_t r = 0; r < b.valid; ++r)
        rows[b.examples[r]] =
            std::vector<double>(b.input.data<float>() + r * 108, b.input.data<float>() + (r + 1) * 108);
    return rows;
  };
  const auto epoch1 = by_example(Epoch(*ordered, 1));
  CHECK(by_example(Epoch(*shuffled, 1)) == epoch1);
  const auto epoch2 = by_example(Epoch(*shuffled, 2));
  int differ = 0;
  for (const auto& [example, pixels] : epoch2) differ += pixels != epoch1.at(example);
  CHECK(differ >= 15);  // 50 crops x 2 flips: few repeats between epochs

  o.seed = 10;
  int other_seed_differs = 0;
  for (const auto& [example, pixels] : by_example(Epoch(*MakeLoader(data, o), 1)))
    other_seed_differs += pixels != epoch1.at(example);
  CHECK(other_seed_differs >= 15);
}

TEST_CASE("Prefetching gives the same batches as preparing them in Next") {
  DataLoaderOptions o;
  o.batch_size = 6;
  o.drop_last = false;
  o.crop_height = 3;
  o.crop_width = 3;
  o.crop_padding = 1;
  o.random_flip = true;
  o.mean = {0.5f, 0.4f};
  o.std = {0.2f, 0.3f};
  auto data = std::make_shared<IndexImages>(31, Shape{2, 4, 4});
  o.prefetch = 0;
  auto sync = MakeLoader(data, o);
  for (int prefetch : {1, 4}) {
    o.prefetch = prefetch;
    auto async = MakeLoader(data, o);
    for (int64_t epoch : {0, 1}) {
      const std::vector<Batch> want = Epoch(*sync, epoch), got = Epoch(*async, epoch);
      REQUIRE(want.size() == got.size());
      for (size_t i = 0; i < want.size(); ++i) CHECK(SameBatch(want[i], got[i]));
    }
  }
}

TEST_CASE("The prefetch queue fills up to its bound") {
  DataLoaderOptions o;
  o.batch_size = 2;
  o.prefetch = 3;
  auto loader = MakeLoader(std::make_shared<IndexImages>(100, Shape{1, 2, 2}), o);
  CHECK(loader->ready_batches() == 0);  // nothing before Start
  REQUIRE(loader->Start(0).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (loader->ready_batches() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(loader->ready_batches() == 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(loader->ready_batches() == 3);  // and no further
  const double waited = loader->wait_seconds();
  Batch b;
  REQUIRE(loader->Next(&b).value());
  CHECK(loader->wait_seconds() == waited);  // the batch was ready: no wait
}

TEST_CASE("Destroying a loader early does not hang") {
  DataLoaderOptions o;
  o.batch_size = 4;
  o.prefetch = 2;
  // Get sleeps 2 ms, so the thread is usually inside a batch when the loader goes.
  auto slow = std::make_shared<IndexImages>(400, Shape{1, 2, 2}, 2000);
  const auto start = std::chrono::steady_clock::now();
  { auto never_started = MakeLoader(slow, o); }
  {
    auto queue_full = MakeLoader(slow, o);
    REQUIRE(queue_full->Start(0).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  {
    auto mid_batch = MakeLoader(slow, o);
    REQUIRE(mid_batch->Start(0).ok());
    Batch b;
    REQUIRE(mid_batch->Next(&b).value());
  }
  {
    auto restarted = MakeLoader(slow, o);
    REQUIRE(restarted->Start(0).ok());
    REQUIRE(restarted->Start(1, 3).ok());
  }
  // Each teardown waits for at most the batch in hand (4 x 2 ms).
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
}

TEST_CASE("Loader errors") {
  auto images = std::make_shared<IndexImages>(10, Shape{3, 4, 4});
  auto error = [](std::shared_ptr<const Dataset> data, const DataLoaderOptions& o) {
    auto l = DataLoader::Create(std::move(data), o);
    return l.ok() ? std::string() : l.status().message();
  };
  DataLoaderOptions o;
  o.batch_size = 0;
  CHECK_THAT(error(images, o), Contains("batch_size must be >= 1, got 0"));
  o.batch_size = 11;
  CHECK_THAT(error(images, o), Contains("batch_size 11 is larger than the dataset (10 examples) and drop_last is set"));
  o.batch_size = 4;
  o.prefetch = -1;
  CHECK_THAT(error(images, o), Contains("prefetch must be >= 0, got -1"));
  o.prefetch = 2;
  CHECK_THAT(error(std::make_shared<IndexImages>(0, Shape{3, 4, 4}), o), Contains("the dataset is empty"));
  CHECK_THAT(error(nullptr, o), Contains("no dataset"));

  o.mean = {0.5f, 0.5f};
  o.std = {0.5f, 0.5f};
  CHECK_THAT(error(images, o),
             Contains("mean and std need 1 or 3 values each (one per channel of [3, 4, 4]), got 2 and 2"));
  o.mean = {0.5f, 0.5f, 0.5f};
  o.std = {0.5f, 0.0f, 0.5f};
  CHECK_THAT(error(images, o), Contains("channel 1 has mean 0.5 and std 0; std must be finite and > 0"));
  o.mean.clear();
  o.std.clear();
  o.crop_height = 7;
  o.crop_padding = 1;
  CHECK_THAT(error(images, o), Contains("crop 7x4 is larger than the image [3, 4, 4] padded by 1 on each side"));
  o.crop_height = 0;
  o.crop_padding = -1;
  CHECK_THAT(error(images, o), Contains("must be >= 0"));
  o.crop_padding = 0;
  o.random_flip = true;
  SyntheticOptions so;
  so.input = {Shape{8}, DType::kI64};
  CHECK_THAT(error(SyntheticDataset::Create(so).value(), o),
             Contains("crop, flip and normalisation apply to f32 images [C, H, W], the dataset's inputs are [8] i64"));

  o.random_flip = false;
  auto loader = MakeLoader(images, o);
  Batch b;
  auto early = loader->Next(&b);
  REQUIRE_FALSE(early.ok());
  CHECK_THAT(early.status().message(), Contains("Next called before Start"));
  CHECK_THAT(loader->Start(0, 3).message(), Contains("skip_batches 3 is outside [0, 2]"));
  CHECK_THAT(loader->Start(-1).message(), Contains("epoch must be >= 0, got -1"));
  // Skipping the whole epoch is allowed: it is over at once.
  REQUIRE(loader->Start(0, 2).ok());
  CHECK_FALSE(loader->Next(&b).value());
}

}  // namespace
}  // namespace loom
