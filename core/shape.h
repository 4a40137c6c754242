// Tensor shapes: a list of non-negative extents, row-major.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/status.h"

namespace loom {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  // Negative axes count from the end (-1 is the last).
  int64_t dim(int axis) const { return dims_[axis < 0 ? axis + rank() : axis]; }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t> Strides() const;  // row-major, in elements
  std::string ToString() const;  // "[2, 3, 4]"

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

// Resolves a possibly negative axis against a rank, or says why it can't.
StatusOr<int> NormalizeAxis(int64_t axis, int rank);

// Numpy-style broadcast of two shapes.
StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);

}  // namespace loom
