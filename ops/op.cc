#include "ops/op.h"

#include <algorithm>
#include <type_traits>

#include "core/allocator.h"
#include "core/half.h"
#include "core/half_convert.h"
#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"

namespace loom {

OpCost OpDef::Cost(const AttrMap&, const std::vector<TensorType>& inputs,
                   const std::vector<TensorType>& outputs) const {
  OpCost c;
  for (const auto& t : inputs) c.bytes_read += static_cast<double>(t.shape.numel() * DTypeSize(t.dtype));
  for (const auto& t : outputs) c.bytes_written += static_cast<double>(t.shape.numel() * DTypeSize(t.dtype));
  return c;
}

Status OpDef::Gradient(GradBuilder&) const { return Unimplemented("op ", name(), " has no gradient rule"); }

const char* FusionKindName(FusionKind kind) {
  switch (kind) {
    case FusionKind::kFused: return "fused";
    case FusionKind::kFusedOrPerReplica: return "fused or per replica";
    case FusionKind::kPerReplica: return "per replica";
  }
  return "?";
}

Status OpDef::Fuse(FusionBuilder& f) const { return f.PerReplica(); }

Status ElementwiseOpDef::Fuse(FusionBuilder& f) const { return f.Elementwise(); }

DimSplit SplitAlong(int axis, size_t inputs, size_t outputs) {
  DimSplit d;
  AxisSplit a;
  a.axis = axis;
  d.inputs.assign(inputs, a);
  d.outputs.assign(outputs, a);
  return d;
}

bool DimSplit::HasWindow() const {
  for (const AxisSplit& a : inputs)
    if (a.stride != 1 || a.span != 1 || a.padding != 0) return true;
  return false;
}

bool DimSplit::HasOwnedInputs() const {
  for (const AxisSplit& a : inputs)
    if (a.part >= 0) return true;
  return false;
}

bool DimSplit::Replicates() const {
  if (partial_sums || expands) return false;
  for (const auto* list : {&inputs, &outputs})
    for (const AxisSplit& a : *list)
      if (a.axis >= 0 || a.part >= 0) return false;
  return true;
}

bool DimSplit::SameAxes(const DimSplit& o) const {
  if (inputs.size() != o.inputs.size() || outputs.size() != o.outputs.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].axis != o.inputs[i].axis) return false;
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].axis != o.outputs[i].axis) return false;
  return true;
}

std::vector<DimSplit> SplitRules::All() const {
  std::vector<DimSplit> all;
  for (const auto* r : {&sample, &attribute, &parameter})
    if (*r) all.push_back(**r);
  for (const auto& [name, rule] : parameter_variants) all.push_back(rule);
  all.insert(all.end(), other.begin(), other.end());
  return all;
}

std::optional<DimSplit> SplitRules::Parameter(const std::string& variant) const {
  if (variant.empty()) return parameter;
  for (const auto& [name, rule] : parameter_variants)
    if (name == variant) return rule;
  return std::nullopt;
}

std::string SplitRules::VariantNames() const {
  std::string names;
  for (const auto& [name, rule] : parameter_variants) names += (names.empty() ? "'" : ", '") + name + "'";
  return names.empty() ? "none" : names;
}

DimSplit ElementwiseAlong(int axis, const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs) {
  DimSplit d = SplitAlong(axis, inputs.size(), outputs.size());
  const Shape& out = outputs.at(0).shape;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Shape& in = inputs[i].shape;
    const int aligned = axis - (out.rank() - in.rank());
    d.inputs[i].axis = aligned >= 0 && in[aligned] == out[axis] ? aligned : -1;
  }
  return d;
}

std::vector<DimSplit> ElementwiseAxes(const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs,
                                      int except) {
  std::vector<DimSplit> splits;
  if (outputs.empty()) return splits;
  for (const TensorType& t : outputs)
    if (t.shape != outputs[0].shape) return splits;  // outputs of other shapes: no common axis
  for (int a = 0; a < outputs[0].shape.rank(); ++a)
    if (a != except) splits.push_back(ElementwiseAlong(a, inputs, outputs));
  return splits;
}

SplitRules AllAxesBut(const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs, int except) {
  SplitRules rules;
  rules.other = ElementwiseAxes(inputs, outputs, except);
  if (except != 0 && !rules.other.empty() && !outputs.empty() && outputs[0].shape.rank() > 0) {
    rules.sample = std::move(rules.other.front());
    rules.other.erase(rules.other.begin());
  }
  return rules;
}

SplitRules ViewSplits(const TensorType& input, const TensorType& output) {
  SplitRules rules;
  const Shape& in = input.shape;
  const Shape& out = output.shape;
  int64_t in_prefix = 1;
  for (int a = 0; a < in.rank(); in_prefix *= in[a], ++a) {
    int64_t out_prefix = 1;
    for (int b = 0; b < out.rank() && out_prefix <= in_prefix; out_prefix *= out[b], ++b) {
      if (out_prefix != in_prefix || in[a] < 2 || out[b] < 2) continue;
      DimSplit d = SplitAlong(a, 1, 1);
      d.outputs[0].axis = b;
      if (a == 0 && b == 0 && in[0] == out[0]) rules.sample = d;
      else rules.other.push_back(d);
    }
  }
  return rules;
}

SplitRules OpDef::Splits(const AttrMap&, const std::vector<TensorType>&, const std::vector<TensorType>&) const {
  return {};
}

std::optional<std::vector<Region>> OpDef::WholeReads(const AttrMap&, const std::vector<TensorType>&,
                                                     const std::vector<TensorType>&) const {
  return std::nullopt;
}

StatusOr<AttrMap> OpDef::PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&, const std::vector<TensorType>&,
                                   const std::vector<Region>&, const std::vector<Region>&) const {
  return attrs;
}

Status OpDef::Expand(ExpandBuilder& b) const {
  return Internal("op ", name(), " (node '", b.node().name, "') declares no expansion");
}

SplitRules SampleAlongBatch(const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs) {
  SplitRules rules;
  int64_t batch = -1;
  for (const auto* types : {&inputs, &outputs})
    for (const TensorType& t : *types) {
      if (t.shape.rank() == 0) return rules;  // a scalar has no batch
      if (batch >= 0 && t.shape[0] != batch) return rules;
      batch = t.shape[0];
    }
  rules.sample = SplitAlong(0, inputs.size(), outputs.size());
  return rules;
}

StatusOr<int64_t> ReplicaCountAttr(const std::string& op, const AttrMap& attrs) {
  const int64_t r = attrs.Int("replicas");
  if (r < 0) return InvalidArgument(op, ": replicas must be >= 1 (absent or 0 = unfused), got ", r);
  return r;
}

AttrMap PartReplicaCount(const AttrMap& attrs, const TensorType& input0, const Region& input0_region) {
  const int64_t part = input0_region.shape()[0];
  if (attrs.Int("replicas") == 0 || part == input0.shape[0]) return attrs;
  AttrMap a = attrs;
  a.Set("replicas", part);
  return a;
}

std::optional<DimSplit> ImageRows(const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs) {
  if (outputs.empty() || outputs[0].shape.rank() != 4) return std::nullopt;
  return ElementwiseAlong(2, inputs, outputs);
}

SplitRules ElementwiseOpDef::Splits(const AttrMap&, const std::vector<TensorType>& inputs,
                                    const std::vector<TensorType>& outputs) const {
  SplitRules rules = SampleAlongBatch(inputs, outputs);
  rules.attribute = ImageRows(inputs, outputs);
  rules.other = ElementwiseAxes(inputs, outputs, rules.sample ? 0 : -1);
  return rules;
}

ValueId GradBuilder::SumToShape(ValueId grad, const Shape& shape) {
  if (type(grad).shape == shape) return grad;
  return Emit1("SumToShape", {grad}, AttrMap{{"shape", shape.dims()}});
}

OpRegistry& OpRegistry::Global() {
  static OpRegistry* registry = new OpRegistry;
  return *registry;
}

void OpRegistry::RegisterOp(std::unique_ptr<OpDef> op) {
  std::string name = op->name();
  LOOM_CHECK(!ops_.count(name), "op ", name, " registered twice");
  ops_[name] = std::move(op);
}

void OpRegistry::RegisterKernel(const std::string& op, DeviceType device, KernelFn fn) {
  auto key = std::make_pair(op, device);
  LOOM_CHECK(!kernels_.count(key), "kernel for ", op, " registered twice");
  kernels_[key] = std::move(fn);
}

void OpRegistry::RegisterGroupKernel(const std::string& op, DeviceType device, GroupKernelFn fn) {
  auto key = std::make_pair(op, device);
  LOOM_CHECK(!group_kernels_.count(key), "group kernel for ", op, " registered twice");
  RegisterKernel(op, device, [fn](KernelContext& ctx) {
    std::vector<KernelContext> one = {ctx};
    return fn(one);
  });
  group_kernels_[key] = std::move(fn);
}

void OpRegistry::RegisterKernelSupport(const std::string& op, DeviceType device, KernelSupportFn fn) {
  auto key = std::make_pair(op, device);
  LOOM_CHECK(!support_.count(key), "kernel support of ", op, " registered twice");
  support_[key] = std::move(fn);
}

KernelSupportFn DTypeSupport(std::vector<DType> dtypes) {
  return [dtypes](const Node&, const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs) {
    for (const auto* types : {&inputs, &outputs})
      for (const TensorType& t : *types)
        if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
          std::string names;
          for (DType d : dtypes) names += (names.empty() ? "" : ", ") + std::string(DTypeName(d));
          return Unimplemented("dtype ", DTypeName(t.dtype), " (", types == &inputs ? "an input" : "an output",
                               "); the kernel covers ", names);
        }
    return Status::Ok();
  };
}

KernelSupportFn FloatKernelSupport() {
  return [](const Node&, const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs) {
    for (const auto* types : {&inputs, &outputs})
      for (const TensorType& t : *types)
        if (IsFloating(t.dtype) && t.dtype != DType::kF32 && t.dtype != DType::kF64)
          return Unimplemented("dtype ", DTypeName(t.dtype), " (", types == &inputs ? "an input" : "an output",
                               "); the kernel covers f32, f64");
    return Status::Ok();
  };
}

// Today that is every floating dtype; one added later (fp8) is refused until its kernels exist.
KernelSupportFn HalfFloatKernelSupport() {
  return [](const Node&, const std::vector<TensorType>& inputs, const std::vector<TensorType>& outputs) {
    for (const auto* types : {&inputs, &outputs})
      for (const TensorType& t : *types)
        if (IsFloating(t.dtype) && t.dtype != DType::kF32 && t.dtype != DType::kF64 && t.dtype != DType::kBF16 &&
            t.dtype != DType::kF16)
          return Unimplemented("dtype ", DTypeName(t.dtype), " (", types == &inputs ? "an input" : "an output",
                               "); the kernel covers f32, f64, bf16, f16");
    return Status::Ok();
  };
}

KernelSupportFn AnyDTypeSupport() {
  return [](const Node&, const std::vector<TensorType>&, const std::vector<TensorType>&) { return Status::Ok(); };
}

Status OpRegistry::SupportsNode(const Node& node, const std::vector<TensorType>& inputs,
                                const std::vector<TensorType>& outputs, DeviceType device) const {
  const std::string where = "node '" + node.name + "' (" + node.op + ")";
  const std::string on = device == DeviceType::kCpu ? "CPU" : "CUDA";
  if (!FindKernel(node.op, device)) return Unimplemented(where, ": op ", node.op, " has no kernel for ", on);
  auto it = support_.find({node.op, device});
  static const KernelSupportFn kDefault = FloatKernelSupport();
  Status s = (it == support_.end() ? kDefault : it->second)(node, inputs, outputs);
  if (!s.ok()) return Unimplemented(where, ": the ", on, " kernel of ", node.op, " does not support ", s.message());
  return Status::Ok();
}

Status CanonicalizeAttrs(const OpDef& op, AttrMap* attrs) {
  const AttrSchema* schema = op.attr_schema();
  return schema ? schema->Canonicalize(attrs) : Status::Ok();
}

StatusOr<std::vector<TensorType>> InferOpTypes(const OpDef& op, AttrMap attrs, const std::vector<TensorType>& inputs) {
  LOOM_RETURN_IF_ERROR(CanonicalizeAttrs(op, &attrs));
  return op.InferTypes(attrs, inputs);
}

const OpDef* OpRegistry::FindOp(const std::string& name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

namespace {
// Case-insensitive edit distance, for "did you mean" suggestions.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

StatusOr<const OpDef*> OpRegistry::GetOp(const std::string& name) const {
  if (const OpDef* op = FindOp(name)) return op;
  // Suggest the closest names (a typo or a case slip), closest first.
  std::vector<std::pair<size_t, std::string>> near;
  const size_t limit = std::max<size_t>(2, name.size() / 4);
  for (const auto& [n, _] : ops_)
    if (size_t d = EditDistance(name, n); d <= limit) near.push_back({d, n});
  std::sort(near.begin(), near.end());
  std::string list;
  for (size_t i = 0; i < near.size() && i < 3; ++i) list += (i ? ", " : "") + near[i].second;
  return NotFound("unknown op '", name, "'", list.empty() ? "" : " (did you mean " + list + "?)");
}

const KernelFn* OpRegistry::FindKernel(const std::string& op, DeviceType device) const {
  auto it = kernels_.find(std::make_pair(op, device));
  return it == kernels_.end() ? nullptr : &it->second;
}

const GroupKernelFn* OpRegistry::FindGroupKernel(const std::string& op, DeviceType device) const {
  auto it = group_kernels_.find(std::make_pair(op, device));
  return it == group_kernels_.end() ? nullptr : &it->second;
}

std::vector<std::string> OpRegistry::OpNames() const {
  std::vector<std::string> names;
  for (const auto& [n, _] : ops_) names.push_back(n);
  return names;
}

namespace {
template <typename Half>
void WidenInto(const Tensor& from, Tensor* to, ThreadPool* pool) {
  const Half* in = from.data<Half>();
  float* out = to->data<float>();
  ParallelRange(pool, from.numel(), [&](int64_t s, int64_t e) {
    if constexpr (std::is_same_v<Half, Float16>) {
      WidenF16(in + s, out + s, e - s);
    } else {
      for (int64_t i = s; i < e; ++i) out[i] = ToFloat(in[i]);
    }
  });
}
// The f32 temporaries of the half kernels below: they come and go within a
// kernel call, the same sizes every step, so they come from a cache that
// hands the same pages back, not from fresh pages that the kernel zeroes on
// first touch in every call (MobileNetV3's bf16 step spent a quarter of its
// time zeroing them). Never destroyed: kernels run until the process ends.
Allocator* HalfScratch() {
  static CachingCpuAllocator* const cache = new CachingCpuAllocator();
  return cache;
}

template <typename Half>
void NarrowInto(const Tensor& from, Tensor* to, ThreadPool* pool) {
  const float* in = from.data<float>();
  Half* out = to->data<Half>();
  ParallelRange(pool, from.numel(), [&](int64_t s, int64_t e) {
    if constexpr (std::is_same_v<Half, Float16>) {
      NarrowToF16(in + s, out + s, e - s);
    } else {
      for (int64_t i = s; i < e; ++i) out[i] = NarrowFloat<Half>::From(in[i]);
    }
  });
}
}  // namespace

Status RunHalfOutputsInF32(KernelContext& ctx, const KernelFn& kernel) {
  KernelContext wide = ctx;
  std::vector<Tensor> wide_outputs;
  wide_outputs.reserve(ctx.outputs.size());
  for (size_t i = 0; i < ctx.outputs.size(); ++i) {
    const Tensor& t = *ctx.outputs[i];
    if (!IsHalf(t.dtype())) continue;
    LOOM_ASSIGN_OR_RETURN(Tensor w, Tensor::Empty(t.shape(), DType::kF32, HalfScratch()));
    wide_outputs.push_back(std::move(w));
    wide.outputs[i] = &wide_outputs.back();
  }
  LOOM_RETURN_IF_ERROR(kernel(wide));
  for (size_t i = 0; i < ctx.outputs.size(); ++i) {
    Tensor* t = ctx.outputs[i];
    if (wide.outputs[i] == t) continue;
    if (t->dtype() == DType::kBF16) NarrowInto<BFloat16>(*wide.outputs[i], t, ctx.pool);
    else NarrowInto<Float16>(*wide.outputs[i], t, ctx.pool);
  }
  return Status::Ok();
}

Status RunHalfInF32(KernelContext& ctx, const KernelFn& f32_kernel) {
  KernelContext wide = ctx;
  std::vector<Tensor> widened_inputs;
  widened_inputs.reserve(ctx.inputs.size());
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Tensor& t = *ctx.inputs[i];
    if (!IsHalf(t.dtype())) continue;
    LOOM_ASSIGN_OR_RETURN(Tensor w, Tensor::Empty(t.shape(), DType::kF32, HalfScratch()));
    if (t.dtype() == DType::kBF16) WidenInto<BFloat16>(t, &w, ctx.pool);
    else WidenInto<Float16>(t, &w, ctx.pool);
    widened_inputs.push_back(std::move(w));
    wide.inputs[i] = &widened_inputs.back();
  }
  return RunHalfOutputsInF32(wide, f32_kernel);
}

Status ExpectInputs(const std::vector<TensorType>& inputs, size_t n, const std::string& what) {
  if (inputs.size() != n) return InvalidArgument(what, " takes ", n, " input(s), got ", inputs.size());
  return Status::Ok();
}

Status ExpectRank(const TensorType& t, int rank, const std::string& what) {
  if (t.shape.rank() != rank) return InvalidArgument(what, " must have rank ", rank, ", got shape ", t.shape.ToString());
  return Status::Ok();
}

Status ExpectFloat(const TensorType& t, const std::string& what) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kF64)
    return InvalidArgument(what, " must be f32 or f64, got ", DTypeName(t.dtype));
  return Status::Ok();
}

Status ExpectFloatOrHalf(const TensorType& t, const std::string& what) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kF64 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
    return InvalidArgument(what, " must be f32, f64, bf16 or f16, got ", DTypeName(t.dtype));
  return Status::Ok();
}

Status ExpectSameType(const TensorType& a, const TensorType& b, const std::string& what) {
  if (a != b) return InvalidArgument(what, ": ", a.ToString(), " vs ", b.ToString());
  return Status::Ok();
}

}  // namespace loom
