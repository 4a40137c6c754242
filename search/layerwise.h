// OptCNN's layer-wise cost model of a search space (docs/search.md), what
// the exact solver (search/elimination.h) minimises:
//
//   cost(choice) = sum over layers of t_layer(config)
//                + sum over edges of t_move(producer config, consumer config)
//
// t_layer: the layer's simulated tasks under the config's degrees (its
// forward, backward and update parts, and their all-reduces), the busiest
// device's sum, or the longest chain through the layer's own tasks where
// that is longer; on devices with copy engines its parameters' gradient
// all-reduces count on the links beside the compute, not added to it (the
// backward pass goes on meanwhile). Measured by lowering the whole step
// once per degree vector with every layer that can take it split so, and
// the same on any block of devices (the machine's devices are alike).
// t_move: the seconds the value's bytes that a consumer part needs from
// other devices take on the machine's links, forward and (its gradient)
// backward: the busiest receiver's messages one after another, or the
// busiest link resource's bytes (readers sharing a link take turns). It
// ignores overlap between layers and contention between messages of
// different edges: the solver's optimum seeds the simulated search, which
// decides.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/status.h"
#include "graph/ir.h"
#include "search/elimination.h"
#include "search/space.h"
#include "simulator/cost_model.h"
#include "simulator/machine.h"

namespace loom {

struct LayerwiseCosts {
  CostGraph graph;  // a node per layer of the space, an edge per SearchSpace::Edge
  // Per layer: the space's configuration that each of the node's configs
  // stands for (a subset when the layer has more than max_configs).
  std::vector<std::vector<int>> configs;
  // Per layer and node config: the bytes of the layer's pieces (what its
  // tasks write, its parameters' homes) on its fullest device, measured
  // in the same lowerings as t_layer. Their sum over a choice bounds the
  // fullest device's peak from above, as the node costs' sum its time.
  std::vector<std::vector<double>> memory;
  int64_t lowerings = 0;  // step lowerings the layer costs took
};

struct LayerwiseOptions {
  // A layer with more configurations keeps those on all devices, then the
  // whole layer on device 0, then the others in the space's order: the
  // solver's work grows with the cube of the count.
  int64_t max_configs = 48;
};

StatusOr<LayerwiseCosts> BuildLayerwiseCosts(const SearchSpace& space, const Graph& step, const Machine& machine,
                                             const CostModel& cost, const LayerwiseOptions& options = {});

// The space's choice that a solution of `costs.graph` stands for.
Choice ChoiceOfSolution(const LayerwiseCosts& costs, const std::vector<int>& solution);

// A choice's cost in the layer-wise model, or nullopt when a layer's
// config is not among those the model kept.
std::optional<double> LayerwiseCostOf(const LayerwiseCosts& costs, const Choice& choice);

}  // namespace loom
