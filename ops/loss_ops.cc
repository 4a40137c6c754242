// Losses: CrossEntropy, NLL, MSE and BCEWithLogits, each with a dedicated
// backward op. Every loss returns a scalar (shape [], the input's float
// dtype) and takes attr reduction = "mean" (default) | "sum".
//
// Conventions (PyTorch's):
//   CrossEntropy(logits, targets) attrs label_smoothing (default 0, in
//     [0, 1]), ignore_index (default -100), reduction. logits [N, C] or
//     [N, C, d1, ...] (or [C] for one sample), targets i32/i64 class indices
//     [N] or [N, d1, ...] (or []). Per sample:
//       (1 - eps) * -log p[target] + eps / C * sum_c -log p[c],
//     p = softmax over C. Targets equal to ignore_index contribute nothing
//     and are left out of the mean's denominator; if all are ignored the
//     mean is NaN (0 / 0) and the gradient is zero. Other targets outside
//     [0, C) fail the kernel with InvalidArgument naming the position.
//   CrossEntropyBackward(logits, targets, dy), same attrs -> dlogits.
//   Fused (horizontal fusion), attr replicas = R >= 1: logits [R, ...]
//     (R replicas' scores stacked), targets shared (one replica's shape)
//     or [R, ...]; the loss is [R], replica r's the unfused loss of its
//     chunk; dy [R]. CountTargets takes the attribute too (targets [R, ...]
//     -> [R] counts).
//   NLL(log_probs, targets) attrs ignore_index, reduction: the same shapes
//     as CrossEntropy; per sample -log_probs[target].
//   NLLBackward(targets, dy) attrs num_classes, ignore_index, reduction ->
//     dlog_probs.
//   MSE(prediction, target): same shape and dtype; (prediction - target)^2.
//   MSEBackward(prediction, target, dy) -> dprediction (dtarget is its
//     negation).
//   BCEWithLogits(logits, targets[, pos_weight]): targets float, the shape
//     of logits; pos_weight broadcasts to logits (typically [C] against the
//     last dim). Per element, with log_weight = 1 + (pos_weight - 1) * t:
//       (1 - t) * x + log_weight * (log(1 + exp(-|x|)) + max(-x, 0)),
//     which is max(x, 0) - x * t + log(1 + exp(-|x|)) without pos_weight,
//     and never overflows.
//   BCEWithLogitsBackward(dy, logits, targets[, pos_weight]) attrs
//     reduction, wrt = "logits" | "targets" | "pos_weight" -> the per-element
//     gradient (shape of logits; for pos_weight still to be summed to its
//     shape).
//   Fused BCEWithLogits, attr replicas = R >= 1: logits [R, ...], targets
//     shared (one replica's shape) or [R, ...], pos_weight shared
//     (broadcasting to one replica's logits); the loss is [R], dy [R].
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/loss_geometry.h"
#include "ops/op.h"

namespace loom {
namespace {

// ------------------------------------------------------------------ helpers

// The attributes the losses share, declared once for all of them (and for
// the backward ops, which take the forward op's).
AttrSchema& DeclareReduction(AttrSchema& s) {
  return s.Default("reduction", "mean", "\"mean\" or \"sum\" over the samples");
}
AttrSchema& DeclareIgnoreIndex(AttrSchema& s) {
  return s.Default("ignore_index", int64_t{-100}, "samples with this target add nothing (nor count for the mean)");
}
AttrSchema& DeclareLossReplicas(AttrSchema& s) {
  return s.Default("replicas", int64_t{0}, "fused: R replicas' losses at once (0 = unfused)");
}
AttrSchema& DeclareCrossEntropyAttrs(AttrSchema& s) {
  return DeclareLossReplicas(DeclareIgnoreIndex(DeclareReduction(s)))
      .Default("label_smoothing", 0.0, "weight moved from the target class to a uniform distribution, in [0, 1]");
}

StatusOr<bool> ParseMeanReduction(const std::string& op, const AttrMap& attrs) {
  const std::string r = attrs.Str("reduction");
  if (r != "mean" && r != "sum")
    return InvalidArgument(op, ": attribute 'reduction' must be \"mean\" or \"sum\", got \"", r, "\"");
  return r == "mean";
}

std::vector<TensorType> Scalar(DType dtype) { return {TensorType{Shape{}, dtype}}; }

Status ExpectScalarGrad(const std::string& op, const TensorType& dy, DType dtype) {
  if (dy.shape.rank() != 0 || dy.dtype != dtype)
    return InvalidArgument(op, ": dy must be a scalar [] ", DTypeName(dtype), ", got ", dy.ToString());
  return Status::Ok();
}

// `groups` sums over [0, n) each (a fused loss's replicas): fixed-size
// blocks of every group are summed in parallel (in double) by
// sum_range(group, i0, i1) and each group's block sums added in order, so a
// group's sum depends neither on the thread count nor on the other groups.
template <typename Fn>
std::vector<double> BlockedSums(ThreadPool* pool, int64_t groups, int64_t n, int64_t block, Fn&& sum_range) {
  std::vector<double> totals(static_cast<size_t>(groups), 0.0);
  if (n <= 0) return totals;
  block = std::max<int64_t>(1, block);
  const int64_t blocks = (n + block - 1) / block;
  std::vector<double> partial(static_cast<size_t>(groups * blocks));
  ParallelRange(pool, groups * blocks, [&](int64_t b0, int64_t b1) {
    for (int64_t gb = b0; gb < b1; ++gb) {
      const int64_t g = gb / blocks, b = gb % blocks;
      partial[gb] = sum_range(g, b * block, std::min(n, (b + 1) * block));
    }
  }, 1);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < blocks; ++b) totals[g] += partial[g * blocks + b];
  return totals;
}

template <typename Fn>
double BlockedSum(ThreadPool* pool, int64_t n, int64_t block, Fn&& sum_range) {
  return BlockedSums(pool, 1, n, block, [&](int64_t, int64_t i0, int64_t i1) { return sum_range(i0, i1); })[0];
}

// Items per block for BlockedSum and per chunk for ParallelRange when each
// item costs `cost` element operations.
int64_t ItemsFor(int64_t cost) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, cost)); }

// Calls fn(T{}, I{}) for the float dtype of the scores and the index dtype
// of the targets.
template <typename Fn>
Status DispatchFloatIndex(DType float_dtype, DType index_dtype, Fn&& fn) {
  Status status;
  LOOM_RETURN_IF_ERROR(DispatchFloat(float_dtype, [&](auto zf) {
    switch (index_dtype) {
      case DType::kI32: fn(zf, int32_t{}); break;
      case DType::kI64: fn(zf, int64_t{}); break;
      default: status = Unimplemented("no CPU kernel for index dtype ", DTypeName(index_dtype));
    }
  }));
  return status;
}

// ------------------------------------------------- class-index losses layout

// The targets shape that goes with a scores shape: the class dim removed.
Shape TargetShapeFor(const Shape& scores) {
  std::vector<int64_t> dims = scores.dims();
  dims.erase(dims.begin() + (scores.rank() == 1 ? 0 : 1));
  return Shape(dims);
}

// The scores shape that goes with targets and a class count.
Shape ScoreShapeFor(const Shape& targets, int64_t classes) {
  std::vector<int64_t> dims = targets.dims();
  dims.insert(dims.begin() + (targets.rank() == 0 ? 0 : 1), classes);
  return Shape(dims);
}

Status ExpectIndexTargets(const std::string& op, const TensorType& targets) {
  if (!IsInteger(targets.dtype))
    return InvalidArgument(op, ": targets must be integer class indices (i32 or i64), got ", DTypeName(targets.dtype));
  return Status::Ok();
}

Status CheckClassInputs(const std::string& op, const char* scores_name, const TensorType& scores,
                        const TensorType& targets) {
  LOOM_RETURN_IF_ERROR(ExpectFloat(scores, op + " " + scores_name));
  LOOM_RETURN_IF_ERROR(ExpectIndexTargets(op, targets));
  const Shape& s = scores.shape;
  if (s.rank() < 1)
    return InvalidArgument(op, ": ", scores_name, " must be [N, C, ...] or [C], got ", s.ToString());
  if (ClassLayoutOf(s).classes == 0)
    return InvalidArgument(op, ": ", scores_name, " ", s.ToString(), " have no classes (C = 0)");
  if (targets.shape != TargetShapeFor(s))
    return InvalidArgument(op, ": targets ", targets.shape.ToString(), " do not match ", scores_name, " ", s.ToString(),
                           ": expected targets ", TargetShapeFor(s).ToString(), " (", scores_name,
                           " [N, C, d1, ...] take targets [N, d1, ...])");
  return Status::Ok();
}

// Checks every target and counts those not ignored (the mean's denominator).
StatusOr<int64_t> CountTargets(const std::string& op, const Tensor& targets, int64_t classes, int64_t ignore_index) {
  if (targets.dtype() == DType::kI32)
    return CountClassTargets(op, targets.data<int32_t>(), targets.shape(), classes, ignore_index);
  return CountClassTargets(op, targets.data<int64_t>(), targets.shape(), classes, ignore_index);
}

// The same for each replica of a fused loss.
StatusOr<std::vector<int64_t>> CountTargets(const std::string& op, const Tensor& targets, const LossReplicas& rep,
                                            int64_t classes, int64_t ignore_index) {
  if (targets.dtype() == DType::kI32)
    return CountReplicaTargets(op, targets.data<int32_t>(), targets.shape(), rep, classes, ignore_index);
  return CountReplicaTargets(op, targets.data<int64_t>(), targets.shape(), rep, classes, ignore_index);
}

// The class-index inputs of a loss that may be fused (attribute replicas):
// checked as one replica's, the loss's shape returned ([] or [R]).
StatusOr<Shape> CheckReplicaClassInputs(const std::string& op, const char* scores_name, const AttrMap& attrs,
                                        const TensorType& scores, const TensorType& targets) {
  LOOM_ASSIGN_OR_RETURN(const int64_t r, ReplicaCountAttr(op, attrs));
  if (r == 0) {
    LOOM_RETURN_IF_ERROR(CheckClassInputs(op, scores_name, scores, targets));
    return Shape{};
  }
  if (scores.shape.rank() < 2 || scores.shape[0] != r)
    return InvalidArgument(op, ": replicas = ", r, " needs ", scores_name, " [", r, ", ...], got ",
                           scores.shape.ToString());
  const LossReplicas rep = LossReplicasOf(attrs, scores.shape, targets.shape);
  if (rep.target_stride != 0 && targets.shape[0] != r)
    return InvalidArgument(op, ": per-replica targets must be [", r, ", ...], got ", targets.shape.ToString());
  LOOM_RETURN_IF_ERROR(CheckClassInputs(op, scores_name, {rep.scores, scores.dtype}, {rep.targets, targets.dtype}));
  return Shape{r};
}

// The scale d loss / d (per-sample term): dy (replica r's, fused), divided
// by the mean's count.
template <typename T>
T LossScale(const Tensor& dy, bool mean, int64_t count, int64_t r = 0) {
  const double g = dy.data<T>()[r];
  return static_cast<T>(mean ? g / static_cast<double>(count) : g);
}

// ------------------------------------------------ splits along the batch

// A loss (or its backward) split along the batch: `batched` inputs by axis
// 0 (`pos_weight`, when >= 0, too if it has the batch's own rows), the
// others whole; the loss a partial sum (`partial`) or the gradient by axis
// 0. A mean expands (its divisor is the whole batch's). `x` is the input
// the loss is over; nothing when it is a scalar.
SplitRules LossBatchSplit(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                          int x, std::vector<int> batched, int pos_weight, bool partial) {
  SplitRules rules;
  const Shape& xs = in[static_cast<size_t>(x)].shape;
  if (xs.rank() < 1) return rules;
  if (pos_weight >= 0 && static_cast<size_t>(pos_weight) < in.size()) {
    const Shape& w = in[static_cast<size_t>(pos_weight)].shape;
    if (w.rank() == xs.rank() && w[0] == xs[0] && xs[0] > 1) batched.push_back(pos_weight);
  }
  DimSplit d = SplitAlong(-1, in.size(), out.size());
  for (int i : batched) d.inputs[static_cast<size_t>(i)].axis = 0;
  if (!partial) d.outputs[0].axis = 0;
  d.partial_sums = partial;
  d.expands = IsMeanReduction(attrs);
  rules.sample = d;
  return rules;
}

// A class-index loss: the same, nothing for a single sample ([C] scores).
SplitRules BatchSplit(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                      std::vector<int> batched, bool partial) {
  if (in[0].shape.rank() < 2) return {};
  return LossBatchSplit(attrs, in, out, 0, std::move(batched), -1, partial);
}

// CrossEntropy and its backward, fused or not: the batch of scores and
// targets (axis 1 of a fused op's scores and per-replica targets), dy whole.
// A fused op also splits along its replicas (axis 0 of everything but
// shared targets; PartReplicaCount gives each part its count).
SplitRules ClassBatchSplit(const AttrMap& attrs, const std::vector<TensorType>& in,
                           const std::vector<TensorType>& out, bool partial) {
  if (attrs.Int("replicas") == 0) return BatchSplit(attrs, in, out, {0, 1}, partial);
  const LossReplicas rep = LossReplicasOf(attrs, in[0].shape, in[1].shape);
  SplitRules rules;
  DimSplit replicas = SplitAlong(0, in.size(), out.size());
  if (rep.target_stride == 0) replicas.inputs[1].axis = -1;
  rules.other.push_back(replicas);
  if (rep.scores.rank() < 2 || rep.scores[0] < 2) return rules;
  DimSplit d = SplitAlong(-1, in.size(), out.size());
  d.inputs[0].axis = 1;
  d.inputs[1].axis = rep.target_stride == 0 ? 0 : 1;
  if (!partial) d.outputs[0].axis = 1;
  d.partial_sums = partial;
  d.expands = IsMeanReduction(attrs);
  rules.sample = d;
  return rules;
}

// The count of `targets` (of `classes` classes) a mean divides by, in
// `dtype` (CountTargets, ignore_index from the node); per replica ([R])
// when `replicas` > 0.
ValueId EmitCount(ExpandBuilder& b, ValueId targets, int64_t classes, DType dtype, int64_t replicas = 0) {
  AttrMap attrs{{"classes", classes},
                {"ignore_index", b.attrs().Int("ignore_index")},
                {"dtype", std::string(DTypeName(dtype))}};
  if (replicas > 0) attrs.Set("replicas", replicas);
  return b.Emit("CountTargets", {targets}, attrs, "count").at(0);
}

// The same for a mean over `scores` ([N, C, ...], or a fused loss's), in
// their dtype: [] or, for a fused loss's per-replica targets, [R].
ValueId EmitCount(ExpandBuilder& b, ValueId targets, ValueId scores) {
  const TensorType& s = b.type(scores);
  const LossReplicas rep = LossReplicasOf(b.attrs(), s.shape, b.type(targets).shape);
  return EmitCount(b, targets, ClassLayoutOf(rep.scores).classes, s.dtype, rep.target_stride != 0 ? rep.count : 0);
}

// A loss node's mean reduction as its sum: the node re-emitted with
// reduction "sum" on `inputs` (named "sum").
ValueId EmitSum(ExpandBuilder& b, const std::string& op, const std::vector<ValueId>& inputs) {
  AttrMap sum = b.attrs();
  sum.Set("reduction", "sum");
  return b.Emit(op, inputs, sum, "sum").at(0);
}

// ------------------------------------------------------------- CrossEntropy

Status CheckCrossEntropyAttrs(const std::string& op, const AttrMap& attrs) {
  LOOM_RETURN_IF_ERROR(ParseMeanReduction(op, attrs).status());
  const double eps = attrs.Float("label_smoothing");
  if (!(eps >= 0.0 && eps <= 1.0))
    return InvalidArgument(op, ": attribute 'label_smoothing' must be in [0, 1], got ", eps);
  return Status::Ok();
}

// max and log(sum(exp(x - max))) over the C scores of one sample.
template <typename T>
struct LogSumExp {
  T max;
  double log_sum;
};

template <typename T>
LogSumExp<T> RowLogSumExp(const T* row, int64_t classes, int64_t stride) {
  T m = row[0];
  for (int64_t c = 1; c < classes; ++c) m = row[c * stride] > m ? row[c * stride] : m;
  double sum = 0;
  for (int64_t c = 0; c < classes; ++c) sum += std::exp(row[c * stride] - m);
  return {m, std::log(sum)};
}

// An f32 row of contiguous scores ([N, C] logits: a language model's
// vocabulary): its max, exps[c] = e^(x[c] - max) in vector lanes (ExpF;
// glibc's expf per element was most of the loss's time) and their sum in
// double lanes. `exps` is the caller's scratch of at least `classes` floats.
struct RowExps {
  float max;
  double sum;
};
RowExps ContiguousRowExps(const float* __restrict row, int64_t classes, float* __restrict exps) {
  float m = row[0];
  for (int64_t c = 1; c < classes; ++c) m = row[c] > m ? row[c] : m;
  for (int64_t c = 0; c < classes; ++c) exps[c] = ExpF(row[c] - m);
  return {m, SumAsDouble(exps, classes)};
}

// CrossEntropyBackward's dlogits of one f32 row of contiguous scores: the
// softmax as the row's exps over their sum, in vector lanes (restrict and
// values, not the kernel's captured references, so that the loop
// vectorises).
void ContiguousCrossEntropyGrad(const float* x, float* __restrict dx, int64_t classes, int64_t target, float scale,
                                float smooth, float hit, float* __restrict exps) {
  const float inv_sum = static_cast<float>(1.0 / ContiguousRowExps(x, classes, exps).sum);
  for (int64_t c = 0; c < classes; ++c) dx[c] = scale * (exps[c] * inv_sum - smooth - (c == target ? hit : 0.0f));
}

// RowLogSumExp of sample i's scores at `row`: the vector one where it
// applies.
template <typename T>
LogSumExp<T> ScoresLogSumExp(const T* row, const ClassLayout& L, std::vector<float>& exps) {
  if constexpr (std::is_same_v<T, float>) {
    if (L.inner == 1) {
      exps.resize(static_cast<size_t>(L.classes));
      const RowExps r = ContiguousRowExps(row, L.classes, exps.data());
      return {r.max, std::log(r.sum)};
    }
  }
  return RowLogSumExp(row, L.classes, L.inner);
}

// NLL and MSE have no fused form (yet): the fusion pass runs them once per
// replica (R small ops at the end of the forward pass).
class LossOpDef : public OpDef {
 public:
  FusionKind fusion_kind() const override { return FusionKind::kPerReplica; }
};

class CrossEntropyOp : public OpDef {
 public:
  CrossEntropyOp() { DeclareCrossEntropyAttrs(DeclareAttrs()); }
  std::string name() const override { return "CrossEntropy"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, "CrossEntropy (logits, targets)"));
    LOOM_RETURN_IF_ERROR(CheckCrossEntropyAttrs("CrossEntropy", attrs));
    LOOM_ASSIGN_OR_RETURN(Shape loss, CheckReplicaClassInputs("CrossEntropy", "logits", attrs, in[0], in[1]));
    return std::vector<TensorType>{{std::move(loss), in[0].dtype}};
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // R replicas' losses in one node: the logits with their replica axis
  // first, the targets shared or with theirs first too.
  Status Fuse(FusionBuilder& f) const override {
    if (f.attrs().Int("replicas") != 0) return InvalidArgument("CrossEntropy '", f.name(), "' is fused already");
    LOOM_ASSIGN_OR_RETURN(const FusedValue logits, f.Replicated(f.input(0), 0, f.name() + "/logits"));
    FusedValue targets = f.input(1);
    if (targets.replicated()) {
      LOOM_ASSIGN_OR_RETURN(targets, f.MoveAxis(targets, 0, f.name() + "/targets"));
    }
    AttrMap attrs = f.attrs();
    attrs.Set("replicas", f.replicas());
    LOOM_ASSIGN_OR_RETURN(FusedValue loss, f.Emit1("CrossEntropy", {logits, targets}, attrs, f.name(),
                                                    ReplicaLayout::Axis(0)));
    return f.MapOutputs({loss});
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    // Per logit: max, subtract, exp, add; label smoothing adds one more sum.
    c.flops = (a.Float("label_smoothing") > 0 ? 5.0 : 4.0) * static_cast<double>(in[0].shape.numel());
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    g.SetInputGrad(0, g.Emit1("CrossEntropyBackward", {g.input(0), g.input(1), g.output_grad(0)}, g.attrs()));
    return Status::Ok();
  }
  // Sample: the batch of logits and targets; the loss is a partial sum. A
  // mean divides by the whole batch's count of targets: it expands.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return ClassBatchSplit(attrs, in, out, true);
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    return PartReplicaCount(attrs, in[0], in_regions[0]);
  }
  // Mean: the sum over the part's samples, divided by the count of
  // targets not ignored (CountTargets), both all-reduced.
  Status Expand(ExpandBuilder& b) const override {
    const ValueId total = EmitSum(b, "CrossEntropy", {b.input(0), b.input(1)});
    const ValueId count = EmitCount(b, b.input(1), b.input(0));
    b.SetOutput(0, b.Emit("Div", {total, count}, {}, "mean").at(0));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(CrossEntropyOp);

LOOM_REGISTER_KERNEL("CrossEntropy", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  const Tensor& t = ctx.in(1);
  const LossReplicas rep = LossReplicasOf(*ctx.attrs, x.shape(), t.shape());
  const ClassLayout L = ClassLayoutOf(rep.scores);
  const int64_t ignore = ctx.attrs->Int("ignore_index");
  const double eps = ctx.attrs->Float("label_smoothing");
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> counts, CountTargets("CrossEntropy", t, rep, L.classes, ignore));
  return DispatchFloatIndex(x.dtype(), t.dtype(), [&](auto zf, auto zi) {
    using T = decltype(zf);
    using I = decltype(zi);
    // One sum per replica, each over its own chunk of the logits.
    const std::vector<double> totals =
        BlockedSums(ctx.pool, rep.count, L.samples(), ItemsFor(L.classes), [&](int64_t r, int64_t i0, int64_t i1) {
      const T* px = x.data<T>() + r * rep.scores.numel();
      const I* pt = t.data<I>() + r * rep.target_stride;
      double sum = 0;
      std::vector<float> exps;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t y = pt[i];
        if (y == ignore) continue;
        const T* row = px + L.ScoreOffset(i);
        const LogSumExp<T> lse = ScoresLogSumExp(row, L, exps);
        // -log p[c] = log_sum - (x[c] - max); shifted values keep f32 digits.
        double loss = (1.0 - eps) * (lse.log_sum - (row[y * L.inner] - lse.max));
        if (eps > 0) {
          double shifted = 0;
          for (int64_t c = 0; c < L.classes; ++c) shifted += row[c * L.inner] - lse.max;
          loss += eps / static_cast<double>(L.classes) * (static_cast<double>(L.classes) * lse.log_sum - shifted);
        }
        sum += loss;
      }
      return sum;
    });
    const bool mean = IsMeanReduction(*ctx.attrs);
    for (int64_t r = 0; r < rep.count; ++r)
      ctx.out(0).data<T>()[r] = static_cast<T>(mean ? totals[r] / static_cast<double>(counts[r]) : totals[r]);
  });
});

// dlogits = scale * (softmax - eps / C - (1 - eps) * onehot(target)); zero
// for ignored samples.
class CrossEntropyBackwardOp : public OpDef {
 public:
  CrossEntropyBackwardOp() { DeclareCrossEntropyAttrs(DeclareAttrs()); }
  std::string name() const override { return "CrossEntropyBackward"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 3, "CrossEntropyBackward (logits, targets, dy)"));
    LOOM_RETURN_IF_ERROR(CheckCrossEntropyAttrs("CrossEntropyBackward", attrs));
    LOOM_ASSIGN_OR_RETURN(const Shape loss,
                          CheckReplicaClassInputs("CrossEntropyBackward", "logits", attrs, in[0], in[1]));
    if (in[2].shape != loss || in[2].dtype != in[0].dtype)
      return InvalidArgument("CrossEntropyBackward: dy must be ", TensorType{loss, in[0].dtype}.ToString(),
                             " (the loss's type), got ", in[2].ToString());
    return std::vector<TensorType>{in[0]};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    // Per logit: max, subtract, exp and sum again, then exp, scale, shift, multiply.
    c.flops = 8.0 * static_cast<double>(in[0].shape.numel());
    return c;
  }
  // Sample: logits, targets and dlogits by the batch, dy whole; a mean
  // scales by the whole batch's count: it expands.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return ClassBatchSplit(attrs, in, out, false);
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    return PartReplicaCount(attrs, in[0], in_regions[0]);
  }
  // Mean: the sum's gradient of dy / count.
  Status Expand(ExpandBuilder& b) const override {
    const ValueId count = EmitCount(b, b.input(1), b.input(0));
    const ValueId scaled = b.Emit("Div", {b.input(2), count}, {}, "scale").at(0);
    b.SetOutput(0, EmitSum(b, "CrossEntropyBackward", {b.input(0), b.input(1), scaled}));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(CrossEntropyBackwardOp);

LOOM_REGISTER_KERNEL("CrossEntropyBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  const Tensor& t = ctx.in(1);
  const LossReplicas rep = LossReplicasOf(*ctx.attrs, x.shape(), t.shape());
  const ClassLayout L = ClassLayoutOf(rep.scores);
  const int64_t ignore = ctx.attrs->Int("ignore_index");
  const double eps = ctx.attrs->Float("label_smoothing");
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> counts,
                        CountTargets("CrossEntropyBackward", t, rep, L.classes, ignore));
  return DispatchFloatIndex(x.dtype(), t.dtype(), [&](auto zf, auto zi) {
    using T = decltype(zf);
    using I = decltype(zi);
    const T* px = x.data<T>();
    const I* pt = t.data<I>();
    T* pdx = ctx.out(0).data<T>();
    std::vector<T> scales(static_cast<size_t>(rep.count));
    for (int64_t r = 0; r < rep.count; ++r)
      scales[r] = LossScale<T>(ctx.in(2), IsMeanReduction(*ctx.attrs), counts[r], r);
    const T smooth = static_cast<T>(eps / static_cast<double>(L.classes)), hit = static_cast<T>(1.0 - eps);
    // Item r * samples + i: replica r's sample i.
    const int64_t samples = L.samples();
    ParallelRange(ctx.pool, rep.count * samples, [&](int64_t i0, int64_t i1) {
      std::vector<float> exps;
      for (int64_t item = i0; item < i1; ++item) {
        const int64_t r = item / samples, i = item % samples;
        const T scale = scales[r];
        const int64_t y = pt[r * rep.target_stride + i];
        const int64_t at = r * rep.scores.numel() + L.ScoreOffset(i);
        if (y == ignore) {
          for (int64_t c = 0; c < L.classes; ++c) pdx[at + c * L.inner] = T(0);
          continue;
        }
        if constexpr (std::is_same_v<T, float>) {
          if (L.inner == 1) {  // contiguous f32 scores
            exps.resize(static_cast<size_t>(L.classes));
            ContiguousCrossEntropyGrad(px + at, pdx + at, L.classes, y, scale, smooth, hit, exps.data());
            continue;
          }
        }
        const LogSumExp<T> lse = RowLogSumExp(px + at, L.classes, L.inner);
        const T log_sum = static_cast<T>(lse.log_sum);
        for (int64_t c = 0; c < L.classes; ++c) {
          const T p = std::exp((px[at + c * L.inner] - lse.max) - log_sum);
          pdx[at + c * L.inner] = scale * (p - smooth - (c == y ? hit : T(0)));
        }
      }
    }, ItemsFor(L.classes));
  });
});

// CountTargets(targets) attrs classes, ignore_index, dtype -> [] of dtype:
// how many targets are not ignored (checked against [0, classes)), the
// denominator of a mean; partial counts over a split batch add up.
class CountTargetsOp : public OpDef {
 public:
  CountTargetsOp() {
    DeclareLossReplicas(DeclareIgnoreIndex(DeclareAttrs()))
        .Required("classes", AttrType::kInt, "the class count targets are checked against")
        .Default("dtype", "f32", "the count's float dtype");
  }
  std::string name() const override { return "CountTargets"; }
  // Sample: the batch (axis 1 of a fused loss's [R, N, ...] targets); a
  // fused one's replicas too.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    const int batch = attrs.Int("replicas") > 0 ? 1 : 0;
    if (batch == 1) rules.other.push_back(SplitAlong(0, in.size(), out.size()));
    if (in[0].shape.rank() < batch + 1) return rules;
    rules.sample = SplitAlong(-1, in.size(), out.size());
    rules.sample->inputs[0].axis = batch;
    rules.sample->partial_sums = true;
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    return PartReplicaCount(attrs, in[0], in_regions[0]);
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "CountTargets (targets)"));
    LOOM_RETURN_IF_ERROR(ExpectIndexTargets("CountTargets", in[0]));
    LOOM_ASSIGN_OR_RETURN(const DType dtype, ParseDType(attrs.Str("dtype")));
    if (!IsFloating(dtype)) return InvalidArgument("CountTargets: dtype must be a float type, got ", DTypeName(dtype));
    if (attrs.Int("classes") < 1) return InvalidArgument("CountTargets: classes must be >= 1, got ", attrs.Int("classes"));
    LOOM_ASSIGN_OR_RETURN(const int64_t r, ReplicaCountAttr("CountTargets", attrs));
    if (r == 0) return Scalar(dtype);
    if (in[0].shape.rank() < 1 || in[0].shape[0] != r)
      return InvalidArgument("CountTargets: replicas = ", r, " needs targets [", r, ", ...], got ",
                             in[0].shape.ToString());
    return std::vector<TensorType>{{Shape{r}, dtype}};
  }
};
LOOM_REGISTER_OP(CountTargetsOp);

LOOM_REGISTER_KERNEL("CountTargets", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& t = ctx.in(0);
  LOOM_ASSIGN_OR_RETURN(const std::vector<int64_t> counts,
                        CountTargets("CountTargets", t, StackedTargets(ctx.attrs->Int("replicas"), t.shape()),
                                     ctx.attrs->Int("classes"), ctx.attrs->Int("ignore_index")));
  return DispatchFloat(ctx.out(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    for (size_t r = 0; r < counts.size(); ++r) ctx.out(0).data<T>()[r] = static_cast<T>(counts[r]);
  });
});

// ---------------------------------------------------------------------- NLL

class NllOp : public LossOpDef {
 public:
  NllOp() { DeclareIgnoreIndex(DeclareReduction(DeclareAttrs())); }
  std::string name() const override { return "NLL"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, "NLL (log_probs, targets)"));
    LOOM_RETURN_IF_ERROR(ParseMeanReduction("NLL", attrs).status());
    LOOM_RETURN_IF_ERROR(CheckClassInputs("NLL", "log_probs", in[0], in[1]));
    return Scalar(in[0].dtype);
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const double samples = static_cast<double>(in[1].shape.numel());
    c.flops = samples;  // one add per sample
    // Reads one score per sample, not the whole log_probs tensor.
    c.bytes_read = samples * static_cast<double>(DTypeSize(in[0].dtype) + DTypeSize(in[1].dtype));
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    AttrMap attrs = g.attrs();
    attrs.Set("num_classes", AttrValue(ClassLayoutOf(g.type(g.input(0)).shape).classes));
    g.SetInputGrad(0, g.Emit1("NLLBackward", {g.input(1), g.output_grad(0)}, attrs));
    return Status::Ok();
  }
  // As CrossEntropy's: the batch of log_probs and targets, a partial-sum
  // loss; a mean divides by the whole batch's count.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return BatchSplit(attrs, in, out, {0, 1}, true);
  }
  Status Expand(ExpandBuilder& b) const override {
    const ValueId total = EmitSum(b, "NLL", {b.input(0), b.input(1)});
    b.SetOutput(0, b.Emit("Div", {total, EmitCount(b, b.input(1), b.input(0))}, {}, "mean").at(0));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(NllOp);

LOOM_REGISTER_KERNEL("NLL", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& lp = ctx.in(0);
  const Tensor& t = ctx.in(1);
  const ClassLayout L = ClassLayoutOf(lp.shape());
  const int64_t ignore = ctx.attrs->Int("ignore_index");
  LOOM_ASSIGN_OR_RETURN(const int64_t count, CountTargets("NLL", t, L.classes, ignore));
  return DispatchFloatIndex(lp.dtype(), t.dtype(), [&](auto zf, auto zi) {
    using T = decltype(zf);
    using I = decltype(zi);
    const T* plp = lp.data<T>();
    const I* pt = t.data<I>();
    const double total = BlockedSum(ctx.pool, L.samples(), ItemsFor(1), [&](int64_t i0, int64_t i1) {
      double sum = 0;
      for (int64_t i = i0; i < i1; ++i)
        if (pt[i] != ignore) sum -= plp[L.ScoreOffset(i) + pt[i] * L.inner];
      return sum;
    });
    ctx.out(0).data<T>()[0] = static_cast<T>(IsMeanReduction(*ctx.attrs) ? total / static_cast<double>(count) : total);
  });
});

class NllBackwardOp : public OpDef {
 public:
  NllBackwardOp() {
    DeclareIgnoreIndex(DeclareReduction(DeclareAttrs()))
        .Required("num_classes", AttrType::kInt, "C, the class dim of the forward log_probs");
  }
  std::string name() const override { return "NLLBackward"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, "NLLBackward (targets, dy)"));
    LOOM_RETURN_IF_ERROR(ParseMeanReduction("NLLBackward", attrs).status());
    LOOM_RETURN_IF_ERROR(ExpectIndexTargets("NLLBackward", in[0]));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[1], "NLLBackward dy"));
    LOOM_RETURN_IF_ERROR(ExpectScalarGrad("NLLBackward", in[1], in[1].dtype));
    const int64_t classes = attrs.Int("num_classes");
    if (classes <= 0) return InvalidArgument("NLLBackward: attribute 'num_classes' must be positive, got ", classes);
    return std::vector<TensorType>{{ScoreShapeFor(in[0].shape, classes), in[1].dtype}};
  }
  // Targets and dlog_probs by the batch, dy whole; a mean scales by the
  // whole batch's count: it expands.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    if (out[0].shape.rank() < 2) return rules;  // one sample: [C]
    DimSplit d = SplitAlong(-1, in.size(), out.size());
    d.inputs[0].axis = 0;
    d.outputs[0].axis = 0;
    d.expands = IsMeanReduction(attrs);
    rules.sample = d;
    return rules;
  }
  Status Expand(ExpandBuilder& b) const override {
    const ValueId count = EmitCount(b, b.input(0), b.attrs().Int("num_classes"), b.type(b.input(1)).dtype);
    const ValueId scaled = b.Emit("Div", {b.input(1), count}, {}, "scale").at(0);
    b.SetOutput(0, EmitSum(b, "NLLBackward", {b.input(0), scaled}));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(NllBackwardOp);

LOOM_REGISTER_KERNEL("NLLBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& t = ctx.in(0);
  Tensor& dlp = ctx.out(0);
  const ClassLayout L = ClassLayoutOf(dlp.shape());
  const int64_t ignore = ctx.attrs->Int("ignore_index");
  LOOM_ASSIGN_OR_RETURN(const int64_t count, CountTargets("NLLBackward", t, L.classes, ignore));
  return DispatchFloatIndex(dlp.dtype(), t.dtype(), [&](auto zf, auto zi) {
    using T = decltype(zf);
    using I = decltype(zi);
    const I* pt = t.data<I>();
    T* pd = dlp.data<T>();
    std::fill(pd, pd + dlp.numel(), T(0));
    const T g = -LossScale<T>(ctx.in(1), IsMeanReduction(*ctx.attrs), count);
    for (int64_t i = 0; i < L.samples(); ++i)
      if (pt[i] != ignore) pd[L.ScoreOffset(i) + pt[i] * L.inner] = g;
  });
});

// ---------------------------------------------------------------------- MSE

class MseOp : public LossOpDef {
 public:
  MseOp() { DeclareReduction(DeclareAttrs()); }
  std::string name() const override { return "MSE"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, "MSE (prediction, target)"));
    LOOM_RETURN_IF_ERROR(ParseMeanReduction("MSE", attrs).status());
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "MSE prediction"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], "MSE: prediction and target differ"));
    return Scalar(in[0].dtype);
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 3.0 * static_cast<double>(in[0].shape.numel());  // subtract, square, add
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    ValueId dp = g.Emit1("MSEBackward", {g.input(0), g.input(1), g.output_grad(0)}, g.attrs());
    g.SetInputGrad(0, dp);
    if (g.NeedsInputGrad(1)) g.SetInputGrad(1, g.Emit1("Neg", {dp}));
    return Status::Ok();
  }
  // Sample: prediction and target by the batch, a partial-sum loss; a mean
  // divides by the whole's element count: it expands.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return LossBatchSplit(attrs, in, out, 0, {0, 1}, -1, true);
  }
  Status Expand(ExpandBuilder& b) const override {
    const ValueId total = EmitSum(b, "MSE", {b.input(0), b.input(1)});
    const double n = static_cast<double>(b.type(b.input(0)).shape.numel());
    b.SetOutput(0, b.Emit("MulScalar", {total}, AttrMap{{"value", 1.0 / n}}, "mean").at(0));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(MseOp);

LOOM_REGISTER_KERNEL("MSE", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& p = ctx.in(0);
  return DispatchFloat(p.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pp = p.data<T>();
    const T* pt = ctx.in(1).data<T>();
    const double total = BlockedSum(ctx.pool, p.numel(), ItemsFor(3), [&](int64_t i0, int64_t i1) {
      double sum = 0;
      for (int64_t i = i0; i < i1; ++i) {
        const double d = static_cast<double>(pp[i]) - static_cast<double>(pt[i]);
        sum += d * d;
      }
      return sum;
    });
    ctx.out(0).data<T>()[0] =
        static_cast<T>(IsMeanReduction(*ctx.attrs) ? total / static_cast<double>(p.numel()) : total);
  });
});

class MseBackwardOp : public OpDef {
 public:
  MseBackwardOp() { DeclareReduction(DeclareAttrs()); }
  std::string name() const override { return "MSEBackward"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 3, "MSEBackward (prediction, target, dy)"));
    LOOM_RETURN_IF_ERROR(ParseMeanReduction("MSEBackward", attrs).status());
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "MSEBackward prediction"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], "MSEBackward: prediction and target differ"));
    LOOM_RETURN_IF_ERROR(ExpectScalarGrad("MSEBackward", in[2], in[0].dtype));
    return std::vector<TensorType>{in[0]};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 2.0 * static_cast<double>(in[0].shape.numel());  // subtract, multiply
    return c;
  }
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return LossBatchSplit(attrs, in, out, 0, {0, 1}, -1, false);
  }
  // Mean: the sum's gradient of dy / (the whole's element count).
  Status Expand(ExpandBuilder& b) const override {
    const double n = static_cast<double>(b.type(b.input(0)).shape.numel());
    const ValueId scaled = b.Emit("MulScalar", {b.input(2)}, AttrMap{{"value", 1.0 / n}}, "scale").at(0);
    b.SetOutput(0, EmitSum(b, "MSEBackward", {b.input(0), b.input(1), scaled}));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(MseBackwardOp);

LOOM_REGISTER_KERNEL("MSEBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& p = ctx.in(0);
  return DispatchFloat(p.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pp = p.data<T>();
    const T* pt = ctx.in(1).data<T>();
    T* pd = ctx.out(0).data<T>();
    const T scale = 2 * LossScale<T>(ctx.in(2), IsMeanReduction(*ctx.attrs), p.numel());
    ParallelRange(ctx.pool, p.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pd[i] = scale * (pp[i] - pt[i]);
    });
  });
});

// ------------------------------------------------------------ BCEWithLogits

// (logits, targets[, pos_weight]) of a BCE op with attributes `attrs`,
// checked; returns the loss's shape ([] or, fused, [R]).
StatusOr<Shape> CheckBceInputs(const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in) {
  LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], op + " logits"));
  LOOM_ASSIGN_OR_RETURN(const int64_t r, ReplicaCountAttr(op, attrs));
  Shape one = in[0].shape;  // one replica's logits
  if (r > 0) {
    if (in[0].shape.rank() < 1 || in[0].shape[0] != r)
      return InvalidArgument(op, ": replicas = ", r, " needs logits [", r, ", ...], got ", in[0].shape.ToString());
    one = Shape(std::vector<int64_t>(in[0].shape.dims().begin() + 1, in[0].shape.dims().end()));
    if (in[1].dtype != in[0].dtype || (in[1].shape != one && in[1].shape != in[0].shape))
      return InvalidArgument(op, ": targets ", in[1].ToString(), " must be ", DTypeName(in[0].dtype), " ",
                             one.ToString(), " (shared) or ", in[0].shape.ToString(), " (per replica)");
  } else {
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], op + ": logits and targets differ"));
  }
  if (in.size() == 3) {
    if (in[2].dtype != in[0].dtype)
      return InvalidArgument(op, ": pos_weight is ", DTypeName(in[2].dtype), " but logits are ", DTypeName(in[0].dtype));
    auto b = BroadcastShapes(in[2].shape, one);
    if (!b.ok() || *b != one)
      return InvalidArgument(op, ": pos_weight ", in[2].shape.ToString(), " does not broadcast to ",
                             r > 0 ? "one replica's logits " : "logits ", one.ToString(),
                             " (use [C] for C classes on the last dim)");
  }
  return r > 0 ? Shape{r} : Shape{};
}

// softplus(-x) = log(1 + exp(-x)) without overflow.
template <typename T>
T SoftplusNeg(T x) {
  return std::log1p(std::exp(-std::abs(x))) + std::max(-x, T(0));
}

// sigmoid(-x) without overflow.
template <typename T>
T SigmoidNeg(T x) {
  if (x >= 0) {
    const T e = std::exp(-x);
    return e / (1 + e);
  }
  return 1 / (1 + std::exp(x));
}

// Visits elements [row_begin, row_end) x last dim of the logits with the
// matching pos_weight offset: fn(i, w) (w is 0 when there is no pos_weight).
template <typename Fn>
void ForEachBceElement(const Shape& logits, const std::vector<int64_t>& pw_strides, int64_t row_begin, int64_t row_end,
                       Fn&& fn) {
  const std::vector<int64_t> none(logits.rank(), 0);
  ForEachBroadcast(logits, pw_strides, none, row_begin, row_end,
                   [&](int64_t o, int64_t w, int64_t, int64_t len, int64_t step, int64_t) {
                     for (int64_t j = 0; j < len; ++j) fn(o + j, w + j * step);
                   });
}

// The replicas (BceReplicas), one replica's logits in rows (last-dim
// runs), and the pos_weight strides against them.
struct BceLayout : BceReplicas {
  int64_t rows = 0, row_len = 1;
  std::vector<int64_t> pw_strides;
};

BceLayout BceLayoutOf(const KernelContext& ctx, int logits_input) {
  BceLayout L;
  static_cast<BceReplicas&>(L) =
      BceReplicasOf(*ctx.attrs, ctx.in(logits_input).shape(), ctx.in(logits_input + 1).shape());
  L.row_len = L.logits.rank() == 0 ? 1 : L.logits.dim(-1);
  L.rows = L.row_len == 0 ? 0 : L.logits.numel() / L.row_len;
  const bool has_pw = static_cast<int>(ctx.inputs.size()) > logits_input + 2;
  L.pw_strides = has_pw ? BroadcastStrides(ctx.in(logits_input + 2).shape(), L.logits)
                        : std::vector<int64_t>(L.logits.rank(), 0);
  return L;
}

// BCEWithLogits and its backward split along the batch: logits and targets
// (per-replica ones; shared ones by their own axis 0) and pos_weight when
// it has the batch's rows, by axis `lead` (1 fused); the loss a partial sum
// (`partial`) or the gradient by the batch too. A fused op also splits
// along its replicas (shared targets and pos_weight whole).
SplitRules BceSplits(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                     int logits, bool partial) {
  if (attrs.Int("replicas") == 0)
    return LossBatchSplit(attrs, in, out, logits, {logits, logits + 1}, logits + 2, partial);
  const TensorType& x = in[static_cast<size_t>(logits)];
  const bool shared_targets = in[static_cast<size_t>(logits) + 1].shape != x.shape;
  const size_t pw = static_cast<size_t>(logits) + 2;
  SplitRules rules;
  DimSplit replicas = SplitAlong(0, in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i)
    if (i != static_cast<size_t>(logits) && !(i == pw - 1 && !shared_targets)) replicas.inputs[i].axis = -1;
  rules.other.push_back(replicas);
  if (x.shape.rank() < 2 || x.shape[1] < 2) return rules;
  DimSplit d = SplitAlong(-1, in.size(), out.size());
  d.inputs[static_cast<size_t>(logits)].axis = 1;
  d.inputs[pw - 1].axis = shared_targets ? 0 : 1;
  if (pw < in.size() && in[pw].shape.rank() == x.shape.rank() - 1 && in[pw].shape[0] == x.shape[1])
    d.inputs[pw].axis = 0;
  if (!partial) d.outputs[0].axis = 1;
  d.partial_sums = partial;
  d.expands = IsMeanReduction(attrs);
  rules.sample = d;
  return rules;
}

// The element count a mean divides each replica's sum by: one replica's
// logits, those of input `logits` (its targets next).
double BceMeanCount(const ExpandBuilder& b, int logits) {
  const Shape& x = b.type(b.input(logits)).shape;
  return static_cast<double>(BceReplicasOf(b.attrs(), x, b.type(b.input(logits + 1)).shape).logits.numel());
}

class BceWithLogitsOp : public OpDef {
 public:
  BceWithLogitsOp() { DeclareLossReplicas(DeclareReduction(DeclareAttrs())); }
  std::string name() const override { return "BCEWithLogits"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (in.size() != 2 && in.size() != 3)
      return InvalidArgument("BCEWithLogits takes (logits, targets[, pos_weight]), got ", in.size(), " inputs");
    LOOM_RETURN_IF_ERROR(ParseMeanReduction("BCEWithLogits", attrs).status());
    LOOM_ASSIGN_OR_RETURN(Shape loss, CheckBceInputs("BCEWithLogits", attrs, in));
    return std::vector<TensorType>{{std::move(loss), in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    // abs, exp, log1p, max, add, (1 - t) * x, add; pos_weight adds three.
    c.flops = (in.size() == 3 ? 10.0 : 7.0) * static_cast<double>(in[0].shape.numel());
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    std::vector<ValueId> ins = {g.output_grad(0)};
    for (ValueId v : g.node().inputs) ins.push_back(v);
    const char* wrt[] = {"logits", "targets", "pos_weight"};
    for (int i = 0; i < static_cast<int>(g.node().inputs.size()); ++i) {
      if (!g.NeedsInputGrad(i)) continue;
      AttrMap attrs = g.attrs();
      attrs.Set("wrt", wrt[i]);
      ValueId d = g.Emit1("BCEWithLogitsBackward", ins, attrs);
      // pos_weight sums its broadcast, shared targets their replicas'.
      g.SetInputGrad(i, g.SumToShape(d, g.type(g.input(i)).shape));
    }
    return Status::Ok();
  }
  // R replicas' losses in one node: the logits with their replica axis
  // first, the targets shared or with theirs first too. A per-replica
  // pos_weight runs per replica.
  FusionKind fusion_kind() const override { return FusionKind::kFusedOrPerReplica; }
  Status Fuse(FusionBuilder& f) const override {
    if (f.attrs().Int("replicas") != 0) return InvalidArgument("BCEWithLogits '", f.name(), "' is fused already");
    if (f.num_inputs() == 3 && f.input(2).replicated()) return f.PerReplica();
    LOOM_ASSIGN_OR_RETURN(const FusedValue logits, f.Replicated(f.input(0), 0, f.name() + "/logits"));
    std::vector<FusedValue> inputs = {logits, f.input(1)};
    if (inputs[1].replicated()) {
      LOOM_ASSIGN_OR_RETURN(inputs[1], f.MoveAxis(inputs[1], 0, f.name() + "/targets"));
    }
    if (f.num_inputs() == 3) inputs.push_back(f.input(2));
    AttrMap attrs = f.attrs();
    attrs.Set("replicas", f.replicas());
    LOOM_ASSIGN_OR_RETURN(FusedValue loss, f.Emit1("BCEWithLogits", inputs, attrs, f.name(), ReplicaLayout::Axis(0)));
    return f.MapOutputs({loss});
  }
  // Sample: logits and targets by the batch (pos_weight when it has the
  // batch's rows), a partial-sum loss; a mean expands as MSE's.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    return BceSplits(attrs, in, out, 0, true);
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    return PartReplicaCount(attrs, in[0], in_regions[0]);
  }
  Status Expand(ExpandBuilder& b) const override {
    const ValueId total = EmitSum(b, "BCEWithLogits", b.node().inputs);
    const double n = BceMeanCount(b, 0);
    b.SetOutput(0, b.Emit("MulScalar", {total}, AttrMap{{"value", 1.0 / n}}, "mean").at(0));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(BceWithLogitsOp);

// Each replica's sum in the unfused op's blocks and order (its bits).
LOOM_REGISTER_KERNEL("BCEWithLogits", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& x = ctx.in(0);
  const BceLayout L = BceLayoutOf(ctx, 0);
  const bool has_pw = ctx.inputs.size() == 3;
  return DispatchFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pw = has_pw ? ctx.in(2).data<T>() : nullptr;
    const std::vector<double> totals =
        BlockedSums(ctx.pool, L.count, L.rows, ItemsFor(10 * L.row_len), [&](int64_t r, int64_t r0, int64_t r1) {
          const T* px = x.data<T>() + r * L.logits_stride;
          const T* pt = ctx.in(1).data<T>() + r * L.targets_stride;
          double sum = 0;
          ForEachBceElement(L.logits, L.pw_strides, r0, r1, [&](int64_t i, int64_t w) {
            const T log_weight = has_pw ? 1 + (pw[w] - 1) * pt[i] : T(1);
            sum += (1 - pt[i]) * px[i] + log_weight * SoftplusNeg(px[i]);
          });
          return sum;
        });
    const bool mean = IsMeanReduction(*ctx.attrs);
    for (int64_t r = 0; r < L.count; ++r)
      ctx.out(0).data<T>()[r] =
          static_cast<T>(mean ? totals[r] / static_cast<double>(L.logits.numel()) : totals[r]);
  });
});

class BceWithLogitsBackwardOp : public OpDef {
 public:
  BceWithLogitsBackwardOp() {
    DeclareLossReplicas(DeclareReduction(DeclareAttrs()))
        .Default("wrt", "logits", "the input differentiated: \"logits\", \"targets\" or \"pos_weight\"");
  }
  std::string name() const override { return "BCEWithLogitsBackward"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (in.size() != 3 && in.size() != 4)
      return InvalidArgument("BCEWithLogitsBackward takes (dy, logits, targets[, pos_weight]), got ", in.size(),
                             " inputs");
    LOOM_RETURN_IF_ERROR(ParseMeanReduction("BCEWithLogitsBackward", attrs).status());
    const std::vector<TensorType> rest(in.begin() + 1, in.end());
    LOOM_ASSIGN_OR_RETURN(const Shape loss, CheckBceInputs("BCEWithLogitsBackward", attrs, rest));
    if (in[0].shape != loss || in[0].dtype != in[1].dtype)
      return InvalidArgument("BCEWithLogitsBackward: dy must be ", TensorType{loss, in[1].dtype}.ToString(),
                             " (the loss's type), got ", in[0].ToString());
    const std::string wrt = attrs.Str("wrt");
    if (wrt != "logits" && wrt != "targets" && wrt != "pos_weight")
      return InvalidArgument("BCEWithLogitsBackward: attribute 'wrt' must be \"logits\", \"targets\" or \"pos_weight\", got \"",
                             wrt, "\"");
    if (wrt == "pos_weight" && in.size() != 4)
      return InvalidArgument("BCEWithLogitsBackward: wrt \"pos_weight\" needs the pos_weight input");
    return std::vector<TensorType>{in[1]};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 8.0 * static_cast<double>(in[1].shape.numel());  // exp and log1p or divide, plus a few mul/adds
    return c;
  }
  // dy whole; logits, targets (pos_weight with the batch's rows) and the
  // gradient by the batch.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules = BceSplits(attrs, in, out, 1, false);
    for (DimSplit& d : rules.other) d.inputs[0].axis = 0;  // dy [R] along the replicas
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    return PartReplicaCount(attrs, in[1], in_regions[1]);
  }
  Status Expand(ExpandBuilder& b) const override {
    const double n = BceMeanCount(b, 1);
    std::vector<ValueId> inputs = b.node().inputs;
    inputs[0] = b.Emit("MulScalar", {b.input(0)}, AttrMap{{"value", 1.0 / n}}, "scale").at(0);
    b.SetOutput(0, EmitSum(b, "BCEWithLogitsBackward", inputs));
    return Status::Ok();
  }
};
LOOM_REGISTER_OP(BceWithLogitsBackwardOp);

enum class BceWrt { kLogits, kTargets, kPosWeight };

LOOM_REGISTER_KERNEL("BCEWithLogitsBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  const Tensor& x = ctx.in(1);
  const BceLayout L = BceLayoutOf(ctx, 1);
  const bool has_pw = ctx.inputs.size() == 4;
  const std::string wrt_name = ctx.attrs->Str("wrt");
  const BceWrt wrt = wrt_name == "targets" ? BceWrt::kTargets : wrt_name == "pos_weight" ? BceWrt::kPosWeight : BceWrt::kLogits;
  const bool mean = IsMeanReduction(*ctx.attrs);
  return DispatchFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pw = has_pw ? ctx.in(3).data<T>() : nullptr;
    // Rows of every replica in one range: q = r * rows + row.
    ParallelRange(ctx.pool, L.count * L.rows, [&](int64_t q0, int64_t q1) {
      for (int64_t r = q0 / L.rows; r < L.count && r * L.rows < q1; ++r) {
        const T* px = x.data<T>() + r * L.logits_stride;
        const T* pt = ctx.in(2).data<T>() + r * L.targets_stride;
        T* pd = ctx.out(0).data<T>() + r * L.logits_stride;
        const T scale = LossScale<T>(ctx.in(0), mean, L.logits.numel(), r);
        const int64_t first = std::max(q0, r * L.rows) - r * L.rows, end = std::min(q1, (r + 1) * L.rows) - r * L.rows;
        ForEachBceElement(L.logits, L.pw_strides, first, end, [&](int64_t i, int64_t w) {
          const T weight = has_pw ? pw[w] : T(1);
          switch (wrt) {
            case BceWrt::kLogits:  // (1 - t) - log_weight * sigmoid(-x)
              pd[i] = scale * ((1 - pt[i]) - (1 + (weight - 1) * pt[i]) * SigmoidNeg(px[i]));
              break;
            case BceWrt::kTargets:  // -x + (pos_weight - 1) * softplus(-x)
              pd[i] = scale * (-px[i] + (has_pw ? (weight - 1) * SoftplusNeg(px[i]) : T(0)));
              break;
            case BceWrt::kPosWeight:  // t * softplus(-x)
              pd[i] = scale * pt[i] * SoftplusNeg(px[i]);
              break;
          }
        });
      }
    }, ItemsFor(8 * L.row_len));
  });
});

}  // namespace
}  // namespace loom
