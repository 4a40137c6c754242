// The generated point clouds: the surface sampler puts points on each
// primitive with area-uniform density; the dataset is deterministic,
// balanced, normalised and thread-safe, and its segmentation examples mix
// part kinds.
#include "train/data/point_cloud.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>

namespace loom {
namespace {

using Catch::Matchers::Contains;

int64_t Kind(const std::string& name) {
  const auto names = PointCloudDataset::ClassNames(false);
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int64_t>(i);
  FAIL("no primitive " << name);
  return -1;
}

double Fraction(const std::vector<Point3>& points, bool (*pred)(const Point3&)) {
  int64_t hits = 0;
  for (const Point3& p : points) hits += pred(p) ? 1 : 0;
  return static_cast<double>(hits) / points.size();
}

// 20000 points: a fraction's standard deviation is at most 0.0035.
constexpr int64_t kSamples = 20000;
constexpr double kTolerance = 0.015;
constexpr double kPi = 3.14159265358979323846;

TEST_CASE("sphere points lie on the scaled sphere, area-uniformly") {
  for (const Point3& p : SamplePrimitiveSurface(Kind("sphere"), {2, 1, 0.5}, 1000, 1))
    CHECK(std::pow(p[0] / 2, 2) + std::pow(p[1] / 1, 2) + std::pow(p[2] / 0.5, 2) == Approx(1).epsilon(1e-9));
  // Archimedes: the cap z > 0.5 of the unit sphere is a quarter of its area.
  const auto points = SamplePrimitiveSurface(Kind("sphere"), {1, 1, 1}, kSamples, 2);
  CHECK(Fraction(points, [](const Point3& p) { return p[2] > 0.5; }) == Approx(0.25).margin(kTolerance));
  CHECK(Fraction(points, [](const Point3& p) { return p[0] < -0.5; }) == Approx(0.25).margin(kTolerance));
}

TEST_CASE("a curved patch under an uneven scale is still area-uniform") {
  // A dome squashed to height 0.01 is nearly two unit disks: half the points
  // on each, and uniform over the disk (half of them within radius
  // 1/sqrt(2)). The unscaled dome's equal-area map would put only 29% there:
  // the rejection step corrects for the scale.
  const auto points = SamplePrimitiveSurface(Kind("dome"), {1, 1, 0.01}, kSamples, 10);
  int64_t cap = 0, inner = 0;
  for (const Point3& p : points)
    if (p[2] > 0) ++cap, inner += std::hypot(p[0], p[1]) < std::sqrt(0.5) ? 1 : 0;
  CHECK(static_cast<double>(cap) / kSamples == Approx(0.5).margin(kTolerance));
  CHECK(static_cast<double>(inner) / cap == Approx(0.5).margin(2 * kTolerance));
}

TEST_CASE("box faces get points in proportion to their scaled areas") {
  // [-2, 2] x [-1, 1] x [-1, 1]: the two x faces are 4 each, the four others 8.
  const auto points = SamplePrimitiveSurface(Kind("box"), {2, 1, 1}, kSamples, 3);
  for (const Point3& p : points) {
    const double on_face = std::max({std::abs(p[0]) / 2, std::abs(p[1]), std::abs(p[2])});
    CHECK(on_face == Approx(1).epsilon(1e-12));
  }
  CHECK(Fraction(points, [](const Point3& p) { return std::abs(p[0]) == 2; }) == Approx(0.2).margin(kTolerance));
  CHECK(Fraction(points, [](const Point3& p) { return p[2] == 1; }) == Approx(0.2).margin(kTolerance));
}

TEST_CASE("cylinder, cone, torus and dome points lie on their surfaces with area-uniform density") {
  {
    // Radius 1, height 2: the caps are 2 pi of the 6 pi total.
    const auto points = SamplePrimitiveSurface(Kind("cylinder"), {1, 1, 1}, kSamples, 4);
    for (const Point3& p : points) {
      const double r = std::hypot(p[0], p[1]);
      CHECK((std::abs(r - 1) < 1e-9 || (std::abs(std::abs(p[2]) - 1) < 1e-12 && r <= 1 + 1e-12)));
    }
    CHECK(Fraction(points, [](const Point3& p) { return std::abs(std::abs(p[2]) - 1) < 1e-12; }) ==
          Approx(1.0 / 3).margin(kTolerance));
    // Uniform on a cap: half its area lies within radius 1/sqrt(2).
    int64_t cap = 0, inner = 0;
    for (const Point3& p : points)
      if (std::abs(std::abs(p[2]) - 1) < 1e-12) ++cap, inner += std::hypot(p[0], p[1]) < std::sqrt(0.5) ? 1 : 0;
    CHECK(static_cast<double>(inner) / cap == Approx(0.5).margin(2 * kTolerance));
  }
  {
    // Base pi, lateral surface pi * sqrt(5); the lower half of the lateral
    // surface (z < 0) holds 3/4 of its area.
    const auto points = SamplePrimitiveSurface(Kind("cone"), {1, 1, 1}, kSamples, 5);
    int64_t lateral = 0, lower = 0;
    for (const Point3& p : points) {
      const bool base = std::abs(p[2] + 1) < 1e-12;
      if (!base) {
        CHECK(std::hypot(p[0], p[1]) == Approx((1 - p[2]) / 2).margin(1e-9));
        ++lateral, lower += p[2] < 0 ? 1 : 0;
      }
    }
    CHECK(1 - static_cast<double>(lateral) / kSamples == Approx(1 / (1 + std::sqrt(5.0))).margin(kTolerance));
    CHECK(static_cast<double>(lower) / lateral == Approx(0.75).margin(kTolerance));
  }
  {
    // Major radius 1, minor 0.4: the outer half (farther than 1 from the
    // axis) holds (pi + 2 * 0.4) / (2 pi) of the area.
    const auto points = SamplePrimitiveSurface(Kind("torus"), {1, 1, 1}, kSamples, 6);
    for (const Point3& p : points)
      CHECK(std::pow(std::hypot(p[0], p[1]) - 1, 2) + p[2] * p[2] == Approx(0.16).epsilon(1e-9));
    CHECK(Fraction(points, [](const Point3& p) { return std::hypot(p[0], p[1]) > 1; }) ==
          Approx((kPi + 0.8) / (2 * kPi)).margin(kTolerance));
  }
  {
    // Half-sphere 2 pi, base pi.
    const auto points = SamplePrimitiveSurface(Kind("dome"), {1, 1, 1}, kSamples, 7);
    for (const Point3& p : points) {
      const double r = std::sqrt(p[0] * p[0] + p[1] * p[1] + p[2] * p[2]);
      CHECK((std::abs(r - 1) < 1e-9 || (p[2] == 0 && r <= 1 + 1e-12)));
      CHECK(p[2] >= 0);
    }
    CHECK(Fraction(points, [](const Point3& p) { return p[2] == 0; }) == Approx(1.0 / 3).margin(kTolerance));
  }
}

TEST_CASE("pyramid and octahedron points lie on their faces") {
  for (const Point3& p : SamplePrimitiveSurface(Kind("octahedron"), {1, 1, 1}, 1000, 8))
    CHECK(std::abs(p[0]) + std::abs(p[1]) + std::abs(p[2]) == Approx(1).epsilon(1e-12));
  // Base 4, each side sqrt(5): the base holds 4 / (4 + 4 sqrt(5)).
  const auto points = SamplePrimitiveSurface(Kind("pyramid"), {1, 1, 1}, kSamples, 9);
  for (const Point3& p : points) {
    const bool base = p[2] == -1;
    if (!base) CHECK(std::max(std::abs(p[0]), std::abs(p[1])) == Approx((1 - p[2]) / 2).margin(1e-12));
  }
  CHECK(Fraction(points, [](const Point3& p) { return p[2] == -1; }) ==
        Approx(1 / (1 + std::sqrt(5.0))).margin(kTolerance));
}

std::shared_ptr<PointCloudDataset> Make(PointCloudOptions o) {
  auto d = PointCloudDataset::Create(o);
  REQUIRE(d.ok());
  return *d;
}

struct Example {
  std::vector<float> points;
  std::vector<int64_t> target;
};

Example GetExample(const Dataset& d, int64_t index) {
  Example e{std::vector<float>(d.input_spec().shape.numel()), std::vector<int64_t>(d.target_spec().shape.numel())};
  d.Get(index, e.points.data(), e.target.data());
  return e;
}

TEST_CASE("examples are a function of (options, index)") {
  PointCloudOptions o;
  o.num_points = 64;
  o.num_examples = 20;
  for (bool segmentation : {false, true}) {
    INFO("segmentation " << segmentation);
    o.segmentation = segmentation;
    auto a = Make(o), b = Make(o);
    for (int64_t i : {0, 7, 19}) {
      const Example x = GetExample(*a, i), y = GetExample(*b, i), again = GetExample(*a, i);
      CHECK(std::memcmp(x.points.data(), y.points.data(), x.points.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(x.points.data(), again.points.data(), x.points.size() * sizeof(float)) == 0);
      CHECK(x.target == y.target);
    }
    CHECK(GetExample(*a, 0).points != GetExample(*a, 1).points);
    PointCloudOptions other = o;
    other.seed = 2;
    CHECK(GetExample(*Make(other), 3).points != GetExample(*a, 3).points);
  }
}

TEST_CASE("Get from two threads at once gives what one thread gets") {
  PointCloudOptions o;
  o.num_points = 128;
  o.num_examples = 40;
  o.segmentation = true;
  auto d = Make(o);
  std::vector<Example> sequential, parallel(40);
  for (int64_t i = 0; i < 40; ++i) sequential.push_back(GetExample(*d, i));
  auto half = [&](int64_t begin) {
    for (int64_t i = begin; i < 40; i += 2) parallel[i] = GetExample(*d, i);
  };
  std::thread t0(half, 0), t1(half, 1);
  t0.join();
  t1.join();
  for (int64_t i = 0; i < 40; ++i) {
    CHECK(parallel[i].points == sequential[i].points);
    CHECK(parallel[i].target == sequential[i].target);
  }
}

TEST_CASE("classification examples: [3, N] f32 clouds, centred in the unit ball, balanced classes") {
  PointCloudOptions o;
  o.num_points = 256;
  o.num_examples = 95;
  o.noise = 0;
  auto d = Make(o);
  const int64_t classes = static_cast<int64_t>(PointCloudDataset::ClassNames(false).size());
  CHECK(classes >= 8);
  CHECK(d->num_classes() == classes);
  CHECK(d->size() == 95);
  CHECK(d->input_spec() == ExampleSpec{Shape{3, 256}, DType::kF32});
  CHECK(d->target_spec() == ExampleSpec{Shape{}, DType::kI64});
  std::map<int64_t, int64_t> counts;
  std::vector<double> extent_ratio_sum(classes, 0.0);
  for (int64_t i = 0; i < d->size(); ++i) {
    const Example e = GetExample(*d, i);
    REQUIRE(e.target[0] >= 0);
    REQUIRE(e.target[0] < classes);
    ++counts[e.target[0]];
    double mean[3] = {0, 0, 0}, largest = 0;
    for (int64_t n = 0; n < 256; ++n) {
      double r2 = 0;
      for (int c = 0; c < 3; ++c) {
        mean[c] += e.points[c * 256 + n] / 256.0;
        r2 += std::pow(e.points[c * 256 + n], 2);
      }
      largest = std::max(largest, std::sqrt(r2));
    }
    INFO("example " << i);
    for (double m : mean) CHECK(std::abs(m) < 1e-5);
    CHECK(largest == Approx(1).epsilon(1e-5));
  }
  // 95 = 9 full runs of 10 classes and 5 more: every class 9 or 10 times.
  REQUIRE(counts.size() == static_cast<size_t>(classes));
  for (auto [label, count] : counts) CHECK((count == 9 || count == 10));
}

TEST_CASE("jitter moves every coordinate by about `noise`") {
  PointCloudOptions o;
  o.num_points = 512;
  o.num_examples = 3;
  o.noise = 0;
  PointCloudOptions noisy = o;
  noisy.noise = 0.01;
  const Example clean = GetExample(*Make(o), 2), jittered = GetExample(*Make(noisy), 2);
  CHECK(clean.target == jittered.target);
  double sum2 = 0;
  for (size_t i = 0; i < clean.points.size(); ++i) sum2 += std::pow(jittered.points[i] - clean.points[i], 2);
  CHECK(std::sqrt(sum2 / clean.points.size()) == Approx(0.01).epsilon(0.15));
}

TEST_CASE("segmentation examples: a part label per point, 2-4 part kinds each") {
  PointCloudOptions o;
  o.num_points = 200;
  o.num_examples = 60;
  o.segmentation = true;
  o.noise = 0;
  auto d = Make(o);
  const int64_t kinds = static_cast<int64_t>(PointCloudDataset::ClassNames(true).size());
  CHECK(d->num_classes() == kinds);
  CHECK(d->input_spec() == ExampleSpec{Shape{3, 200}, DType::kF32});
  CHECK(d->target_spec() == ExampleSpec{Shape{200}, DType::kI64});
  std::set<int64_t> part_counts, kinds_seen;
  for (int64_t i = 0; i < d->size(); ++i) {
    INFO("example " << i);
    const Example e = GetExample(*d, i);
    std::set<int64_t> labels;
    for (int64_t label : e.target) {
      REQUIRE(label >= 0);
      REQUIRE(label < kinds);
      labels.insert(label);
    }
    CHECK(labels.size() >= 2);
    CHECK(labels.size() <= 4);
    part_counts.insert(static_cast<int64_t>(labels.size()));
    kinds_seen.insert(labels.begin(), labels.end());
    // Labels are not in blocks: the points come shuffled.
    int64_t changes = 0;
    for (size_t n = 1; n < e.target.size(); ++n) changes += e.target[n] != e.target[n - 1];
    CHECK(changes > static_cast<int64_t>(labels.size()));
    double largest = 0;
    for (int64_t n = 0; n < 200; ++n)
      largest = std::max(largest, std::sqrt(std::pow(e.points[n], 2) + std::pow(e.points[200 + n], 2) +
                                            std::pow(e.points[400 + n], 2)));
    CHECK(largest == Approx(1).epsilon(1e-5));
  }
  CHECK(part_counts == std::set<int64_t>{2, 3, 4});
  CHECK(static_cast<int64_t>(kinds_seen.size()) == kinds);
}

TEST_CASE("bad options are errors that name the option") {
  auto error = [](PointCloudOptions o) {
    auto d = PointCloudDataset::Create(o);
    REQUIRE(!d.ok());
    return d.status().ToString();
  };
  PointCloudOptions o;
  o.num_points = 0;
  CHECK_THAT(error(o), Contains("num_points") && Contains("got 0"));
  o = {};
  o.num_points = 3;
  o.segmentation = true;
  CHECK_THAT(error(o), Contains("num_points") && Contains("segmentation"));
  o = {};
  o.num_examples = -1;
  CHECK_THAT(error(o), Contains("num_examples") && Contains("-1"));
  o = {};
  o.noise = -0.5;
  CHECK_THAT(error(o), Contains("noise") && Contains("-0.5"));
  o = {};
  o.noise = std::nan("");
  CHECK_THAT(error(o), Contains("noise"));
  o = {};
  o.num_points = 3;
  CHECK(PointCloudDataset::Create(o).ok());  // classification takes any positive count
}

}  // namespace
}  // namespace loom
