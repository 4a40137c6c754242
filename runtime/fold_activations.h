// The executor's rewrite of its own graph copy: ops folded into the op
// before them where one kernel pass does the work of two. The graph keeps
// its meaning (the folded op says what it applies, in its attributes), so
// any executor runs it: the CPU's and the GPU's kernels do the folded op's
// work in their own passes.
#pragma once

#include "graph/ir.h"

namespace loom {

// Folds each ReLU (or ReLU6) whose input is a BatchNorm's y, directly or
// through views, into that BatchNorm as its activation epilogue (attr
// activation "relu" or "relu6"), where nothing else reads y or the views
// between (but the activation's own backward, which then reads the
// activated values: ReLU6's mask is the same from them) and none of them is
// a value callers read (a graph output, a state update) or a gradient. The
// activation's readers then read the BatchNorm's y (or the last view),
// which holds the same values, and its node is removed: a pass over the
// activations saved. An activation whose own output is a graph output or
// state update stays.
//
// Likewise backward: a ReLUBackward or ReLU6Backward (dy, s) whose output
// only a BatchNormBackward reads as its dy (through views) is done by that
// node, which reads dy and s and masks dy as it goes (attr activation, s
// its sixth input): the backward op's pass and its output saved.
//
// The same bits either way. Returns how many nodes were folded.
int FoldReluIntoBatchNorm(Graph* graph);

}  // namespace loom
