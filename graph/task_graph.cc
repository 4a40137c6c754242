#include "graph/task_graph.h"

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/hash.h"
#include "core/parse.h"
#include "ops/op.h"

namespace loom {

const char* TaskKindName(TaskKind kind) {
  switch (kind) {
    case TaskKind::kCompute: return "compute";
    case TaskKind::kTransfer: return "transfer";
    case TaskKind::kAllReduce: return "all-reduce";
  }
  return "?";
}

namespace {

constexpr int kPartialAxis = -3;

// How a planned node wrote a value, per SOAP dimension: its degree and the
// axis it split (-1: whole or replicated, kPartialAxis: partial sums).
struct ValueSplit {
  LayerSplit split;  // of its producer
  std::array<int, kSplitDims> axis{-1, -1, -1, -1};
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

template <typename T>
std::string Join(const std::vector<T>& v) {
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
  Expansion(Graph& graph, const Node& node) : g_(graph), node_(node), outputs_(node.outputs.size(), kNoValue) {}
  const Node& node() const override { return node_; }
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

 private:
  Graph& g_;
  const Node node_;
  std::vector<ValueId> outputs_;
  std::vector<NodeId> emitted_;
  Status status_;
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
      int64_t partial_index = 0;
      for (size_t d = 0; d < kSplitDims; ++d) {
        if (!dims[d]) continue;
        const AxisSplit& a = input ? dims[d]->inputs[j] : dims[d]->outputs[j];
        if (a.axis < 0) {
          if (!input && dims[d]->partial_sums) {
            partial = true;
            partial_index = partial_index * split.degree[d] + coord[d];
          }
          continue;
        }
        if (a.axis >= r.rank())
          return InvalidArgument("axis ", a.axis, " of '", g.value(v).name, "' ", g.type(v).shape.ToString());
        if (input && (a.stride != 1 || a.span != 1 || a.padding != 0)) {
          // Output rows [lo, hi) read input rows [lo * stride - padding,
          // (hi - 1) * stride - padding + span); rows outside the input
          // are the padding, read as zeros.
          const int out_axis = dims[d]->outputs[0].axis;
          const Region& y = part.outputs[0];
          r.lo[a.axis] = y.lo[out_axis] * a.stride - a.padding;
          r.hi[a.axis] = (y.hi[out_axis] - 1) * a.stride - a.padding + a.span;
          continue;
        }
        const int64_t k = split.degree[d], len = r.hi[a.axis] - r.lo[a.axis];
        if (len % k != 0)
          return InvalidArgument(SplitDimName(kAllSplitDims[d]), " ", k, " does not divide extent ", len, " of axis ",
                                 a.axis, " of '", g.value(v).name, "' ", g.type(v).shape.ToString());
        r.lo[a.axis] += coord[d] * (len / k);
        r.hi[a.axis] = r.lo[a.axis] + len / k;
      }
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

// The rules of a forward layer's split, one per dimension it splits (its
// op's labelled rule; the replica dimension's follows the replica layouts).
StatusOr<DimRules> ForwardDims(const Graph& g, const Node& n, const SplitRules& rules, const LayerSplit& split) {
  DimRules dims;
  const std::optional<DimSplit>* labelled[kSplitDims] = {&rules.sample, nullptr, &rules.attribute, &rules.parameter};
  for (int d = 0; d < kSplitDims; ++d) {
    const int64_t degree = split.degree[static_cast<size_t>(d)];
    if (degree == 1) continue;
    std::string why;
    if (d == static_cast<int>(SplitDim::kReplica)) {
      dims[static_cast<size_t>(d)] = ReplicaSplit(g, n, rules, &why);
    } else {
      dims[static_cast<size_t>(d)] = *labelled[d];
      if (!*labelled[d]) why = "its op has no rule for it";
    }
    if (!why.empty())
      return InvalidArgument("layer '", n.name, "' (", n.op, "): ", SplitDimName(kAllSplitDims[d]), " ", degree, ": ",
                             why);
  }
  return dims;
}

class Lowering {
 public:
  Lowering(const Graph& graph, const std::map<std::string, LayerSplit>& layers, int64_t devices)
      : g_(graph), layers_(layers) {
    tg_.devices = devices;
  }

  StatusOr<TaskGraph> Run() {
    std::vector<NodeId> order;  // a copy: expansions change the graph
    for (const Node& n : g_.nodes()) order.push_back(n.id);
    // Room for a part of each node on every device of the widest split, and
    // two pieces each (about what data parallelism makes): growing would
    // move every task and piece again, into memory not touched before.
    int64_t widest = 1;
    for (const auto& [name, split] : layers_) widest = std::max(widest, split.parts());
    tg_.tasks.reserve(static_cast<size_t>(g_.num_nodes() * widest));
    tg_.pieces.reserve(static_cast<size_t>(2 * g_.num_nodes() * widest));
    for (NodeId id : order)
      if (!IsSourceOp(g_.node(id).op)) LOOM_RETURN_IF_ERROR(PlanNode(id));
    ReplaceExpanded(order);
    for (const auto& [name, v] : g_.outputs()) {
      LOOM_ASSIGN_OR_RETURN(tg_.outputs[name], Whole(v));
    }
    for (const Node& n : g_.nodes())
      if (IsStateOp(n.op)) CoverHomes(n.outputs[0]);
    for (const StateUpdate& u : g_.state_updates())
      for (int h : std::vector<int>(tg_.homes[u.state])) {  // a copy: Fetch may add homes
        LOOM_ASSIGN_OR_RETURN(Operand from, Fetch(u.new_value, piece(h).region, piece(h).device));
        tg_.writebacks.emplace_back(h, std::move(from));
      }
    tg_.piece_bytes.assign(static_cast<size_t>(tg_.devices), 0.0);
    for (const Piece& p : tg_.pieces) tg_.piece_bytes[static_cast<size_t>(p.device)] += p.bytes;
    tg_.fingerprints.reserve(tg_.tasks.size());
    for (const Task& t : tg_.tasks) tg_.fingerprints.push_back(Fingerprint(t));
    tg_.graph = std::move(g_);
    return std::move(tg_);
  }

 private:
  uint64_t Fingerprint(const Task& t) const {
    Hash64 h;
    h.Add(t.kind);
    h.Add(t.device);
    h.Add(t.src_device);
    h.Add(t.name.data(), t.name.size());
    h.Add(t.flops);
    h.Add(t.bytes);
    h.Add(t.dtype);
    h.AddAll(t.deps);
    h.AddAll(t.group);
    for (const Operand& op : t.inputs) {
      h.AddAll(op.region.lo);
      h.AddAll(op.region.hi);
    }
    for (const std::vector<int>* list : {&t.sources, &t.outputs}) {
      h.Add(list->size());
      for (int p : *list) {
        h.Add(piece(p).device);
        h.AddAll(piece(p).region.lo);
        h.AddAll(piece(p).region.hi);
      }
    }
    return h.value();
  }

  int AddPiece(ValueId v, int64_t device, Region region, bool partial, int producer) {
    Piece p;
    p.value = v;
    p.device = device;
    p.region = std::move(region);
    p.partial = partial;
    p.producer = producer;
    p.bytes = Bytes(v, p.region);
    tg_.pieces.push_back(std::move(p));
    return static_cast<int>(tg_.pieces.size()) - 1;
  }
  const Piece& piece(int p) const { return tg_.pieces[static_cast<size_t>(p)]; }
  double Bytes(ValueId v, const Region& r) const {
    return static_cast<double>(r.numel()) * static_cast<double>(DTypeSize(g_.type(v).dtype));
  }
  int AddTask(Task t) {
    t.id = static_cast<int>(tg_.tasks.size());
    t.deps.erase(std::remove(t.deps.begin(), t.deps.end(), -1), t.deps.end());
    std::sort(t.deps.begin(), t.deps.end());
    t.deps.erase(std::unique(t.deps.begin(), t.deps.end()), t.deps.end());
    tg_.tasks.push_back(std::move(t));
    return tg_.tasks.back().id;
  }
  bool IsSourceValue(ValueId v) const { return IsSourceOp(g_.node(g_.value(v).producer).op); }

  // Combines partial pieces of equal regions with an all-reduce; the
  // reduced pieces replace them.
  void Reduce(ValueId v) {
    if (!unreduced_.erase(v)) return;
    std::vector<int>& origin = origin_[v];
    std::map<Region, std::vector<int>> partial;
    std::vector<int> kept;
    for (int p : origin) {
      if (piece(p).partial) partial[piece(p).region].push_back(p);
      else kept.push_back(p);
    }
    for (const auto& [region, group] : partial) {
      Task t;
      t.kind = TaskKind::kAllReduce;
      t.device = piece(group[0]).device;
      std::set<int64_t> summed;
      for (int p : group) {
        t.group.push_back(piece(p).device);
        if (!summed.insert(piece(p).partial_index).second) continue;  // a copy of one already summed
        t.sources.push_back(p);
        t.deps.push_back(piece(p).producer);
      }
      t.name = g_.value(v).name + " all-reduce " + Join(t.group);
      t.bytes = Bytes(v, region);
      const int id = AddTask(std::move(t));
      for (int64_t d : tg_.tasks[static_cast<size_t>(id)].group) {
        const int out = AddPiece(v, d, region, false, id);
        tg_.tasks[static_cast<size_t>(id)].outputs.push_back(out);
        kept.push_back(out);
      }
    }
    origin = kept;
  }

  // `region` of v on `device`: a piece there that holds it, or the pieces
  // that tile it, transferred where they are elsewhere. A source gets a
  // home piece there instead.
  StatusOr<Operand> Fetch(ValueId v, Region wanted, int64_t device) {
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
    auto it = origin_.find(v);
    if (it == origin_.end()) {  // no producer planned: a source's home, or an error
      if (!IsSourceValue(v)) return Internal("value '", g_.value(v).name, "' is read before it is written");
      std::vector<int>& homes = tg_.homes[v];
      for (int h : homes)
        if (piece(h).device == device && piece(h).region.Contains(region)) {
          op.pieces = {h};
          return op;
        }
      homes.push_back(AddPiece(v, device, region, false, -1));
      op.pieces = {homes.back()};
      return op;
    }
    Reduce(v);
    std::vector<int>* local = nullptr;  // the pieces of v transferred to the device (made with the first)
    if (auto d = derived_.find({v, device}); d != derived_.end()) local = &d->second;
    for (const std::vector<int>* list : {&it->second, local})
      for (size_t i = 0; list && i < list->size(); ++i)
        if (const int p = (*list)[i]; piece(p).device == device && piece(p).region.Contains(region)) {
          op.pieces = {p};
          return op;
        }
    DistinctRegions seen(ByRegion{&tg_.pieces});
    int64_t covered = 0;
    for (int p : it->second) {
      const Region& whole = piece(p).region;
      if (seen.count(p)) continue;
      std::optional<Region> part = whole.Intersect(region);
      if (!part) continue;
      seen.insert(p);
      int from = -1;
      for (int q : it->second)
        if (piece(q).device == device && piece(q).region == whole) from = q;
      for (size_t i = 0; from < 0 && local && i < local->size(); ++i)
        if (piece((*local)[i]).region.Contains(*part)) from = (*local)[i];
      if (from < 0) {
        Task t;
        t.kind = TaskKind::kTransfer;
        t.device = device;
        t.src_device = piece(p).device;
        t.sources = {p};
        t.deps = {piece(p).producer};
        t.bytes = Bytes(v, *part);
        t.name = g_.value(v).name + " " + part->ToString() + " " + std::to_string(t.src_device) + "->" +
                 std::to_string(device);
        const int id = AddTask(std::move(t));
        from = AddPiece(v, device, *part, false, id);
        tg_.tasks[static_cast<size_t>(id)].outputs = {from};
        if (!local) local = &derived_[{v, device}];
        local->push_back(from);
      }
      op.pieces.push_back(from);
      covered += part->numel();
    }
    if (covered != region.numel())
      return Internal("the pieces of '", g_.value(v).name, "' do not tile ", region.ToString());
    return op;
  }

  // The whole of v, one piece per region, on any devices.
  StatusOr<Operand> Whole(ValueId v) {
    const Region all = Region::Whole(g_.type(v).shape);
    if (IsSourceValue(v)) return Fetch(v, all, 0);
    if (!origin_.count(v)) return Internal("value '", g_.value(v).name, "' is never written");
    Reduce(v);
    Operand op{v, all, {}};
    DistinctRegions seen(ByRegion{&tg_.pieces});
    for (int p : origin_[v])
      if (seen.insert(p).second) op.pieces.push_back(p);
    return op;
  }

  // Makes sure the homes of a state value tile it (for reading it back): a
  // whole home on device 0 when they do not.
  void CoverHomes(ValueId state) {
    const std::vector<int>& homes = tg_.homes[state];
    const DistinctRegions regions(homes.begin(), homes.end(), ByRegion{&tg_.pieces});
    int64_t volume = 0;
    bool disjoint = true;
    for (auto a = regions.begin(); a != regions.end(); ++a) {
      volume += piece(*a).region.numel();
      for (auto b = std::next(a); b != regions.end(); ++b)
        disjoint = disjoint && !piece(*a).region.Intersect(piece(*b).region);
    }
    if (disjoint && volume == g_.type(state).shape.numel()) return;
    tg_.homes[state].push_back(AddPiece(state, 0, Region::Whole(g_.type(state).shape), false, -1));
  }

  // The forward layer a node belongs to: itself, or the longest layer name
  // L with the node's named "L/...".
  const LayerSplit* OwnerOf(const std::string& name) const {
    auto it = layers_.find(name);
    if (it != layers_.end()) return &it->second;
    for (size_t pos = name.rfind('/'); pos != std::string::npos && pos > 0; pos = name.rfind('/', pos - 1)) {
      it = layers_.find(name.substr(0, pos));
      if (it != layers_.end()) return &it->second;
    }
    return nullptr;
  }

  int64_t DeviceOfInputs(const Node& n) const {
    for (ValueId v : n.inputs) {
      auto it = origin_.find(v);
      if (it != origin_.end() && !it->second.empty()) return piece(it->second[0]).device;
    }
    return 0;
  }

  static const ValueSplit* Find(const std::unordered_map<ValueId, ValueSplit>& map, ValueId v) {
    auto it = map.find(v);
    return it == map.end() ? nullptr : &it->second;
  }

  // A following node's rule along dimension d: the one under which the
  // most elements of its inputs are already where it reads them: inputs
  // that arrive split as it reads them (in the same or a nested degree),
  // and parameters and buffers read as their forward layer reads them (else
  // every part holds a whole copy, refreshed every step: the weights of a
  // parameter-split Linear); ties go to the earlier rule, a replicated run
  // last.
  DimSplit BestMatch(const Node& n, const SplitRules& rules, int d, int64_t degree) const {
    std::vector<DimSplit> candidates;
    for (DimSplit& r : rules.All())
      if (!r.HasWindow()) candidates.push_back(std::move(r));
    candidates.push_back(Replicated(n.inputs.size(), n.outputs.size()));
    int best = -1;
    int64_t best_score = -1;
    for (size_t c = 0; c < candidates.size(); ++c) {
      int64_t score = 0;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ValueSplit* arrived = Find(splits_, n.inputs[i]);
        if (!arrived) arrived = Find(source_reads_, n.inputs[i]);
        if (!arrived) continue;
        // Along the same axis in nested degrees (a 4-way batch split read
        // 2-way) the parts hold most of what they read.
        const int64_t held = arrived->split.degree[static_cast<size_t>(d)];
        if (held == 1 || (held % degree != 0 && degree % held != 0)) continue;
        int axis = arrived->axis[static_cast<size_t>(d)];
        if (axis == kPartialAxis) axis = -1;
        if (axis == candidates[c].inputs[i].axis) score += g_.type(n.inputs[i]).shape.numel();
      }
      if (score > best_score) best = static_cast<int>(c), best_score = score;
    }
    return candidates[static_cast<size_t>(best)];
  }

  // Replaces node `id` by its op's expansion and plans the expansion's
  // nodes. Its place in the node order and its outputs' consumers, graph
  // outputs, state updates and gradients go to the expansion once, at the
  // end (ReplaceExpanded): doing so per expansion costs the whole graph.
  Status Expand(NodeId id, const OpDef& def) {
    // Expanded nodes leave the graph at the end, but their names are free at
    // once: an expansion whose names ("<node>/...") might take one removes
    // them first.
    const std::string prefix = g_.node(id).name + "/";
    auto held = expanded_names_.lower_bound(prefix);
    if (held != expanded_names_.end() && held->rfind(prefix, 0) == 0) RemoveExpanded();
    Expansion b(g_, g_.node(id));  // copies the node: emitting moves the graph's
    LOOM_RETURN_IF_ERROR(def.Expand(b));
    LOOM_ASSIGN_OR_RETURN(const std::vector<NodeId> emitted, b.Finish());
    for (size_t i = 0; i < b.node().outputs.size(); ++i) {
      const ValueId v = b.node().outputs[i];
      renamed_[v] = b.outputs()[i];
      g_.mutable_value(b.outputs()[i]).replica_layout = g_.value(v).replica_layout;
    }
    expanded_.push_back(id);
    expanded_names_.insert(b.node().name);
    expansions_[id] = emitted;
    for (NodeId e : emitted) LOOM_RETURN_IF_ERROR(PlanNode(e));
    return Status::Ok();
  }

  // What stands for v: v, or the value of the expansion that replaced its
  // producer (which may have been expanded in turn).
  ValueId Renamed(ValueId v) const {
    for (auto it = renamed_.find(v); it != renamed_.end(); it = renamed_.find(v)) v = it->second;
    return v;
  }

  void RemoveExpanded() {
    g_.RemoveNodes(expanded_);
    expanded_.clear();
    expanded_names_.clear();
  }

  // The graph with every expanded node replaced by its expansion, in its
  // place in `order` (the graph's order before lowering), and its outputs,
  // state updates and gradients naming the expansions' values.
  void ReplaceExpanded(const std::vector<NodeId>& order) {
    if (expansions_.empty()) return;
    std::vector<NodeId> replaced;
    std::function<void(NodeId)> place = [&](NodeId id) {
      if (auto it = expansions_.find(id); it != expansions_.end())
        for (NodeId e : it->second) place(e);
      else
        replaced.push_back(id);
    };
    for (NodeId id : order) place(id);
    for (auto& [name, v] : g_.outputs()) v = Renamed(v);
    for (StateUpdate& u : g_.state_updates()) u.new_value = Renamed(u.new_value);
    for (auto& [param, grad] : g_.gradients()) grad = Renamed(grad);
    RemoveExpanded();
    g_.SetNodeOrder(replaced);
  }

  Status PlanNode(NodeId id) {
    // Inputs that expanded nodes wrote are their expansions' values now.
    for (ValueId& v : g_.mutable_node(id).inputs) v = Renamed(v);
    const Node& n = g_.node(id);  // valid until an expansion adds nodes
    const OpDef* def = OpRegistry::Global().FindOp(n.op);
    if (!def) return InvalidArgument("node '", n.name, "': unknown op ", n.op);
    std::vector<TensorType> in, out;
    in.reserve(n.inputs.size());
    out.reserve(n.outputs.size());
    for (ValueId v : n.inputs) in.push_back(g_.type(v));
    for (ValueId v : n.outputs) out.push_back(g_.type(v));
    const bool forward = layers_.count(n.name) > 0;
    const LayerSplit* owner = OwnerOf(n.name);
    // A node of no layer (the gradient norm, the divergence checks) follows
    // the first of its inputs that a split node wrote.
    for (size_t i = 0; !owner && i < n.inputs.size(); ++i) {
      auto it = splits_.find(n.inputs[i]);
      if (it != splits_.end() && it->second.split.parts() > 1) owner = &it->second.split;
    }
    LayerSplit split;
    split.devices = {owner ? owner->devices[0] : DeviceOfInputs(n)};
    DimRules dims;
    if (owner) {
      split = *owner;
      const SplitRules rules = def->Splits(n.attrs, in, out);
      if (forward) {
        LOOM_ASSIGN_OR_RETURN(dims, ForwardDims(g_, n, rules, split));
      } else {
        for (int d = 0; d < kSplitDims; ++d)
          if (split.degree[static_cast<size_t>(d)] > 1)
            dims[static_cast<size_t>(d)] = BestMatch(n, rules, d, split.degree[static_cast<size_t>(d)]);
      }
      for (const std::optional<DimSplit>& d : dims)
        if (d && d->expands) return Expand(id, *def);
    }
    StatusOr<std::vector<PartRegions>> parts = Parts(g_, n, split, dims);
    std::vector<std::shared_ptr<const AttrMap>> attrs;
    std::vector<bool> alike;
    Status fits = parts.status();
    if (fits.ok()) fits = PartAttrs(n, *def, in, out, *parts, &attrs, &alike);
    if (!fits.ok()) {
      if (forward)
        return InvalidArgument("layer '", n.name, "' (", n.op, "): ", split.ToString(), ": ", fits.message());
      split = LayerSplit{};  // a following node that cannot follow runs whole
      split.devices = {owner ? owner->devices[0] : DeviceOfInputs(n)};
      dims = DimRules{};
      LOOM_ASSIGN_OR_RETURN(parts, Parts(g_, n, split, dims));
      attrs = {std::make_shared<const AttrMap>(n.attrs)};
      alike = {false};
    }
    std::vector<std::vector<int>*> origins;  // of each output
    for (ValueId v : n.outputs) {
      origins.push_back(&origin_[v]);
      origins.back()->reserve(parts->size());
    }
    OpCost cost;
    DType work_dtype = DType::kF32;  // the first floating output's (a loss over f32 logits is f32 work)
    for (const TensorType& o : out)
      if (IsFloating(o.dtype)) {
        work_dtype = o.dtype;
        break;
      }
    for (size_t p = 0; p < parts->size(); ++p) {
      PartRegions& part = (*parts)[p];
      Task t;
      t.kind = TaskKind::kCompute;
      t.node = n.id;
      t.part = static_cast<int64_t>(p);
      t.device = split.devices[p];
      t.name = TaskName(n.name, p, parts->size());
      t.attrs = std::move(attrs[p]);
      if (!alike[p]) cost = def->Cost(*t.attrs, PartTypes(part.inputs, in), PartTypes(part.outputs, out));
      t.inputs.reserve(n.inputs.size());
      t.deps.reserve(n.inputs.size());
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        LOOM_ASSIGN_OR_RETURN(Operand op, Fetch(n.inputs[i], std::move(part.inputs[i]), t.device));
        for (int q : op.pieces) t.deps.push_back(piece(q).producer);
        t.inputs.push_back(std::move(op));
      }
      t.flops = cost.flops;
      t.bytes = cost.bytes_read + cost.bytes_written;
      t.dtype = work_dtype;
      t.outputs.reserve(n.outputs.size());
      const int id = AddTask(std::move(t));
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        const int q = AddPiece(n.outputs[i], split.devices[p], std::move(part.outputs[i]), part.partial[i], id);
        tg_.pieces[static_cast<size_t>(q)].partial_index = part.partial_index[i];
        tg_.tasks[static_cast<size_t>(id)].outputs.push_back(q);
        origins[i]->push_back(q);
        if (part.partial[i]) unreduced_.insert(n.outputs[i]);
      }
    }
    if (forward)
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        if (!IsSourceValue(n.inputs[i]) || source_reads_.count(n.inputs[i])) continue;
        ValueSplit& s = source_reads_[n.inputs[i]];
        s.split = split;
        for (size_t d = 0; d < kSplitDims; ++d)
          if (dims[d]) s.axis[d] = dims[d]->inputs[i].axis;
      }
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      ValueSplit& s = splits_[n.outputs[i]];
      s.split = split;
      for (size_t d = 0; d < kSplitDims; ++d)
        if (dims[d])
          s.axis[d] = dims[d]->outputs[i].axis >= 0 ? dims[d]->outputs[i].axis
                      : dims[d]->partial_sums      ? kPartialAxis
                                                   : -1;
    }
    return Status::Ok();
  }

  Graph g_;  // the graph being lowered: expansions replace nodes of it
  const std::map<std::string, LayerSplit>& layers_;
  TaskGraph tg_;
  std::unordered_map<ValueId, std::vector<int>> origin_;            // pieces its producer (or an all-reduce) wrote
  std::map<std::pair<ValueId, int64_t>, std::vector<int>> derived_;  // transferred pieces, by value and device
  std::unordered_map<ValueId, ValueSplit> splits_;
  // Sources (parameters, buffers) as a forward layer's split reads them.
  std::unordered_map<ValueId, ValueSplit> source_reads_;
  std::set<ValueId> unreduced_;  // values with partial pieces, not yet all-reduced
  // Expansions: the nodes that replace each expanded node, the values that
  // stand for its outputs, and the expanded nodes (and their names) still
  // in the graph.
  std::map<NodeId, std::vector<NodeId>> expansions_;
  std::map<ValueId, ValueId> renamed_;
  std::vector<NodeId> expanded_;
  std::set<std::string> expanded_names_;
};

}  // namespace

std::string TaskGraph::ToString() const {
  std::ostringstream s;
  s.precision(17);  // bytes and FLOPs exactly
  for (const Task& t : tasks) {
    s << t.id << " " << TaskKindName(t.kind) << " " << t.name;
    if (t.kind == TaskKind::kAllReduce) s << " on " << Join(t.group);
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
    if (t.kind == TaskKind::kAllReduce) s << ", \"group\": [" << Join(t.group) << "]";
    s << ", \"flops\": " << t.flops << ", \"bytes\": " << t.bytes << ", \"deps\": [" << Join(t.deps) << "]}";
  }
  s << "\n]}\n";
  return s.str();
}

double TaskGraph::TransferBytes() const {
  double bytes = 0;
  for (const Task& t : tasks) {
    if (t.kind == TaskKind::kTransfer) bytes += t.bytes;
    if (t.kind == TaskKind::kAllReduce) bytes += t.bytes * static_cast<double>(t.group.size());
  }
  return bytes;
}

StatusOr<TaskGraph> BuildTaskGraph(const Graph& graph, const std::map<std::string, LayerSplit>& layers,
                                   int64_t devices) {
  if (devices < 1) return InvalidArgument("a task graph needs >= 1 device, got ", devices);
  for (const auto& [name, split] : layers)
    for (int64_t d : split.devices)
      if (d < 0 || d >= devices)
        return InvalidArgument("layer '", name, "': device ", d, " is not one of the ", devices, " devices");
  return Lowering(graph, layers, devices).Run();
}

StatusOr<std::vector<PartRegions>> LayerParts(const Graph& forward, const Node& node, const LayerSplit& split) {
  const OpDef* def = OpRegistry::Global().FindOp(node.op);
  if (!def) return InvalidArgument("layer '", node.name, "': unknown op ", node.op);
  std::vector<TensorType> in, out;
  for (ValueId v : node.inputs) in.push_back(forward.type(v));
  for (ValueId v : node.outputs) out.push_back(forward.type(v));
  LOOM_ASSIGN_OR_RETURN(const DimRules dims, ForwardDims(forward, node, def->Splits(node.attrs, in, out), split));
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

StatusOr<TaskGraph> LowerToTaskGraph(const Graph& step, const Strategy& strategy, const Graph& forward) {
  LOOM_ASSIGN_OR_RETURN(auto layers, ResolveLayers(strategy, forward));
  return BuildTaskGraph(step, layers, strategy.devices());
}

}  // namespace loom
