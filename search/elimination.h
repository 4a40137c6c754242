// An exact solver for OptCNN's layer-wise parallelization cost graph (Jia et
// al. 2018, "Exploring hidden dimensions in parallelizing CNNs"): every layer
// (node) picks one of its configurations; a choice costs
//   sum over nodes v of node_costs[v][c_v]
//     + sum over edges (u, v) of edge.costs[c_u][c_v].
// The solver shrinks the graph with rules that keep the optimum exact:
//   node elimination  a node whose edges reach exactly two other nodes u, w
//                     becomes an edge u-w: cost[c_u][c_w] = min over c_v of
//                     e(u,v) + node_costs[v][c_v] + e(v,w)
//   edge elimination  two edges between one pair of nodes become their sum
//   leaf elimination  a node with one neighbour u folds into u's node cost
//                     (extends OptCNN to trees)
//   isolated node     takes its cheapest configuration
// and enumerates whatever is left (nodes of degree 3 or more) exhaustively.
// Chains, trees, diamonds and residual blocks reduce fully. Undoing the
// eliminations in reverse order recovers every node's configuration.
//
// Costs may be +infinity (an impossible configuration); the solver only adds
// and compares costs, so infinities never turn into NaN. Among equal costs
// each step keeps the lower configuration index, so the result is
// deterministic.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace loom {

// OptCNN's cost graph. Edges are directed only in how their matrix is laid
// out; any number may join the same pair of nodes, in either direction.
struct CostGraph {
  std::vector<std::vector<double>> node_costs;  // node -> config -> cost (every node >= 1 config)
  struct Edge {
    int from = 0, to = 0;
    std::vector<double> costs;  // row-major [config of from][config of to]
  };
  std::vector<Edge> edges;
  // Optional: nodes with the same non-negative id must take the same config
  // index ("repeated blocks sharing one choice"; they need equal config
  // counts); -1 = free. Empty = all free. The solver contracts each group into
  // one node before eliminating (exact, and it keeps chains of tied blocks
  // reducible); a choice that breaks a tie costs +infinity.
  std::vector<int> tie_group;
};

struct EliminationResult {
  std::vector<int> choice;  // a config index per node
  double cost = 0;          // CostOf(graph, choice)
  // How it was solved, in the caller's nodes (a tie group counts as all its
  // members): nodes removed by the rules, edges merged with a parallel one,
  // nodes left to enumeration. nodes_eliminated + enumerated = node count.
  int64_t nodes_eliminated = 0, edges_eliminated = 0, enumerated = 0;
};

// Checks the graph (sizes, node indices, self edges, tie groups; costs must
// be numbers or +infinity: NaN and -infinity are errors) -> InvalidArgument
// naming the node or edge, then solves exactly. When the nodes left after
// elimination have more than `max_enumeration` (>= 0) joint configurations,
// fails with FailedPrecondition saying how many remain.
StatusOr<EliminationResult> SolveByElimination(const CostGraph& graph, double max_enumeration = 1e7);

// The objective for a choice (checks the graph as above, and the choice's size
// and indices). A choice that breaks a tie group costs +infinity.
StatusOr<double> CostOf(const CostGraph& graph, const std::vector<int>& choice);

}  // namespace loom
