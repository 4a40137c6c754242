// The executor's rewrite of its own graph copy: ops folded into the op
// before them where one kernel pass does the work of two. The graph keeps
// its meaning (the folded op says what it applies, in its attributes), so
// any executor could run it; the CPU's gains the pass it saves.
#pragma once

#include "graph/ir.h"

namespace loom {

// Folds each ReLU whose input is a BatchNorm's y, directly or through
// views, into that BatchNorm as its activation epilogue (attr activation
// "relu"), where nothing else reads y or the views between and none of
// them is a value callers read (a graph output, a state update) or a
// gradient. The ReLU's readers then read the BatchNorm's y (or the last
// view), which holds the same values, and the ReLU node is removed: a pass
// over the activations saved. A ReLU whose own output is a graph output or
// state update stays.
//
// Likewise backward: a ReLUBackward (dy, y) whose output only a
// BatchNormBackward reads as its dy (through views) is done by that node,
// which reads dy and y and masks dy as it goes (attr activation "relu",
// y its sixth input): the ReLUBackward's pass and its output saved.
//
// The same bits either way. Returns how many nodes were folded.
int FoldReluIntoBatchNorm(Graph* graph);

}  // namespace loom
