// Mixed precision (docs/mixed_precision.md): a pass over a forward graph
// that runs its FLOP-heavy ops (LowPrecisionOps) in bf16 or f16 and leaves
// everything else in f32. For every node of such an op whose float inputs
// are all f32, each input goes through Cast(to = low) and each output comes
// back through Cast(to = f32); the node keeps its name and id, its outputs
// keep their value ids (now produced by the cast back, so graph outputs and
// consumers still see f32), and its new low-precision outputs take over the
// old ones' names. One Cast per (value, dtype) however many nodes consume
// it, and a value that is itself a cast back from the low dtype is not cast
// again (its low-precision source is used). Parameters stay f32 (master
// weights): their casts are nodes of the graph, recomputed every step, and
// autodiff carries the gradient back through them to f32 (the backward of
// a Cast is a Cast). Nodes with f64 inputs (gradient-check graphs) are left
// alone, and precision f32 leaves the graph as it is.
//
// Compile (graph/compile.h) runs it for CompileOptions::precision, before
// fusion; a train config's `precision` field sets that.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.h"
#include "graph/ir.h"
#include "graph/pass.h"

namespace loom {

// The ops that run in the low precision: MatMul, BatchMatMul, Linear,
// Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d.
const std::vector<std::string>& LowPrecisionOps();

class MixedPrecisionPass : public Pass {
 public:
  // precision: kF32 (no-op), kBF16 or kF16. `ops` is the list of ops to run
  // in it (tests pass their own).
  explicit MixedPrecisionPass(DType precision, std::vector<std::string> ops = LowPrecisionOps())
      : precision_(precision), ops_(std::move(ops)) {}
  std::string name() const override { return "mixed-precision"; }
  // Errors: a precision other than f32, bf16 or f16; a node on the list
  // whose op does not take the low dtype (named, with the op's reason).
  StatusOr<bool> Run(Graph* graph) override;

 private:
  DType precision_;
  std::vector<std::string> ops_;
};

// The pass with the default op list, then the verifier (a pipeline runs it
// between passes anyway; this is for callers outside one).
StatusOr<bool> ApplyMixedPrecision(Graph* graph, DType precision);

}  // namespace loom
