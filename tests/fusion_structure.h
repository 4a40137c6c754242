// XLA-style structural checks of fused graphs (graph/fusion.h): which ops
// the fusion pass emitted for each node of the model, and which nodes run
// once per replica. The numbers cannot tell: a per-replica fallback, or a
// rule that copies its inputs around, computes the same results as the
// fused form, only slower.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace loom::testing {

// The nodes of a fused forward graph (as FuseReplicas returns it) that
// compute on one replica's slice: the per-replica fallback of ops without a
// fused form and of unfused layers. The pass records a replica layout on
// every other value it creates, so these are the nodes with an output of
// unknown layout.
std::vector<NodeId> PerReplicaNodes(const Graph& fused);

// The node of `model` that the fused node named `fused_name` was emitted
// for: the longest of "a/b/c", "a/b", "a" that names a node of the model, or
// "" when none does (the pass's own "outputs/..." nodes).
std::string ModelNodeOf(const std::string& fused_name, const Graph& model);

// Op -> how many nodes of `fused` were emitted for the model node `node`.
std::map<std::string, int> OpsEmittedFor(const Graph& fused, const Graph& model, const std::string& node);

}  // namespace loom::testing
