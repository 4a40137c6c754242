// Generated point clouds, for PointNet without ModelNet40 or ShapeNet-part
// on disk: points sampled area-uniformly on the surfaces of parametric
// shapes, generated when asked (example i is a pure function of the options
// and i, no memory held).
//
// Classification: one shape per example (sphere, box, cylinder, cone, torus,
// pyramid, capsule, disk, octahedron, dome), scaled by a random factor in
// [0.5, 1.5] per axis (so a box is not a cube, nor a sphere round: scale
// alone does not tell the classes apart), rotated at random (uniform over
// all 3D rotations), then centred on the points' centroid and divided by
// the largest distance from it (ModelNet's preprocessing), then jittered.
// Classes are balanced: each run of num_classes consecutive indices holds
// every class once, in a seeded order.
//
// Segmentation: an object assembled from 2 to 4 different primitives, each
// scaled and rotated at random and attached to an earlier part in a random
// direction (overlapping it a little); a point's label is the kind of the
// part it lies on, so telling a box face from a cylinder wall needs the
// local geometry. The object is normalised and jittered as above.
//
// Area-uniform sampling: every primitive is a few parametric patches
// (s, t) in [0, 1)^2 -> R^3 (faces, walls, caps). After the per-axis scale,
// a patch is chosen with probability proportional to its area (integrated
// numerically on a 16x16 grid of the area element |dp/ds x dp/dt|) and a
// point on it by rejection: (s, t) uniform, kept with probability
// area element / (1.1 * its largest value on the grid); flat patches, whose
// area element a per-axis scale leaves constant, skip the rejection. Flat
// patches' areas are exact, curved ones' within ~0.1%.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/data/dataset.h"

namespace loom {

struct PointCloudOptions {
  int64_t num_points = 1024;    // N points per example
  int64_t num_examples = 10000;
  bool segmentation = false;    // targets: a part label per point [N] instead of one class []
  uint64_t seed = 1;            // examples are a function of (seed, index)
  double noise = 0.01;          // Gaussian jitter added to every coordinate
};

class PointCloudDataset : public Dataset {
 public:
  // Errors name the bad option: num_points >= 1 (>= 4 for segmentation, so
  // each of up to 4 parts gets a point), num_examples >= 1, noise >= 0.
  static StatusOr<std::shared_ptr<PointCloudDataset>> Create(const PointCloudOptions& o);
  // The shape classes, or the part kinds (the same primitives), by label.
  static std::vector<std::string> ClassNames(bool segmentation);

  int64_t size() const override { return options_.num_examples; }
  ExampleSpec input_spec() const override { return {Shape{3, options_.num_points}, DType::kF32}; }  // x row, y, z
  ExampleSpec target_spec() const override;  // [] i64 class or [N] i64 part labels
  int64_t num_classes() const override;
  void Get(int64_t index, void* input, int64_t* target) const override;

  const PointCloudOptions& options() const { return options_; }

 private:
  explicit PointCloudDataset(const PointCloudOptions& o) : options_(o) {}
  PointCloudOptions options_;
};

using Point3 = std::array<double, 3>;

// The sampler behind the dataset, for tests: n points area-uniform on the
// primitive `kind` (an index into ClassNames(false)) in its canonical pose
// scaled per axis by `scale`, before any rotation or normalisation; a pure
// function of (kind, scale, n, seed). Canonical poses: sphere radius 1; box [-1, 1]^3; cylinder radius 1, z in [-1, 1]
// with both caps; cone apex (0, 0, 1), base radius 1 at z = -1 (with the
// base); torus major radius 1, minor 0.4, around z; pyramid square base
// [-1, 1]^2 at z = -1, apex (0, 0, 1); capsule radius 0.5, axis z in
// [-0.5, 0.5] plus the half-spheres; disk radius 1 in z = 0; octahedron
// vertices +-1 on each axis; dome the half-sphere z >= 0 of radius 1 with
// its base disk.
std::vector<Point3> SamplePrimitiveSurface(int64_t kind, const Point3& scale, int64_t n, uint64_t seed);

}  // namespace loom
