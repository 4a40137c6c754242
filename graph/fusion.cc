#include "graph/fusion.h"

#include <map>

#include "graph/builder.h"
#include "ops/fusion_builder.h"

namespace loom {
namespace {

// s with a leading extent-1 axis: one replica's result, to be stacked.
Shape AsOneOfStack(const Shape& s) {
  std::vector<int64_t> d = s.dims();
  d.insert(d.begin(), 1);
  return Shape(d);
}

// Builds the fused graph node by node. The pass itself handles sources,
// active Dropout (one mask per replica from the replicas' seeds), nodes
// whose inputs are all shared (kept as they are) and unfused_layers (run
// per replica); every other node is fused by its op's rule (OpDef::Fuse),
// which sees the pass through the FusionBuilder interface.
class Fuser final : public FusionBuilder {
 public:
  Fuser(const Graph& model, const FusionOptions& options)
      : src_(model), opt_(options), r_(options.replicas), b_(&dst_) {}

  StatusOr<Graph> Run() {
    if (r_ < 1) return InvalidArgument("fusion needs at least one replica, got ", r_);
    if (static_cast<int>(opt_.seeds.size()) != r_)
      return InvalidArgument("fusion of ", r_, " replicas needs ", r_, " seeds, got ", opt_.seeds.size());
    if (!src_.gradients().empty())
      return InvalidArgument("fuse the forward graph: this graph already has gradients");
    if (src_.fused()) return InvalidArgument("the graph is already fused (", src_.replicas(), " replicas)");
    for (const std::string& name : opt_.per_replica_inputs) {
      auto id = src_.FindNode(name);
      if (!id || src_.node(*id).op != kInputOp)
        return InvalidArgument("per-replica input '", name, "' is not an input of the model");
    }
    for (const std::string& layer : opt_.unfused_layers) {
      bool found = false;
      for (const Node& n : src_.nodes()) found = found || MatchesLayer(n.name, {layer});
      if (!found) return InvalidArgument("unfused layer '", layer, "' names no node of the model");
    }
    dst_.set_replicas(static_cast<int>(r_));
    for (const Node& n : src_.nodes()) {
      Status s = FuseNode(n);
      if (!s.ok()) return s.WithContext("fusing node '" + n.name + "' (" + n.op + ") into " + std::to_string(r_) +
                                        " replicas");
    }
    for (const auto& [name, v] : src_.outputs()) {
      LOOM_ASSIGN_OR_RETURN(FusedValue out, Replicated(map_.at(v), 0, "outputs/" + name));
      dst_.outputs()[name] = out.v;
    }
    for (const StateUpdate& u : src_.state_updates()) {
      LOOM_ASSIGN_OR_RETURN(FusedValue nv, Replicated(map_.at(u.new_value), 0, Name(u.new_value) + "/stacked"));
      dst_.state_updates().push_back({map_.at(u.state).v, nv.v});
    }
    return std::move(dst_);
  }

  // ---- FusionBuilder ----

  const Node& node() const override { return *node_; }
  const FusedValue& input(int i) const override { return map_.at(node_->inputs.at(i)); }
  const TensorType& output_type(int i) const override { return src_.type(node_->outputs.at(i)); }
  const TensorType& type(ValueId fused) const override { return dst_.type(fused); }
  int64_t replicas() const override { return r_; }
  const std::vector<uint64_t>& seeds() const override { return opt_.seeds; }

  StatusOr<std::vector<FusedValue>> Emit(const std::string& op, const std::vector<FusedValue>& inputs,
                                         const AttrMap& attrs, const std::string& name,
                                         const std::vector<ReplicaLayout>& layouts) override {
    std::vector<ValueId> ins;
    for (const FusedValue& x : inputs) ins.push_back(x.v);
    LOOM_ASSIGN_OR_RETURN(std::vector<ValueId> outs, b_.Add(op, ins, attrs, name));
    if (layouts.size() != 1 && layouts.size() != outs.size())
      return Internal("emitting ", op, " '", name, "': ", layouts.size(), " layouts for ", outs.size(), " outputs");
    std::vector<FusedValue> fused;
    for (size_t i = 0; i < outs.size(); ++i) {
      const ReplicaLayout& layout = layouts[layouts.size() == 1 ? 0 : i];
      dst_.mutable_value(outs[i]).replica_layout = layout;
      fused.push_back({outs[i], layout});
    }
    return fused;
  }

  Status MapOutputs(const std::vector<FusedValue>& outputs) override {
    const Node& n = *node_;
    if (outputs.size() != n.outputs.size())
      return Internal("the rule of ", n.op, " mapped ", outputs.size(), " outputs of ", n.outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      const FusedValue& y = outputs[i];
      const Shape& single = src_.type(n.outputs[i]).shape;
      const bool plain =
          y.layout.shared() || (y.replicated() && y.layout.per_replica == 1 && y.axis() <= single.rank());
      if (!plain || type(y.v).shape != (y.replicated() ? WithReplicaAxis(single, y.axis()) : single))
        return Internal("the rule of ", n.op, " mapped output ", i, " ", single.ToString(), " to ",
                        type(y.v).ToString(), " laid out ", y.layout.ToString(),
                        ": expected it shared or with a replica axis of its own");
      map_[n.outputs[i]] = y;
    }
    return Status::Ok();
  }

  // Runs the op once per replica on its slices and stacks the results. The
  // slices and the per-replica results belong to no fused layout. With one
  // replica the slice and the stack are views (its replica axis has size 1),
  // not copies.
  Status PerReplica() override {
    const Node& n = *node_;
    const OpDef* def = OpRegistry::Global().FindOp(n.op);
    if (def && def->IsRandom())
      return Unimplemented("random op ", n.op, " has no per-replica form (its streams are keyed by node name)");
    std::vector<std::vector<FusedValue>> stacked(n.outputs.size());
    for (int r = 0; r < r_; ++r) {
      const std::string name = n.name + "/replica" + std::to_string(r);
      std::vector<FusedValue> ins;
      for (int i = 0; i < num_inputs(); ++i) {
        LOOM_ASSIGN_OR_RETURN(FusedValue s, Select(input(i), r, name + "/in" + std::to_string(i)));
        ins.push_back(s);
      }
      LOOM_ASSIGN_OR_RETURN(auto outs, Emit(n.op, ins, n.attrs, name, {ReplicaLayout::Unknown()}));
      for (size_t i = 0; i < outs.size(); ++i) {
        const ReplicaLayout layout = r_ == 1 ? ReplicaLayout::Axis(0) : ReplicaLayout::Unknown();
        LOOM_ASSIGN_OR_RETURN(FusedValue one, Reshape(outs[i], AsOneOfStack(shape(outs[i])), layout,
                                                      name + "/out" + std::to_string(i)));
        stacked[i].push_back(one);
      }
    }
    std::vector<FusedValue> outs;
    for (size_t i = 0; i < stacked.size(); ++i) {
      if (r_ == 1) {
        outs.push_back(stacked[i][0]);
        continue;
      }
      LOOM_ASSIGN_OR_RETURN(FusedValue cat, Emit1("Concat", stacked[i], {{"axis", int64_t{0}}},
                                                  n.name + "/stack" + std::to_string(i), ReplicaLayout::Axis(0)));
      outs.push_back(cat);
    }
    LOOM_RETURN_IF_ERROR(MapOutputs(outs));
    per_replica_ = true;
    return Status::Ok();
  }

 private:
  std::string Name(ValueId src_value) const { return src_.node(src_.value(src_value).producer).name; }

  // Replica r of x as a single-model value.
  StatusOr<FusedValue> Select(const FusedValue& x, int r, const std::string& name) {
    if (!x.replicated()) return x;
    if (r_ == 1) return Reshape(x, SingleShape(x), ReplicaLayout::Unknown(), name + "/select");
    LOOM_ASSIGN_OR_RETURN(FusedValue s, Emit1("Slice", {x},
                                              {{"axis", static_cast<int64_t>(x.axis())},
                                               {"start", static_cast<int64_t>(r)},
                                               {"end", static_cast<int64_t>(r + 1)}},
                                              name + "/select", ReplicaLayout::Unknown()));
    return Reshape(s, SingleShape(x), ReplicaLayout::Unknown(), name + "/select");
  }

  Status FuseNode(const Node& n) {
    node_ = &n;
    per_replica_ = false;
    bool any_replicated = false;
    for (ValueId v : n.inputs) any_replicated = any_replicated || map_.at(v).replicated();
    if (n.op == kInputOp) return FuseInput(n);
    if (n.op == kParameterOp || n.op == kBufferOp) return FuseState(n);
    if (n.op == "Dropout" && n.attrs.Bool("training") && n.attrs.Float("p") > 0) return FuseDropout();
    if (!any_replicated) return Clone(n);
    if (MatchesLayer(n.name, opt_.unfused_layers)) return PerReplica();
    LOOM_ASSIGN_OR_RETURN(const OpDef* def, OpRegistry::Global().GetOp(n.op));
    LOOM_RETURN_IF_ERROR(def->Fuse(*this));
    for (ValueId v : n.outputs)
      if (!map_.count(v)) return Internal("the fusion rule of ", n.op, " did not map all its outputs");
    // Hold the rule to its declared kind, so that `loom ops` and the fusion
    // tests can trust it: a fused op that falls back loses the speed-up.
    const FusionKind kind = def->fusion_kind();
    if (kind == FusionKind::kFused && per_replica_)
      return Internal("op ", n.op, " declares a fused form, but its rule ran it once per replica");
    if (kind == FusionKind::kPerReplica && !per_replica_)
      return Internal("op ", n.op, " declares no fused form, but its rule emitted one");
    return Status::Ok();
  }

  Status FuseInput(const Node& n) {
    TensorType t = src_.type(n.outputs[0]);
    const bool per_replica = opt_.per_replica_inputs.count(n.name) > 0;
    if (per_replica) t.shape = WithReplicaAxis(t.shape, 0);
    const ValueId v = b_.Input(n.name, t);
    const ReplicaLayout layout = per_replica ? ReplicaLayout::Axis(0) : ReplicaLayout::Shared();
    dst_.mutable_value(v).replica_layout = layout;
    map_[n.outputs[0]] = FusedValue{v, layout};
    return Status::Ok();
  }

  Status FuseState(const Node& n) {
    TensorType t = src_.type(n.outputs[0]);
    t.shape = WithReplicaAxis(t.shape, 0);
    AttrMap attrs = n.attrs;
    std::vector<int64_t> seeds(opt_.seeds.begin(), opt_.seeds.end());
    attrs.Set(kReplicaSeedsAttr, seeds);
    const ValueId v = n.op == kParameterOp ? b_.Parameter(n.name, t, attrs) : b_.Buffer(n.name, t, attrs);
    dst_.mutable_value(v).replica_layout = ReplicaLayout::Axis(0);
    map_[n.outputs[0]] = FusedValue{v, ReplicaLayout::Axis(0)};
    return Status::Ok();
  }

  // The node as it is: all its inputs are shared, so are its outputs.
  Status Clone(const Node& n) {
    std::vector<FusedValue> ins;
    for (int i = 0; i < num_inputs(); ++i) ins.push_back(input(i));
    LOOM_ASSIGN_OR_RETURN(auto outs, Emit(n.op, ins, n.attrs, n.name, {ReplicaLayout::Shared()}));
    return MapOutputs(outs);
  }

  // Each replica draws its own mask, from its own seed, along the replica
  // axis (a shared input is broadcast to R copies first).
  Status FuseDropout() {
    const Node& n = *node_;
    FusedValue x = input(0);
    if (!x.replicated()) {
      LOOM_ASSIGN_OR_RETURN(x, Replicated(x, shape(x).rank() >= 2 ? 1 : 0, n.name));
    }
    AttrMap attrs = n.attrs;
    attrs.Set(kReplicaAxisAttr, static_cast<int64_t>(x.axis()));
    attrs.Set(kReplicaSeedsAttr, std::vector<int64_t>(opt_.seeds.begin(), opt_.seeds.end()));
    LOOM_ASSIGN_OR_RETURN(auto outs, Emit(n.op, {x}, attrs, n.name, {x.layout}));
    return MapOutputs(outs);
  }

  const FusedValue* FindMoved(ValueId v, int to) const override {
    auto it = moved_.find({v, to});
    return it == moved_.end() ? nullptr : &it->second;
  }
  void RememberMoved(ValueId v, int to, const FusedValue& moved) override { moved_[{v, to}] = moved; }

  const Graph& src_;
  const FusionOptions& opt_;
  const int64_t r_;
  Graph dst_;
  GraphBuilder b_;
  std::map<ValueId, FusedValue> map_;                   // model value -> fused value
  std::map<std::pair<ValueId, int>, FusedValue> moved_;  // (fused value, replica axis) -> its move there
  const Node* node_ = nullptr;         // the model node being fused
  bool per_replica_ = false;           // whether it ran once per replica
};

}  // namespace

bool MatchesLayer(const std::string& node_name, const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes)
    if (node_name == p || (node_name.size() > p.size() && node_name.compare(0, p.size(), p) == 0 &&
                           node_name[p.size()] == '/'))
      return true;
  return false;
}

StatusOr<Graph> FuseReplicas(const Graph& model, const FusionOptions& options) {
  return Fuser(model, options).Run();
}

}  // namespace loom
