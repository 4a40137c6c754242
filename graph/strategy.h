// Parallelization strategies (docs/parallel.md): a text-proto file
// (core/proto/strategy.proto) that says, per forward layer, how many parts
// each SOAP dimension splits it into and which device runs each part.
//
//   devices: 2
//   default_split { sample: 2 }              # data parallel where a layer allows it
//   layer { layer: "fc*" parameter: 2 }      # the first matching entry wins
//   layer { layer: "classifier" devices: 1 } # operation parallel: whole, on device 1
//
// A layer is a compute node of the forward graph (sources, Parameters and
// Inputs, are not), named as the graph names it; a fused graph's layers
// keep the model's names. Entries apply as written: a degree the layer's op
// cannot split (OpDef::Splits), a degree that does not divide the extent it
// splits, or a device out of range is an error naming the file, line, layer
// and dimension. `default_split` applies to each layer along the dimensions
// the layer can split; the others stay 1, and its parts take the first
// devices of the default's list. A layer that reads only parameters (a
// fused array's weight reshapes) has no samples: its sample split runs it
// whole on every part's device (FollowBatch). An entry that matches no
// layer is an error too (a typo would otherwise go unnoticed).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/proto/strategy.pb.h"
#include "core/status.h"
#include "core/text_proto.h"
#include "graph/ir.h"
#include "ops/op.h"

namespace loom {

enum class SplitDim { kSample = 0, kReplica = 1, kAttribute = 2, kParameter = 3 };
inline constexpr int kSplitDims = 4;
inline constexpr SplitDim kAllSplitDims[kSplitDims] = {SplitDim::kSample, SplitDim::kReplica, SplitDim::kAttribute,
                                                       SplitDim::kParameter};
const char* SplitDimName(SplitDim d);  // "sample", "replica", "attribute", "parameter"

// One layer's split: a degree per dimension and the device of each part
// (parts in row-major order of sample, replica, attribute, parameter).
struct LayerSplit {
  std::array<int64_t, kSplitDims> degree{1, 1, 1, 1};
  // The op's parameter rule the parameter degree splits by
  // (SplitRules::Parameter): "" its default, or a variant's name.
  std::string parameter_split;
  std::vector<int64_t> devices{0};
  int64_t degree_of(SplitDim d) const { return degree[static_cast<int>(d)]; }
  int64_t parts() const { return degree[0] * degree[1] * degree[2] * degree[3]; }
  // The same degrees along the same rules (devices aside): the parts
  // divide the layer's tensors alike.
  bool SameForm(const LayerSplit& o) const { return degree == o.degree && parameter_split == o.parameter_split; }
  // "sample 2 x parameter 2 (vocabulary) on devices 0,1,2,3", "whole on device 1".
  std::string ToString() const;
  // Places the parts on devices first, first + 1, ...: in the parts' order,
  // except that the parts of one replica group go to adjacent devices (no
  // value moves between replica groups; a group's parts exchange
  // activations and all-reduce gradients, best over the nearest links:
  // search/baselines.cc has a measure).
  void PlaceGroupedByReplica(int64_t first);
};

// The replica count of a value's layout (graph/fusion.h), 0 when it has no
// replica axis.
int64_t ReplicasOf(const Value& v);

// The replica split of a fused graph's node: the rule of its op whose axes
// are those of its values' replica layouts (shared values read whole), or
// nullopt with the reason in `why`.
std::optional<DimSplit> ReplicaSplit(const Graph& graph, const Node& node, const SplitRules& rules, std::string* why);

// By value id: the axis that holds the step's samples, followed from the
// graph's inputs (axis 0; a fused array's per-replica inputs excepted)
// through each node's sample rule (FollowBatch); kNoSamples for parameters,
// state and what is computed from them alone (no Input reaches it: a fused
// array's stacked weights); -1 where none is known (a sum over the batch, a
// value no rule follows it into, a node that reads nothing).
inline constexpr int kNoSamples = -2;
std::vector<int> BatchAxes(const Graph& graph);

// `rules` with `sample` the rule that splits the batch where the node's
// inputs hold it (`batch_axes`: BatchAxes). An op labels as sample the split
// of its output's axis 0, which is time after a swap to time-major ([T, B,
// H], what an LSTM reads): there the rule that splits along the batch
// instead (another of the op's rules) becomes the sample rule, and the
// labelled one joins `other`. Unchanged where the labelled rule follows the
// batch, where no rule does, or where no input holds a known batch. A node
// that reads only values with kNoSamples (not a random one) has no samples
// to split: its sample rule replicates it (DimSplit::Replicates), as data
// parallelism keeps every parameter on every device; a labelled one joins
// `other`.
SplitRules FollowBatch(SplitRules rules, const Graph& graph, const Node& node, const std::vector<int>& batch_axes);

// The split rules of `node`'s op for its types (OpDef::Splits), the sample
// rule following the batch (FollowBatch); an error names the layer when its
// op is unknown.
StatusOr<SplitRules> NodeSplitRules(const Graph& graph, const Node& node, const std::vector<int>& batch_axes);

// The rule a layer's op splits by along `d` (sample, attribute, or the
// parameter rule `parameter_split` names; not replica), or nullopt with the
// reason in `why`.
std::optional<DimSplit> LabelledRule(const SplitRules& rules, SplitDim d, const std::string& parameter_split,
                                     std::string* why);

// The extent a layer's parts divide along `d` (`rules` are its op's
// splits): a fused array's replica count for the replica dimension, else
// the first axis its op's rule splits (for the parameter dimension, the
// rule `parameter_split` names). 0 when it cannot split along `d`, with the
// reason in `what`; else `what` names the extent ("output 0 axis 1 of
// [6, 8]"). A degree is valid when it divides the extent.
int64_t SplitExtent(const Graph& graph, const Node& node, const SplitRules& rules, SplitDim d, std::string* what,
                    const std::string& parameter_split = "");

// '*' matches any run of characters (also none), '?' any one character.
bool GlobMatch(const std::string& pattern, const std::string& name);

class Strategy {
 public:
  // From a file or text (`origin` names it in errors). Checks the file on
  // its own: devices >= 1, degrees >= 0, each entry's device list as long
  // as its parts, devices in range and distinct within an entry.
  static StatusOr<Strategy> Load(const std::string& path);
  static StatusOr<Strategy> Parse(const std::string& text, const std::string& origin);
  // A strategy built in code (the standard ones); errors name `origin`.
  static StatusOr<Strategy> FromProto(const proto::Strategy& strategy, const std::string& origin);

  const proto::Strategy& proto() const { return proto_; }
  int64_t devices() const { return proto_.devices(); }
  const std::string& origin() const { return origin_; }

  // Each compute node of `graph` (a forward graph, fused or not) with its
  // split, in node order; errors as in the header comment.
  StatusOr<std::vector<std::pair<NodeId, LayerSplit>>> Resolve(const Graph& graph) const;

 private:
  // The checks of the file on its own; fills default_ and entries_.
  Status Check();
  // "FILE:LINE" of an entry's field, or the file when the text has no line.
  std::string Where(const std::string& path) const;

  proto::Strategy proto_;
  LayerSplit default_;
  std::vector<LayerSplit> entries_;  // proto_.layer's splits
  TextLocations locations_;
  std::string origin_;
};

std::string StrategyToText(const proto::Strategy& strategy);

}  // namespace loom
