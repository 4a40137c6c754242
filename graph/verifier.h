// The graph verifier: the invariants every pass must preserve and every
// loaded graph must satisfy. It runs between passes (graph/pass.h) and after
// deserialization (graph/serialize.h).
#pragma once

#include "core/status.h"
#include "graph/ir.h"

namespace loom {

// Checks, in execution order, that
//  - node names are unique and every node's op is registered;
//  - each input value exists and is produced by an earlier node;
//  - each output value belongs to its node, and the stored output types are
//    exactly what the op's type inference gives now;
//  - graph outputs, state updates and gradients refer to existing values;
//    a state update replaces the output of a Parameter or Buffer node (once)
//    with a value of the same type; a gradient has its value's type.
// The first violation is returned, naming the node (and op) or the entry.
Status VerifyGraph(const Graph& graph);

}  // namespace loom
