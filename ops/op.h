// The operator interface. An op is defined once (OpDef: attributes, type
// inference, cost, gradient rule, fusion rule) and has kernels registered
// per device type (CPU always, CUDA under --config=cuda). A backend that has
// no kernel for an op, or none for a node's dtypes, says so through
// SupportsOp / SupportsNode; the executor and simulator route around it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/region.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "graph/attrs.h"
#include "graph/ir.h"

namespace loom {

// What one execution of an op costs; the simulator's analytical model.
struct OpCost {
  double flops = 0;
  double bytes_read = 0;
  double bytes_written = 0;
};

// What a gradient rule sees and how it emits backward nodes. Implemented by
// autodiff (graph layer); rules only build nodes, they never run kernels.
class GradBuilder {
 public:
  virtual ~GradBuilder() = default;
  virtual const Node& node() const = 0;
  virtual const TensorType& type(ValueId v) const = 0;
  // Gradient flowing into output i of the node, or kNoValue if none does.
  virtual ValueId output_grad(int i) const = 0;
  // Emits a node; its type inference must succeed (a rule emitting an
  // ill-typed node is a bug in the rule). Returns the node's outputs.
  virtual std::vector<ValueId> Emit(const std::string& op, const std::vector<ValueId>& inputs,
                                    const AttrMap& attrs = {}) = 0;
  ValueId Emit1(const std::string& op, const std::vector<ValueId>& inputs, const AttrMap& attrs = {}) {
    return Emit(op, inputs, attrs).at(0);
  }
  // Whether input i needs a gradient (rules may skip work when it does not).
  virtual bool NeedsInputGrad(int i) const = 0;
  // Declares the gradient of input i (accumulated if called twice; ignored
  // when the input needs none).
  virtual void SetInputGrad(int i, ValueId grad) = 0;

  // Conveniences used by many rules.
  ValueId input(int i) const { return node().inputs.at(i); }
  ValueId output(int i) const { return node().outputs.at(i); }
  const AttrMap& attrs() const { return node().attrs; }
  // Sums a broadcast gradient back to `shape` (identity when equal).
  ValueId SumToShape(ValueId grad, const Shape& shape);
};

// Builds the graph that replaces a node whose split needs a reduction
// between its parts (OpDef::Expand): nodes named "<node>/<suffix>", so they
// belong to the node's layer, and the values that stand for its outputs.
class ExpandBuilder {
 public:
  virtual ~ExpandBuilder() = default;
  virtual const Node& node() const = 0;
  virtual const TensorType& type(ValueId v) const = 0;
  // Emits node "<node>/<suffix>" (type inference must succeed, as for
  // GradBuilder::Emit). Returns its outputs.
  virtual std::vector<ValueId> Emit(const std::string& op, const std::vector<ValueId>& inputs, const AttrMap& attrs,
                                    const std::string& suffix) = 0;
  // Output i of the node is `v` (of the same type) from now on.
  virtual void SetOutput(int i, ValueId v) = 0;
  // The degree of the split that expands the node: its parts along that
  // dimension.
  virtual int64_t parts() const = 0;
  // The nodes emitted after this run on the node's parts whose coordinate
  // along the expanding dimension is `part` (a chain of parts: an LSTM's
  // sequence chunks); -1, the default: on all of them, as the node's other
  // nodes.
  virtual void Pin(int64_t part) = 0;

  ValueId input(int i) const { return node().inputs.at(i); }
  const AttrMap& attrs() const { return node().attrs; }
};

class FusionBuilder;  // ops/fusion_builder.h

// How an op runs in the fused graph of R replicas (graph/fusion.h). A node
// whose inputs are all shared runs as it is, whatever its kind.
enum class FusionKind {
  kFused,              // one fused form for any inputs (a grouped convolution, a batched GEMM, ...)
  kFusedOrPerReplica,  // fused for some inputs, once per replica for others
  kPerReplica,         // no fused form: once per replica on slices, results stacked
};
const char* FusionKindName(FusionKind kind);  // "fused", "fused or per replica", "per replica"

// ---- Parallel splits (graph/strategy.h, docs/parallel.md) ----

// What one part of an op split along one dimension reads or writes of a
// tensor: a slice of `axis` (its share of the extent) or, with axis -1,
// the whole tensor (a replicated input, or a partial-sum output).
struct AxisSplit {
  int axis = -1;
  // Window ops split along an attribute: output rows [lo, hi) read input
  // rows [lo * stride - padding, (hi - 1) * stride - padding + span) (a
  // halo of span - stride rows between parts). With zero_padding the rows
  // outside the input are read as zeros (convolutions, average pools);
  // without, the part reads only the rows inside and pads itself (max
  // pools, whose padding is not zeros).
  int64_t stride = 1, padding = 0, span = 1;
  bool zero_padding = true;
  // >= 0 (an input with axis -1): only the part with this coordinate
  // along the dimension reads it, whole; the others read none of it (a
  // Concat of chunks, each where it was made).
  int64_t part = -1;
};

// How an op's parts along one dimension divide its tensors: one AxisSplit
// per input and per output. With partial_sums the outputs no part divides
// (axis -1) are partial sums of the whole (a split reduction: a batch
// part's weight gradient) that a reduction combines; the others are split.
struct DimSplit {
  std::vector<AxisSplit> inputs, outputs;
  bool partial_sums = false;
  // The op realises this split only through OpDef::Expand: its parts need
  // a reduction between them (BatchNorm's batch statistics under a sample
  // split), so the lowering replaces the node by the op's expansion, whose
  // nodes split without one.
  bool expands = false;
  // The split combines with no other dimension (an LSTM's sequence: its
  // expansion chains whole parts).
  bool alone = false;
  // Whether some input is read through a window (a halo between parts).
  bool HasWindow() const;
  // Whether some input is read by one part only (AxisSplit::part).
  bool HasOwnedInputs() const;
  // Whether it divides nothing: every part computes all of the node (no
  // axis split, no partial sums).
  bool Replicates() const;
  // Whether both split the same axes of every input and output.
  bool SameAxes(const DimSplit& o) const;
};

// The dimensions an op can be split along (absent: it cannot); the replica
// dimension needs no rule: it follows the values' replica layouts. `other`
// holds further valid ways to divide the op that no SOAP dimension names (a
// GEMM's reduction, any axis of an element-wise op): the task graph lets
// backward and update nodes pick, among all of them, the one that matches
// how their inputs arrive (graph/task_graph.h).
struct SplitRules {
  std::optional<DimSplit> sample, attribute, parameter;
  // Further parameter splits, each named as a strategy file chooses it
  // (`parameter_split: "vocabulary"`): an Embedding's vocabulary, a GEMM's
  // reduction. `parameter` is the one a split that names none takes.
  std::vector<std::pair<std::string, DimSplit>> parameter_variants;
  std::vector<DimSplit> other;
  // Every rule: sample, attribute, parameter, the parameter variants (those
  // present), then other.
  std::vector<DimSplit> All() const;
  // The parameter rule named `variant` ("": `parameter`); nullopt when the
  // op has none of that name.
  std::optional<DimSplit> Parameter(const std::string& variant) const;
  // The variants' names, quoted and comma-separated ("none" when empty).
  std::string VariantNames() const;
};

// Every input and output split along the same axis.
DimSplit SplitAlong(int axis, size_t inputs, size_t outputs);
// Output axis `axis` of a broadcasting element-wise op: each input splits
// along the axis it aligns with (numpy's right alignment) unless it
// broadcasts there (extent 1, or no such axis), where it is read whole.
DimSplit ElementwiseAlong(int axis, const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs);
// A view op (Reshape, Flatten): axis a of the input and axis b of the
// output split alike when the dims before them have the same product (the
// parts then hold the same elements in the same order); sample is (0, 0)
// when the batch is kept.
SplitRules ViewSplits(const TensorType& input, const TensorType& output);
// The attribute split of an element-wise op on images: the rows (axis 2)
// of [N, C, H, W] outputs, so that the activations and residual sums of
// row-split convolutions stay split. Other ranks name none: a sequence
// [B, T, F] and a signal [N, C, L] hold their positions on different axes.
std::optional<DimSplit> ImageRows(const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs);
// ElementwiseAlong for every axis of output 0 but `except`.
std::vector<DimSplit> ElementwiseAxes(const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs,
                                      int except = -1);
// Every axis but `except` as ElementwiseAxes gives them, the one along axis
// 0 (unless it is `except`) the sample rule: ops that work along one axis
// and keep the others apart (a softmax, a concatenation).
SplitRules AllAxesBut(const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs, int except);
// Sample along axis 0 of every input and output when they all share their
// dim 0 (the batch): element-wise ops, reshapes that keep the batch,
// pooling. Nothing otherwise.
SplitRules SampleAlongBatch(const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs);

// The attribute `replicas` of an op with a fused form: R >= 1 replicas, or
// 0 (absent) for the unfused op; an error naming `op` when negative.
StatusOr<int64_t> ReplicaCountAttr(const std::string& op, const AttrMap& attrs);
// The attributes of one part of a fused op whose attribute `replicas` (R >
// 0; 0 = unfused) counts the replicas along axis 0 of input 0: a part that
// holds fewer of them gets its own count (OpDef::PartAttrs).
AttrMap PartReplicaCount(const AttrMap& attrs, const TensorType& input0, const Region& input0_region);

class OpDef {
 public:
  virtual ~OpDef() = default;
  virtual std::string name() const = 0;
  // The attributes the op takes (docs/ops.md). The builder and the loader
  // fill in the defaults and reject undeclared or mistyped attributes; the
  // verifier checks the same. Null for an op that never called DeclareAttrs:
  // its attributes go unchecked, and graph/builder_test.cc fails on it.
  const AttrSchema* attr_schema() const { return schema_ ? &*schema_ : nullptr; }
  // Output types from attributes and input types; errors say what is wrong
  // with which input or attribute (the caller adds the node name).
  virtual StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs,
                                                       const std::vector<TensorType>& inputs) const = 0;
  // Default cost: no FLOPs, reads inputs and writes outputs once.
  virtual OpCost Cost(const AttrMap& attrs, const std::vector<TensorType>& inputs,
                      const std::vector<TensorType>& outputs) const;
  // Emits the backward nodes. Ops without one (integer ops, backward ops)
  // keep the default, which fails with a message naming the op.
  virtual Status Gradient(GradBuilder& g) const;
  // Horizontal fusion: what the op's rule does for R stacked replicas, and
  // the rule. The default has no fused form: the op runs once per replica
  // (FusionBuilder::PerReplica), which is correct but forgoes the speed-up.
  // The fusion pass holds each rule to its declared kind.
  virtual FusionKind fusion_kind() const { return FusionKind::kPerReplica; }
  virtual Status Fuse(FusionBuilder& f) const;
  // True for ops whose result depends on the RNG stream (dropout).
  virtual bool IsRandom() const { return false; }
  // True for ops whose only output is input 0's elements in the same order
  // (Reshape, Flatten, Identity): the executor makes it a view of the input
  // and runs no kernel.
  virtual bool IsView() const { return false; }
  // The input that output `output` may be written over, or -1: the kernel
  // reads each element of that input before it writes the same element of
  // the output, and reads no other element of it (element-wise updates).
  // The memory plan uses it to update optimizer state in place.
  virtual int InPlaceInput(const AttrMap& attrs, int output) const {
    (void)attrs;
    (void)output;
    return -1;
  }
  // Which SOAP dimensions a node of this op can be split along, and how its
  // parts divide the tensors (types as the node holds them). The default:
  // none, so the node runs whole on one device (operation parallelism only).
  virtual SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& inputs,
                            const std::vector<TensorType>& outputs) const;
  // The attributes of one part of a split node: `inputs` and `outputs` are
  // the node's (whole) types, the regions what the part reads and writes of
  // them. Ops whose attributes describe shapes or replicas (a backward op's
  // input_shape, a fused update's replica count and per-replica lists)
  // rewrite them; the default keeps them. An error when the part cannot
  // run as such.
  virtual StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& inputs,
                                      const std::vector<TensorType>& outputs, const std::vector<Region>& input_regions,
                                      const std::vector<Region>& output_regions) const;
  // The regions of its inputs that a run computing all of its outputs
  // reads, where that is less than the inputs (a Slice: its range); nullopt,
  // the default: all of them. The lowering fetches only those, and the part
  // takes PartAttrs for them.
  virtual std::optional<std::vector<Region>> WholeReads(const AttrMap& attrs, const std::vector<TensorType>& inputs,
                                                        const std::vector<TensorType>& outputs) const;
  // The graph of ops that realises a split rule marked `expands` (every
  // output set with SetOutput). The default fails: only ops that declare
  // such a rule have one.
  virtual Status Expand(ExpandBuilder& b) const;

 protected:
  // Declares the op's attributes (from its constructor; an op without
  // attributes calls it too, so that any attribute is an error).
  AttrSchema& DeclareAttrs() {
    if (!schema_) schema_.emplace();
    return *schema_;
  }

 private:
  std::optional<AttrSchema> schema_;
};

// Checks `attrs` against the op's schema and fills in defaults (no-op for an
// op without one). Errors name the attribute and list the declared ones.
Status CanonicalizeAttrs(const OpDef& op, AttrMap* attrs);
// InferTypes on `attrs` as a node would hold them (checked, defaults filled):
// for callers that infer without a graph (tests, ops reusing another op's).
StatusOr<std::vector<TensorType>> InferOpTypes(const OpDef& op, AttrMap attrs, const std::vector<TensorType>& inputs);

// Ops whose outputs are element-wise functions of their one input
// (activations, scalar arithmetic, Identity, Dropout): fused, each runs as
// it is on the fused input (FusionBuilder::Elementwise).
// Splits: sample along axis 0 (the batch) of every tensor; any other axis
// as `other`.
class ElementwiseOpDef : public OpDef {
 public:
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  Status Fuse(FusionBuilder& f) const override;
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& inputs,
                    const std::vector<TensorType>& outputs) const override;
};

// What a kernel gets: inputs, preallocated outputs (types from InferTypes),
// attributes and the device's execution resources.
struct KernelContext {
  const Node* node = nullptr;
  const AttrMap* attrs = nullptr;
  std::vector<const Tensor*> inputs;
  std::vector<Tensor*> outputs;
  Device device = Device::Cpu();
  ThreadPool* pool = nullptr;    // CPU kernels
  void* stream = nullptr;        // CUDA kernels: the cudaStream_t
  Rng* rng = nullptr;            // per node and step, for random ops
  // What rng was made from: Rng::Stream(seed, rng_key, step). Fused
  // replicas draw from their own seeds' streams with StreamFor.
  uint64_t rng_key = 0, step = 0;
  Rng StreamFor(uint64_t seed) const { return Rng::Stream(seed, rng_key, step); }

  const Tensor& in(int i) const { return *inputs.at(i); }
  Tensor& out(int i) const { return *outputs.at(i); }
};

using KernelFn = std::function<Status(KernelContext&)>;

// A kernel that runs several nodes of one op in one pass (one launch on a
// GPU): the optimizer updates of a model's parameters. The executor hands it
// a run of consecutive nodes with equal attributes and input and output
// dtypes, where no node reads what another writes (runtime/executor.h).
using GroupKernelFn = std::function<Status(std::vector<KernelContext>& group)>;

// Whether a kernel handles a node with these input and output types: Ok, or
// the reason it does not ("dtype bf16; the kernel covers f32, f64").
using KernelSupportFn =
    std::function<Status(const Node& node, const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs)>;
// The common predicates. FloatKernelSupport is what DispatchFloat covers and
// what a kernel without a registered predicate is held to: every
// floating-point input and output is f32 or f64 (integer and bool inputs,
// labels and indices, are the op's to check). AnyDTypeSupport: kernels that
// move bytes (shape ops, copies).
KernelSupportFn DTypeSupport(std::vector<DType> dtypes);
KernelSupportFn FloatKernelSupport();
// HalfFloatKernelSupport: FloatKernelSupport plus bf16 and f16 (kernels that
// compute half types in f32 and round once, e.g. the GEMMs).
KernelSupportFn HalfFloatKernelSupport();
KernelSupportFn AnyDTypeSupport();

// Registry of op definitions and kernels.
class OpRegistry {
 public:
  static OpRegistry& Global();
  void RegisterOp(std::unique_ptr<OpDef> op);
  void RegisterKernel(const std::string& op, DeviceType device, KernelFn fn);

  // Null if unknown.
  const OpDef* FindOp(const std::string& name) const;
  StatusOr<const OpDef*> GetOp(const std::string& name) const;  // error lists close names
  const KernelFn* FindKernel(const std::string& op, DeviceType device) const;
  // A group kernel of (op, device); it is the op's kernel there too (a
  // group of one node), so both paths run the same code. Null if none.
  void RegisterGroupKernel(const std::string& op, DeviceType device, GroupKernelFn fn);
  const GroupKernelFn* FindGroupKernel(const std::string& op, DeviceType device) const;
  // Whether `device` has a kernel for the op at all (any dtype).
  bool SupportsOp(const std::string& op, DeviceType device) const { return FindKernel(op, device) != nullptr; }
  // Restricts the kernel of (op, device) to the nodes `fn` accepts; kernels
  // without one get FloatKernelSupport.
  void RegisterKernelSupport(const std::string& op, DeviceType device, KernelSupportFn fn);
  // Whether `device` has a kernel for this node with these types: Ok, or an
  // error naming the node, op, device and the reason (the dtype).
  Status SupportsNode(const Node& node, const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs,
                      DeviceType device) const;
  std::vector<std::string> OpNames() const;

 private:
  std::map<std::string, std::unique_ptr<OpDef>> ops_;
  std::map<std::pair<std::string, DeviceType>, KernelFn> kernels_;
  std::map<std::pair<std::string, DeviceType>, GroupKernelFn> group_kernels_;
  std::map<std::pair<std::string, DeviceType>, KernelSupportFn> support_;
};

// Static registration from the op's own .cc file (libraries are alwayslink).
struct OpRegistration {
  explicit OpRegistration(std::unique_ptr<OpDef> op) { OpRegistry::Global().RegisterOp(std::move(op)); }
};
struct KernelRegistration {
  KernelRegistration(const std::string& op, DeviceType device, KernelFn fn) {
    OpRegistry::Global().RegisterKernel(op, device, std::move(fn));
  }
};
struct GroupKernelRegistration {
  GroupKernelRegistration(const std::string& op, DeviceType device, GroupKernelFn fn) {
    OpRegistry::Global().RegisterGroupKernel(op, device, std::move(fn));
  }
};
struct KernelSupportRegistration {
  KernelSupportRegistration(const std::string& op, DeviceType device, KernelSupportFn fn) {
    OpRegistry::Global().RegisterKernelSupport(op, device, std::move(fn));
  }
};

#define LOOM_OP_REG_NAME(line) LOOM_CONCAT(loom_op_registration_, line)
#define LOOM_REGISTER_OP(OpClass, ...) \
  static ::loom::OpRegistration LOOM_OP_REG_NAME(__LINE__)(std::make_unique<OpClass>(__VA_ARGS__))
#define LOOM_REGISTER_KERNEL(op_name, device_type, ...) \
  static ::loom::KernelRegistration LOOM_OP_REG_NAME(__LINE__)(op_name, device_type, __VA_ARGS__)
#define LOOM_REGISTER_GROUP_KERNEL(op_name, device_type, ...) \
  static ::loom::GroupKernelRegistration LOOM_OP_REG_NAME(__LINE__)(op_name, device_type, __VA_ARGS__)
// LOOM_REGISTER_KERNEL_SUPPORT("Transpose", DeviceType::kCpu, AnyDTypeSupport());
#define LOOM_REGISTER_KERNEL_SUPPORT(op_name, device_type, ...) \
  static ::loom::KernelSupportRegistration LOOM_OP_REG_NAME(__LINE__)(op_name, device_type, __VA_ARGS__)

// Shared helpers for type inference messages.
Status ExpectInputs(const std::vector<TensorType>& inputs, size_t n, const std::string& what);
Status ExpectRank(const TensorType& t, int rank, const std::string& what);
Status ExpectFloat(const TensorType& t, const std::string& what);
// f32, f64, bf16 or f16 (ops with half-precision kernels: the GEMMs).
Status ExpectFloatOrHalf(const TensorType& t, const std::string& what);
Status ExpectSameType(const TensorType& a, const TensorType& b, const std::string& what);

// CPU kernels of half types computed in f32: runs `f32_kernel` on ctx with
// every bf16 / f16 input widened to an f32 copy and every bf16 / f16 output
// replaced by an f32 temporary, then rounds those outputs once into ctx's.
// Other inputs and outputs pass through untouched. Host tensors only.
Status RunHalfInF32(KernelContext& ctx, const KernelFn& f32_kernel);
// The same with the inputs as they are: `kernel` reads bf16 / f16 inputs
// itself and writes f32 temporaries for the half outputs (the GEMM ops'
// bf16 kernel, HasBf16Gemm()).
Status RunHalfOutputsInF32(KernelContext& ctx, const KernelFn& kernel);
inline bool IsHalf(DType d) { return d == DType::kBF16 || d == DType::kF16; }

// Calls fn(T{}) with T = float or double for the dtype:
//   DispatchFloat(dt, [&](auto zero) { using T = decltype(zero); ... });
template <typename Fn>
Status DispatchFloat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: fn(float{}); return Status::Ok();
    case DType::kF64: fn(double{}); return Status::Ok();
    default: return Unimplemented("no CPU kernel for dtype ", DTypeName(dtype));
  }
}

}  // namespace loom
