// What a fusion rule (OpDef::Fuse) sees and how it emits the fused form of
// one node for R stacked replicas. Implemented by the horizontal-fusion pass
// (graph/fusion.cc); rules only build nodes, they never run kernels.
//
// A rule gets the node of the single-model graph and its inputs as values of
// the fused graph, each with its replica layout (graph/ir.h): shared, or with
// a replica axis of extent R of its own. It emits fused-graph nodes (giving
// each output its layout) and maps the node's outputs to fused values that
// again are shared or carry a replica axis of their own; in between it may
// merge the replicas into a dimension (MergeIntoDim1), which is how a
// convolution becomes a grouped convolution. The rule must compute, for
// replica r, exactly what the single op computes with replica r's inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "graph/attrs.h"
#include "graph/ir.h"

namespace loom {

// A value of the fused graph and where it holds the replicas: the layout
// the graph records for it, except that a helper needing no node (a reshape
// to the same shape) hands back the value under the layout asked for, which
// can differ from the recorded one only where the replica axis has extent 1
// (R = 1).
struct FusedValue {
  ValueId v = kNoValue;
  ReplicaLayout layout;
  bool replicated() const { return layout.replicated(); }
  int axis() const { return layout.dim; }  // the replica axis; -1 when shared
};

// Position of single-model axis `single_axis` in a fused value whose
// replica axis is at `replica_axis`.
inline int FusedAxis(int single_axis, int replica_axis) {
  return single_axis < replica_axis ? single_axis : single_axis + 1;
}

class FusionBuilder {
 public:
  virtual ~FusionBuilder() = default;

  // The node being fused, of the single-model graph.
  virtual const Node& node() const = 0;
  // Input i of the node as a value of the fused graph.
  virtual const FusedValue& input(int i) const = 0;
  // The single-model type of output i of the node.
  virtual const TensorType& output_type(int i) const = 0;
  // The type of a value of the fused graph.
  virtual const TensorType& type(ValueId fused) const = 0;
  virtual int64_t replicas() const = 0;
  // One per replica (graph/fusion.h FusionOptions::seeds).
  virtual const std::vector<uint64_t>& seeds() const = 0;

  // Emits a node of the fused graph named `name`, its outputs with
  // `layouts` (one per output, or one for all). Errors name the node.
  virtual StatusOr<std::vector<FusedValue>> Emit(const std::string& op, const std::vector<FusedValue>& inputs,
                                                 const AttrMap& attrs, const std::string& name,
                                                 const std::vector<ReplicaLayout>& layouts) = 0;
  // Declares the fused values of the node's outputs, in order. Each is
  // shared or has a replica axis of its own (per_replica 1) with the single
  // output's shape around it; the pass checks.
  virtual Status MapOutputs(const std::vector<FusedValue>& outputs) = 0;
  // The fallback of an op without a fused form: the op once per replica on
  // the replica's slices of the inputs, the results stacked [R, ...]. It is
  // correct and forgoes the speed-up; ops that take it for some inputs say so
  // with FusionKind::kFusedOrPerReplica.
  virtual Status PerReplica() = 0;
  // The value MoveAxis already made of fused value v with its replica axis
  // at `to`, or null: one move per value and axis, however many consumers
  // want it there (the q, k and v projections of one input share it, and
  // so does its gradient's way back). RememberMoved records one.
  virtual const FusedValue* FindMoved(ValueId v, int to) const = 0;
  virtual void RememberMoved(ValueId v, int to, const FusedValue& moved) = 0;

  // ---- conveniences (ops/fusion_builder.cc), built on the above ----

  const AttrMap& attrs() const { return node().attrs; }
  const std::string& name() const { return node().name; }
  int num_inputs() const { return static_cast<int>(node().inputs.size()); }
  const Shape& output_shape(int i) const { return output_type(i).shape; }
  const Shape& shape(const FusedValue& x) const { return type(x.v).shape; }
  // x's shape without its replica axis: the single model's shape.
  Shape SingleShape(const FusedValue& x) const;
  // A single-model shape with a replica axis of extent R inserted at `axis`.
  Shape WithReplicaAxis(const Shape& single, int axis) const;

  StatusOr<FusedValue> Emit1(const std::string& op, const std::vector<FusedValue>& inputs, const AttrMap& attrs,
                             const std::string& name, const ReplicaLayout& layout);
  // x reshaped to `to`, laid out as `layout` (no node when the shape is
  // already `to`).
  StatusOr<FusedValue> Reshape(const FusedValue& x, const Shape& to, const ReplicaLayout& layout,
                               const std::string& name);
  // Replicated x with its replica axis moved to `to`: a Reshape when only
  // extent-1 axes change places, else a Transpose.
  StatusOr<FusedValue> MoveAxis(const FusedValue& x, int to, const std::string& name);
  // x with its replica axis at `axis`; a shared x is broadcast to R copies.
  StatusOr<FusedValue> Replicated(const FusedValue& x, int axis, const std::string& name);
  // Replicated x reshaped to the single shape `to`, keeping the replica axis
  // in place when the dims before it are kept (else it moves to the front).
  StatusOr<FusedValue> ReshapeReplicated(const FusedValue& x, const Shape& to, const std::string& name);
  // x (single rank m) as an operand of a broadcasting op of single rank
  // `rank` whose replica axis is at t: padded to `rank` with leading 1s, with
  // the replica axis (or an extent-1 axis, when x is shared) at t.
  StatusOr<FusedValue> AlignForBroadcast(const FusedValue& x, int rank, int t, const std::string& name);
  // Where a broadcasting op of output rank `rank` puts the replica axis: the
  // axis of a replicated input that the fewest others must move to (a value
  // already moved there, for a fused Linear say, moves for free); ties to
  // the first. -1 when no input is replicated.
  int BroadcastReplicaAxis(int rank) const;
  // x as [d0, R*d1, ...] (layout Merged(1, d1)): ops that work per channel,
  // plane or head then see R times as many.
  StatusOr<FusedValue> MergeIntoDim1(const FusedValue& x, const std::string& name);
  // x, replicated with its replica axis at 0, as [R*d0, ...] (layout
  // Merged(0, d0)): ops that work per batch entry see R times as many, and
  // x moves no data.
  StatusOr<FusedValue> MergeIntoDim0(const FusedValue& x, const std::string& name);

  // ---- rules that several ops share ----

  // The node as it is, on its fused inputs, with its outputs on input 0's
  // replica axis: element-wise ops, whose result at each position depends
  // on the inputs at that position only.
  Status Elementwise();
  // The node's output 0 is input 0 reshaped (Reshape, Flatten): one Reshape
  // of the fused input, the replica axis kept in place where it can be.
  Status AsReshape();
  // The node as it is with its axis attribute `attr` shifted past input 0's
  // replica axis; the outputs keep it.
  Status AlongAxis(const char* attr);
  // The node as it is on `merged` inputs (MergeIntoDim1, or shared), for
  // ops that work per channel, plane or head; its outputs, merged in dim 1,
  // are mapped back as [d0, R, d1, ...]. With dim 0 (MergeIntoDim0 inputs),
  // merged in dim 0 and mapped back as [R, d0, ...].
  Status EmitMergedAndMap(const std::vector<FusedValue>& merged, int dim = 1);

 private:
  // The move of MoveAxis, emitted anew on every call.
  StatusOr<FusedValue> EmitMove(const FusedValue& x, int to, const std::string& name);
};

}  // namespace loom
