// The work shape the norm and reduce families' kernels share: a block is a
// tile of `lanes` items (outputs, channels or rows) times `parts` threads per
// item, which fold strided shares of the item's elements and are combined by
// a fixed shared-memory tree (TileReduce). The threads along the contiguous
// direction are the fastest in the block, so loads coalesce either way. Long
// sums with few items are split over gridDim.y blocks (SplitOver); the
// kernels write the splits' partial results and combine them in split order.
// Included only by nvcc-compiled files.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/cuda/device_util.cuh"

namespace loom::cuda {

constexpr int64_t kTargetBlocks = 1024;  // enough resident blocks to fill an H200 (132 SMs)
constexpr int64_t kMinFold = 32;         // elements per thread before a sum is split further
constexpr int64_t kMaxSplits = 65535;    // gridDim.y limit

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The smallest power of two >= n, capped at `cap` (a power of two).
inline int PowerOfTwoAtLeast(int64_t n, int cap) {
  int p = 1;
  while (p < cap && p < n) p *= 2;
  return p;
}

struct TilePlan {
  int lanes = 1, parts = 1;    // lanes * parts threads per block, parts a power of two
  bool parts_fastest = false;  // thread id = lane * parts + part, else part * lanes + lane
  int64_t tiles = 0;           // tiles of `lanes` items
  int64_t splits = 1, split_len = 0;  // gridDim.y blocks, each folding split_len of the split extent
};

// `items` items of `len` elements each; `contiguous`: an item's elements are
// adjacent in memory (else adjacent items are). No split (split_len = len).
inline TilePlan PlanTiles(int64_t items, int64_t len, bool contiguous) {
  TilePlan p;
  p.parts_fastest = contiguous;
  if (contiguous) {
    p.parts = PowerOfTwoAtLeast(len, kThreads);
  } else {
    const int lanes = PowerOfTwoAtLeast(items, 32);
    p.parts = PowerOfTwoAtLeast(len, kThreads / lanes);
  }
  p.lanes = PowerOfTwoAtLeast(items, kThreads / p.parts);
  p.tiles = CeilDiv(items, p.lanes);
  p.split_len = len;
  return p;
}

// Splits an extent of `len` (each split folds split_len of it) over gridDim.y
// when the tiles alone leave the GPU idle and each item sums `work` elements,
// enough to keep every thread of every split busy.
inline void SplitOver(TilePlan& p, int64_t len, int64_t work) {
  p.splits = 1;
  p.split_len = len;
  if (p.tiles > 0 && p.tiles < kTargetBlocks && len > 1 && work > p.parts * kMinFold) {
    const int64_t splits =
        std::min({CeilDiv(kTargetBlocks, p.tiles), CeilDiv(work, p.parts * kMinFold), len, kMaxSplits});
    p.split_len = CeilDiv(len, splits);
    p.splits = CeilDiv(len, p.split_len);
  }
}

__device__ inline void LanePart(const TilePlan& p, int& lane, int& part) {
  const int t = threadIdx.x;
  lane = p.parts_fastest ? t / p.parts : t % p.lanes;
  part = p.parts_fastest ? t % p.parts : t / p.lanes;
}

// Combines the `parts` values of each lane of the tile (a fixed tree) and
// returns the result to every thread of that lane. Called by all threads of
// the block; `scratch` holds lanes * parts values.
template <typename Acc, typename Combine>
__device__ inline Acc TileReduce(Acc value, Acc* scratch, const TilePlan& p, int lane, int part, Combine combine) {
  scratch[part * p.lanes + lane] = value;
  __syncthreads();
  for (int h = p.parts / 2; h > 0; h >>= 1) {
    Acc* mine = scratch + part * p.lanes + lane;
    if (part < h) *mine = combine(*mine, mine[h * p.lanes]);
    __syncthreads();
  }
  const Acc total = scratch[lane];
  __syncthreads();  // scratch is reused right after
  return total;
}

}  // namespace loom::cuda
