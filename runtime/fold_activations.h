// The executor's rewrite of its own graph copy: ops folded into the op
// before them where one kernel pass does the work of two. The graph keeps
// its meaning (the folded op says what it applies, in its attributes), so
// any executor runs it: the CPU's and the GPU's kernels do the folded op's
// work in their own passes.
#pragma once

#include "graph/ir.h"

namespace loom {

// Folds each ReLU, ReLU6 or Hardswish whose input is a BatchNorm's y,
// directly or through views, into that BatchNorm as its activation
// epilogue (attr activation "relu", "relu6" or "hardswish"), where nothing
// else reads y or the views between (but ReLU's and ReLU6's own backward,
// which then reads the activated values: their masks are the same from
// them) and none of them is a value callers read (a graph output, a state
// update) or a gradient. The
// activation's readers then read the BatchNorm's y (or the last view),
// which holds the same values, and its node is removed: a pass over the
// activations saved. An activation whose own output is a graph output or
// state update stays.
//
// Likewise backward, first: a ReLUBackward, ReLU6Backward or
// HardswishBackward (dy, s) whose output only a BatchNormBackward reads as
// its dy (through views), where s is the BatchNorm's y (or, for the masks,
// the activation of it), is done by that node, which reads dy and the
// BatchNorm's beta (its sixth input) and takes dy through the activation's
// backward as it goes, at the pre-activation values it rebuilds from x
// (attr activation): the backward op's pass and its output saved, and s not
// read.
//
// The same bits either way. Returns how many nodes were folded.
int FoldActivationsIntoBatchNorm(Graph* graph);

}  // namespace loom
