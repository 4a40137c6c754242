#include "graph/task_graph.h"

#include <algorithm>
#include <array>
#include <optional>
#include <set>
#include <sstream>

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

// What one part reads and writes.
struct PartRegions {
  std::vector<Region> inputs, outputs;
  std::vector<bool> partial;  // per output
  // Per output: which partial sum it is (its coordinates along the dims
  // that sum it); parts that differ only along dims that replicate it hold
  // copies of the same partial sum, which an all-reduce adds once.
  std::vector<int64_t> partial_index;
};

using DimRules = std::array<std::optional<DimSplit>, kSplitDims>;

// Every tensor whole, every part computing all of it (a replicated op).
DimSplit Replicated(size_t inputs, size_t outputs) { return SplitAlong(-1, inputs, outputs); }

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

class Lowering {
 public:
  Lowering(const Graph& graph, const std::map<std::string, LayerSplit>& layers, int64_t devices)
      : g_(graph), layers_(layers) {
    tg_.devices = devices;
  }

  StatusOr<TaskGraph> Run() {
    std::vector<NodeId> order;  // a copy: expansions change the graph
    for (const Node& n : g_.nodes())
      if (!IsSourceOp(n.op)) order.push_back(n.id);
    for (NodeId id : order) LOOM_RETURN_IF_ERROR(PlanNode(id));
    for (const auto& [name, v] : g_.outputs()) {
      LOOM_ASSIGN_OR_RETURN(tg_.outputs[name], Whole(v));
    }
    for (const Node& n : g_.nodes())
      if (IsStateOp(n.op)) CoverHomes(n.outputs[0]);
    for (const StateUpdate& u : g_.state_updates())
      for (int h : std::vector<int>(tg_.homes[u.state])) {  // a copy: Fetch may add homes
        const Piece home = piece(h);
        LOOM_ASSIGN_OR_RETURN(Operand from, Fetch(u.new_value, home.region, home.device));
        tg_.writebacks.emplace_back(h, std::move(from));
      }
    tg_.graph = std::move(g_);
    return std::move(tg_);
  }

 private:
  int AddPiece(ValueId v, int64_t device, Region region, bool partial, int producer) {
    Piece p;
    p.value = v;
    p.device = device;
    p.region = std::move(region);
    p.partial = partial;
    p.producer = producer;
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
    std::vector<int>& origin = origin_[v];
    std::map<Region, std::vector<int>> partial;
    std::vector<int> kept;
    for (int p : origin) {
      if (piece(p).partial) partial[piece(p).region].push_back(p);
      else kept.push_back(p);
    }
    if (partial.empty()) return;
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
  StatusOr<Operand> Fetch(ValueId v, const Region& wanted, int64_t device) {
    // A window part's rows may reach into the padding: it reads the rows
    // inside and the runtime fills the rest with zeros.
    const std::optional<Region> inside = wanted.Intersect(Region::Whole(g_.type(v).shape));
    if (!inside) return Internal("a part reads only padding of '", g_.value(v).name, "'");
    if (*inside != wanted) {
      LOOM_ASSIGN_OR_RETURN(Operand op, Fetch(v, *inside, device));
      op.region = wanted;
      return op;
    }
    const Region& region = wanted;
    Operand op{v, region, {}};
    if (IsSourceValue(v)) {
      for (int h : tg_.homes[v])
        if (piece(h).device == device && piece(h).region.Contains(region)) {
          op.pieces = {h};
          return op;
        }
      const int h = AddPiece(v, device, region, false, -1);
      tg_.homes[v].push_back(h);
      op.pieces = {h};
      return op;
    }
    auto it = origin_.find(v);
    if (it == origin_.end()) return Internal("value '", g_.value(v).name, "' is read before it is written");
    Reduce(v);
    std::vector<int>& local = derived_[{v, device}];
    for (const std::vector<int>* list : {&it->second, &local})
      for (int p : *list)
        if (piece(p).device == device && piece(p).region.Contains(region)) {
          op.pieces = {p};
          return op;
        }
    std::set<Region> seen;
    int64_t covered = 0;
    for (int p : std::vector<int>(it->second)) {
      const Region& whole = piece(p).region;
      if (seen.count(whole)) continue;
      std::optional<Region> part = whole.Intersect(region);
      if (!part) continue;
      seen.insert(whole);
      int from = -1;
      for (int q : it->second)
        if (piece(q).device == device && piece(q).region == whole) from = q;
      for (size_t i = 0; from < 0 && i < local.size(); ++i)
        if (piece(local[i]).region.Contains(*part)) from = local[i];
      if (from < 0) {
        Task t;
        t.kind = TaskKind::kTransfer;
        t.device = device;
        t.src_device = piece(p).device;
        t.sources = {p};
        t.deps = {piece(p).producer};
        t.bytes = Bytes(v, *part);
        t.name = StrCat(g_.value(v).name, " ", part->ToString(), " ", t.src_device, "->", device);
        const int id = AddTask(std::move(t));
        from = AddPiece(v, device, *part, false, id);
        tg_.tasks[static_cast<size_t>(id)].outputs = {from};
        local.push_back(from);
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
    std::set<Region> seen;
    for (int p : origin_[v])
      if (seen.insert(piece(p).region).second) op.pieces.push_back(p);
    return op;
  }

  // Makes sure the homes of a state value tile it (for reading it back): a
  // whole home on device 0 when they do not.
  void CoverHomes(ValueId state) {
    std::set<Region> regions;
    for (int h : tg_.homes[state]) regions.insert(piece(h).region);
    int64_t volume = 0;
    bool disjoint = true;
    for (auto a = regions.begin(); a != regions.end(); ++a) {
      volume += a->numel();
      for (auto b = std::next(a); b != regions.end(); ++b) disjoint = disjoint && !a->Intersect(*b);
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

  // A following node's rule along dimension d: the one most of whose
  // inputs arrive split as it reads them; ties go to the earlier rule, a
  // replicated run last.
  DimSplit BestMatch(const Node& n, const SplitRules& rules, int d, int64_t degree) const {
    std::vector<DimSplit> candidates;
    for (DimSplit& r : rules.All())
      if (!r.HasWindow()) candidates.push_back(std::move(r));
    candidates.push_back(Replicated(n.inputs.size(), n.outputs.size()));
    int best = -1, best_score = -1;
    for (size_t c = 0; c < candidates.size(); ++c) {
      int score = 0;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        auto it = splits_.find(n.inputs[i]);
        if (it == splits_.end() || it->second.split.degree[static_cast<size_t>(d)] != degree) continue;
        int axis = it->second.axis[static_cast<size_t>(d)];
        if (axis == kPartialAxis) axis = -1;
        if (axis == candidates[c].inputs[i].axis) ++score;
      }
      if (score > best_score) best = static_cast<int>(c), best_score = score;
    }
    return candidates[static_cast<size_t>(best)];
  }

  // The regions of every part (row-major over sample, replica, attribute,
  // parameter), or why the split does not fit the shapes.
  StatusOr<std::vector<PartRegions>> Parts(const Node& n, const LayerSplit& split, const DimRules& dims) const {
    std::vector<PartRegions> parts(static_cast<size_t>(split.parts()));
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
        Region r = Region::Whole(g_.type(v).shape);
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
            return InvalidArgument("axis ", a.axis, " of '", g_.value(v).name, "' ", g_.type(v).shape.ToString());
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
                                   a.axis, " of '", g_.value(v).name, "' ", g_.type(v).shape.ToString());
          r.lo[a.axis] += coord[d] * (len / k);
          r.hi[a.axis] = r.lo[a.axis] + len / k;
        }
        if (input) {
          part.inputs.push_back(std::move(r));
        } else {
          part.outputs.push_back(std::move(r));
          part.partial.push_back(partial);
          part.partial_index.push_back(partial_index);
        }
      }
    }
    return parts;
  }

  // A part's attributes, checked by type inference against its regions.
  StatusOr<AttrMap> PartAttrs(const Node& n, const OpDef& def, const std::vector<TensorType>& in,
                              const std::vector<TensorType>& out, const PartRegions& part) const {
    bool whole = true;
    for (size_t i = 0; i < in.size(); ++i) whole = whole && part.inputs[i].shape() == in[i].shape;
    for (size_t i = 0; i < out.size(); ++i) whole = whole && part.outputs[i].shape() == out[i].shape;
    if (whole) return n.attrs;
    LOOM_ASSIGN_OR_RETURN(AttrMap attrs, def.PartAttrs(n.attrs, in, out, part.inputs, part.outputs));
    std::vector<TensorType> part_in;
    for (size_t i = 0; i < in.size(); ++i) part_in.push_back({part.inputs[i].shape(), in[i].dtype});
    LOOM_ASSIGN_OR_RETURN(std::vector<TensorType> inferred, InferOpTypes(def, attrs, part_in));
    for (size_t i = 0; i < out.size(); ++i)
      if (i >= inferred.size() || inferred[i].shape != part.outputs[i].shape())
        return InvalidArgument("a part of output ", i, " would be ",
                               i < inferred.size() ? inferred[i].shape.ToString() : "missing", ", not ",
                               part.outputs[i].shape().ToString());
    return attrs;
  }

  // Replaces node n by its op's expansion, placed where n was, and plans
  // the expansion's nodes; consumers, graph outputs, state updates and
  // gradients that named n's outputs name the expansion's.
  Status Expand(const Node& n, const OpDef& def) {
    Expansion b(g_, n);
    LOOM_RETURN_IF_ERROR(def.Expand(b));
    LOOM_ASSIGN_OR_RETURN(const std::vector<NodeId> emitted, b.Finish());
    std::map<ValueId, ValueId> renamed;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      renamed[n.outputs[i]] = b.outputs()[i];
      g_.mutable_value(b.outputs()[i]).replica_layout = g_.value(n.outputs[i]).replica_layout;
    }
    auto rename = [&](ValueId& v) {
      auto it = renamed.find(v);
      if (it != renamed.end()) v = it->second;
    };
    const std::set<NodeId> mine(emitted.begin(), emitted.end());
    std::vector<NodeId> order;
    for (const Node& m : g_.nodes()) {
      if (m.id == n.id) order.insert(order.end(), emitted.begin(), emitted.end());
      if (m.id == n.id || mine.count(m.id)) continue;
      order.push_back(m.id);
    }
    for (NodeId id : order)
      if (!mine.count(id))
        for (ValueId& v : g_.mutable_node(id).inputs) rename(v);
    for (auto& [name, v] : g_.outputs()) rename(v);
    for (StateUpdate& u : g_.state_updates()) rename(u.new_value);
    for (auto& [param, grad] : g_.gradients()) rename(grad);
    g_.RemoveNodes({n.id});
    g_.SetNodeOrder(order);
    for (NodeId id : emitted) LOOM_RETURN_IF_ERROR(PlanNode(id));
    return Status::Ok();
  }

  Status PlanNode(NodeId id) {
    const Node n = g_.node(id);  // a copy: an expansion changes the graph
    const OpDef* def = OpRegistry::Global().FindOp(n.op);
    if (!def) return InvalidArgument("node '", n.name, "': unknown op ", n.op);
    std::vector<TensorType> in, out;
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
      const std::optional<DimSplit>* labelled[kSplitDims] = {&rules.sample, nullptr, &rules.attribute,
                                                             &rules.parameter};
      for (int d = 0; d < kSplitDims; ++d) {
        const int64_t degree = split.degree[static_cast<size_t>(d)];
        if (degree == 1) continue;
        std::string why;
        if (!forward) {
          dims[static_cast<size_t>(d)] = BestMatch(n, rules, d, degree);
        } else if (d == static_cast<int>(SplitDim::kReplica)) {
          dims[static_cast<size_t>(d)] = ReplicaSplit(g_, n, rules, &why);
        } else {
          dims[static_cast<size_t>(d)] = *labelled[d];
          if (!*labelled[d]) why = "its op has no rule for it";

        }
        if (!why.empty())
          return InvalidArgument("layer '", n.name, "' (", n.op, "): ", SplitDimName(kAllSplitDims[d]), " ", degree,
                                 ": ", why);
      }
      for (const std::optional<DimSplit>& d : dims)
        if (d && d->expands) return Expand(n, *def);
    }
    StatusOr<std::vector<PartRegions>> parts = Parts(n, split, dims);
    std::vector<AttrMap> attrs;
    Status fits = parts.status();
    for (size_t p = 0; fits.ok() && p < parts->size(); ++p) {
      StatusOr<AttrMap> a = PartAttrs(n, *def, in, out, (*parts)[p]);
      fits = a.status();
      if (a.ok()) attrs.push_back(std::move(*a));
    }
    if (!fits.ok()) {
      if (forward)
        return InvalidArgument("layer '", n.name, "' (", n.op, "): ", split.ToString(), ": ", fits.message());
      split = LayerSplit{};  // a following node that cannot follow runs whole
      split.devices = {owner ? owner->devices[0] : DeviceOfInputs(n)};
      dims = DimRules{};
      LOOM_ASSIGN_OR_RETURN(parts, Parts(n, split, dims));
      attrs = {n.attrs};
    }
    for (size_t p = 0; p < parts->size(); ++p) {
      const PartRegions& part = (*parts)[p];
      Task t;
      t.kind = TaskKind::kCompute;
      t.node = n.id;
      t.part = static_cast<int64_t>(p);
      t.device = split.devices[p];
      t.name = parts->size() == 1 ? n.name : StrCat(n.name, "[", p, "]");
      t.attrs = attrs[p];
      std::vector<TensorType> part_in, part_out;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        LOOM_ASSIGN_OR_RETURN(Operand op, Fetch(n.inputs[i], part.inputs[i], t.device));
        for (int q : op.pieces) t.deps.push_back(piece(q).producer);
        t.inputs.push_back(std::move(op));
        part_in.push_back({part.inputs[i].shape(), in[i].dtype});
      }
      for (size_t i = 0; i < n.outputs.size(); ++i) part_out.push_back({part.outputs[i].shape(), out[i].dtype});
      const OpCost cost = def->Cost(t.attrs, part_in, part_out);
      t.flops = cost.flops;
      t.bytes = cost.bytes_read + cost.bytes_written;
      const int id = AddTask(std::move(t));
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        const int q = AddPiece(n.outputs[i], split.devices[p], part.outputs[i], part.partial[i], id);
        tg_.pieces[static_cast<size_t>(q)].partial_index = part.partial_index[i];
        tg_.tasks[static_cast<size_t>(id)].outputs.push_back(q);
        origin_[n.outputs[i]].push_back(q);
      }
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
  std::map<ValueId, std::vector<int>> origin_;                   // pieces its producer (or an all-reduce) wrote
  std::map<std::pair<ValueId, int64_t>, std::vector<int>> derived_;  // transferred pieces, by value and device
  std::map<ValueId, ValueSplit> splits_;
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
