// Reverse-mode autodiff on the graph: walks the nodes backwards from a scalar
// loss and appends the backward nodes that each op's gradient rule emits.
// Gradients reaching a value from several consumers are summed with Add.
#pragma once

#include <map>
#include <vector>

#include "graph/ir.h"

namespace loom {

// Appends backward nodes for d(loss)/d(v) for each v in `wrt` (all
// Parameter outputs when empty) and records them in graph->gradients().
// Returns wrt value -> gradient value. A value in wrt that the loss does not
// depend on gets an explicit zero gradient.
StatusOr<std::map<ValueId, ValueId>> BuildGradients(Graph* graph, ValueId loss, std::vector<ValueId> wrt = {});

}  // namespace loom
