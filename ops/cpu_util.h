// Small helpers shared by CPU kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "core/shape.h"
#include "core/thread_pool.h"

namespace loom {

// Runs fn(begin, end) over [0, n) on the pool in chunks big enough to pay
// for the hand-off (element-wise work of ~32k items per chunk).
template <typename Fn>
void ParallelRange(ThreadPool* pool, int64_t n, Fn&& fn, int64_t min_chunk = 32768) {
  if (!pool || n < 2 * min_chunk) {
    fn(int64_t{0}, n);
    return;
  }
  pool->ParallelFor(n, min_chunk, fn);
}

// Sum of term(i) for i in [0, n), accumulated in Acc in kSumLanes independent
// partial sums (a single running sum is a chain of dependent adds, which
// neither vectorises nor pipelines) combined in a fixed order: the result
// depends on n and the terms only, never on threads.
constexpr int kSumLanes = 8;
template <typename Acc, typename Term>
Acc LaneSum(int64_t n, Term&& term) {
  Acc part[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) part[l] += term(i + l);
  Acc sum = 0;
  for (; i < n; ++i) sum += term(i);
  for (int l = 0; l < kSumLanes; ++l) sum += part[l];
  return sum;
}

// Strides (in elements) of `in` broadcast against `out`: 0 on broadcast dims.
// `in` is right-aligned to `out`'s rank.
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out);

// Visits every element of `out` in row-major order with the matching offsets
// into two broadcast operands: fn(out_index, offset_a, offset_b) in chunks of
// the innermost dimension, for [begin, end) of the outer rows.
template <typename Fn>
void ForEachBroadcast(const Shape& out, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb,
                      int64_t row_begin, int64_t row_end, Fn&& fn) {
  const int rank = out.rank();
  if (rank == 0) {
    fn(0, 0, 0, 1, 0, 0);
    return;
  }
  const int64_t inner = out[rank - 1];
  std::vector<int64_t> idx(rank - 1, 0);
  // Position the counter at row_begin.
  int64_t r = row_begin;
  for (int d = rank - 2; d >= 0; --d) {
    idx[d] = r % out[d];
    r /= out[d];
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < rank - 1; ++d) {
      oa += idx[d] * sa[d];
      ob += idx[d] * sb[d];
    }
    fn(row * inner, oa, ob, inner, sa[rank - 1], sb[rank - 1]);
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace loom
