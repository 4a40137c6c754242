#include "core/region.h"

#include "core/work_queue.h"

#include <catch2/catch.hpp>

#include <random>

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

// Boxes whose trailing dimensions both tensors hold whole copy as longer
// rows (a 3x3 kernel's weights split by output channel: one block); every
// box of random regions against an element-by-element copy.
TEST_CASE("CopyRegion copies random boxes as element-by-element copies do") {
  std::unique_ptr<WorkQueue> cpu = CreateWorkQueue(Device::Cpu(), 0).value();
  std::mt19937_64 rng(7);
  auto draw = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  for (int trial = 0; trial < 500; ++trial) {
    const int rank = 1 + static_cast<int>(draw(4));
    Region src_region, dst_region, box;
    for (int i = 0; i < rank; ++i) {
      const int64_t extent = 1 + draw(5);
      // Often whole along a dimension in all three (the case that collapses).
      const bool whole = draw(2) == 0;
      const int64_t blo = whole ? 0 : draw(extent), bhi = whole ? extent : blo + 1 + draw(extent - blo);
      box.lo.push_back(blo);
      box.hi.push_back(bhi);
      src_region.lo.push_back(whole ? 0 : blo - draw(blo + 1));
      src_region.hi.push_back(whole ? extent : bhi + draw(3));
      dst_region.lo.push_back(whole ? 0 : blo - draw(blo + 1));
      dst_region.hi.push_back(whole ? extent : bhi + draw(3));
    }
    const Tensor src = Iota(src_region.shape());
    Tensor dst = Tensor::Zeros(dst_region.shape(), DType::kF32);
    REQUIRE(CopyRegion(src, src_region, &dst, dst_region, box).ok());
    std::vector<float> want(static_cast<size_t>(dst.numel()), 0.0f);
    const std::vector<int64_t> ss = src.shape().Strides(), ds = dst.shape().Strides();
    std::vector<int64_t> at(box.lo.begin(), box.lo.end());
    for (int64_t k = 0; k < box.numel(); ++k) {
      int64_t so = 0, doff = 0;
      for (int i = 0; i < rank; ++i) {
        so += (at[i] - src_region.lo[i]) * ss[i];
        doff += (at[i] - dst_region.lo[i]) * ds[i];
      }
      want[static_cast<size_t>(doff)] = src.data<float>()[so];
      for (int i = rank - 1; i >= 0 && ++at[i] == box.hi[i]; --i) at[i] = box.lo[i];
    }
    INFO("box " << box.ToString() << " of " << src_region.ToString() << " into " << dst_region.ToString());
    REQUIRE(std::vector<float>(dst.data<float>(), dst.data<float>() + dst.numel()) == want);
    // The same copy queued as 2-D blocks (what a GPU's queue runs).
    Tensor queued = Tensor::Zeros(dst_region.shape(), DType::kF32);
    REQUIRE(CopyRegionOn(*cpu, src, src_region, &queued, dst_region, box).ok());
    REQUIRE(std::vector<float>(queued.data<float>(), queued.data<float>() + queued.numel()) == want);
  }
}

// Rows are the box's last partial dimension with the whole ones after it;
// a block is the rows along the dimension before.
TEST_CASE("a region copy is planned as strided blocks of whole rows") {
  const Tensor src = Iota({4, 6, 8});
  const Region all = Region::Whole(src.shape());
  const Region box{{1, 2, 1}, {3, 5, 7}};
  const Tensor dst = Tensor::Zeros(box.shape(), DType::kF32);
  const RegionCopy copy = PlanRegionCopy(src, all, dst, box, box).value();
  CHECK(copy.row_bytes == 6 * 4);
  CHECK(copy.height == 3);
  CHECK(copy.src_pitch == 8 * 4);
  CHECK(copy.dst_pitch == 6 * 4);
  CHECK(copy.src_offsets == std::vector<int64_t>{(1 * 48 + 2 * 8 + 1) * 4, (2 * 48 + 2 * 8 + 1) * 4});
  CHECK(copy.dst_offsets == std::vector<int64_t>{0, 3 * 6 * 4});
  // Whole along the last dimension: a row spans the box's [2:5] x [0:8],
  // a block its two rows along the first.
  const Region wide{{1, 2, 0}, {3, 5, 8}};
  const RegionCopy two = PlanRegionCopy(src, all, Tensor::Zeros(wide.shape(), DType::kF32), wide, wide).value();
  CHECK(two.src_offsets.size() == 1);
  CHECK(two.height == 2);
  CHECK(two.row_bytes == 3 * 8 * 4);
  CHECK(two.src_pitch == 48 * 4);
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
