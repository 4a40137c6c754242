// The configurations a strategy search chooses among (docs/search.md):
// FlexFlow's "valid parallelization configurations" per layer, over the
// SOAP dimensions and a fused array's replicas.
//
// A layer's configurations are the splits whose degrees divide the extents
// they split (SplitExtent; along the parameter dimension, by each of the
// op's parameter rules) and whose part count p divides the devices, with
// the parts on an aligned block of consecutive devices (k*p .. k*p + p - 1):
// every block a tree of links would group together. Each is checked as the
// lowering would plan it (LayerParts), so every proposal lowers. A
// configuration the blocks leave out (a strategy file's own placement, or
// parts that do not divide the devices) joins the space when a strategy
// using it is read with ChoiceOf.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/proto/strategy.pb.h"
#include "core/status.h"
#include "graph/ir.h"
#include "graph/strategy.h"
#include "graph/task_graph.h"

namespace loom {

// A configuration index per layer of a SearchSpace, in its layer order.
using Choice = std::vector<int>;

class SearchSpace {
 public:
  struct Layer {
    NodeId node = -1;
    std::string name;
    std::vector<LayerSplit> configs;  // configs[0]: whole on device 0
    SplitRules rules;                 // its op's, the sample rule following the batch (NodeSplitRules)
  };
  // A value one layer writes and another reads: where a choice may have to
  // move data between them (forward, and its gradient backward).
  struct Edge {
    int from = 0, to = 0;   // layer indices
    ValueId value = kNoValue;
    int output = 0, input = 0;  // the value's output slot of `from`, input slot of `to`
  };

  // The space of `forward` (a forward graph, fused or not; it must outlive
  // the space) on `devices`.
  // Layer names must be usable as strategy patterns (no '*' or '?').
  static StatusOr<SearchSpace> Build(const Graph& forward, int64_t devices);

  const Graph& forward() const { return *forward_; }
  int64_t devices() const { return devices_; }
  const std::vector<Layer>& layers() const { return layers_; }
  const std::vector<Edge>& edges() const { return edges_; }
  // log10 of the number of choices.
  double Log10Size() const;

  // What BuildTaskGraph takes: each layer's split by name.
  std::map<std::string, LayerSplit> Splits(const Choice& choice) const;
  // A strategy file with an entry per layer not whole on device 0 (the
  // default split), naming the layer exactly.
  proto::Strategy ToStrategy(const Choice& choice) const;
  // The choice that resolves like `strategy` on the forward graph; a layer
  // configuration the space lacks is added (and checked as above).
  StatusOr<Choice> ChoiceOf(const Strategy& strategy);

 private:
  // The index of `split` among `layer`'s configurations, adding it if new.
  StatusOr<int> IndexOf(Layer* layer, const LayerSplit& split);

  const Graph* forward_ = nullptr;
  int64_t devices_ = 1;
  std::vector<Layer> layers_;
  std::vector<Edge> edges_;
};

}  // namespace loom
