// The analytical cost of nodes and graphs from each op's Cost(): FLOPs and
// bytes moved. Benchmarks use it to turn times into rates; the simulator
// builds on it.
#pragma once

#include "graph/ir.h"
#include "ops/op.h"

namespace loom {

OpCost NodeCost(const Graph& graph, const Node& node);
OpCost GraphCost(const Graph& graph);  // summed over all nodes

}  // namespace loom
