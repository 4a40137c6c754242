// Host-side logic of the losses, shared by the CPU kernels
// (ops/loss_ops.cc) and the CUDA kernels (ops/cuda/loss_kernels.cc): the
// layout of class scores, the reduction attribute and the error for a class
// target out of range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"
#include "core/status.h"
#include "graph/attrs.h"

namespace loom {

// Whether attribute reduction is "mean" (else "sum"; type inference rejects
// anything else).
inline bool IsMeanReduction(const AttrMap& attrs) { return attrs.Str("reduction") == "mean"; }

// Scores [N, C, d1, ...] (or [C]) with targets [N, d1, ...] (or []): the
// score of sample i = n * inner + s for class c is at (n * C + c) * inner + s.
struct ClassLayout {
  int64_t batch = 1, classes = 0, inner = 1;
  int64_t samples() const { return batch * inner; }
  int64_t ScoreOffset(int64_t sample) const { return (sample / inner) * classes * inner + sample % inner; }
};

inline ClassLayout ClassLayoutOf(const Shape& scores) {
  ClassLayout L;
  if (scores.rank() == 1) {
    L.classes = scores[0];
    return L;
  }
  L.batch = scores[0];
  L.classes = scores[1];
  for (int d = 2; d < scores.rank(); ++d) L.inner *= scores[d];
  return L;
}

// "op: target 7 at position [1, 2] is out of range for 5 classes (expected
// 0..4 or ignore_index -100)": `flat` is the target's row-major position in
// `targets`.
inline Status TargetOutOfRange(const std::string& op, int64_t value, int64_t flat, const Shape& targets,
                               int64_t classes, int64_t ignore_index) {
  std::vector<int64_t> idx(targets.rank());
  for (int d = targets.rank() - 1; d >= 0; --d) {
    idx[d] = flat % targets[d];
    flat /= targets[d];
  }
  return InvalidArgument(op, ": target ", value, " at position ", Shape(idx).ToString(), " is out of range for ",
                         classes, " classes (expected 0..", classes - 1, " or ignore_index ", ignore_index, ")");
}

// How many of the n targets are not ignore_index (the mean's denominator),
// or the error for the first one out of [0, classes).
template <typename I>
StatusOr<int64_t> CountClassTargets(const std::string& op, const I* targets, const Shape& shape, int64_t classes,
                                    int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const int64_t v = targets[i];
    if (v == ignore_index) continue;
    if (v < 0 || v >= classes) return TargetOutOfRange(op, v, i, shape, classes, ignore_index);
    ++count;
  }
  return count;
}

}  // namespace loom
