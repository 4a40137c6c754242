// Host-side logic of the losses, shared by the CPU kernels
// (ops/loss_ops.cc) and the CUDA kernels (ops/cuda/loss_kernels.cc): the
// layout of class scores, the reduction attribute and the error for a class
// target out of range.
#pragma once

#include <algorithm>
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

// A fused loss (attribute replicas = R >= 1; absent or 0: unfused) reads R
// replicas' scores stacked [R, ...] and their targets either shared (one
// replica's shape) or stacked [R, ...]; its loss is [R], replica r's the
// unfused loss of chunk r.
struct LossReplicas {
  int64_t count = 1;          // R (1 when unfused)
  Shape scores, targets;      // one replica's
  int64_t target_stride = 0;  // elements from one replica's targets to the next's (0: shared)
};

// Targets of `replicas` replicas stacked [R, ...] (replicas = 0: one set,
// unfused); no scores.
inline LossReplicas StackedTargets(int64_t replicas, const Shape& targets) {
  LossReplicas r;
  r.targets = targets;
  if (replicas == 0 || targets.rank() < 1) return r;
  r.count = targets[0];
  r.targets = Shape(std::vector<int64_t>(targets.dims().begin() + 1, targets.dims().end()));
  r.target_stride = r.targets.numel();
  return r;
}

inline LossReplicas LossReplicasOf(const AttrMap& attrs, const Shape& scores, const Shape& targets) {
  const int64_t replicas = scores.rank() < 1 ? 0 : attrs.Int("replicas", 0);
  const bool stacked = targets.rank() == scores.rank() - 1;
  LossReplicas r = StackedTargets(stacked ? replicas : 0, targets);
  r.scores = scores;
  if (replicas == 0) return r;
  r.count = scores[0];
  r.scores = Shape(std::vector<int64_t>(scores.dims().begin() + 1, scores.dims().end()));
  return r;
}

// A BCEWithLogits op's logits as R replicas' (attribute replicas = R >= 1;
// one, unfused): one replica's shape, and where each replica's logits and
// targets start (shared targets, one replica's shape, at stride 0).
struct BceReplicas {
  int64_t count = 1;
  Shape logits;
  int64_t logits_stride = 0, targets_stride = 0;
};

inline BceReplicas BceReplicasOf(const AttrMap& attrs, const Shape& logits, const Shape& targets) {
  BceReplicas r;
  r.logits = logits;
  if (attrs.Int("replicas", 0) == 0 || logits.rank() < 1) return r;
  r.count = logits[0];
  r.logits = Shape(std::vector<int64_t>(logits.dims().begin() + 1, logits.dims().end()));
  r.logits_stride = r.logits.numel();
  r.targets_stride = targets == logits ? r.logits_stride : 0;
  return r;
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

// How many targets of each replica are not ignore_index (the mean's
// denominators: R counts, shared targets counted once for all), or the
// error for the first one out of [0, classes), named by its position in
// the whole targets tensor. One pass.
template <typename I>
StatusOr<std::vector<int64_t>> CountReplicaTargets(const std::string& op, const I* targets, const Shape& shape,
                                                   const LossReplicas& rep, int64_t classes, int64_t ignore_index) {
  std::vector<int64_t> counts(static_cast<size_t>(rep.count), 0);
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const int64_t v = targets[i];
    if (v == ignore_index) continue;
    if (v < 0 || v >= classes) return TargetOutOfRange(op, v, i, shape, classes, ignore_index);
    ++counts[rep.target_stride == 0 ? 0 : i / rep.target_stride];
  }
  if (rep.target_stride == 0) std::fill(counts.begin(), counts.end(), counts[0]);
  return counts;
}

// The same for one set of targets (an unfused loss).
template <typename I>
StatusOr<int64_t> CountClassTargets(const std::string& op, const I* targets, const Shape& shape, int64_t classes,
                                    int64_t ignore_index) {
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> counts,
                        CountReplicaTargets(op, targets, shape, LossReplicas{}, classes, ignore_index));
  return counts[0];
}

}  // namespace loom
