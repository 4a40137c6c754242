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
//    with a value of the same type; a gradient has its value's type;
//  - in a fused graph of R replicas (graph/fusion.h), every recorded replica
//    layout (graph/ir.h) fits its value: the replica dim is < rank and has
//    extent R * per_replica; Parameters, Buffers and graph outputs are
//    [R, ...], laid out with the replica axis 0 where a layout is recorded
//    (optimizer state and step outputs that a pass adds may have none). An
//    unfused graph records no layouts.
// The first violation is returned, naming the node (and op) or the entry.
Status VerifyGraph(const Graph& graph);

}  // namespace loom
