#include "graph/fusion.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "graph/builder.h"

namespace loom {
namespace {

// A value of the fused graph and where its replica axis is (-1: shared).
struct FusedValue {
  ValueId v = kNoValue;
  int axis = -1;
  bool replicated() const { return axis >= 0; }
};

const std::set<std::string>& ElementwiseUnaryOps() {
  static const std::set<std::string> ops = {
      "Identity", "Neg",   "AddScalar", "MulScalar", "PowScalar", "ReLU", "ReLU6", "LeakyReLU",
      "GELU",     "Sigmoid", "Tanh",    "Hardswish", "Hardsigmoid", "SiLU", "Exp",  "Log",
      "Sqrt",     "Rsqrt", "Abs"};
  return ops;
}

bool IsBinaryOp(const std::string& op) { return op == "Add" || op == "Sub" || op == "Mul" || op == "Div"; }
bool IsConvOp(const std::string& op) {
  return op == "Conv1d" || op == "Conv2d" || op == "ConvTranspose1d" || op == "ConvTranspose2d";
}
bool IsPoolOp(const std::string& op) { return op == "MaxPool2d" || op == "AvgPool2d" || op == "AdaptiveAvgPool2d"; }
bool IsReduceOp(const std::string& op) { return op == "ReduceSum" || op == "ReduceMean" || op == "ReduceMax"; }

Shape InsertDim(const Shape& s, int at, int64_t extent) {
  std::vector<int64_t> d = s.dims();
  d.insert(d.begin() + at, extent);
  return Shape(d);
}

Shape RemoveDim(const Shape& s, int at) {
  std::vector<int64_t> d = s.dims();
  d.erase(d.begin() + at);
  return Shape(d);
}

int64_t Product(const std::vector<int64_t>& d, int begin, int end) {
  int64_t p = 1;
  for (int i = begin; i < end; ++i) p *= d[i];
  return p;
}

// Position of single-model axis `a` in a fused value whose replica axis is
// at `k`.
int FusedAxis(int a, int k) { return a < k ? a : a + 1; }

class Fuser {
 public:
  Fuser(const Graph& model, const FusionOptions& options)
      : src_(model), opt_(options), r_(options.replicas), b_(&dst_) {}

  StatusOr<Graph> Run() {
    if (r_ < 1) return InvalidArgument("fusion needs at least one replica, got ", r_);
    if (static_cast<int>(opt_.seeds.size()) != r_)
      return InvalidArgument("fusion of ", r_, " replicas needs ", r_, " seeds, got ", opt_.seeds.size());
    if (!src_.gradients().empty())
      return InvalidArgument("fuse the forward graph: this graph already has gradients");
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
    for (const Node& n : src_.nodes()) {
      Status s = FuseNode(n);
      if (!s.ok()) return s.WithContext("fusing node '" + n.name + "' (" + n.op + ") into " + std::to_string(r_) +
                                        " replicas");
    }
    for (const auto& [name, v] : src_.outputs()) {
      LOOM_ASSIGN_OR_RETURN(ValueId out, Replicated(map_.at(v), 0, "outputs/" + name));
      dst_.outputs()[name] = out;
    }
    for (const StateUpdate& u : src_.state_updates()) {
      LOOM_ASSIGN_OR_RETURN(ValueId nv, Replicated(map_.at(u.new_value), 0, Name(u.new_value) + "/stacked"));
      dst_.state_updates().push_back({map_.at(u.state).v, nv});
    }
    return std::move(dst_);
  }

 private:
  // ---- helpers on fused values ----

  const Shape& FusedShape(ValueId v) const { return dst_.type(v).shape; }
  Shape SingleShape(const FusedValue& x) const {
    return x.replicated() ? RemoveDim(FusedShape(x.v), x.axis) : FusedShape(x.v);
  }
  std::string Name(ValueId src_value) const { return src_.node(src_.value(src_value).producer).name; }

  StatusOr<ValueId> Emit(const std::string& op, const std::vector<ValueId>& in, const AttrMap& attrs,
                         const std::string& name) {
    return b_.Add1(op, in, attrs, name);
  }

  StatusOr<ValueId> Reshape(ValueId v, const Shape& to, const std::string& name) {
    if (FusedShape(v) == to) return v;
    return Emit("Reshape", {v}, {{"shape", to.dims()}}, name);
  }

  // Moves the replica axis of x to position `to`: a Reshape when only
  // extent-1 axes change places, else a Transpose.
  StatusOr<ValueId> MoveAxis(const FusedValue& x, int to, const std::string& name) {
    if (x.axis == to) return x.v;
    const Shape& s = FusedShape(x.v);
    std::vector<int64_t> perm(s.rank());
    std::iota(perm.begin(), perm.end(), 0);
    perm.erase(perm.begin() + x.axis);
    perm.insert(perm.begin() + to, x.axis);
    std::vector<int64_t> dims;
    int64_t last = -1;
    bool order_kept = true;
    for (int64_t p : perm) {
      dims.push_back(s[static_cast<int>(p)]);
      if (s[static_cast<int>(p)] == 1) continue;
      order_kept = order_kept && p > last;
      last = p;
    }
    if (order_kept) return Reshape(x.v, Shape(dims), name + "/move_replica_axis");
    return Emit("Transpose", {x.v}, {{"perm", perm}}, name + "/move_replica_axis");
  }

  // x with its replica axis at `axis`; a shared x is broadcast to R copies.
  StatusOr<ValueId> Replicated(const FusedValue& x, int axis, const std::string& name) {
    if (x.replicated()) return MoveAxis(x, axis, name);
    const Shape s = FusedShape(x.v);
    LOOM_ASSIGN_OR_RETURN(ValueId one, Reshape(x.v, InsertDim(s, axis, 1), name + "/replica_axis"));
    return Emit("BroadcastTo", {one}, {{"shape", InsertDim(s, axis, r_).dims()}}, name + "/broadcast_replicas");
  }

  // Replica r of x as a single-model value.
  StatusOr<ValueId> Select(const FusedValue& x, int r, const std::string& name) {
    if (!x.replicated()) return x.v;
    LOOM_ASSIGN_OR_RETURN(ValueId s, Emit("Slice", {x.v},
                                          {{"axis", static_cast<int64_t>(x.axis)},
                                           {"start", static_cast<int64_t>(r)},
                                           {"end", static_cast<int64_t>(r + 1)}},
                                          name + "/select"));
    return Reshape(s, SingleShape(x), name + "/select");
  }

  // Reshapes replicated x (single shape `from`) to single shape `to`,
  // keeping the replica axis in place when the dims before it are kept.
  StatusOr<FusedValue> ReshapeReplicated(const FusedValue& x, const Shape& to, const std::string& name) {
    const Shape from = SingleShape(x);
    const int64_t prefix = Product(from.dims(), 0, x.axis);
    for (int k = 0; k <= to.rank(); ++k) {
      if (Product(to.dims(), 0, k) != prefix) continue;
      LOOM_ASSIGN_OR_RETURN(ValueId v, Reshape(x.v, InsertDim(to, k, r_), name));
      return FusedValue{v, k};
    }
    LOOM_ASSIGN_OR_RETURN(ValueId front, MoveAxis(x, 0, name));
    LOOM_ASSIGN_OR_RETURN(ValueId v, Reshape(front, InsertDim(to, 0, r_), name));
    return FusedValue{v, 0};
  }

  // x (single rank m) as an operand of a broadcasting op of single rank n
  // whose replica axis is at t: padded to rank n with leading 1s, with the
  // replica axis (or an extent-1 axis, when shared) at t.
  StatusOr<ValueId> AlignForBroadcast(const FusedValue& x, int n, int t, const std::string& name) {
    const Shape s = SingleShape(x);
    std::vector<int64_t> padded(n - s.rank(), 1);
    padded.insert(padded.end(), s.dims().begin(), s.dims().end());
    if (!x.replicated()) return Reshape(x.v, InsertDim(Shape(padded), t, 1), name + "/align");
    const int in_place = std::max(0, t - (n - s.rank()));
    LOOM_ASSIGN_OR_RETURN(ValueId moved, MoveAxis(x, in_place, name));
    return Reshape(moved, InsertDim(Shape(padded), t, r_), name + "/align");
  }

  // x as [d0, R*d1, ...]: the replica axis merged into dim 1 (channels,
  // heads), where ops that work per plane or per head see R times as many.
  StatusOr<ValueId> MergeIntoDim1(const FusedValue& x, const std::string& name) {
    LOOM_ASSIGN_OR_RETURN(ValueId v, Replicated(x, 1, name));
    std::vector<int64_t> d = SingleShape(x).dims();
    d[1] *= r_;
    return Reshape(v, Shape(d), name + "/merge_replicas");
  }

  // Maps n's outputs, computed on values merged by MergeIntoDim1, back to
  // [d0, R, d1, ...] (replica axis 1).
  Status MapMergedOutputs(const Node& n, const std::vector<ValueId>& outs) {
    std::vector<ValueId> fused;
    for (size_t i = 0; i < outs.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(ValueId v, Reshape(outs[i], InsertDim(src_.type(n.outputs[i]).shape, 1, r_),
                                               n.name + "/split_replicas" + std::to_string(i)));
      fused.push_back(v);
    }
    MapOutputs(n, fused, std::vector<int>(fused.size(), 1));
    return Status::Ok();
  }

  // ---- rules ----

  Status FuseNode(const Node& n) {
    std::vector<FusedValue> in;
    bool any_replicated = false;
    for (ValueId v : n.inputs) {
      in.push_back(map_.at(v));
      any_replicated = any_replicated || in.back().replicated();
    }
    if (n.op == kInputOp) return FuseInput(n);
    if (n.op == kParameterOp || n.op == kBufferOp) return FuseState(n);
    if (n.op == "Dropout" && n.attrs.Bool("training", true) && n.attrs.Float("p", 0.5) > 0)
      return FuseDropout(n, in);
    if (!any_replicated) return Clone(n, in);
    if (MatchesLayer(n.name, opt_.unfused_layers)) return PerReplica(n, in);
    if (ElementwiseUnaryOps().count(n.op) || n.op == "Dropout") return Same(n, in, in[0].axis);
    if (IsBinaryOp(n.op)) return FuseBinary(n, in);
    if (n.op == "Linear") return FuseLinear(n, in);
    if (n.op == "MatMul" || n.op == "BatchMatMul") return FuseMatMul(n, in);
    if (IsConvOp(n.op)) return FuseConv(n, in);
    if (n.op == "BatchNorm") return FuseBatchNorm(n, in);
    if (n.op == "LayerNorm") return FuseLayerNorm(n, in);
    if (IsPoolOp(n.op)) return FusePool(n, in);
    if (n.op == "Reshape" || n.op == "Flatten") return FuseReshape(n, in);
    if (n.op == "Transpose" || n.op == "Permute") return FuseTranspose(n, in);
    if (IsReduceOp(n.op)) return FuseReduce(n, in);
    if (n.op == "Softmax" || n.op == "LogSoftmax") return FuseAxisOp(n, in, "axis", -1);
    if (n.op == "Slice" || n.op == "Split") return FuseAxisOp(n, in, "axis", 0);
    if (n.op == "Concat") return FuseConcat(n, in);
    if (n.op == "BroadcastTo") return FuseBroadcastTo(n, in);
    if (n.op == "Embedding") return FuseEmbedding(n, in);
    if (n.op == "ScaledDotProductAttention") return FuseAttention(n, in);
    return PerReplica(n, in);
  }

  void MapOutputs(const Node& n, const std::vector<ValueId>& outs, const std::vector<int>& axes) {
    for (size_t i = 0; i < n.outputs.size(); ++i) map_[n.outputs[i]] = FusedValue{outs[i], axes[i]};
  }

  Status FuseInput(const Node& n) {
    TensorType t = src_.type(n.outputs[0]);
    const bool per_replica = opt_.per_replica_inputs.count(n.name) > 0;
    if (per_replica) t.shape = InsertDim(t.shape, 0, r_);
    map_[n.outputs[0]] = FusedValue{b_.Input(n.name, t), per_replica ? 0 : -1};
    return Status::Ok();
  }

  Status FuseState(const Node& n) {
    TensorType t = src_.type(n.outputs[0]);
    t.shape = InsertDim(t.shape, 0, r_);
    AttrMap attrs = n.attrs;
    std::vector<int64_t> seeds(opt_.seeds.begin(), opt_.seeds.end());
    attrs.Set(kReplicaSeedsAttr, seeds);
    const ValueId v = n.op == kParameterOp ? b_.Parameter(n.name, t, attrs) : b_.Buffer(n.name, t, attrs);
    map_[n.outputs[0]] = FusedValue{v, 0};
    return Status::Ok();
  }

  // The node as it is: all its inputs are shared, so are its outputs.
  Status Clone(const Node& n, const std::vector<FusedValue>& in) {
    std::vector<ValueId> ins;
    for (const FusedValue& x : in) ins.push_back(x.v);
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, ins, n.attrs, n.name));
    MapOutputs(n, outs, std::vector<int>(outs.size(), -1));
    return Status::Ok();
  }

  // The node with replicated inputs as they are; outputs keep `axis`.
  Status Same(const Node& n, const std::vector<FusedValue>& in, int axis) {
    std::vector<ValueId> ins;
    for (const FusedValue& x : in) ins.push_back(x.v);
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, ins, n.attrs, n.name));
    MapOutputs(n, outs, std::vector<int>(outs.size(), axis));
    return Status::Ok();
  }

  // Runs the op once per replica on its slices and stacks the results.
  Status PerReplica(const Node& n, const std::vector<FusedValue>& in) {
    const OpDef* def = OpRegistry::Global().FindOp(n.op);
    if (def && def->IsRandom())
      return Unimplemented("random op ", n.op, " has no per-replica form (its streams are keyed by node name)");
    std::vector<std::vector<ValueId>> stacked(n.outputs.size());
    for (int r = 0; r < r_; ++r) {
      const std::string name = n.name + "/replica" + std::to_string(r);
      std::vector<ValueId> ins;
      for (size_t i = 0; i < in.size(); ++i) {
        LOOM_ASSIGN_OR_RETURN(ValueId s, Select(in[i], r, name + "/in" + std::to_string(i)));
        ins.push_back(s);
      }
      LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, ins, n.attrs, name));
      for (size_t i = 0; i < outs.size(); ++i) {
        LOOM_ASSIGN_OR_RETURN(ValueId one, Reshape(outs[i], InsertDim(FusedShape(outs[i]), 0, 1),
                                                   name + "/out" + std::to_string(i)));
        stacked[i].push_back(one);
      }
    }
    std::vector<ValueId> outs;
    for (size_t i = 0; i < stacked.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(ValueId cat, Emit("Concat", stacked[i], {{"axis", int64_t{0}}},
                                              n.name + "/stack" + std::to_string(i)));
      outs.push_back(cat);
    }
    MapOutputs(n, outs, std::vector<int>(outs.size(), 0));
    return Status::Ok();
  }

  Status FuseDropout(const Node& n, const std::vector<FusedValue>& in) {
    FusedValue x = in[0];
    if (!x.replicated()) {  // each replica draws its own mask
      const int axis = FusedShape(x.v).rank() >= 2 ? 1 : 0;
      LOOM_ASSIGN_OR_RETURN(ValueId v, Replicated(x, axis, n.name));
      x = FusedValue{v, axis};
    }
    AttrMap attrs = n.attrs;
    attrs.Set(kReplicaAxisAttr, static_cast<int64_t>(x.axis));
    attrs.Set(kReplicaSeedsAttr, std::vector<int64_t>(opt_.seeds.begin(), opt_.seeds.end()));
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, {x.v}, attrs, n.name));
    MapOutputs(n, outs, {x.axis, x.axis});
    return Status::Ok();
  }

  Status FuseBinary(const Node& n, const std::vector<FusedValue>& in) {
    const int rank = src_.type(n.outputs[0]).shape.rank();
    int t = -1;
    for (const FusedValue& x : in)
      if (t < 0 && x.replicated()) t = x.axis + (rank - SingleShape(x).rank());
    std::vector<ValueId> ins;
    for (size_t i = 0; i < in.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(ValueId a, AlignForBroadcast(in[i], rank, t, n.name + "/in" + std::to_string(i)));
      ins.push_back(a);
    }
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, ins, n.attrs, n.name));
    MapOutputs(n, outs, {t});
    return Status::Ok();
  }

  // Linear(x [..., in], w [out, in], b [out]).
  Status FuseLinear(const Node& n, const std::vector<FusedValue>& in) {
    const Shape xs = SingleShape(in[0]);
    const Shape ws = SingleShape(in[1]);
    const int64_t out_f = ws[0], in_f = ws[1];
    std::vector<ValueId> params;
    for (size_t i = 1; i < in.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(ValueId p, Replicated(in[i], 0, n.name + "/param" + std::to_string(i)));
      params.push_back(p);
    }
    const Shape ys = src_.type(n.outputs[0]).shape;
    if (!in[0].replicated()) {
      // Shared x: one GEMM against all replicas' weights, [R*out, in].
      LOOM_ASSIGN_OR_RETURN(ValueId w, Reshape(params[0], Shape({r_ * out_f, in_f}), n.name + "/stacked_weight"));
      std::vector<ValueId> ins = {in[0].v, w};
      if (params.size() == 2) {
        LOOM_ASSIGN_OR_RETURN(ValueId bias, Reshape(params[1], Shape({r_ * out_f}), n.name + "/stacked_bias"));
        ins.push_back(bias);
      }
      LOOM_ASSIGN_OR_RETURN(ValueId y, Emit("Linear", ins, n.attrs, n.name));
      const int axis = ys.rank() - 1;
      std::vector<int64_t> d = ys.dims();
      d.insert(d.begin() + axis, r_);
      LOOM_ASSIGN_OR_RETURN(ValueId out, Reshape(y, Shape(d), n.name + "/split_replicas"));
      MapOutputs(n, {out}, {axis});
      return Status::Ok();
    }
    // Replicated x: a batched GEMM [R, rows, in] x [R, out, in]^T.
    const int64_t rows = xs.numel() / std::max<int64_t>(1, in_f);
    LOOM_ASSIGN_OR_RETURN(ValueId x0, MoveAxis(in[0], 0, n.name + "/x"));
    LOOM_ASSIGN_OR_RETURN(ValueId x3, Reshape(x0, Shape({r_, rows, in_f}), n.name + "/rows"));
    LOOM_ASSIGN_OR_RETURN(ValueId y, Emit("BatchMatMul", {x3, params[0]}, {{"transpose_b", true}}, n.name));
    if (params.size() == 2) {
      LOOM_ASSIGN_OR_RETURN(ValueId bias, Reshape(params[1], Shape({r_, 1, out_f}), n.name + "/bias_rows"));
      LOOM_ASSIGN_OR_RETURN(y, Emit("Add", {y, bias}, {}, n.name + "/bias"));
    }
    LOOM_ASSIGN_OR_RETURN(ValueId out, Reshape(y, InsertDim(ys, 0, r_), n.name + "/unrows"));
    MapOutputs(n, {out}, {0});
    return Status::Ok();
  }

  // MatMul / BatchMatMul: a batched product with the replicas leading.
  Status FuseMatMul(const Node& n, const std::vector<FusedValue>& in) {
    std::vector<ValueId> ins;
    for (size_t i = 0; i < in.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(ValueId v, Replicated(in[i], 0, n.name + "/in" + std::to_string(i)));
      ins.push_back(v);
    }
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add("BatchMatMul", ins, n.attrs, n.name));
    MapOutputs(n, outs, {0});
    return Status::Ok();
  }

  // Conv(x [N, C, *], w, b): x as [N, R*C, *], R times the groups. A shared
  // x with one group needs no copies: one convolution into R*O channels.
  Status FuseConv(const Node& n, const std::vector<FusedValue>& in) {
    const bool transposed = n.op.rfind("ConvTranspose", 0) == 0;
    const int64_t groups = n.attrs.Int("groups", 1);
    const Shape ys = src_.type(n.outputs[0]).shape;
    const bool shared_x = !in[0].replicated() && groups == 1 && !transposed;
    ValueId x = in[0].v;
    if (!shared_x) {
      LOOM_ASSIGN_OR_RETURN(x, MergeIntoDim1(in[0], n.name + "/x"));
    }
    std::vector<ValueId> ins = {x};
    for (size_t i = 1; i < in.size(); ++i) {
      const std::string pname = n.name + "/param" + std::to_string(i);
      LOOM_ASSIGN_OR_RETURN(ValueId p, Replicated(in[i], 0, pname));
      std::vector<int64_t> d = SingleShape(in[i]).dims();
      d[0] *= r_;
      LOOM_ASSIGN_OR_RETURN(p, Reshape(p, Shape(d), pname + "/stacked"));
      ins.push_back(p);
    }
    AttrMap attrs = n.attrs;
    if (!shared_x) attrs.Set("groups", groups * r_);
    LOOM_ASSIGN_OR_RETURN(ValueId y, Emit(n.op, ins, attrs, n.name));
    LOOM_ASSIGN_OR_RETURN(ValueId out, Reshape(y, InsertDim(ys, 1, r_), n.name + "/split_replicas"));
    MapOutputs(n, {out}, {1});
    return Status::Ok();
  }

  // BatchNorm over R*C channels; the per-channel outputs come back [R, C].
  Status FuseBatchNorm(const Node& n, const std::vector<FusedValue>& in) {
    const Shape xs = SingleShape(in[0]);
    const int64_t c = xs[1];
    LOOM_ASSIGN_OR_RETURN(ValueId x, MergeIntoDim1(in[0], n.name + "/x"));
    std::vector<ValueId> ins = {x};
    for (size_t i = 1; i < in.size(); ++i) {
      const std::string pname = n.name + "/param" + std::to_string(i);
      LOOM_ASSIGN_OR_RETURN(ValueId p, Replicated(in[i], 0, pname));
      LOOM_ASSIGN_OR_RETURN(p, Reshape(p, Shape({r_ * c}), pname + "/stacked"));
      ins.push_back(p);
    }
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, ins, n.attrs, n.name));
    std::vector<ValueId> fused;
    LOOM_ASSIGN_OR_RETURN(ValueId y, Reshape(outs[0], InsertDim(xs, 1, r_), n.name + "/split_replicas"));
    fused.push_back(y);
    for (size_t i = 1; i < outs.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(ValueId s, Reshape(outs[i], Shape({r_, c}), n.name + "/stat" + std::to_string(i)));
      fused.push_back(s);
    }
    std::vector<int> axes(outs.size(), 0);
    axes[0] = 1;
    MapOutputs(n, fused, axes);
    return Status::Ok();
  }

  // LayerNorm: normalization over the last dims is per replica as long as
  // the replica axis is not among them; the affine part is a broadcast
  // Mul / Add with the per-replica gamma and beta.
  Status FuseLayerNorm(const Node& n, const std::vector<FusedValue>& in) {
    const int k = static_cast<int>(n.attrs.Ints("normalized_shape").size());
    FusedValue x = in[0];
    const int rank = SingleShape(x).rank();
    if (x.replicated() && x.axis > rank - k) {
      LOOM_ASSIGN_OR_RETURN(ValueId v, MoveAxis(x, 0, n.name + "/x"));
      x = FusedValue{v, 0};
    }
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add("LayerNorm", {x.v}, n.attrs, n.name));
    FusedValue y{outs[0], x.axis};
    const char* affine_ops[] = {"Mul", "Add"};
    for (size_t i = 1; i < in.size(); ++i) {
      const std::string name = n.name + (i == 1 ? "/gamma" : "/beta");
      const int t = y.replicated() ? y.axis : 0;
      LOOM_ASSIGN_OR_RETURN(ValueId lhs, AlignForBroadcast(y, rank, t, name + "/y"));
      LOOM_ASSIGN_OR_RETURN(ValueId rhs, AlignForBroadcast(in[i], rank, t, name));
      LOOM_ASSIGN_OR_RETURN(ValueId v, Emit(affine_ops[i - 1], {lhs, rhs}, {}, name));
      y = FusedValue{v, t};
    }
    map_[n.outputs[0]] = y;
    for (size_t i = 1; i < outs.size(); ++i) map_[n.outputs[i]] = FusedValue{outs[i], x.axis};
    return Status::Ok();
  }

  // Pooling works per plane: [N, R*C, H, W].
  Status FusePool(const Node& n, const std::vector<FusedValue>& in) {
    LOOM_ASSIGN_OR_RETURN(ValueId x, MergeIntoDim1(in[0], n.name + "/x"));
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, {x}, n.attrs, n.name));
    return MapMergedOutputs(n, outs);
  }

  Status FuseReshape(const Node& n, const std::vector<FusedValue>& in) {
    LOOM_ASSIGN_OR_RETURN(FusedValue y, ReshapeReplicated(in[0], src_.type(n.outputs[0]).shape, n.name));
    map_[n.outputs[0]] = y;
    return Status::Ok();
  }

  // The replica axis keeps its position; the permutation moves the rest.
  Status FuseTranspose(const Node& n, const std::vector<FusedValue>& in) {
    const int rank = SingleShape(in[0]).rank();
    std::vector<int64_t> perm = n.attrs.Ints("perm");
    if (perm.empty())
      for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
    const int k = in[0].axis;
    std::vector<int64_t> fused;
    for (int j = 0; j <= rank; ++j) {
      if (j == k) {
        fused.push_back(k);
        continue;
      }
      int64_t p = perm[j < k ? j : j - 1];
      if (p < 0) p += rank;
      fused.push_back(FusedAxis(static_cast<int>(p), k));
    }
    AttrMap attrs = n.attrs;
    attrs.Set("perm", fused);
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, {in[0].v}, attrs, n.name));
    MapOutputs(n, outs, {k});
    return Status::Ok();
  }

  Status FuseReduce(const Node& n, const std::vector<FusedValue>& in) {
    const int rank = SingleShape(in[0]).rank();
    const int k = in[0].axis;
    std::vector<int64_t> axes = n.attrs.Ints("axes");
    if (axes.empty())
      for (int i = 0; i < rank; ++i) axes.push_back(i);
    std::vector<int64_t> fused;
    int before = 0;
    for (int64_t a : axes) {
      LOOM_ASSIGN_OR_RETURN(int axis, NormalizeAxis(a, rank));
      fused.push_back(FusedAxis(axis, k));
      before += axis < k ? 1 : 0;
    }
    AttrMap attrs = n.attrs;
    attrs.Set("axes", fused);
    // A reduction over no axis (of a scalar) is the identity; an empty axes
    // list would reduce the replica axis too.
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(fused.empty() ? "Identity" : n.op, {in[0].v},
                                            fused.empty() ? AttrMap{} : attrs, n.name));
    MapOutputs(n, outs, std::vector<int>(outs.size(), n.attrs.Bool("keepdims") ? k : k - before));
    return Status::Ok();
  }

  // Ops acting along one axis (Softmax, Slice, Split): the axis shifts past
  // the replica axis.
  Status FuseAxisOp(const Node& n, const std::vector<FusedValue>& in, const char* attr, int64_t def) {
    const int rank = SingleShape(in[0]).rank();
    LOOM_ASSIGN_OR_RETURN(int axis, NormalizeAxis(n.attrs.Int(attr, def), rank));
    AttrMap attrs = n.attrs;
    attrs.Set(attr, static_cast<int64_t>(FusedAxis(axis, in[0].axis)));
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, {in[0].v}, attrs, n.name));
    MapOutputs(n, outs, std::vector<int>(outs.size(), in[0].axis));
    return Status::Ok();
  }

  Status FuseConcat(const Node& n, const std::vector<FusedValue>& in) {
    int k = -1;
    for (const FusedValue& x : in)
      if (k < 0 && x.replicated()) k = x.axis;
    const int rank = SingleShape(in[0]).rank();
    LOOM_ASSIGN_OR_RETURN(int axis, NormalizeAxis(n.attrs.Int("axis", 0), rank));
    std::vector<ValueId> ins;
    for (size_t i = 0; i < in.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(ValueId v, Replicated(in[i], k, n.name + "/in" + std::to_string(i)));
      ins.push_back(v);
    }
    AttrMap attrs = n.attrs;
    attrs.Set("axis", static_cast<int64_t>(FusedAxis(axis, k)));
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, ins, attrs, n.name));
    MapOutputs(n, outs, {k});
    return Status::Ok();
  }

  Status FuseBroadcastTo(const Node& n, const std::vector<FusedValue>& in) {
    const Shape to = src_.type(n.outputs[0]).shape;
    const int t = in[0].axis + (to.rank() - SingleShape(in[0]).rank());
    LOOM_ASSIGN_OR_RETURN(ValueId x, AlignForBroadcast(in[0], to.rank(), t, n.name));
    AttrMap attrs = n.attrs;
    attrs.Set("shape", InsertDim(to, t, r_).dims());
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, {x}, attrs, n.name));
    MapOutputs(n, outs, {t});
    return Status::Ok();
  }

  // Embedding with shared indices: one lookup in the tables laid side by
  // side, [V, R*D]; per-replica indices run per replica.
  Status FuseEmbedding(const Node& n, const std::vector<FusedValue>& in) {
    if (in[0].replicated()) return PerReplica(n, in);
    const Shape ws = SingleShape(in[1]);
    const Shape ys = src_.type(n.outputs[0]).shape;
    LOOM_ASSIGN_OR_RETURN(ValueId w0, MoveAxis(in[1], 1, n.name + "/tables"));
    LOOM_ASSIGN_OR_RETURN(ValueId w, Reshape(w0, Shape({ws[0], r_ * ws[1]}), n.name + "/side_by_side"));
    LOOM_ASSIGN_OR_RETURN(ValueId y, Emit("Embedding", {in[0].v, w}, n.attrs, n.name));
    const int axis = ys.rank() - 1;
    LOOM_ASSIGN_OR_RETURN(ValueId out, Reshape(y, InsertDim(ys, axis, r_), n.name + "/split_replicas"));
    MapOutputs(n, {out}, {axis});
    return Status::Ok();
  }

  // Attention is independent per (batch, head): replicas become heads,
  // q/k/v [B, R*H, T, D]. A key padding mask [B, Tk] is shared by all.
  Status FuseAttention(const Node& n, const std::vector<FusedValue>& in) {
    if (in.size() > 3 && in[3].replicated()) return PerReplica(n, in);
    std::vector<ValueId> ins;
    for (size_t i = 0; i < 3; ++i) {
      LOOM_ASSIGN_OR_RETURN(ValueId v, MergeIntoDim1(in[i], n.name + "/in" + std::to_string(i)));
      ins.push_back(v);
    }
    if (in.size() > 3) ins.push_back(in[3].v);
    LOOM_ASSIGN_OR_RETURN(auto outs, b_.Add(n.op, ins, n.attrs, n.name));
    return MapMergedOutputs(n, outs);
  }

  const Graph& src_;
  const FusionOptions& opt_;
  const int64_t r_;
  Graph dst_;
  GraphBuilder b_;
  std::map<ValueId, FusedValue> map_;
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
