#include "train/data/point_cloud.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "core/rng.h"

namespace loom {
namespace {

constexpr uint64_t kExampleStream = 0x50434c44;     // "PCLD": an example's draws
constexpr uint64_t kClassOrderStream = 0x50434c4f;  // "PCLO": the class order of a run of indices
constexpr int64_t kMinParts = 2, kMaxParts = 4;
constexpr double kPi = 3.14159265358979323846;
constexpr double kMinScale = 0.5, kMaxScale = 1.5;          // per axis, classification
constexpr double kMinPartScale = 0.4, kMaxPartScale = 1.0;  // per axis, segmentation parts

// A piece of a primitive's surface: (s, t) in [0, 1)^2 -> a point. The
// canonical patches are equal-area maps where that is easy (sqrt for disks
// and triangles, z uniform on spheres), so that the rejection step below
// mostly accepts; only the per-axis scale (and the torus) make the area
// element vary.
using Patch = std::function<Point3(double, double)>;

struct Primitive {
  std::string name;
  std::vector<Patch> patches;
};

Point3 Polar(double radius, double angle, double z) {
  return {radius * std::cos(angle), radius * std::sin(angle), z};
}

// The disk of `radius` in the plane z = `z`.
Patch Disk(double radius, double z) {
  return [=](double s, double t) { return Polar(radius * std::sqrt(s), 2 * kPi * t, z); };
}

// The spherical cap of `radius` around +z (or -z when `sign` is -1) from
// the pole down to `polar_end` radians, centred at (0, 0, z0); the height
// along the axis is uniform in s (Archimedes: equal heights, equal areas).
Patch SphereCap(double radius, double polar_end, double z0, double sign) {
  const double lowest = std::cos(polar_end);
  return [=](double s, double t) {
    const double cos_theta = 1 - s * (1 - lowest);
    const double sin_theta = std::sqrt(std::max(0.0, 1 - cos_theta * cos_theta));
    return Polar(radius * sin_theta, 2 * kPi * t, z0 + sign * radius * cos_theta);
  };
}

// Triangle abc: sqrt(s) runs from a to the edge bc, t along it.
Patch Triangle(Point3 a, Point3 b, Point3 c) {
  return [=](double s, double t) {
    const double r = std::sqrt(s);
    Point3 p;
    for (int i = 0; i < 3; ++i) p[i] = a[i] + r * (b[i] - a[i]) + r * t * (c[i] - b[i]);
    return p;
  };
}

std::vector<Primitive> MakePrimitives() {
  std::vector<Primitive> prims;
  prims.push_back({"sphere", {SphereCap(1, kPi, 0, 1)}});
  {
    Primitive box{"box", {}};
    for (int axis = 0; axis < 3; ++axis)
      for (double side : {-1.0, 1.0})
        box.patches.push_back([=](double s, double t) {
          Point3 p;
          p[axis] = side;
          p[(axis + 1) % 3] = 2 * s - 1;
          p[(axis + 2) % 3] = 2 * t - 1;
          return p;
        });
    prims.push_back(box);
  }
  prims.push_back({"cylinder",
                   {[](double s, double t) { return Polar(1, 2 * kPi * s, 2 * t - 1); }, Disk(1, 1), Disk(1, -1)}});
  prims.push_back({"cone", {[](double s, double t) {
                              const double r = std::sqrt(s);
                              return Polar(r, 2 * kPi * t, 1 - 2 * r);
                            },
                            Disk(1, -1)}});
  prims.push_back({"torus", {[](double s, double t) {
                     constexpr double kMajor = 1, kMinor = 0.4;
                     const double theta = 2 * kPi * t;
                     return Polar(kMajor + kMinor * std::cos(theta), 2 * kPi * s, kMinor * std::sin(theta));
                   }}});
  {
    Primitive pyramid{"pyramid", {[](double s, double t) { return Point3{2 * s - 1, 2 * t - 1, -1}; }}};
    const Point3 apex{0, 0, 1};
    const Point3 corners[4] = {{-1, -1, -1}, {1, -1, -1}, {1, 1, -1}, {-1, 1, -1}};
    for (int i = 0; i < 4; ++i) pyramid.patches.push_back(Triangle(apex, corners[i], corners[(i + 1) % 4]));
    prims.push_back(pyramid);
  }
  prims.push_back({"capsule",
                   {[](double s, double t) { return Polar(0.5, 2 * kPi * s, t - 0.5); }, SphereCap(0.5, kPi / 2, 0.5, 1),
                    SphereCap(0.5, kPi / 2, -0.5, -1)}});
  prims.push_back({"disk", {Disk(1, 0)}});
  {
    Primitive octahedron{"octahedron", {}};
    for (double x : {-1.0, 1.0})
      for (double y : {-1.0, 1.0})
        for (double z : {-1.0, 1.0}) octahedron.patches.push_back(Triangle({x, 0, 0}, {0, y, 0}, {0, 0, z}));
    prims.push_back(octahedron);
  }
  prims.push_back({"dome", {SphereCap(1, kPi / 2, 0, 1), Disk(1, 0)}});
  return prims;
}

const std::vector<Primitive>& Primitives() {
  static const std::vector<Primitive> prims = MakePrimitives();  // built once, read-only after
  return prims;
}

// |dp/ds x dp/dt| of the scaled patch at (s, t), by forward differences
// (the patches continue smoothly a little past s, t = 1); sets *point to the unscaled
// patch(s, t).
double AreaElement(const Patch& patch, const Point3& scale, double s, double t, Point3* point) {
  constexpr double h = 1e-7;
  *point = patch(s, t);
  const Point3 s1 = patch(s + h, t), t1 = patch(s, t + h);
  Point3 ds, dt;
  for (int i = 0; i < 3; ++i) {
    ds[i] = scale[i] * (s1[i] - (*point)[i]) / h;
    dt[i] = scale[i] * (t1[i] - (*point)[i]) / h;
  }
  const double cx = ds[1] * dt[2] - ds[2] * dt[1], cy = ds[2] * dt[0] - ds[0] * dt[2],
               cz = ds[0] * dt[1] - ds[1] * dt[0];
  return std::sqrt(cx * cx + cy * cy + cz * cz);
}

// A primitive under a per-axis scale, with what area-uniform sampling needs.
class ScaledPrimitive {
 public:
  ScaledPrimitive(int64_t kind, const Point3& scale) : prim_(Primitives()[kind]), scale_(scale) {
    constexpr int kGrid = 16;
    for (const Patch& patch : prim_.patches) {
      double area = 0, largest = 0, smallest = HUGE_VAL;
      for (int i = 0; i < kGrid; ++i)
        for (int j = 0; j < kGrid; ++j) {
          Point3 unused;
          const double a = AreaElement(patch, scale, (i + 0.5) / kGrid, (j + 0.5) / kGrid, &unused);
          area += a / (kGrid * kGrid);
          largest = std::max(largest, a);
          smallest = std::min(smallest, a);
        }
      areas_.push_back(area);
      // The grid misses the largest value by a little (a scaled sphere's
      // element peaks between grid points); 10% covers that.
      bounds_.push_back(1.1 * largest);
      // Flat patches stay equal-area under the scale: no rejection needed.
      constant_.push_back(largest - smallest <= 1e-4 * largest);
    }
    total_area_ = std::accumulate(areas_.begin(), areas_.end(), 0.0);
  }

  double area() const { return total_area_; }

  Point3 Sample(Rng& rng) const {
    double pick = rng.Uniform() * total_area_;
    size_t k = 0;
    while (k + 1 < areas_.size() && pick >= areas_[k]) pick -= areas_[k++];
    const Patch& patch = prim_.patches[k];
    if (constant_[k]) {
      const double s = rng.Uniform(), t = rng.Uniform();
      return Scaled(patch(s, t));
    }
    for (;;) {
      const double s = rng.Uniform(), t = rng.Uniform();
      Point3 p;
      if (rng.Uniform() * bounds_[k] <= AreaElement(patch, scale_, s, t, &p)) return Scaled(p);
    }
  }

 private:
  const Primitive& prim_;
  Point3 scale_;
  Point3 Scaled(Point3 p) const {
    for (int i = 0; i < 3; ++i) p[i] *= scale_[i];
    return p;
  }

  std::vector<double> areas_, bounds_;
  std::vector<bool> constant_;
  double total_area_ = 0;
};

using Matrix3 = std::array<Point3, 3>;  // rows

// Uniform over rotations: a unit quaternion from 4 normals.
Matrix3 RandomRotation(Rng& rng) {
  double w = rng.Normal(), x = rng.Normal(), y = rng.Normal(), z = rng.Normal();
  const double norm = std::sqrt(w * w + x * x + y * y + z * z);
  w /= norm, x /= norm, y /= norm, z /= norm;
  return {{{1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)},
           {2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)},
           {2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)}}};
}

Point3 Rotate(const Matrix3& r, const Point3& p) {
  Point3 q;
  for (int i = 0; i < 3; ++i) q[i] = r[i][0] * p[0] + r[i][1] * p[1] + r[i][2] * p[2];
  return q;
}

Point3 RandomDirection(Rng& rng) {
  Point3 d{rng.Normal(), rng.Normal(), rng.Normal()};
  const double norm = std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
  for (double& v : d) v /= norm;
  return d;
}

Point3 RandomScale(Rng& rng, double lo, double hi) {
  return {rng.Uniform(lo, hi), rng.Uniform(lo, hi), rng.Uniform(lo, hi)};
}

// ModelNet's pc_normalize: subtract the centroid, divide by the largest
// distance from it.
void Normalize(std::vector<Point3>& points) {
  Point3 centroid{0, 0, 0};
  for (const Point3& p : points)
    for (int i = 0; i < 3; ++i) centroid[i] += p[i] / points.size();
  double largest = 0;
  for (Point3& p : points) {
    for (int i = 0; i < 3; ++i) p[i] -= centroid[i];
    largest = std::max(largest, std::sqrt(p[0] * p[0] + p[1] * p[1] + p[2] * p[2]));
  }
  if (largest > 0)
    for (Point3& p : points)
      for (double& v : p) v /= largest;
}

// Splits n points between parts in proportion to their areas (largest
// remainders), at least one each (n >= parts).
std::vector<int64_t> PointsPerPart(const std::vector<double>& areas, int64_t n) {
  const int64_t parts = static_cast<int64_t>(areas.size());
  const double total = std::accumulate(areas.begin(), areas.end(), 0.0);
  std::vector<int64_t> counts(parts, 1);
  const int64_t spare = n - parts;
  std::vector<std::pair<double, int64_t>> remainders;
  int64_t given = 0;
  for (int64_t j = 0; j < parts; ++j) {
    const double exact = spare * areas[j] / total;
    counts[j] += static_cast<int64_t>(exact);
    given += static_cast<int64_t>(exact);
    remainders.push_back({exact - std::floor(exact), j});
  }
  std::sort(remainders.begin(), remainders.end(), std::greater<>());
  for (int64_t k = 0; given < spare; ++k, ++given) ++counts[remainders[k].second];
  return counts;
}

}  // namespace

StatusOr<std::shared_ptr<PointCloudDataset>> PointCloudDataset::Create(const PointCloudOptions& o) {
  if (o.num_examples < 1) return InvalidArgument("point cloud dataset: num_examples must be >= 1, got ", o.num_examples);
  if (o.num_points < 1) return InvalidArgument("point cloud dataset: num_points must be >= 1, got ", o.num_points);
  if (o.segmentation && o.num_points < kMaxParts)
    return InvalidArgument("point cloud dataset: num_points must be >= ", kMaxParts,
                           " for segmentation (a point on each of up to ", kMaxParts, " parts), got ", o.num_points);
  if (!(o.noise >= 0) || !std::isfinite(o.noise))
    return InvalidArgument("point cloud dataset: noise must be a finite number >= 0, got ", o.noise);
  return std::shared_ptr<PointCloudDataset>(new PointCloudDataset(o));
}

std::vector<std::string> PointCloudDataset::ClassNames(bool segmentation) {
  (void)segmentation;  // the part kinds are the same primitives as the shape classes
  std::vector<std::string> names;
  for (const Primitive& p : Primitives()) names.push_back(p.name);
  return names;
}

ExampleSpec PointCloudDataset::target_spec() const {
  return options_.segmentation ? ExampleSpec{Shape{options_.num_points}, DType::kI64} : ExampleSpec{Shape{}, DType::kI64};
}

int64_t PointCloudDataset::num_classes() const { return static_cast<int64_t>(Primitives().size()); }

std::vector<Point3> SamplePrimitiveSurface(int64_t kind, const Point3& scale, int64_t n, uint64_t seed) {
  Rng rng = Rng::Stream(seed, kExampleStream, static_cast<uint64_t>(kind));
  ScaledPrimitive prim(kind, scale);
  std::vector<Point3> points(n);
  for (Point3& p : points) p = prim.Sample(rng);
  return points;
}

void PointCloudDataset::Get(int64_t index, void* input, int64_t* target) const {
  const int64_t n = options_.num_points, kinds = num_classes();
  Rng rng = Rng::Stream(options_.seed, kExampleStream, static_cast<uint64_t>(index));
  std::vector<Point3> points;
  points.reserve(n);
  if (!options_.segmentation) {
    // Each run of `kinds` indices holds every class once, in a seeded order.
    Rng order_rng = Rng::Stream(options_.seed, kClassOrderStream, static_cast<uint64_t>(index / kinds));
    std::vector<int64_t> order(kinds);
    std::iota(order.begin(), order.end(), 0);
    for (int64_t i = kinds - 1; i > 0; --i) std::swap(order[i], order[order_rng.UniformInt(i + 1)]);
    const int64_t kind = order[index % kinds];
    ScaledPrimitive prim(kind, RandomScale(rng, kMinScale, kMaxScale));
    const Matrix3 rotation = RandomRotation(rng);
    for (int64_t i = 0; i < n; ++i) points.push_back(Rotate(rotation, prim.Sample(rng)));
    *target = kind;
  } else {
    // 2-4 different kinds of part, each attached to an earlier one.
    const int64_t parts = kMinParts + rng.UniformInt(kMaxParts - kMinParts + 1);
    std::vector<int64_t> kind(kinds);
    std::iota(kind.begin(), kind.end(), 0);
    for (int64_t j = 0; j < parts; ++j) std::swap(kind[j], kind[j + rng.UniformInt(kinds - j)]);
    std::vector<ScaledPrimitive> prims;
    std::vector<Matrix3> rotations;
    std::vector<Point3> centres;
    std::vector<double> radii, areas;
    for (int64_t j = 0; j < parts; ++j) {
      const Point3 scale = RandomScale(rng, kMinPartScale, kMaxPartScale);
      prims.emplace_back(kind[j], scale);
      rotations.push_back(RandomRotation(rng));
      // The canonical primitives reach about distance 1 from their centre.
      radii.push_back(*std::max_element(scale.begin(), scale.end()));
      areas.push_back(prims.back().area());
      Point3 centre{0, 0, 0};
      if (j > 0) {
        const int64_t anchor = rng.UniformInt(j);
        const Point3 d = RandomDirection(rng);
        const double distance = 0.8 * (radii[anchor] + radii[j]);  // overlapping a little
        for (int i = 0; i < 3; ++i) centre[i] = centres[anchor][i] + distance * d[i];
      }
      centres.push_back(centre);
    }
    const std::vector<int64_t> counts = PointsPerPart(areas, n);
    for (int64_t j = 0; j < parts; ++j)
      for (int64_t c = 0; c < counts[j]; ++c) {
        Point3 p = Rotate(rotations[j], prims[j].Sample(rng));
        for (int i = 0; i < 3; ++i) p[i] += centres[j][i];
        points.push_back(p);
        target[points.size() - 1] = kind[j];
      }
    // Points in a random order, not grouped by part.
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t k = rng.UniformInt(i + 1);
      std::swap(points[i], points[k]);
      std::swap(target[i], target[k]);
    }
  }
  Normalize(points);
  float* xyz = static_cast<float*>(input);  // [3, N]
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c) {
      const double jitter = options_.noise > 0 ? options_.noise * rng.Normal() : 0.0;
      xyz[c * n + i] = static_cast<float>(points[i][c] + jitter);
    }
}

}  // namespace loom
