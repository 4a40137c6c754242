#include "ops/fusion_builder.h"

#include <algorithm>
#include <numeric>

namespace loom {
namespace {

// s with an extent-1 axis at `at`: where a shared operand lines up with a
// replica axis.
Shape WithUnitAxis(const Shape& s, int at) {
  std::vector<int64_t> d = s.dims();
  d.insert(d.begin() + at, 1);
  return Shape(d);
}

int64_t Product(const std::vector<int64_t>& d, int begin, int end) {
  int64_t p = 1;
  for (int i = begin; i < end; ++i) p *= d[i];
  return p;
}

// Where an operand of single rank `own` holds the replica axis that a
// broadcasting op of single rank `rank` puts at t (numpy's right alignment;
// an operand without that many dims holds it first).
int AxisInOperand(int t, int rank, int own) { return std::max(0, t - (rank - own)); }

}  // namespace

Shape FusionBuilder::SingleShape(const FusedValue& x) const {
  if (!x.replicated()) return shape(x);
  std::vector<int64_t> d = shape(x).dims();
  d.erase(d.begin() + x.axis());
  return Shape(d);
}

Shape FusionBuilder::WithReplicaAxis(const Shape& single, int axis) const {
  std::vector<int64_t> d = single.dims();
  d.insert(d.begin() + axis, replicas());
  return Shape(d);
}

StatusOr<FusedValue> FusionBuilder::Emit1(const std::string& op, const std::vector<FusedValue>& inputs,
                                          const AttrMap& attrs, const std::string& name,
                                          const ReplicaLayout& layout) {
  LOOM_ASSIGN_OR_RETURN(std::vector<FusedValue> outs, Emit(op, inputs, attrs, name, {layout}));
  if (outs.empty()) return Internal("op ", op, " has no outputs");
  return outs[0];
}

StatusOr<FusedValue> FusionBuilder::Reshape(const FusedValue& x, const Shape& to, const ReplicaLayout& layout,
                                            const std::string& name) {
  if (shape(x) == to) return FusedValue{x.v, layout};
  return Emit1("Reshape", {x}, {{"shape", to.dims()}}, name, layout);
}

StatusOr<FusedValue> FusionBuilder::MoveAxis(const FusedValue& x, int to, const std::string& name) {
  if (x.axis() == to) return x;
  if (const FusedValue* moved = FindMoved(x.v, to)) return *moved;
  LOOM_ASSIGN_OR_RETURN(FusedValue moved, EmitMove(x, to, name));
  RememberMoved(x.v, to, moved);
  return moved;
}

StatusOr<FusedValue> FusionBuilder::EmitMove(const FusedValue& x, int to, const std::string& name) {
  const Shape& s = shape(x);
  std::vector<int64_t> perm(s.rank());
  std::iota(perm.begin(), perm.end(), 0);
  perm.erase(perm.begin() + x.axis());
  perm.insert(perm.begin() + to, x.axis());
  std::vector<int64_t> dims;
  int64_t last = -1;
  bool order_kept = true;
  for (int64_t p : perm) {
    dims.push_back(s[static_cast<int>(p)]);
    if (s[static_cast<int>(p)] == 1) continue;
    order_kept = order_kept && p > last;
    last = p;
  }
  const std::string moved = name + "/move_replica_axis";
  if (order_kept) return Reshape(x, Shape(dims), ReplicaLayout::Axis(to), moved);
  return Emit1("Transpose", {x}, {{"perm", perm}}, moved, ReplicaLayout::Axis(to));
}

StatusOr<FusedValue> FusionBuilder::Replicated(const FusedValue& x, int axis, const std::string& name) {
  if (x.replicated()) return MoveAxis(x, axis, name);
  const Shape s = shape(x);
  LOOM_ASSIGN_OR_RETURN(FusedValue one,
                        Reshape(x, WithUnitAxis(s, axis), ReplicaLayout::Shared(), name + "/replica_axis"));
  return Emit1("BroadcastTo", {one}, {{"shape", WithReplicaAxis(s, axis).dims()}}, name + "/broadcast_replicas",
               ReplicaLayout::Axis(axis));
}

StatusOr<FusedValue> FusionBuilder::ReshapeReplicated(const FusedValue& x, const Shape& to, const std::string& name) {
  const Shape from = SingleShape(x);
  const int64_t prefix = Product(from.dims(), 0, x.axis());
  for (int k = 0; k <= to.rank(); ++k) {
    if (Product(to.dims(), 0, k) != prefix) continue;
    return Reshape(x, WithReplicaAxis(to, k), ReplicaLayout::Axis(k), name);
  }
  LOOM_ASSIGN_OR_RETURN(FusedValue front, MoveAxis(x, 0, name));
  return Reshape(front, WithReplicaAxis(to, 0), ReplicaLayout::Axis(0), name);
}

StatusOr<FusedValue> FusionBuilder::AlignForBroadcast(const FusedValue& x, int rank, int t, const std::string& name) {
  const Shape s = SingleShape(x);
  std::vector<int64_t> padded(rank - s.rank(), 1);
  padded.insert(padded.end(), s.dims().begin(), s.dims().end());
  if (!x.replicated()) return Reshape(x, WithUnitAxis(Shape(padded), t), ReplicaLayout::Shared(), name + "/align");
  const int in_place = AxisInOperand(t, rank, s.rank());
  LOOM_ASSIGN_OR_RETURN(FusedValue moved, MoveAxis(x, in_place, name));
  return Reshape(moved, WithReplicaAxis(Shape(padded), t), ReplicaLayout::Axis(t), name + "/align");
}

int FusionBuilder::BroadcastReplicaAxis(int rank) const {
  auto moves_to = [&](int t) {
    int moves = 0;
    for (int i = 0; i < num_inputs(); ++i) {
      const FusedValue& x = input(i);
      const int to = AxisInOperand(t, rank, SingleShape(x).rank());
      if (x.replicated() && x.axis() != to && FindMoved(x.v, to) == nullptr) ++moves;
    }
    return moves;
  };
  int best = -1, fewest = 0;
  for (int i = 0; i < num_inputs(); ++i) {
    if (!input(i).replicated()) continue;
    const int t = input(i).axis() + (rank - SingleShape(input(i)).rank());
    const int moves = moves_to(t);
    if (best < 0 || moves < fewest) best = t, fewest = moves;
  }
  return best;
}

StatusOr<FusedValue> FusionBuilder::MergeIntoDim1(const FusedValue& x, const std::string& name) {
  LOOM_ASSIGN_OR_RETURN(FusedValue v, Replicated(x, 1, name));
  std::vector<int64_t> d = SingleShape(x).dims();
  const int64_t per_replica = d[1];
  d[1] *= replicas();
  return Reshape(v, Shape(d), ReplicaLayout::Merged(1, per_replica), name + "/merge_replicas");
}

StatusOr<FusedValue> FusionBuilder::MergeIntoDim0(const FusedValue& x, const std::string& name) {
  if (!x.replicated() || x.axis() != 0) return Internal("MergeIntoDim0 of a value whose replica axis is not 0");
  std::vector<int64_t> d = SingleShape(x).dims();
  const int64_t per_replica = d[0];
  d[0] *= replicas();
  return Reshape(x, Shape(d), ReplicaLayout::Merged(0, per_replica), name + "/merge_replicas");
}

Status FusionBuilder::Elementwise() {
  std::vector<FusedValue> ins;
  for (int i = 0; i < num_inputs(); ++i) ins.push_back(input(i));
  LOOM_ASSIGN_OR_RETURN(auto outs, Emit(node().op, ins, attrs(), name(), {input(0).layout}));
  return MapOutputs(outs);
}

Status FusionBuilder::AsReshape() {
  LOOM_ASSIGN_OR_RETURN(FusedValue y, ReshapeReplicated(input(0), output_shape(0), name()));
  return MapOutputs({y});
}

Status FusionBuilder::AlongAxis(const char* attr) {
  const FusedValue& x = input(0);
  LOOM_ASSIGN_OR_RETURN(int axis, NormalizeAxis(attrs().Int(attr), SingleShape(x).rank()));
  AttrMap fused = attrs();
  fused.Set(attr, static_cast<int64_t>(FusedAxis(axis, x.axis())));
  LOOM_ASSIGN_OR_RETURN(auto outs, Emit(node().op, {x}, fused, name(), {x.layout}));
  return MapOutputs(outs);
}

Status FusionBuilder::EmitMergedAndMap(const std::vector<FusedValue>& merged, int dim) {
  std::vector<ReplicaLayout> layouts;
  for (size_t i = 0; i < node().outputs.size(); ++i)
    layouts.push_back(ReplicaLayout::Merged(dim, output_shape(static_cast<int>(i))[dim]));
  LOOM_ASSIGN_OR_RETURN(auto outs, Emit(node().op, merged, attrs(), name(), layouts));
  std::vector<FusedValue> split;
  for (size_t i = 0; i < outs.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(FusedValue v,
                          Reshape(outs[i], WithReplicaAxis(output_shape(static_cast<int>(i)), dim),
                                  ReplicaLayout::Axis(dim), name() + "/split_replicas" + std::to_string(i)));
    split.push_back(v);
  }
  return MapOutputs(split);
}

}  // namespace loom
