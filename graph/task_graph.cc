#include "graph/task_graph.h"

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/hash.h"
#include "core/parse.h"
#include "ops/op.h"

namespace loom {

const char* TaskKindName(TaskKind kind) {
  switch (kind) {
    case TaskKind::kCompute: return "compute";
    case TaskKind::kTransfer: return "transfer";
    case TaskKind::kAllReduce: return "all-reduce";
    case TaskKind::kAllGather: return "all-gather";
    case TaskKind::kReduceScatter: return "reduce-scatter";
    case TaskKind::kAllToAll: return "all-to-all";
  }
  return "?";
}

namespace {

constexpr int kPartialAxis = -3;
constexpr int kNoAxis = -4;  // (BestMatch: a value not held split along a dimension matches no rule's axis)

// How a planned node wrote a value, per SOAP dimension: its degree and the
// axis it split (-1: whole or replicated, kPartialAxis: partial sums).
struct ValueSplit {
  LayerSplit split;  // of its producer
  std::array<int, kSplitDims> axis{-1, -1, -1, -1};
  // A producer pinned to the parts of one coordinate along a dimension of
  // its layer (ExpandBuilder::Pin): that dimension and coordinate.
  int pin_dim = -1;
  int64_t pin_part = -1;
};

// Orders pieces (by index) by their regions: a set of them keeps one
// piece of each region, without copying regions.
struct ByRegion {
  const std::vector<Piece>* pieces;
  bool operator()(int a, int b) const { return (*pieces)[a].region < (*pieces)[b].region; }
};
using DistinctRegions = std::set<int, ByRegion>;

using DimRules = std::array<std::optional<DimSplit>, kSplitDims>;

// Every tensor whole, every part computing all of it (a replicated op).
DimSplit Replicated(size_t inputs, size_t outputs) { return SplitAlong(-1, inputs, outputs); }

// Which of its op's labelled rules a node split by along a dimension:
// sample, attribute, or a parameter rule (with its variant's name).
struct RuleLabel {
  SplitDim dim = SplitDim::kSample;
  std::string parameter_split;
};
using DimLabels = std::array<std::optional<RuleLabel>, kSplitDims>;

std::optional<RuleLabel> LabelOf(const SplitRules& rules, const DimSplit& chosen) {
  auto same = [&](const std::optional<DimSplit>& r) {
    return r && r->SameAxes(chosen) && r->partial_sums == chosen.partial_sums && r->expands == chosen.expands;
  };
  if (same(rules.sample)) return RuleLabel{SplitDim::kSample, ""};
  if (same(rules.attribute)) return RuleLabel{SplitDim::kAttribute, ""};
  if (same(rules.parameter)) return RuleLabel{SplitDim::kParameter, ""};
  for (const auto& [name, rule] : rules.parameter_variants)
    if (same(rule)) return RuleLabel{SplitDim::kParameter, name};
  return std::nullopt;
}

// Whether each region has the shape of the type at its index, as
// regions[i].shape() == types[i].shape says (without making the shapes).
bool ShapedAs(const std::vector<Region>& regions, const std::vector<TensorType>& types) {
  for (size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    for (int d = 0; d < r.rank(); ++d)
      if (r.hi[d] - r.lo[d] != types[i].shape[d]) return false;
  }
  return true;
}

// Whether the regions at each index have the same shape (a[i].shape() ==
// b[i].shape(), without making the shapes).
bool SameShapes(const std::vector<Region>& a, const std::vector<Region>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    for (int d = 0; d < a[i].rank(); ++d)
      if (a[i].hi[d] - a[i].lo[d] != b[i].hi[d] - b[i].lo[d]) return false;
  return true;
}

// The types of a part's regions of values of types `whole`.
std::vector<TensorType> PartTypes(const std::vector<Region>& regions, const std::vector<TensorType>& whole) {
  std::vector<TensorType> types;
  types.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) types.push_back({regions[i].shape(), whole[i].dtype});
  return types;
}

// Whether r is a non-empty box inside a tensor of `shape` (a window part's
// may reach past it), as r.Intersect(Region::Whole(shape)) == r says.
bool Inside(const Region& r, const Shape& shape) {
  if (r.rank() != shape.rank()) return false;
  for (int d = 0; d < r.rank(); ++d)
    if (r.lo[d] < 0 || r.hi[d] > shape[d] || r.lo[d] >= r.hi[d]) return false;
  return true;
}

// A compute task's name: its node's, with "[p]" when the node has parts.
std::string TaskName(const std::string& node, size_t part, size_t parts) {
  if (parts == 1) return node;
  const std::string index = std::to_string(part);
  std::string name;
  name.reserve(node.size() + index.size() + 2);
  return name.append(node).append("[").append(index).append("]");
}

template <typename List>
std::string Join(const List& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// The output types of `op` on `in`, its attributes made canonical.
StatusOr<std::vector<TensorType>> Infer(const std::string& op, const std::vector<TensorType>& in, AttrMap* attrs) {
  const OpDef* def = OpRegistry::Global().FindOp(op);
  if (!def) return InvalidArgument("unknown op ", op);
  LOOM_RETURN_IF_ERROR(CanonicalizeAttrs(*def, attrs));
  return def->InferTypes(*attrs, in);
}

// Emits a node's expansion (OpDef::Expand) into the graph being lowered.
class Expansion : public ExpandBuilder {
 public:
  Expansion(Graph& graph, const Node& node, int64_t parts)
      : g_(graph), node_(node), outputs_(node.outputs.size(), kNoValue), parts_(parts) {}
  const Node& node() const override { return node_; }
  int64_t parts() const override { return parts_; }
  void Pin(int64_t part) override { pin_ = part; }
  const TensorType& type(ValueId v) const override { return g_.type(v); }
  std::vector<ValueId> Emit(const std::string& op, const std::vector<ValueId>& inputs, const AttrMap& attrs,
                            const std::string& suffix) override {
    std::vector<TensorType> in;
    for (ValueId v : inputs) in.push_back(g_.type(v));
    AttrMap canonical = attrs;
    StatusOr<std::vector<TensorType>> out = Infer(op, in, &canonical);
    if (!out.ok()) {
      // A rule that emits an ill-typed node is a bug in the rule.
      if (status_.ok()) status_ = Internal("the expansion of '", node_.name, "' emits an ill-typed ", op, ": ",
                                           out.status().message());
      return std::vector<ValueId>(1, node_.inputs.at(0));
    }
    const NodeId id = g_.AddNode(g_.UniqueName(node_.name + "/" + suffix), op, canonical, inputs, *out);
    emitted_.push_back(id);
    if (pin_ >= 0) pins_[id] = pin_;
    return g_.node(id).outputs;
  }
  void SetOutput(int i, ValueId v) override { outputs_.at(static_cast<size_t>(i)) = v; }

  // The emitted nodes and what stands for each output, or why the
  // expansion is not one.
  StatusOr<std::vector<NodeId>> Finish() const {
    LOOM_RETURN_IF_ERROR(status_);
    for (size_t i = 0; i < outputs_.size(); ++i)
      if (outputs_[i] == kNoValue || g_.type(outputs_[i]) != g_.type(node_.outputs[i]))
        return Internal("the expansion of '", node_.name, "' (", node_.op, ") does not give output ", i, " as ",
                        g_.type(node_.outputs[i]).ToString());
    return emitted_;
  }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const std::map<NodeId, int64_t>& pins() const { return pins_; }

 private:
  Graph& g_;
  const Node node_;
  std::vector<ValueId> outputs_;
  std::vector<NodeId> emitted_;
  Status status_;
  const int64_t parts_;
  int64_t pin_ = -1;
  std::map<NodeId, int64_t> pins_;  // emitted nodes pinned to a coordinate
};

// The regions of every part (row-major over sample, replica, attribute,
// parameter), or why the split does not fit the shapes.
StatusOr<std::vector<PartRegions>> Parts(const Graph& g, const Node& n, const LayerSplit& split, const DimRules& dims) {
  std::vector<PartRegions> parts(static_cast<size_t>(split.parts()), PartRegions(n.inputs.size(), n.outputs.size()));
  for (int64_t p = 0; p < split.parts(); ++p) {
    std::array<int64_t, kSplitDims> coord{};
    for (int64_t rest = p, d = kSplitDims - 1; d >= 0; --d) {
      coord[static_cast<size_t>(d)] = rest % split.degree[static_cast<size_t>(d)];
      rest /= split.degree[static_cast<size_t>(d)];
    }
    PartRegions& part = parts[static_cast<size_t>(p)];
    // Outputs first: a window input's rows follow from its output rows.
    for (size_t k = 0; k < n.inputs.size() + n.outputs.size(); ++k) {
      const bool input = k >= n.outputs.size();
      const size_t j = input ? k - n.outputs.size() : k;
      const ValueId v = input ? n.inputs[j] : n.outputs[j];
      Region r = Region::Whole(g.type(v).shape);
      bool partial = false;
      int unread_axis = -1;  // another part's input: none of it (an empty range of this axis)
      int64_t partial_index = 0;
      for (size_t d = 0; d < kSplitDims; ++d) {
        if (!dims[d]) continue;
        const AxisSplit& a = input ? dims[d]->inputs[j] : dims[d]->outputs[j];
        if (a.axis < 0) {
          if (!input && dims[d]->partial_sums) {
            partial = true;
            partial_index = partial_index * split.degree[d] + coord[d];
          }
          if (input && a.part >= 0 && a.part != coord[d])
            unread_axis = std::max(0, dims[d]->outputs.empty() ? 0 : dims[d]->outputs[0].axis);
          continue;
        }
        if (a.axis >= r.rank())
          return InvalidArgument("axis ", a.axis, " of '", g.value(v).name, "' ", g.type(v).shape.ToString());
        if (input && (a.stride != 1 || a.span != 1 || a.padding != 0)) {
          // Output rows [lo, hi) read input rows [lo * stride - padding,
          // (hi - 1) * stride - padding + span); rows outside the input
          // are the padding, read as zeros or left to the part.
          const int out_axis = dims[d]->outputs[0].axis;
          const Region& y = part.outputs[0];
          r.lo[a.axis] = y.lo[out_axis] * a.stride - a.padding;
          r.hi[a.axis] = (y.hi[out_axis] - 1) * a.stride - a.padding + a.span;
          if (!a.zero_padding) {
            r.lo[a.axis] = std::max<int64_t>(r.lo[a.axis], 0);
            r.hi[a.axis] = std::min(r.hi[a.axis], g.type(v).shape[a.axis]);
          }
          continue;
        }
        const int64_t k = split.degree[d], len = r.hi[a.axis] - r.lo[a.axis];
        if (len % k != 0)
          return InvalidArgument(SplitDimName(kAllSplitDims[d]), " ", k, " does not divide extent ", len, " of axis ",
                                 a.axis, " of '", g.value(v).name, "' ", g.type(v).shape.ToString());
        r.lo[a.axis] += coord[d] * (len / k);
        r.hi[a.axis] = r.lo[a.axis] + len / k;
      }
      if (unread_axis >= 0 && unread_axis < r.rank()) r.hi[unread_axis] = r.lo[unread_axis];
      (input ? part.inputs : part.outputs)[j] = std::move(r);
      if (!input) {
        part.partial[j] = partial;
        part.partial_index[j] = partial_index;
      }
    }
  }
  return parts;
}

// The attributes of each part, checked by type inference against its
// regions, and per part whether it is like the one before (the same
// attributes and shapes): most parts of a split are, and share the
// attributes, check and cost of the first of them.
Status PartAttrs(const Node& n, const OpDef& def, const std::vector<TensorType>& in,
                 const std::vector<TensorType>& out, const std::vector<PartRegions>& parts,
                 std::vector<std::shared_ptr<const AttrMap>>* attrs, std::vector<bool>* alike) {
  std::shared_ptr<const AttrMap> whole_attrs;  // n's, for the parts that are all of it
  for (size_t p = 0; p < parts.size(); ++p) {
    const PartRegions& part = parts[p];
    const bool whole = ShapedAs(part.inputs, in) && ShapedAs(part.outputs, out);
    if (whole) {
      if (!whole_attrs) whole_attrs = std::make_shared<const AttrMap>(n.attrs);
      attrs->push_back(whole_attrs);
    } else {
      LOOM_ASSIGN_OR_RETURN(AttrMap a, def.PartAttrs(n.attrs, in, out, part.inputs, part.outputs));
      const bool same = p > 0 && a == *attrs->back();
      attrs->push_back(same ? attrs->back() : std::make_shared<const AttrMap>(std::move(a)));
    }
    // Parts of the same shapes are both whole or both not, and then share
    // their attributes when equal.
    alike->push_back(p > 0 && attrs->at(p) == attrs->at(p - 1) && SameShapes(part.inputs, parts[p - 1].inputs) &&
                     SameShapes(part.outputs, parts[p - 1].outputs));
    if (whole || alike->back()) continue;
    LOOM_ASSIGN_OR_RETURN(std::vector<TensorType> inferred,
                          InferOpTypes(def, *attrs->back(), PartTypes(part.inputs, in)));
    for (size_t i = 0; i < out.size(); ++i)
      if (i >= inferred.size() || inferred[i].shape != part.outputs[i].shape())
        return InvalidArgument("a part of output ", i, " would be ",
                               i < inferred.size() ? inferred[i].shape.ToString() : "missing", ", not ",
                               part.outputs[i].shape().ToString());
  }
  return Status::Ok();
}

// Parts that compute all of a node's outputs read only what its op says
// such a run needs (OpDef::WholeReads: a Slice's range).
void ReadLess(const OpDef& def, const Node& n, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
              std::vector<PartRegions>* parts) {
  std::optional<std::vector<Region>> reads;
  bool asked = false;
  for (PartRegions& part : *parts) {
    if (!ShapedAs(part.outputs, out) || !ShapedAs(part.inputs, in)) continue;
    if (!asked) reads = def.WholeReads(n.attrs, in, out), asked = true;
    if (reads) part.inputs = *reads;
  }
}

// The rules of a forward layer's split, one per dimension it splits (its
// op's labelled rule; the replica dimension's follows the replica layouts).
StatusOr<DimRules> ForwardDims(const Graph& g, const Node& n, const SplitRules& rules, const LayerSplit& split) {
  DimRules dims;
  for (int d = 0; d < kSplitDims; ++d) {
    const int64_t degree = split.degree[static_cast<size_t>(d)];
    if (degree == 1) continue;
    std::string why;
    dims[static_cast<size_t>(d)] = d == static_cast<int>(SplitDim::kReplica)
                                       ? ReplicaSplit(g, n, rules, &why)
                                       : LabelledRule(rules, kAllSplitDims[d], split.parameter_split, &why);
    if (!why.empty())
      return InvalidArgument("layer '", n.name, "' (", n.op, "): ", SplitDimName(kAllSplitDims[d]), " ", degree, ": ",
                             why);
  }
  for (int d = 0; d < kSplitDims; ++d)
    if (dims[static_cast<size_t>(d)] && dims[static_cast<size_t>(d)]->alone &&
        split.parts() != split.degree[static_cast<size_t>(d)])
      return InvalidArgument("layer '", n.name, "' (", n.op, "): ", split.ToString(), ": its split along ",
                             SplitDimName(kAllSplitDims[d]), " chains its parts and combines with no other dimension");
  return dims;
}

// The split of a node pinned to coordinate `part` along dimension `dim` of
// its layer's split: the parts with that coordinate (1 along `dim`).
LayerSplit PinnedSplit(const LayerSplit& layer, int dim, int64_t part) {
  LayerSplit pinned = layer;
  pinned.degree[static_cast<size_t>(dim)] = 1;
  pinned.devices.clear();
  for (int64_t p = 0; p < layer.parts(); ++p) {
    int64_t coord = p;
    for (int d = kSplitDims - 1; d > dim; --d) coord /= layer.degree[static_cast<size_t>(d)];
    if (coord % layer.degree[static_cast<size_t>(dim)] == part)
      pinned.devices.push_back(layer.devices[static_cast<size_t>(p)]);
  }
  return pinned;
}

// Where a piece is listed in its value's state: among the pieces its
// producer (or an all-reduce of its partial sums) wrote, the ones transfers
// brought to a device, or a source's homes.
// kLoose: listed nowhere (a partial sum's part brought to where it is
// summed), read only by the task made with it.
enum class Slot : uint8_t { kOrigin, kDerived, kHome, kLoose };

// What the lowering knows of one value while it plans.
struct ValueState {
  bool written = false;    // its producer is planned: `origin` holds its pieces
  bool unreduced = false;  // `origin` holds partial sums not yet all-reduced
  std::vector<int> origin;
  std::vector<std::pair<int64_t, std::vector<int>>> derived;  // transferred pieces, by device
  std::vector<int> homes;                                     // a source's home pieces
  std::vector<int> created;  // all its pieces in the order they were made: a replay maps pieces through it
  int split = -1;        // how its producer wrote it (an index into the lowering's split log)
  int source_read = -1;  // a source: how the first forward layer reading it reads it (likewise)
  ValueId renamed = kNoValue;  // the value of the expansion that replaced its producer
  // A hash of every change above, in order: two lowerings that reach a
  // value with equal versions hold equal pieces of it, made in the same
  // order, with equal splits.
  uint64_t version = 0;

  void Clear() {
    written = unreduced = false;
    origin.clear();
    for (auto& [device, pieces] : derived) pieces.clear();  // kept, with their memory
    homes.clear();
    created.clear();
    split = source_read = -1;
    renamed = kNoValue;
    version = 0;
  }
  std::vector<int>* Derived(int64_t device) {
    for (auto& [d, pieces] : derived)
      if (d == device) return &pieces;
    return nullptr;
  }
  const std::vector<int>* Derived(int64_t device) const { return const_cast<ValueState*>(this)->Derived(device); }
};

// One effect of a segment (planning a node, covering a state's homes, its
// writebacks), in the order it happened. A segment whose signature (the
// node's split, the versions of what it reads) is the last lowering's has
// the same effects, its tasks and pieces renumbered: an incremental
// lowering replays them instead of planning again.
struct Effect {
  enum Kind : uint8_t { kTask, kPiece, kReduce, kUnreduced, kSplit, kSourceRead, kRename, kWriteback };
  Kind kind;
  int index;      // the task, the piece, the value or the writeback
  int other = 0;  // kSplit, kSourceRead: the split log's entry; kRename: the value that stands for it
};

// The effects of one step of a lowering: planning a node of the graph's
// order (and its expansion), reading a node's gradients early (see
// Lowering::ReadGradientsEarly), covering a state's homes, or its
// writebacks.
struct Segment {
  enum Kind : uint8_t { kNode, kEarlyRead, kCover, kWriteback };
  Kind kind = kNode;
  int index = 0;           // the node (also for kEarlyRead: the reader), the state value, the state update
  uint64_t signature = 0;  // what decides its effects: splits and the versions of what it reads
  size_t effects_begin = 0, effects_end = 0;
};

// What a lowering leaves for the next one to replay.
struct Record {
  std::vector<Segment> segments;
  std::vector<Effect> effects;
  std::vector<ValueSplit> splits;       // the split log
  std::vector<ValueId> piece_value;     // by piece: its value (read here, not from the 128-byte Piece)
  std::vector<int> piece_ordinal;       // by piece: its index in its value's `created`
  std::vector<Slot> piece_slot;         // by piece
  std::vector<uint64_t> piece_content;  // by piece: what Place hashes into its value's version

  void Clear() {
    segments.clear();
    effects.clear();
    splits.clear();
    piece_value.clear();
    piece_ordinal.clear();
    piece_slot.clear();
    piece_content.clear();
  }
};

// A node's expansion: the nodes that replace it and the values that stand
// for its outputs.
struct ExpansionOf {
  std::vector<NodeId> nodes;
  std::vector<ValueId> outputs;
};

// An expansion's node pinned to the parts of one coordinate along the
// expanding dimension of its layer (ExpandBuilder::Pin).
struct PinnedTo {
  int dim = 0;
  int64_t part = 0;
};

class Lowering {
 public:
  // Lowers `graph` (owned: expansions add nodes to it) onto `devices`.
  // Incremental: kept between runs, each run replaying what it can of the
  // last; its graph keeps every expansion it made (see IncrementalLowering).
  Lowering(Graph graph, int64_t devices, const LoweringOptions& options, bool incremental)
      : options_(options), incremental_(incremental) {
    tg_.graph = std::move(graph);
    tg_.devices = devices;
    for (const Node& n : g_.nodes()) order_.push_back(n.id);
    GrowValues(order_);
    for (NodeId id : order_)
      if (!IsSourceOp(g_.node(id).op)) planned_order_.push_back(id);
    for (const auto& [param, grad] : g_.gradients()) {
      if (static_cast<size_t>(grad) >= parameter_of_.size())
        parameter_of_.resize(static_cast<size_t>(grad) + 1, kNoValue);
      parameter_of_[static_cast<size_t>(grad)] = param;
    }
    FindGradientReaders();
    batch_axes_ = BatchAxes(g_);
  }

  Status Run(const std::map<std::string, LayerSplit>& layers) {
    layers_ = &layers;
    layer_splits_.clear();
    Hash64 names;
    for (const auto& [name, split] : layers) {
      names.AddString(name);
      layer_splits_.push_back(&split);
    }
    // Other layer names, other owners: nothing to replay.
    if (names.value() != layer_names_) {
      owners_.clear();
      last_ok_ = false;
      layer_names_ = names.value();
    }
    replay_ = incremental_ && last_ok_;
    last_ok_ = false;
    StartRun();
    for (NodeId id : planned_order_) {
      LOOM_RETURN_IF_ERROR(InSegment(Segment::kNode, id, incremental_ ? Signature(id) : 0, [&] {
        ++planned_;
        return PlanNode(id);
      }));
      LOOM_RETURN_IF_ERROR(ReadGradientsEarly(id));
    }
    if (!incremental_) ReplaceExpanded();
    LOOM_RETURN_IF_ERROR(Finish());
    last_ok_ = true;
    return Status::Ok();
  }

  const TaskGraph& result() const { return tg_; }
  TaskGraph Take() { return std::move(tg_); }
  int64_t planned() const { return planned_; }

 private:
  // Clears the last run's results, keeping them (tasks, pieces, effects)
  // for replay.
  void StartRun() {
    std::swap(last_, record_);
    record_.Clear();
    last_tasks_.swap(tg_.tasks);
    last_pieces_.swap(tg_.pieces);
    last_writebacks_.swap(tg_.writebacks);
    last_cost_keys_.swap(tg_.cost_keys);
    tg_.tasks.clear();
    tg_.pieces.clear();
    piece_producers_.clear();
    tg_.writebacks.clear();
    tg_.outputs.clear();
    tg_.fingerprints.clear();
    tg_.cost_keys.clear();
    tg_.dependencies.clear();
    tg_.dependency_end.clear();
    task_map_.assign(last_tasks_.size(), -1);
    for (ValueState& s : values_) s.Clear();
    planned_ = 0;
    // Room for a part of each node on every device of the widest split,
    // and two pieces each (about what data parallelism makes), or for as
    // many as the last run made: growing would move every task and piece
    // again, into memory not touched before.
    int64_t widest = 1;
    for (const auto& [name, split] : *layers_) widest = std::max(widest, split.parts());
    tg_.tasks.reserve(std::max(last_tasks_.size(), static_cast<size_t>(g_.num_nodes() * widest)));
    tg_.pieces.reserve(std::max(last_pieces_.size(), static_cast<size_t>(2 * g_.num_nodes() * widest)));
  }

  // The graph's outputs (planned anew every run), the states' home covers
  // and writebacks (segments, like the nodes), then what the simulator
  // reads: bytes per device and the tasks' fingerprints.
  Status Finish() {
    for (const auto& [name, v] : g_.outputs()) {
      LOOM_ASSIGN_OR_RETURN(tg_.outputs[name], Whole(Renamed(v)));
    }
    for (const Node& n : g_.nodes()) {
      if (!IsStateOp(n.op)) continue;
      const ValueId state = n.outputs[0];
      LOOM_RETURN_IF_ERROR(InSegment(Segment::kCover, state, ValueSignature({state}), [&] {
        CoverHomes(state);
        return Status::Ok();
      }));
    }
    for (size_t i = 0; i < g_.state_updates().size(); ++i) {
      const ValueId state = g_.state_updates()[i].state, new_value = Renamed(g_.state_updates()[i].new_value);
      LOOM_RETURN_IF_ERROR(
          InSegment(Segment::kWriteback, static_cast<int>(i), ValueSignature({state, new_value}), [&]() -> Status {
            const std::vector<int> homes = State(state).homes;  // a copy: Fetch may add homes
            for (int h : homes) {
              LOOM_ASSIGN_OR_RETURN(Operand from, Fetch(new_value, piece(h).region, piece(h).device));
              tg_.writebacks.emplace_back(h, std::move(from));
              Journal(Effect::kWriteback, static_cast<int>(tg_.writebacks.size()) - 1);
            }
            return Status::Ok();
          }));
    }
    // The homes by value, updated in place: a run mostly makes the last
    // run's again, and rebuilding the map allocated every entry anew.
    auto at = tg_.homes.begin();
    for (size_t v = 0; v < values_.size(); ++v) {
      const ValueId id = static_cast<ValueId>(v);
      while (at != tg_.homes.end() && at->first < id) at = tg_.homes.erase(at);
      const std::vector<int>& homes = values_[v].homes;
      if (homes.empty()) continue;
      if (at != tg_.homes.end() && at->first == id) {
        at->second.assign(homes.begin(), homes.end());
        ++at;
      } else {
        tg_.homes.emplace_hint(at, id, homes);
      }
    }
    tg_.homes.erase(at, tg_.homes.end());
    tg_.piece_bytes.assign(static_cast<size_t>(tg_.devices), 0.0);
    for (const Piece& p : tg_.pieces) tg_.piece_bytes[static_cast<size_t>(p.device)] += p.bytes;
    tg_.fingerprints.reserve(tg_.tasks.size());
    tg_.dependency_end.reserve(tg_.tasks.size());
    for (size_t i = 0; i < tg_.tasks.size(); ++i) {
      uint64_t& content = tg_.cost_keys[i];  // (0: not computed; a replayed task keeps its own)
      if (content == 0) content = Content(tg_.tasks[i]);
      const IdList& deps = tg_.tasks[i].deps;
      Hash64 h;
      h.Add(content);
      h.AddAll(deps);
      tg_.fingerprints.push_back(h.value());
      tg_.dependencies.insert(tg_.dependencies.end(), deps.begin(), deps.end());
      tg_.dependency_end.push_back(static_cast<uint32_t>(tg_.dependencies.size()));
    }
    return Status::Ok();
  }

  // Runs `plan` as a segment of the record (in an incremental lowering), or
  // replays the last run's segment instead when it has the same signature.
  template <typename Plan>
  Status InSegment(Segment::Kind kind, int index, uint64_t signature, Plan plan) {
    if (!incremental_) return plan();
    const size_t s = record_.segments.size();
    record_.segments.push_back({kind, index, signature, record_.effects.size(), 0});
    recording_ = true;
    Status status;
    if (replay_ && s < last_.segments.size() && last_.segments[s].kind == kind && last_.segments[s].index == index &&
        last_.segments[s].signature == signature) {
      status = Replay(last_.segments[s]);
    } else {
      status = plan();
    }
    recording_ = false;
    record_.segments[s].effects_end = record_.effects.size();
    return status;
  }

  // What a segment that reads only `values` reads: their versions.
  uint64_t ValueSignature(std::initializer_list<ValueId> values) const {
    Hash64 h;
    for (ValueId v : values) {
      h.Add(v);
      h.Add(State(v).version);
    }
    return h.value();
  }

  // What decides how node `id` is planned: the split of its layer and how
  // its inputs stand (their versions).
  uint64_t Signature(NodeId id) {
    const Node& n = g_.node(id);
    Hash64 h;
    h.Add(id);
    bool forward = false;
    if (const LayerSplit* owner = OwnerOf(id, &forward)) {
      h.Add(forward);
      h.Add(owner->degree);
      h.AddString(owner->parameter_split);
      h.AddAll(owner->devices);
    }
    for (ValueId v : n.inputs) {
      const ValueId w = Renamed(v);
      h.Add(w);
      h.Add(values_[static_cast<size_t>(w)].version);
    }
    return h.value();
  }

  // Redoes a segment of the last run: its tasks and pieces (moved from the
  // last run's, renumbered) and its changes to the values' states.
  Status Replay(const Segment& old) {
    const size_t first_task = tg_.tasks.size(), first_writeback = tg_.writebacks.size();
    for (size_t e = old.effects_begin; e < old.effects_end; ++e) {
      const Effect& effect = last_.effects[e];
      switch (effect.kind) {
        case Effect::kTask: {
          const int id = static_cast<int>(tg_.tasks.size());
          task_map_[static_cast<size_t>(effect.index)] = id;
          tg_.tasks.push_back(std::move(last_tasks_[static_cast<size_t>(effect.index)]));
          tg_.tasks.back().id = id;
          // Its operands are read below, after the segment's other effects:
          // their heap block is fetched meanwhile (it was most of a replay's
          // time, a cache miss per task).
          const std::vector<Operand>& inputs = tg_.tasks.back().inputs;
          for (size_t b = 0; b < inputs.size() * sizeof(Operand); b += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(inputs.data()) + b);
          tg_.cost_keys.push_back(last_cost_keys_[static_cast<size_t>(effect.index)]);
          Journal(Effect::kTask, id);
          break;
        }
        case Effect::kPiece: {
          Piece p = std::move(last_pieces_[static_cast<size_t>(effect.index)]);
          if (p.producer >= 0) p.producer = task_map_[static_cast<size_t>(p.producer)];  // a task of the segment
          Place(std::move(p), last_.piece_slot[static_cast<size_t>(effect.index)],
                last_.piece_content[static_cast<size_t>(effect.index)]);
          break;
        }
        case Effect::kReduce: DropPartials(effect.index); break;
        case Effect::kUnreduced: MarkUnreduced(effect.index); break;
        case Effect::kSplit:
          SetSplit(effect.index, std::move(last_.splits[static_cast<size_t>(effect.other)]), false);
          break;
        case Effect::kSourceRead:
          SetSplit(effect.index, std::move(last_.splits[static_cast<size_t>(effect.other)]), true);
          break;
        case Effect::kRename: SetRenamed(effect.index, effect.other); break;
        case Effect::kWriteback:
          tg_.writebacks.push_back(std::move(last_writebacks_[static_cast<size_t>(effect.index)]));
          Journal(Effect::kWriteback, static_cast<int>(tg_.writebacks.size()) - 1);
          break;
      }
    }
    // The tasks read and write the last run's piece numbers: each is its
    // value's n-th piece, which this run has made too (equal versions).
    for (size_t i = first_task; i < tg_.tasks.size(); ++i) {
      Task& t = tg_.tasks[i];
      for (Operand& op : t.inputs) LOOM_RETURN_IF_ERROR(MapPieces(&op.pieces));
      LOOM_RETURN_IF_ERROR(MapPieces(&t.sources));
      LOOM_RETURN_IF_ERROR(MapPieces(&t.outputs));
      SetDeps(t);
    }
    for (size_t i = first_writeback; i < tg_.writebacks.size(); ++i) {
      auto& [home, from] = tg_.writebacks[i];
      IdList pieces{home};
      LOOM_RETURN_IF_ERROR(MapPieces(&pieces));
      home = pieces[0];
      LOOM_RETURN_IF_ERROR(MapPieces(&from.pieces));
    }
    return Status::Ok();
  }

  // Last run's piece numbers to this run's.
  Status MapPieces(IdList* pieces) const {
    for (int& p : *pieces) {
      const ValueId v = last_.piece_value[static_cast<size_t>(p)];
      const std::vector<int>& created = State(v).created;
      const size_t n = static_cast<size_t>(last_.piece_ordinal[static_cast<size_t>(p)]);
      if (n >= created.size())
        return Internal("incremental lowering: piece ", n, " of '", g_.value(v).name, "' is not made again");
      p = created[n];
    }
    return Status::Ok();
  }

  // What a task's fingerprint hashes but its dependencies (positions,
  // which replays renumber).
  uint64_t Content(const Task& t) const {
    Hash64 h;
    h.Add(t.kind);
    h.Add(t.device);
    h.Add(t.src_device);
    h.Add(t.name.data(), t.name.size());
    h.Add(t.flops);
    h.Add(t.bytes);
    h.Add(t.dtype);
    h.AddAll(t.group);
    for (const Operand& op : t.inputs) {
      h.AddAll(op.region.lo);
      h.AddAll(op.region.hi);
    }
    for (const IdList* list : {&t.sources, &t.outputs}) {
      h.Add(list->size());
      for (int p : *list) {
        h.Add(piece(p).device);
        h.AddAll(piece(p).region.lo);
        h.AddAll(piece(p).region.hi);
      }
    }
    const uint64_t content = h.value();
    return content ? content : 1;  // 0 is "not computed"
  }

  // ---- Changes to the state, each journaled (in an incremental run) and
  // hashed into the value's version.

  void Journal(Effect::Kind kind, int index, int other = 0) {
    if (recording_) record_.effects.push_back({kind, index, other});
  }
  ValueState& State(ValueId v) { return values_[static_cast<size_t>(v)]; }
  const ValueState& State(ValueId v) const { return values_[static_cast<size_t>(v)]; }
  template <typename... T>
  void Bump(ValueId v, const T&... what) {
    Hash64 h;
    h.Add(State(v).version);
    (h.Add(what), ...);
    State(v).version = h.value();
  }

  // Adds piece `p` to the graph and to its value's `slot`; `content`: its
  // hash, when known (a replayed piece's).
  int Place(Piece p, Slot slot, uint64_t content = 0) {
    const int id = static_cast<int>(tg_.pieces.size());
    ValueState& s = State(p.value);
    if (content == 0) {
      Hash64 c;
      c.Add(slot);
      c.Add(p.device);
      c.AddAll(p.region.lo);
      c.AddAll(p.region.hi);
      c.Add(p.partial);
      c.Add(p.partial_index);
      content = c.value();
    }
    Hash64 h;
    h.Add(s.version);
    h.Add(content);
    s.version = h.value();
    switch (slot) {
      case Slot::kOrigin:
        s.written = true;
        s.origin.push_back(id);
        break;
      case Slot::kDerived: {
        std::vector<int>* list = s.Derived(p.device);
        if (!list) list = &s.derived.emplace_back(p.device, std::vector<int>()).second;
        list->push_back(id);
        break;
      }
      case Slot::kHome: s.homes.push_back(id); break;
      case Slot::kLoose: break;
    }
    record_.piece_value.push_back(p.value);
    record_.piece_ordinal.push_back(static_cast<int>(s.created.size()));
    record_.piece_slot.push_back(slot);
    record_.piece_content.push_back(content);
    s.created.push_back(id);
    piece_producers_.push_back(p.producer);
    tg_.pieces.push_back(std::move(p));
    Journal(Effect::kPiece, id);
    return id;
  }
  int NewPiece(ValueId v, int64_t device, Region region, bool partial, int64_t partial_index, int producer,
               Slot slot) {
    Piece p;
    p.value = v;
    p.device = device;
    p.region = std::move(region);
    p.partial = partial;
    p.partial_index = partial_index;
    p.producer = producer;
    p.bytes = Bytes(v, p.region);
    return Place(std::move(p), slot);
  }
  // An all-reduce replaces the partial pieces of v's origin by its outputs.
  void DropPartials(ValueId v) {
    ValueState& s = State(v);
    s.origin.erase(std::remove_if(s.origin.begin(), s.origin.end(), [&](int p) { return piece(p).partial; }),
                   s.origin.end());
    s.unreduced = false;
    Bump(v, Effect::kReduce);
    Journal(Effect::kReduce, v);
  }
  void MarkUnreduced(ValueId v) {
    if (State(v).unreduced) return;
    State(v).unreduced = true;
    Bump(v, Effect::kUnreduced);
    Journal(Effect::kUnreduced, v);
  }
  void SetSplit(ValueId v, ValueSplit split, bool source_read) {
    Hash64 h;
    h.Add(State(v).version);
    h.Add(source_read);
    h.Add(split.split.degree);
    h.AddString(split.split.parameter_split);
    h.AddAll(split.split.devices);
    h.Add(split.axis);
    h.Add(split.pin_dim);
    h.Add(split.pin_part);
    State(v).version = h.value();
    const int index = static_cast<int>(record_.splits.size());
    record_.splits.push_back(std::move(split));
    (source_read ? State(v).source_read : State(v).split) = index;
    Journal(source_read ? Effect::kSourceRead : Effect::kSplit, v, index);
  }
  const ValueSplit* SplitOf(ValueId v) const {
    const int i = State(v).split;
    return i < 0 ? nullptr : &record_.splits[static_cast<size_t>(i)];
  }
  const ValueSplit* SourceReadOf(ValueId v) const {
    const int i = State(v).source_read;
    return i < 0 ? nullptr : &record_.splits[static_cast<size_t>(i)];
  }
  void SetRenamed(ValueId v, ValueId by) {
    State(v).renamed = by;
    Bump(v, Effect::kRename, by);
    Journal(Effect::kRename, v, by);
  }

  // ----

  const Piece& piece(int p) const { return tg_.pieces[static_cast<size_t>(p)]; }
  double Bytes(ValueId v, const Region& r) const {
    return static_cast<double>(r.numel()) * static_cast<double>(DTypeSize(g_.type(v).dtype));
  }
  // Sets a task's dependencies: the writers of what it reads.
  void SetDeps(Task& t) const {
    IdList& deps = t.deps;
    deps.clear();
    for (const Operand& op : t.inputs)
      for (int p : op.pieces) deps.push_back(piece_producers_[static_cast<size_t>(p)]);
    for (int p : t.sources) deps.push_back(piece_producers_[static_cast<size_t>(p)]);
    deps.erase(std::remove(deps.begin(), deps.end(), -1), deps.end());
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  }
  int AddTask(Task t) {
    t.id = static_cast<int>(tg_.tasks.size());
    SetDeps(t);
    tg_.tasks.push_back(std::move(t));
    tg_.cost_keys.push_back(0);
    Journal(Effect::kTask, tg_.tasks.back().id);
    return tg_.tasks.back().id;
  }
  bool IsSourceValue(ValueId v) const { return source_values_[static_cast<size_t>(v)]; }

  // Sizes the value states for every output of `nodes`.
  void GrowValues(const std::vector<NodeId>& nodes) {
    for (NodeId id : nodes) {
      const Node& n = g_.node(id);
      for (ValueId v : n.outputs) {
        if (static_cast<size_t>(v) >= values_.size()) {
          values_.resize(static_cast<size_t>(v) + 1);
          source_values_.resize(values_.size());
        }
        source_values_[static_cast<size_t>(v)] = IsSourceOp(n.op);
      }
    }
  }

  // The split rules of node `id`'s op for its types (the same every run);
  // a forward layer's sample rule follows the batch, as the strategy
  // resolved it (NodeSplitRules).
  const SplitRules& RulesOf(const Node& n, const OpDef& def, const std::vector<TensorType>& in,
                            const std::vector<TensorType>& out, bool forward) {
    if (static_cast<size_t>(n.id) >= rules_.size()) rules_.resize(static_cast<size_t>(n.id) + 1);
    std::optional<SplitRules>& rules = rules_[static_cast<size_t>(n.id)];
    if (!rules) {
      rules = def.Splits(n.attrs, in, out);
      if (forward) rules = FollowBatch(std::move(*rules), g_, n, batch_axes_);
    }
    return *rules;
  }

  // Combines partial pieces of equal regions with an all-reduce; the
  // reduced pieces replace them.
  void Reduce(ValueId v) {
    if (!State(v).unreduced) return;
    std::map<Region, std::vector<int>> partial;
    for (int p : State(v).origin)
      if (piece(p).partial) partial[piece(p).region].push_back(p);
    DropPartials(v);
    for (const auto& [region, group] : partial) {
      Task t;
      t.kind = TaskKind::kAllReduce;
      t.device = piece(group[0]).device;
      std::set<int64_t> summed;
      for (int p : group) {
        t.group.push_back(piece(p).device);
        if (summed.insert(piece(p).partial_index).second) t.sources.push_back(p);  // else a copy of one summed
      }
      t.name = g_.value(v).name + " all-reduce " + Join(t.group);
      t.bytes = Bytes(v, region);
      const int id = AddTask(std::move(t));
      for (int64_t d : tg_.tasks[static_cast<size_t>(id)].group) {
        const int out = NewPiece(v, d, region, false, 0, id, Slot::kOrigin);
        tg_.tasks[static_cast<size_t>(id)].outputs.push_back(out);
      }
    }
  }

  // `region` of v on `device`: a piece there that holds it, or the pieces
  // that tile it, transferred where they are elsewhere. A source gets a
  // home piece there instead.
  StatusOr<Operand> Fetch(ValueId v, Region wanted, int64_t device) {
    if (wanted.numel() == 0) return Operand{v, std::move(wanted), {}};  // another part's input (AxisSplit::part)
    // A window part's rows may reach into the padding: it reads the rows
    // inside and the runtime fills the rest with zeros.
    if (!Inside(wanted, g_.type(v).shape)) {
      const std::optional<Region> inside = wanted.Intersect(Region::Whole(g_.type(v).shape));
      if (!inside) return Internal("a part reads only padding of '", g_.value(v).name, "'");
      LOOM_ASSIGN_OR_RETURN(Operand op, Fetch(v, *inside, device));
      op.region = std::move(wanted);
      return op;
    }
    Operand op{v, std::move(wanted), {}};
    const Region& region = op.region;
    if (!State(v).written) {  // no producer planned: a source's home, or an error
      if (!IsSourceValue(v)) return Internal("value '", g_.value(v).name, "' is read before it is written");
      for (int h : State(v).homes)
        if (piece(h).device == device && piece(h).region.Contains(region)) {
          op.pieces = {h};
          return op;
        }
      op.pieces = {NewPiece(v, device, region, false, 0, -1, Slot::kHome)};
      return op;
    }
    if (State(v).unreduced) {
      LOOM_ASSIGN_OR_RETURN(std::optional<Operand> summed, SumPart(v, region, device));
      if (summed) return std::move(*summed);
      Reduce(v);
    }
    const std::vector<int>& origin = State(v).origin;
    // The pieces of v transferred to the device (made with the first), by
    // index: making pieces moves the states' lists.
    auto local = [&]() -> const std::vector<int>* { return State(v).Derived(device); };
    if (const int p = HeldOn(v, device, region); p >= 0) {
      op.pieces = {p};
      return op;
    }
    // The origin's pieces on the device (few: a wide split's parts read
    // whole would otherwise scan every pair of the origin).
    std::vector<int> origin_here;
    for (int q : origin)
      if (piece(q).device == device) origin_here.push_back(q);
    DistinctRegions seen(ByRegion{&tg_.pieces});
    int64_t covered = 0;
    for (size_t o = 0; o < origin.size(); ++o) {
      const int p = origin[o];
      const Region& whole = piece(p).region;
      if (seen.count(p)) continue;
      std::optional<Region> part = whole.Intersect(region);
      if (!part) continue;
      seen.insert(p);
      int from = -1;
      for (int q : origin_here)
        if (piece(q).region == whole) from = q;
      if (const std::vector<int>* transferred = local())
        for (size_t i = 0; from < 0 && i < transferred->size(); ++i)
          if (piece((*transferred)[i]).region.Contains(*part)) from = (*transferred)[i];
      if (from < 0) from = Transfer(v, p, *part, device, Slot::kDerived);
      op.pieces.push_back(from);
      covered += part->numel();
    }
    if (covered != region.numel())
      return Internal("the pieces of '", g_.value(v).name, "' do not tile ", region.ToString());
    return op;
  }

  // A transfer task copying `part` of v's piece p to `device`; returns the
  // piece it writes there (a partial sum's part is partial too).
  int Transfer(ValueId v, int p, const Region& part, int64_t device, Slot slot) {
    const bool partial = piece(p).partial;
    const int64_t index = partial ? piece(p).partial_index : 0;
    Task t;
    t.kind = TaskKind::kTransfer;
    t.device = device;
    t.src_device = piece(p).device;
    t.sources = {p};
    t.bytes = Bytes(v, part);
    t.name = g_.value(v).name + " " + part.ToString() + (partial ? " partial " + std::to_string(index) : "") + " " +
             std::to_string(t.src_device) + "->" + std::to_string(device);
    const int id = AddTask(std::move(t));
    const int out = NewPiece(v, device, part, partial, index, id, slot);
    tg_.tasks[static_cast<size_t>(id)].outputs = {out};
    return out;
  }

  // `region` of a value still held as partial sums, summed on `device`
  // when it is a strict part of every partial sum it meets: the other
  // members' parts of it come by transfer and a one-device all-reduce adds
  // them in the group's order (the bits of the all-reduce), so devices that
  // each read their own part move it as in a reduce-scatter. Nullopt when
  // the region covers a whole partial sum: the caller all-reduces.
  StatusOr<std::optional<Operand>> SumPart(ValueId v, const Region& region, int64_t device) {
    std::map<Region, std::vector<int>> partial;  // the partial sums by region, each in the origin's order
    for (int p : State(v).origin)
      if (piece(p).partial) partial[piece(p).region].push_back(p);
    std::vector<std::pair<Region, const std::vector<int>*>> met;
    for (const auto& [whole, group] : partial) {
      std::optional<Region> part = whole.Intersect(region);
      if (!part) continue;
      if (*part == whole) return std::optional<Operand>();
      met.emplace_back(std::move(*part), &group);
    }
    if (met.empty()) return Internal("no partial sum of '", g_.value(v).name, "' meets ", region.ToString());
    Operand op{v, region, {}};
    for (const auto& [part, group_ptr] : met) {
      const std::vector<int> group = *group_ptr;  // a copy: making pieces moves the lists
      int summed = -1;                             // an earlier sum of the part on the device
      if (const std::vector<int>* held = State(v).Derived(device))
        for (int p : *held)
          if (piece(p).region.Contains(part)) summed = p;
      // Summed on another device already (devices along a dimension that
      // replicates the part read the same part): a copy of that sum, not
      // every partial sum again.
      int elsewhere = -1;
      for (size_t d = 0; summed < 0 && elsewhere < 0 && d < State(v).derived.size(); ++d)
        for (int p : State(v).derived[d].second)
          if (elsewhere < 0 && piece(p).region.Contains(part)) elsewhere = p;
      if (elsewhere >= 0) summed = Transfer(v, elsewhere, part, device, Slot::kDerived);
      if (summed < 0) {
        Task sum;
        sum.kind = TaskKind::kAllReduce;
        sum.device = device;
        sum.group = {device};
        std::set<int64_t> seen;
        for (int p : group) {
          const int64_t index = piece(p).partial_index;
          if (!seen.insert(index).second) continue;  // a copy of one added
          int source = -1;  // this partial sum on the device (a copy of it counts)
          for (int q : group)
            if (piece(q).partial_index == index && piece(q).device == device) source = q;
          if (source < 0) source = Transfer(v, p, part, device, Slot::kLoose);
          sum.sources.push_back(source);
        }
        sum.name = g_.value(v).name + " " + part.ToString() + " sum";
        sum.bytes = Bytes(v, part);
        const int id = AddTask(std::move(sum));
        summed = NewPiece(v, device, part, false, 0, id, Slot::kDerived);
        tg_.tasks[static_cast<size_t>(id)].outputs = {summed};
      }
      op.pieces.push_back(summed);
    }
    return std::optional<Operand>(std::move(op));
  }

  // Collectives for the parts (on `devices`) of a node reading v (their
  // input `input`), made before the parts fetch it so that Fetch finds
  // their outputs on the readers' devices (LoweringOptions::
  // collective_min_group): where enough devices read one region of v and
  // hold its pieces between them, an all-gather; where each reads a region
  // of its own, an all-to-all; where v is partial sums, a reduce-scatter
  // when each reads its own part, an all-reduce of a part that several
  // read. Else Fetch moves what each lacks by transfers.
  void Collectives(ValueId v, size_t input, const std::vector<PartRegions>& parts,
                   const std::vector<int64_t>& devices) {
    if (IsSourceValue(v) || !State(v).written) return;
    const int64_t min_group = options_.collective_min_group;
    if (State(v).unreduced) {
      std::vector<std::pair<int64_t, Region>> reads;  // by device: the one region it reads
      for (size_t p = 0; p < parts.size(); ++p) {
        const Region& r = parts[p].inputs[input];
        auto same =
            std::find_if(reads.begin(), reads.end(), [&](const auto& read) { return read.first == devices[p]; });
        if (same == reads.end()) reads.emplace_back(devices[p], r);
        else if (same->second != r) return;
      }
      // Devices along a dimension that replicates what they read read the
      // same part: an all-reduce of that part among them; else each its
      // own: a reduce-scatter.
      std::vector<std::pair<const Region*, std::vector<int64_t>>> readers;  // a region and its readers
      for (const auto& [device, r] : reads) {
        auto same = std::find_if(readers.begin(), readers.end(), [&](const auto& x) { return *x.first == r; });
        if (same == readers.end()) same = readers.emplace(readers.end(), &r, std::vector<int64_t>());
        same->second.push_back(device);
      }
      if (readers.size() == reads.size()) {
        if (static_cast<int64_t>(reads.size()) >= min_group) ReduceScatter(v, reads);
        return;
      }
      for (const auto& [region, group] : readers)
        if (static_cast<int64_t>(group.size()) >= min_group) AllReducePart(v, *region, group);
      return;
    }
    std::vector<std::pair<const Region*, std::vector<int64_t>>> reads;  // a region and its readers' devices
    for (size_t p = 0; p < parts.size(); ++p) {
      const Region& r = parts[p].inputs[input];
      auto same = std::find_if(reads.begin(), reads.end(), [&](const auto& read) { return *read.first == r; });
      if (same == reads.end()) same = reads.emplace(reads.end(), &r, std::vector<int64_t>());
      if (std::find(same->second.begin(), same->second.end(), devices[p]) == same->second.end())
        same->second.push_back(devices[p]);
    }
    for (const auto& [region, group] : reads)
      if (static_cast<int64_t>(group.size()) >= min_group && region->numel() > 0 && Inside(*region, g_.type(v).shape))
        AllGather(v, *region, group);
    // Every device its own region (an OWT layer's columns read by rows): an
    // all-to-all.
    if (static_cast<int64_t>(reads.size()) < min_group) return;
    std::vector<std::pair<int64_t, Region>> own;
    for (const auto& [region, group] : reads) {
      const int64_t device = group[0];
      if (group.size() != 1 ||
          std::find_if(own.begin(), own.end(), [&](const auto& o) { return o.first == device; }) != own.end())
        return;
      own.emplace_back(device, *region);
    }
    AllToAll(v, own);
  }

  // The all-to-all of Collectives: when each device reads a region (inside
  // v) that no piece on it holds, tiled by v's pieces on the devices.
  void AllToAll(ValueId v, const std::vector<std::pair<int64_t, Region>>& reads) {
    std::vector<int64_t> members;
    for (const auto& read : reads) members.push_back(read.first);
    for (const auto& [device, region] : reads)
      if (region.numel() == 0 || !Inside(region, g_.type(v).shape) || HeldOn(v, device, region) >= 0) return;
    std::vector<int> sources;
    const bool on_members = OneCopyEach(
        v, members,
        [&](int p) {
          for (const auto& read : reads)
            if (piece(p).region.Intersect(read.second)) return true;
          return false;
        },
        [&](int p, int q) { return piece(p).region == piece(q).region; }, &sources);
    if (!on_members) return;
    double bytes = 0;
    for (const auto& [device, region] : reads) {
      int64_t covered = 0;
      for (int p : sources) {
        std::optional<Region> box = piece(p).region.Intersect(region);
        if (!box) continue;
        covered += box->numel();
        // What the reader holds already it would not be sent (Fetch's copies).
        if (piece(p).device != device && HeldOn(v, device, *box) >= 0) return;
      }
      if (covered != region.numel()) return;
      bytes += Bytes(v, region);
    }
    AddCollective(TaskKind::kAllToAll, v, "", std::move(sources), reads, bytes);
  }

  // A collective task of v that writes `outputs` (a region on each member:
  // its group, whose first member runs it) from `sources`, named by v,
  // `region` (what it moves, when one), its kind and group.
  void AddCollective(TaskKind kind, ValueId v, const std::string& region, std::vector<int> sources,
                     const std::vector<std::pair<int64_t, Region>>& outputs, double bytes) {
    Task t;
    t.kind = kind;
    for (const auto& output : outputs) t.group.push_back(output.first);
    t.device = t.group[0];
    t.sources = std::move(sources);
    t.bytes = bytes;
    t.name = g_.value(v).name + (region.empty() ? "" : " " + region) + " " + TaskKindName(kind) + " " + Join(t.group);
    const int id = AddTask(std::move(t));
    for (const auto& [device, part] : outputs) {
      const int out = NewPiece(v, device, part, false, 0, id, Slot::kDerived);
      tg_.tasks[static_cast<size_t>(id)].outputs.push_back(out);
    }
  }

  // The reduce-scatter of Collectives: when v's partial sums share one
  // region, each device reads a strict part of it that no other reads, and
  // the devices hold every partial sum between them.
  void ReduceScatter(ValueId v, const std::vector<std::pair<int64_t, Region>>& reads) {
    if (SummedFor(v, reads)) return;
    std::vector<int64_t> members;
    for (const auto& read : reads) members.push_back(read.first);
    std::vector<int> sources;
    if (!PartialSumsAmong(v, members, &sources)) return;
    const Region* whole = &piece(sources[0]).region;
    for (size_t a = 0; a < reads.size(); ++a) {
      const Region& r = reads[a].second;
      if (r.numel() == 0 || r == *whole || !whole->Contains(r)) return;
      for (size_t b = 0; b < a; ++b)
        if (r.Intersect(reads[b].second)) return;
    }
    AddCollective(TaskKind::kReduceScatter, v, whole->ToString(), std::move(sources), reads, Bytes(v, *whole));
  }

  // The all-reduce of a part of Collectives: when v's partial sums share
  // one region, `part` is a strict part of it, and the readers hold every
  // partial sum between them.
  void AllReducePart(ValueId v, const Region& part, const std::vector<int64_t>& readers) {
    std::vector<std::pair<int64_t, Region>> outputs;
    for (int64_t d : readers) outputs.emplace_back(d, part);
    if (SummedFor(v, outputs)) return;
    std::vector<int> sources;
    if (!PartialSumsAmong(v, readers, &sources)) return;
    const Region& whole = piece(sources[0]).region;
    if (part.numel() == 0 || part == whole || !whole.Contains(part)) return;
    AddCollective(TaskKind::kAllReduce, v, part.ToString(), std::move(sources), outputs, Bytes(v, part));
  }

  // Whether each (device, region) of `reads` is summed on its device
  // already: the collective was made (for a gradient read early).
  bool SummedFor(ValueId v, const std::vector<std::pair<int64_t, Region>>& reads) const {
    for (const auto& [device, region] : reads) {
      const std::vector<int>* held = State(v).Derived(device);
      if (!held || std::none_of(held->begin(), held->end(), [&](int p) {
            return !piece(p).partial && piece(p).region.Contains(region);
          }))
        return false;
    }
    return true;
  }

  // One copy of each of v's partial sums, on `members` (the first such in
  // the origin's order), into `sources`: false when they do not all share
  // one region, are fewer than two, or some is on no member.
  bool PartialSumsAmong(ValueId v, const std::vector<int64_t>& members, std::vector<int>* sources) const {
    const bool on_members = OneCopyEach(
        v, members, [&](int p) { return piece(p).partial; },
        [&](int p, int q) {
          return piece(p).partial_index == piece(q).partial_index && piece(p).region == piece(q).region;
        },
        sources);
    if (!on_members || sources->size() < 2) return false;
    for (int p : *sources)
      if (piece(p).region != piece((*sources)[0]).region) return false;
    return true;
  }

  // Of v's origin pieces that `wanted` accepts, one of each kind (`same`
  // tells copies apart), on a member of `members` where one is: the first
  // in the origin's order. False when some kind has no copy on a member.
  template <typename Wanted, typename Same>
  bool OneCopyEach(ValueId v, const std::vector<int64_t>& members, Wanted wanted, Same same,
                   std::vector<int>* chosen) const {
    auto member = [&](int64_t d) { return std::find(members.begin(), members.end(), d) != members.end(); };
    chosen->clear();
    for (int p : State(v).origin) {
      if (!wanted(p)) continue;
      auto copy = std::find_if(chosen->begin(), chosen->end(), [&](int q) { return same(p, q); });
      if (copy == chosen->end()) chosen->push_back(p);
      else if (!member(piece(*copy).device) && member(piece(p).device)) *copy = p;
    }
    for (int p : *chosen)
      if (!member(piece(p).device)) return false;
    return true;
  }

  // A piece of v on `device` (its origin's, or one brought there) that
  // holds `region`, or -1.
  int HeldOn(ValueId v, int64_t device, const Region& region) const {
    for (const std::vector<int>* list : {&State(v).origin, State(v).Derived(device)})
      for (size_t i = 0; list && i < list->size(); ++i)
        if (const int p = (*list)[i]; piece(p).device == device && piece(p).region.Contains(region)) return p;
    return -1;
  }

  // The all-gather of Collectives, when its conditions hold.
  void AllGather(ValueId v, const Region& region, const std::vector<int64_t>& group) {
    for (int64_t d : group)
      if (HeldOn(v, d, region) >= 0) return;  // held whole already
    std::vector<int> sources;
    const bool on_members = OneCopyEach(
        v, group, [&](int p) { return piece(p).region.Intersect(region).has_value(); },
        [&](int p, int q) { return piece(p).region == piece(q).region; }, &sources);
    if (!on_members || sources.size() < 2) return;
    int64_t covered = 0;
    for (int p : sources) {
      if (!region.Contains(piece(p).region)) return;  // a piece reaching out of the region: transfers cut it
      covered += piece(p).region.numel();
    }
    if (covered != region.numel()) return;
    std::vector<std::pair<int64_t, Region>> outputs;
    for (int64_t d : group) outputs.emplace_back(d, region);
    AddCollective(TaskKind::kAllGather, v, region.ToString(), std::move(sources), outputs, Bytes(v, region));
  }

  // The whole of v, one piece per region, on any devices.
  StatusOr<Operand> Whole(ValueId v) {
    const Region all = Region::Whole(g_.type(v).shape);
    if (IsSourceValue(v)) return Fetch(v, all, 0);
    if (!State(v).written) return Internal("value '", g_.value(v).name, "' is never written");
    Reduce(v);
    Operand op{v, all, {}};
    DistinctRegions seen(ByRegion{&tg_.pieces});
    for (int p : State(v).origin)
      if (seen.insert(p).second) op.pieces.push_back(p);
    return op;
  }

  // Makes sure the homes of a state value tile it (for reading it back): a
  // whole home on device 0 when they do not.
  void CoverHomes(ValueId state) {
    const std::vector<int>& homes = State(state).homes;
    const DistinctRegions regions(homes.begin(), homes.end(), ByRegion{&tg_.pieces});
    int64_t volume = 0;
    bool disjoint = true;
    for (auto a = regions.begin(); a != regions.end(); ++a) {
      volume += piece(*a).region.numel();
      for (auto b = std::next(a); b != regions.end(); ++b)
        disjoint = disjoint && !piece(*a).region.Intersect(piece(*b).region);
    }
    if (disjoint && volume == g_.type(state).shape.numel()) return;
    NewPiece(state, 0, Region::Whole(g_.type(state).shape), false, 0, -1, Slot::kHome);
  }

  using ForwardAxes = std::array<int, kSplitDims>;  // an axis per dimension (-1: whole)
  struct Owner {
    static constexpr int kUnknown = -2, kNone = -1;
    int layer = kUnknown;  // index into layer_splits_
    bool forward = false;
    NodeId forward_node = -1;  // the layer's forward node
  };

  // The forward layer node `id` belongs to: itself (`forward`), or the
  // longest layer name L with the node named "L/...". Found by name once per
  // set of layer names.
  const LayerSplit* OwnerOf(NodeId id, bool* forward) {
    const Owner& owner = OwnerRecord(id);
    *forward = owner.forward;
    return owner.layer == Owner::kNone ? nullptr : layer_splits_[static_cast<size_t>(owner.layer)];
  }
  const Owner& OwnerRecord(NodeId id) {
    if (static_cast<size_t>(id) >= owners_.size()) owners_.resize(static_cast<size_t>(id) + 1);
    Owner& owner = owners_[static_cast<size_t>(id)];
    if (owner.layer == Owner::kUnknown) {
      const std::string& name = g_.node(id).name;
      auto it = layers_->find(name);
      owner.forward = it != layers_->end();
      for (size_t pos = name.rfind('/'); it == layers_->end() && pos != std::string::npos && pos > 0;
           pos = name.rfind('/', pos - 1))
        it = layers_->find(name.substr(0, pos));
      owner.layer = it == layers_->end() ? Owner::kNone : static_cast<int>(std::distance(layers_->begin(), it));
      if (it != layers_->end()) owner.forward_node = g_.FindNode(it->first).value_or(-1);
    }
    return owner;
  }

  // How the forward node of the layer of node `id` (a backward node) holds
  // its input v along each dimension, or nullopt: an input of the forward
  // node as that node read it; a value that no node of the layer made and
  // that is shaped as one of the forward node's outputs (that output's
  // gradient) as the forward node wrote that output. The backward pass then
  // mirrors the forward one, as the layer-wise model prices it, instead of
  // following how the gradient arrives: a Linear split sample x parameter
  // whose gradient arrived split by rows only split its parameter
  // dimension as a second batch split, every part reading the whole weight
  // and summing a whole weight gradient.
  std::optional<ForwardAxes> ForwardHeld(NodeId id, ValueId v) {
    const Owner owner = OwnerRecord(id);  // (a copy: OwnerRecord may grow owners_)
    if (owner.layer == Owner::kNone || owner.forward || owner.forward_node < 0 || IsSourceValue(v)) return std::nullopt;
    const Node& forward = g_.node(owner.forward_node);
    for (size_t i = 0; i < forward.inputs.size(); ++i) {
      if (forward.inputs[i] != v && Renamed(forward.inputs[i]) != v) continue;
      const auto reads = forward_reads_.find(owner.forward_node);
      if (reads == forward_reads_.end()) return std::nullopt;
      return reads->second[i];
    }
    const NodeId producer = g_.value(v).producer;
    if (producer >= 0 && OwnerRecord(producer).layer == owner.layer) return std::nullopt;
    for (ValueId y : forward.outputs) {
      if (g_.type(y).shape != g_.type(v).shape) continue;
      const ValueSplit* written = SplitOf(Renamed(y));
      ForwardAxes axes;
      for (size_t d = 0; d < kSplitDims; ++d) axes[d] = written ? std::max(written->axis[d], -1) : -1;
      return axes;
    }
    return std::nullopt;
  }

  // What a node of no layer (the gradient norm, the divergence checks)
  // follows: the split that wrote most of its inputs' elements (the first
  // such on ties), or null when none is split. The first input's split
  // could be a small layer's: a fused sweep's gradient norm then ran whole
  // on device 0, every replica's gradients sent there each step.
  const LayerSplit* SplitOfMostInputs(const Node& n) const {
    std::vector<std::pair<const LayerSplit*, int64_t>> written;  // a split, the elements it wrote
    for (ValueId v : n.inputs) {
      const ValueSplit* s = SplitOf(v);
      if (!s || s->split.parts() == 1) continue;
      auto same = std::find_if(written.begin(), written.end(), [&](const auto& w) {
        return w.first->SameForm(s->split) && w.first->devices == s->split.devices;
      });
      if (same == written.end()) same = written.insert(written.end(), {&s->split, 0});
      same->second += g_.type(v).shape.numel();
    }
    const LayerSplit* most = nullptr;
    int64_t elements = -1;
    for (const auto& [split, count] : written)
      if (count > elements) most = split, elements = count;
    return most;
  }

  int64_t DeviceOfInputs(const Node& n) const {
    for (ValueId v : n.inputs)
      if (!State(v).origin.empty()) return piece(State(v).origin[0]).device;
    return 0;
  }

  // A following node's rule along dimension d: the one under which the
  // most elements of its inputs are already where it reads them: inputs
  // that arrive split as it reads them (in the same or a nested degree),
  // and parameters and buffers read as their forward layer reads them (else
  // every part holds a whole copy, refreshed every step: the weights of a
  // parameter-split Linear); and under which a parameter's gradient is
  // written as its forward layer reads the parameter (where its update
  // runs: a vocabulary-split table's gradient by rows, not by columns).
  // An input the layer's forward node held (`forward_held`, ForwardHeld)
  // counts where the rule reads it as the forward node held it instead.
  // Ties go to the earlier rule, a replicated run last.
  DimSplit BestMatch(const Node& n, const std::vector<std::optional<ForwardAxes>>& forward_held,
                     const SplitRules& rules, int d, int64_t degree) const {
    std::vector<DimSplit> candidates;
    for (DimSplit& r : rules.All())
      if (!r.HasWindow()) candidates.push_back(std::move(r));
    candidates.push_back(Replicated(n.inputs.size(), n.outputs.size()));
    // Along the same axis in nested degrees (a 4-way batch split read 2-way)
    // the parts hold most of what they read.
    auto axis_held = [&](const ValueSplit* s) {
      if (!s) return kNoAxis;
      const int64_t held = s->split.degree[static_cast<size_t>(d)];
      if (held == 1 || (held % degree != 0 && degree % held != 0)) return kNoAxis;
      return s->axis[static_cast<size_t>(d)];
    };
    // The share of an input's elements in place when read along `read`:
    // partial sums read split are half (each part sums its own share where
    // it reads it, a reduce-scatter: half an all-reduce's bytes); read
    // whole, none (an all-reduce, and every part computing all of the node).
    auto in_place = [](int held, int read) { return held == read ? 1.0 : held == kPartialAxis && read >= 0 ? 0.5 : 0.0; };
    int best = -1;
    double best_score = -1;
    for (size_t c = 0; c < candidates.size(); ++c) {
      double score = 0;
      bool owned = true;  // every input a single part reads was made there (else the rule is not taken)
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ValueSplit* arrived = SplitOf(n.inputs[i]);
        if (!arrived) arrived = SourceReadOf(n.inputs[i]);
        const AxisSplit& read = candidates[c].inputs[i];
        if (read.part >= 0) {
          owned = owned && arrived && arrived->pin_dim == d && arrived->pin_part == read.part;
          score += static_cast<double>(g_.type(n.inputs[i]).shape.numel());
        } else if (forward_held[i]) {
          if (read.axis == (*forward_held[i])[static_cast<size_t>(d)])
            score += static_cast<double>(g_.type(n.inputs[i]).shape.numel());
        } else {
          score += in_place(axis_held(arrived), read.axis) * static_cast<double>(g_.type(n.inputs[i]).shape.numel());
        }
      }
      if (!owned) continue;
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        const ValueId param = ParameterOf(n.outputs[i]);
        if (param != kNoValue)
          score += in_place(axis_held(SourceReadOf(param)), candidates[c].outputs[i].axis) *
                   static_cast<double>(g_.type(n.outputs[i]).shape.numel());
      }
      if (score > best_score) best = static_cast<int>(c), best_score = score;
    }
    return candidates[static_cast<size_t>(best)];
  }

  // The parameter whose gradient v is, or kNoValue.
  ValueId ParameterOf(ValueId v) const {
    const size_t i = static_cast<size_t>(v);
    return i < parameter_of_.size() ? parameter_of_[i] : kNoValue;
  }

  // Replaces node `id` by its op's expansion and plans the expansion's
  // nodes. Its place in the node order and its outputs' consumers, graph
  // outputs, state updates and gradients go to the expansion once, at the
  // end (ReplaceExpanded): doing so per expansion costs the whole graph. An
  // incremental lowering makes each node's expansion once and keeps it.
  Status Expand(NodeId id, const Node& planned, const OpDef& def, const DimLabels& labels, int dim, int64_t degree) {
    auto cached = expansion_of_.find(id);
    if (cached == expansion_of_.end()) {
      // Expanded nodes leave the graph at the end, but their names are free
      // at once: an expansion whose names ("<node>/...") might take one
      // removes them first.
      const std::string prefix = g_.node(id).name + "/";
      auto held = expanded_names_.lower_bound(prefix);
      if (held != expanded_names_.end() && held->rfind(prefix, 0) == 0) RemoveExpanded();
      // Copies the node (emitting moves the graph's). A one-time lowering
      // expands it reading what stands for its inputs, as it was planned;
      // an incremental one keeps the expansion, so it reads the inputs as
      // built (its nodes are planned reading what stands for them).
      Expansion b(g_, incremental_ ? g_.node(id) : planned, degree);
      LOOM_RETURN_IF_ERROR(def.Expand(b));
      LOOM_ASSIGN_OR_RETURN(std::vector<NodeId> emitted, b.Finish());
      for (const auto& [node, part] : b.pins()) pins_[node] = PinnedTo{dim, part};
      for (size_t i = 0; i < b.node().outputs.size(); ++i)
        g_.mutable_value(b.outputs()[i]).replica_layout = g_.value(b.node().outputs[i]).replica_layout;
      GrowValues(emitted);
      cached = expansion_of_.emplace(id, ExpansionOf{std::move(emitted), b.outputs()}).first;
    }
    const ExpansionOf& e = cached->second;
    const Node& node = g_.node(id);
    for (size_t i = 0; i < node.outputs.size(); ++i) SetRenamed(node.outputs[i], e.outputs[i]);
    if (!incremental_) {
      expanded_.push_back(id);
      expanded_names_.insert(node.name);
    }
    // Along its other dimensions the expansion's nodes split by the rules
    // of the labels the node split by (a BatchNorm's channels, for its
    // statistics' ops too), not by how their inputs arrive: a part then
    // reads x as the node's would.
    DimLabels others = labels;
    others[static_cast<size_t>(dim)].reset();
    const DimLabels outer = std::exchange(expansion_labels_, others);
    Status status;
    for (NodeId node : std::vector<NodeId>(e.nodes))
      if (status = PlanNode(node); !status.ok()) break;
    expansion_labels_ = outer;
    return status;
  }

  // What stands for v: v, or the value of the expansion that replaced its
  // producer (which may have been expanded in turn).
  ValueId Renamed(ValueId v) const {
    for (ValueId w = State(v).renamed; w != kNoValue; w = State(v).renamed) v = w;
    return v;
  }

  void RemoveExpanded() {
    g_.RemoveNodes(expanded_);
    expanded_.clear();
    expanded_names_.clear();
  }

  // The graph with every expanded node replaced by its expansion, in its
  // place in the order, every node reading what stands for its inputs, and
  // its outputs, state updates and gradients naming the expansions' values.
  void ReplaceExpanded() {
    if (expansion_of_.empty()) return;
    std::vector<NodeId> replaced;
    std::function<void(NodeId)> place = [&](NodeId id) {
      if (auto it = expansion_of_.find(id); it != expansion_of_.end())
        for (NodeId e : it->second.nodes) place(e);
      else
        replaced.push_back(id);
    };
    for (NodeId id : order_) place(id);
    for (NodeId id : replaced)
      for (ValueId& v : g_.mutable_node(id).inputs) v = Renamed(v);
    for (auto& [name, v] : g_.outputs()) v = Renamed(v);
    for (StateUpdate& u : g_.state_updates()) u.new_value = Renamed(u.new_value);
    for (auto& [param, grad] : g_.gradients()) grad = Renamed(grad);
    RemoveExpanded();
    g_.SetNodeOrder(replaced);
  }

  // What planning a node decides before it makes anything: the node as it
  // reads (what stands for its inputs), its split, and its parts, or the
  // dimension along which its split expands it.
  struct NodeParts {
    NodeId id = -1;
    std::optional<Node> renamed;  // the node reading its inputs' stand-ins, when one differs
    const OpDef* def = nullptr;
    std::vector<TensorType> in, out;
    bool forward = false;  // a forward layer (else it follows one, or none)
    std::optional<PinnedTo> pin;
    LayerSplit split;
    DimRules dims;
    int expand_dim = -1;  // >= 0: the split expands the node along this dimension (no parts)
    DimLabels labels;     // when it expands: the labels of its rules
    std::vector<PartRegions> parts;
    std::vector<std::shared_ptr<const AttrMap>> attrs;  // per part
    std::vector<bool> alike;                            // per part: its cost is the last part's
    const Node& node(const Graph& g) const { return renamed ? *renamed : g.node(id); }  // until g grows
  };

  // Decides how node `id` splits from its layer's split and how its inputs
  // stand; makes nothing.
  Status DecideParts(NodeId id, NodeParts* plan) {
    plan->id = id;
    // Inputs that expanded nodes wrote are their expansions' values now:
    // the node is planned as reading those (a copy: the graph keeps its own).
    for (size_t i = 0; i < g_.node(id).inputs.size(); ++i) {
      const ValueId v = Renamed(g_.node(id).inputs[i]);
      if (v == g_.node(id).inputs[i]) continue;
      if (!plan->renamed) plan->renamed = g_.node(id);
      plan->renamed->inputs[i] = v;
    }
    const Node& n = plan->node(g_);
    plan->def = OpRegistry::Global().FindOp(n.op);
    if (!plan->def) return InvalidArgument("node '", n.name, "': unknown op ", n.op);
    const OpDef& def = *plan->def;
    std::vector<TensorType>& in = plan->in;
    std::vector<TensorType>& out = plan->out;
    in.reserve(n.inputs.size());
    out.reserve(n.outputs.size());
    for (ValueId v : n.inputs) in.push_back(g_.type(v));
    for (ValueId v : n.outputs) out.push_back(g_.type(v));
    const LayerSplit* owner = OwnerOf(id, &plan->forward);
    if (!owner) owner = SplitOfMostInputs(n);
    if (const auto pin = pins_.find(id); pin != pins_.end()) plan->pin = pin->second;
    LayerSplit pinned;
    if (owner && plan->pin) {
      pinned = PinnedSplit(*owner, plan->pin->dim, plan->pin->part);
      owner = &pinned;
    }
    LayerSplit& split = plan->split;
    DimRules& dims = plan->dims;
    split.devices = {owner ? owner->devices[0] : DeviceOfInputs(n)};
    if (owner) {
      split = *owner;
      const SplitRules& rules = RulesOf(n, def, in, out, plan->forward);
      if (plan->forward) {
        LOOM_ASSIGN_OR_RETURN(dims, ForwardDims(g_, n, rules, split));
      } else {
        std::vector<std::optional<ForwardAxes>> forward_held;  // for BestMatch
        for (ValueId v : n.inputs) forward_held.push_back(ForwardHeld(id, v));
        for (int d = 0; d < kSplitDims; ++d) {
          if (split.degree[static_cast<size_t>(d)] == 1) continue;
          const std::optional<RuleLabel>& label = expansion_labels_[static_cast<size_t>(d)];
          std::string why;
          if (label) dims[static_cast<size_t>(d)] = LabelledRule(rules, label->dim, label->parameter_split, &why);
          if (!dims[static_cast<size_t>(d)])
            dims[static_cast<size_t>(d)] = BestMatch(n, forward_held, rules, d, split.degree[static_cast<size_t>(d)]);
        }
      }
      for (int d = 0; d < kSplitDims; ++d)
        if (dims[static_cast<size_t>(d)] && dims[static_cast<size_t>(d)]->expands) {
          plan->expand_dim = d;
          for (size_t e = 0; e < dims.size(); ++e)
            if (dims[e]) plan->labels[e] = LabelOf(rules, *dims[e]);
          return Status::Ok();
        }
    }
    StatusOr<std::vector<PartRegions>> parts = Parts(g_, n, split, dims);
    if (parts.ok()) ReadLess(def, n, in, out, &*parts);
    Status fits = parts.status();
    if (fits.ok()) fits = PartAttrs(n, def, in, out, *parts, &plan->attrs, &plan->alike);
    if (!fits.ok()) {
      if (plan->forward)
        return InvalidArgument("layer '", n.name, "' (", n.op, "): ", split.ToString(), ": ", fits.message());
      split = LayerSplit{};  // a following node that cannot follow runs whole
      split.devices = {owner ? owner->devices[0] : DeviceOfInputs(n)};
      dims = DimRules{};
      LOOM_ASSIGN_OR_RETURN(parts, Parts(g_, n, split, dims));
      ReadLess(def, n, in, out, &*parts);
      plan->attrs.clear();
      plan->alike.clear();
      LOOM_RETURN_IF_ERROR(PartAttrs(n, def, in, out, *parts, &plan->attrs, &plan->alike));
    }
    plan->parts = std::move(*parts);
    return Status::Ok();
  }

  // For ReadGradientsEarly: the readers of each gradient, by the node after
  // which they read it: two steps further along the backward pass from the
  // gradient's writer, a step being the first node that reads another
  // output of a node (else the node after it). The transfers and
  // collectives those steps wait for (the next layer's input gradient, a
  // split BatchNorm's statistics) are then listed, so served, first.
  // Measured on the simulated clusters (benchmarks.md): one step left
  // ResNet-101's data parallelism 1.2x slower than two.
  void FindGradientReaders() {
    const std::map<ValueId, std::vector<NodeId>> consumers = g_.Consumers();
    // By node id (ids need not be dense): its place in planned_order_.
    NodeId last = 0;
    for (NodeId id : planned_order_) last = std::max(last, id);
    std::vector<size_t> position(static_cast<size_t>(last) + 1);
    for (size_t i = 0; i < planned_order_.size(); ++i) position[static_cast<size_t>(planned_order_[i])] = i;
    // The position of the step after node `w`.
    auto next_step = [&](NodeId w) {
      size_t next = std::min(position[static_cast<size_t>(w)] + 1, planned_order_.size() - 1);
      bool read = false;
      for (ValueId out : g_.node(w).outputs) {
        if (ParameterOf(out) != kNoValue) continue;
        if (auto readers = consumers.find(out); readers != consumers.end())
          for (NodeId c : readers->second)
            if (!read || position[static_cast<size_t>(c)] < next) next = position[static_cast<size_t>(c)], read = true;
      }
      return next;
    };
    for (const auto& [param, grad] : g_.gradients()) {
      const NodeId writer = g_.value(grad).producer;
      const auto readers = consumers.find(grad);
      if (writer < 0 || IsSourceOp(g_.node(writer).op) || readers == consumers.end()) continue;
      const size_t after = next_step(planned_order_[next_step(writer)]);
      const NodeId release = planned_order_[after];
      if (static_cast<size_t>(release) >= gradient_readers_.size())
        gradient_readers_.resize(static_cast<size_t>(release) + 1);
      std::vector<NodeId>& list = gradient_readers_[static_cast<size_t>(release)];
      for (NodeId reader : readers->second)
        if (position[static_cast<size_t>(reader)] > after && std::find(list.begin(), list.end(), reader) == list.end())
          list.push_back(reader);
    }
  }

  // Right after node `id` is planned: the reads of the parameter gradients
  // FindGradientReaders released at it, by the nodes that follow a layer
  // and read them (the updates), where those nodes' inputs are all written
  // (no clipping or loss scaling between). Planned in their own turn, those reads would come
  // after the whole backward pass in the task order, so a device's queue
  // would reach its gradients' all-reduces (or reduce-scatters) only then,
  // behind every other transfer; read here, each runs while the backward
  // pass goes on (DDP's order). The reader decides its split now as it
  // would in its turn (its inputs are all written, and a value stands as
  // written), so the reads are the same; its turn finds them made.
  Status ReadGradientsEarly(NodeId id) {
    if (static_cast<size_t>(id) >= gradient_readers_.size()) return Status::Ok();
    for (NodeId reader : gradient_readers_[static_cast<size_t>(id)]) {
      bool forward = false;
      if (!OwnerOf(reader, &forward) || forward) continue;
      bool written = true;
      for (ValueId v : g_.node(reader).inputs) {
        const ValueId w = Renamed(v);
        written = written && (IsSourceValue(w) || State(w).written);
      }
      if (!written) continue;  // read at a later release (another gradient of it), or in its turn
      LOOM_RETURN_IF_ERROR(InSegment(Segment::kEarlyRead, reader, incremental_ ? Signature(reader) : 0,
                                     [&] { return ReadEarly(reader); }));
    }
    return Status::Ok();
  }
  Status ReadEarly(NodeId reader) {
    NodeParts plan;
    // A reader that cannot be planned, or expands, is left to its turn (which gives its error).
    if (!DecideParts(reader, &plan).ok() || plan.expand_dim >= 0) return Status::Ok();
    for (size_t i = 0; i < plan.in.size(); ++i) {
      if (ParameterOf(g_.node(reader).inputs[i]) == kNoValue) continue;
      const ValueId v = plan.node(g_).inputs[i];
      if (options_.collective_min_group > 0) Collectives(v, i, plan.parts, plan.split.devices);
      for (size_t p = 0; p < plan.parts.size(); ++p)
        LOOM_RETURN_IF_ERROR(Fetch(v, std::move(plan.parts[p].inputs[i]), plan.split.devices[p]).status());
    }
    return Status::Ok();
  }

  Status PlanNode(NodeId id) {
    forward_reads_.erase(id);  // (an expanded forward node reads nothing itself)
    NodeParts plan;
    LOOM_RETURN_IF_ERROR(DecideParts(id, &plan));
    const Node& n = plan.node(g_);  // valid until an expansion adds nodes
    const OpDef& def = *plan.def;
    const LayerSplit& split = plan.split;
    const DimRules& dims = plan.dims;
    if (plan.expand_dim >= 0)
      return Expand(id, n, def, plan.labels, plan.expand_dim, split.degree[static_cast<size_t>(plan.expand_dim)]);
    const std::vector<TensorType>& in = plan.in;
    const std::vector<TensorType>& out = plan.out;
    std::vector<std::shared_ptr<const AttrMap>>& attrs = plan.attrs;
    const std::vector<bool>& alike = plan.alike;
    const bool forward = plan.forward;
    OpCost cost;
    DType work_dtype = DType::kF32;  // the first floating output's (a loss over f32 logits is f32 work)
    for (const TensorType& o : out)
      if (IsFloating(o.dtype)) {
        work_dtype = o.dtype;
        break;
      }
    if (options_.collective_min_group > 0)
      for (size_t i = 0; i < n.inputs.size(); ++i) Collectives(n.inputs[i], i, plan.parts, split.devices);
    for (size_t p = 0; p < plan.parts.size(); ++p) {
      PartRegions& part = plan.parts[p];
      Task t;
      t.kind = TaskKind::kCompute;
      t.node = n.id;
      t.part = static_cast<int64_t>(p);
      t.device = split.devices[p];
      t.name = TaskName(n.name, p, plan.parts.size());
      t.attrs = std::move(attrs[p]);
      if (!alike[p]) cost = def.Cost(*t.attrs, PartTypes(part.inputs, in), PartTypes(part.outputs, out));
      t.inputs.reserve(n.inputs.size());
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        LOOM_ASSIGN_OR_RETURN(Operand op, Fetch(n.inputs[i], std::move(part.inputs[i]), t.device));
        t.inputs.push_back(std::move(op));
      }
      t.flops = cost.flops;
      t.bytes = cost.bytes_read + cost.bytes_written;
      t.dtype = work_dtype;
      t.outputs.reserve(n.outputs.size());
      const int task = AddTask(std::move(t));
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        const int q = NewPiece(n.outputs[i], split.devices[p], std::move(part.outputs[i]), part.partial[i],
                               part.partial_index[i], task, Slot::kOrigin);
        tg_.tasks[static_cast<size_t>(task)].outputs.push_back(q);
        if (part.partial[i]) MarkUnreduced(n.outputs[i]);
      }
    }
    if (forward) {
      std::vector<ForwardAxes>& reads = forward_reads_[id];
      reads.resize(n.inputs.size());
      for (size_t i = 0; i < n.inputs.size(); ++i)
        for (size_t d = 0; d < kSplitDims; ++d) reads[i][d] = dims[d] ? dims[d]->inputs[i].axis : -1;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        if (!IsSourceValue(n.inputs[i]) || SourceReadOf(n.inputs[i])) continue;
        ValueSplit s;
        s.split = split;
        s.axis = reads[i];
        SetSplit(n.inputs[i], std::move(s), true);
      }
    }
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      ValueSplit s;
      s.split = split;
      if (plan.pin) s.pin_dim = plan.pin->dim, s.pin_part = plan.pin->part;
      for (size_t d = 0; d < kSplitDims; ++d)
        if (dims[d])
          s.axis[d] = dims[d]->outputs[i].axis >= 0 ? dims[d]->outputs[i].axis
                      : dims[d]->partial_sums      ? kPartialAxis
                                                   : -1;
      SetSplit(n.outputs[i], std::move(s), false);
    }
    return Status::Ok();
  }

  TaskGraph tg_;          // the result; its graph is the one being lowered
  Graph& g_ = tg_.graph;  // (that graph)
  const LoweringOptions options_;
  const bool incremental_;
  std::vector<NodeId> order_;          // the graph's nodes before lowering, in order
  std::vector<NodeId> planned_order_;  // those that are not sources
  std::vector<bool> source_values_;    // by value: written by a source (Input, Parameter, Buffer)
  std::vector<ValueId> parameter_of_;  // by value: the parameter it is the gradient of, or kNoValue
  std::vector<std::vector<NodeId>> gradient_readers_;  // by node: the gradient readers read early after it
  std::vector<std::optional<SplitRules>> rules_;  // by node, as found
  std::vector<int> batch_axes_;                   // by value (BatchAxes of the graph as given)
  const std::map<std::string, LayerSplit>* layers_ = nullptr;
  std::vector<const LayerSplit*> layer_splits_;  // the layers' splits, in name order
  uint64_t layer_names_ = 0;                     // a hash of the layers' names
  std::vector<Owner> owners_;  // by node
  // By forward node: the axis along which it read each input, per
  // dimension (-1: whole), as last planned (ForwardHeld).
  std::unordered_map<NodeId, std::vector<ForwardAxes>> forward_reads_;
  std::vector<ValueState> values_;  // by value
  // By piece: its producer, apart from the 128-byte pieces (SetDeps reads
  // one per operand piece of every task, a cache miss each in the Piece).
  std::vector<int> piece_producers_;
  // Expansions made (by node), and, in a one-time lowering, the expanded
  // nodes (and their names) still in the graph.
  std::map<NodeId, ExpansionOf> expansion_of_;
  std::map<NodeId, PinnedTo> pins_;  // expansions' nodes pinned to a coordinate of their layer's split
  DimLabels expansion_labels_;       // while an expansion's nodes are planned: the rules they split by
  std::vector<NodeId> expanded_;
  std::set<std::string> expanded_names_;
  // Replay: this run's record and the last one's, with the last run's tasks
  // and pieces (moved from as they are replayed), its tasks' cost keys and
  // where its tasks went.
  Record record_, last_;
  bool recording_ = false, replay_ = false, last_ok_ = false;
  std::vector<Task> last_tasks_;
  std::vector<Piece> last_pieces_;
  std::vector<std::pair<int, Operand>> last_writebacks_;
  std::vector<uint64_t> last_cost_keys_;
  std::vector<int> task_map_;
  int64_t planned_ = 0;
};

}  // namespace

double AllToAllMessageBytes(const Piece& source, const Piece& output) {
  if (source.device == output.device || source.region.numel() == 0) return 0;
  const std::optional<Region> box = source.region.Intersect(output.region);
  return box ? source.bytes * static_cast<double>(box->numel()) / static_cast<double>(source.region.numel()) : 0;
}

std::string TaskGraph::ToString() const {
  std::ostringstream s;
  s.precision(17);  // bytes and FLOPs exactly
  for (const Task& t : tasks) {
    s << t.id << " " << TaskKindName(t.kind) << " " << t.name;
    if (!t.group.empty()) s << " on " << Join(t.group);
    else if (t.kind == TaskKind::kTransfer) s << " " << t.src_device << "->" << t.device;
    else s << " on " << t.device;
    if (!t.deps.empty()) s << "  deps " << Join(t.deps);
    if (t.flops > 0) s << "  flops " << t.flops;
    s << "  bytes " << t.bytes << "\n";
  }
  return s.str();
}

std::string TaskGraph::ToJson() const {
  std::ostringstream s;
  s.precision(17);
  s << "{\"devices\": " << devices << ", \"tasks\": [";
  for (const Task& t : tasks) {
    s << (t.id ? ",\n  " : "\n  ") << "{\"id\": " << t.id << ", \"kind\": " << JsonQuoted(TaskKindName(t.kind))
      << ", \"name\": " << JsonQuoted(t.name) << ", \"device\": " << t.device;
    if (t.kind == TaskKind::kTransfer) s << ", \"src_device\": " << t.src_device;
    if (!t.group.empty()) s << ", \"group\": [" << Join(t.group) << "]";
    s << ", \"flops\": " << t.flops << ", \"bytes\": " << t.bytes << ", \"deps\": [" << Join(t.deps) << "]}";
  }
  s << "\n]}\n";
  return s.str();
}

double TaskGraph::TransferBytes() const {
  double bytes = 0;
  for (const Task& t : tasks) {
    if (t.kind == TaskKind::kTransfer) bytes += t.bytes;
    if (t.kind == TaskKind::kAllReduce && t.group.size() > 1) bytes += t.bytes * static_cast<double>(t.group.size());
    if (t.kind == TaskKind::kAllGather) {
      bytes += t.bytes * static_cast<double>(t.group.size());
      for (int p : t.sources) bytes -= pieces[static_cast<size_t>(p)].bytes;  // each member has its own
    }
    if (t.kind == TaskKind::kReduceScatter)
      for (int out : t.outputs)
        for (int p : t.sources)
          if (pieces[static_cast<size_t>(p)].device != pieces[static_cast<size_t>(out)].device)
            bytes += pieces[static_cast<size_t>(out)].bytes;
    if (t.kind == TaskKind::kAllToAll)
      for (int out : t.outputs)
        for (int p : t.sources)
          bytes += AllToAllMessageBytes(pieces[static_cast<size_t>(p)], pieces[static_cast<size_t>(out)]);
  }
  return bytes;
}

namespace {

Status CheckDevices(const std::map<std::string, LayerSplit>& layers, int64_t devices) {
  if (devices < 1) return InvalidArgument("a task graph needs >= 1 device, got ", devices);
  for (const auto& [name, split] : layers)
    for (int64_t d : split.devices)
      if (d < 0 || d >= devices)
        return InvalidArgument("layer '", name, "': device ", d, " is not one of the ", devices, " devices");
  return Status::Ok();
}

}  // namespace

StatusOr<TaskGraph> BuildTaskGraph(const Graph& graph, const std::map<std::string, LayerSplit>& layers,
                                   int64_t devices, const LoweringOptions& options) {
  LOOM_RETURN_IF_ERROR(CheckDevices(layers, devices));
  Lowering lowering(graph, devices, options, /*incremental=*/false);
  LOOM_RETURN_IF_ERROR(lowering.Run(layers));
  return lowering.Take();
}

struct IncrementalLowering::Impl {
  Impl(const Graph& graph, int64_t devices, const LoweringOptions& options)
      : lowering(graph, devices, options, /*incremental=*/true) {}
  Lowering lowering;
};

IncrementalLowering::IncrementalLowering(const Graph& graph, int64_t devices, const LoweringOptions& options)
    : impl_(std::make_unique<Impl>(graph, devices, options)), devices_(devices) {}
IncrementalLowering::~IncrementalLowering() = default;

StatusOr<const TaskGraph*> IncrementalLowering::Lower(const std::map<std::string, LayerSplit>& layers) {
  LOOM_RETURN_IF_ERROR(CheckDevices(layers, devices_));
  LOOM_RETURN_IF_ERROR(impl_->lowering.Run(layers));
  return &impl_->lowering.result();
}

int64_t IncrementalLowering::planned() const { return impl_->lowering.planned(); }

StatusOr<std::vector<PartRegions>> LayerParts(const Graph& forward, const Node& node, const SplitRules& rules,
                                              const LayerSplit& split) {
  const OpDef* def = OpRegistry::Global().FindOp(node.op);
  if (!def) return InvalidArgument("layer '", node.name, "': unknown op ", node.op);
  std::vector<TensorType> in, out;
  for (ValueId v : node.inputs) in.push_back(forward.type(v));
  for (ValueId v : node.outputs) out.push_back(forward.type(v));
  LOOM_ASSIGN_OR_RETURN(const DimRules dims, ForwardDims(forward, node, rules, split));
  StatusOr<std::vector<PartRegions>> parts = Parts(forward, node, split, dims);
  bool expands = false;
  for (const std::optional<DimSplit>& d : dims) expands = expands || (d && d->expands);
  Status fits = parts.status();
  if (fits.ok() && !expands) {
    std::vector<std::shared_ptr<const AttrMap>> attrs;
    std::vector<bool> alike;
    fits = PartAttrs(node, *def, in, out, *parts, &attrs, &alike);
  }
  if (!fits.ok())
    return InvalidArgument("layer '", node.name, "' (", node.op, "): ", split.ToString(), ": ", fits.message());
  return parts;
}

StatusOr<std::map<std::string, LayerSplit>> ResolveLayers(const Strategy& strategy, const Graph& forward) {
  LOOM_ASSIGN_OR_RETURN(auto resolved, strategy.Resolve(forward));
  std::map<std::string, LayerSplit> layers;
  for (auto& [id, split] : resolved) layers[forward.node(id).name] = std::move(split);
  return layers;
}

StatusOr<TaskGraph> LowerToTaskGraph(const Graph& step, const Strategy& strategy, const Graph& forward,
                                     const LoweringOptions& options) {
  LOOM_ASSIGN_OR_RETURN(auto layers, ResolveLayers(strategy, forward));
  return BuildTaskGraph(step, layers, strategy.devices(), options);
}

}  // namespace loom
