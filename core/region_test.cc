#include "core/region.h"

#include <catch2/catch.hpp>

namespace loom {
namespace {

Tensor Iota(const Shape& shape) {
  Tensor t = Tensor::Zeros(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

TEST_CASE("regions: shape, containment and intersection") {
  const Region all = Region::Whole(Shape({4, 6}));
  CHECK(all.ToString() == "[0:4, 0:6]");
  CHECK(all.numel() == 24);
  const Region a{{0, 2}, {3, 6}}, b{{2, 0}, {4, 4}};
  CHECK(all.Contains(a));
  CHECK(!a.Contains(all));
  CHECK(a.Intersect(b)->ToString() == "[2:3, 2:4]");
  CHECK(!a.Intersect(Region{{3, 0}, {4, 6}}));  // touching rows share nothing
  CHECK(Region::Whole(Shape({})).numel() == 1);
}

TEST_CASE("CopyRegion moves a box between tensors holding different regions") {
  const Tensor whole = Iota({4, 6});
  const Region all = Region::Whole(whole.shape());
  const Region part{{1, 2}, {3, 5}};  // rows 1-2, columns 2-4
  Tensor piece = Tensor::Zeros(part.shape(), DType::kF32);
  REQUIRE(CopyRegion(whole, all, &piece, part, part).ok());
  CHECK(piece.ToDoubleVector() == std::vector<double>{8, 9, 10, 14, 15, 16});
  // Back into a zeroed tensor, only the common box [2:3, 3:5].
  Tensor back = Tensor::Zeros({4, 6}, DType::kF32);
  const Region box{{2, 3}, {3, 5}};
  REQUIRE(CopyRegion(piece, part, &back, all, box).ok());
  std::vector<double> want(24, 0.0);
  want[15] = 15;
  want[16] = 16;
  CHECK(back.ToDoubleVector() == want);
}

TEST_CASE("CopyRegion refuses boxes outside a region, dtypes and shapes that differ") {
  const Tensor whole = Iota({4, 6});
  const Region all = Region::Whole(whole.shape());
  const Region part{{0, 0}, {2, 6}};
  Tensor piece = Tensor::Zeros(part.shape(), DType::kF32);
  CHECK(!CopyRegion(whole, all, &piece, part, all).ok());
  Tensor wrong_dtype = Tensor::Zeros(part.shape(), DType::kF64);
  CHECK(!CopyRegion(whole, all, &wrong_dtype, part, part).ok());
  Tensor wrong_shape = Tensor::Zeros({3, 6}, DType::kF32);
  CHECK(!CopyRegion(whole, all, &wrong_shape, part, part).ok());
}

}  // namespace
}  // namespace loom
