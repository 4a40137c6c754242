// BatchNorm (1d and 2d in one op) and LayerNorm, with PyTorch semantics, and
// their dedicated backward ops, which reuse the statistics the forward pass
// saved instead of recomputing them.
//
// BatchNorm: inputs (x [N, C] | [N, C, L] | [N, C, H, W], gamma [C], beta [C],
// running_mean [C], running_var [C]); attrs training (default false, as
// torch.nn.functional.batch_norm), momentum (0.1), eps (1e-5). Outputs
// (y, new_running_mean, new_running_var, saved_mean [C], saved_invstd [C]).
// Training normalizes with the batch statistics (biased variance) and moves
// the running statistics towards the batch mean and UNBIASED variance; eval
// normalizes with the running statistics and passes them through. The saved
// statistics are what the normalization used (batch or running), so the
// backward op reads them the same way in both modes. Only y is
// differentiable; outputs 1..4 are treated as constants by autodiff. Attr
// activation "relu", "relu6" or "hardswish" (default "none") applies that
// activation to y in the same pass: the executors fold such an activation
// that alone reads y into it (runtime/fold_activations.h), which saves its
// pass over the activations. y = x * scale + shift per channel, with scale
// and shift made from the saved statistics (BatchNormAffine), so that
// BatchNormBackward with the same activation rebuilds each pre-activation
// value, and so the activation's gradient, from x and beta, bit for bit,
// instead of reading y.
//
// LayerNorm: inputs (x[, gamma[, beta]]) with gamma and beta shaped like
// attr normalized_shape (the last k dims of x); eps (1e-5). Outputs (y,
// saved_mean, saved_rstd), both saved statistics shaped like x's leading
// dims. Only y is differentiable. A fused array's LayerNorm (graph/fusion.h)
// names x's replica dim (attrs replica_dim, per_replica: the dim holds R
// blocks of per_replica) and takes gamma and beta [R, normalized_shape],
// each row normalized by its replica's.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/activation_formulas.h"
#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/norm_geometry.h"
#include "ops/op.h"

namespace loom {
namespace {

// Element-wise work per parallel chunk, as in ParallelRange.
constexpr int64_t kGrain = 32768;

// Items per chunk when each item costs `work` elements.
int64_t GrainFor(int64_t work) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work)); }

double Bytes(const TensorType& t) { return static_cast<double>(t.shape.numel() * DTypeSize(t.dtype)); }

Status ExpectEps(const std::string& op, double eps) {
  if (!(eps > 0) || !std::isfinite(eps)) return InvalidArgument(op, ": attribute eps must be positive, got ", eps);
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// BatchNorm

// Channels [c0, c1): the BatchNorm kernels' passes work on all channels,
// or a block of them at a time (ForEachChannelBlock).
struct ChannelRange {
  int64_t c0, c1;
  int64_t size() const { return c1 - c0; }
};
ChannelRange AllChannels(const ChannelLayout& l) { return {0, l.c}; }

// Calls fn(n, c, offset, length) for every plane n * C + c of the range's
// channels, the contiguous runs of channel elements, in parallel. The
// channel is counted along rather than divided out per plane (late layers
// have tens of thousands of planes of a few elements each).
template <typename Fn>
void ForEachPlane(const ChannelLayout& l, ThreadPool* pool, ChannelRange r, Fn&& fn) {
  const int64_t w = r.size();
  if (w == 0) return;  // no channels: no planes (and no division by zero)
  ParallelRange(pool, l.n * w, [&](int64_t q0, int64_t q1) {
    int64_t n = q0 / w, c = r.c0 + q0 % w;
    for (int64_t q = q0; q < q1; ++q) {
      fn(n, c, (n * l.c + c) * l.s, l.s);
      if (++c == r.c1) c = r.c0, ++n;
    }
  }, GrainFor(l.s));
}

// Calls fn(range) for blocks of channels: all of them, or where the
// tensors a channel's elements live in (`bytes` per element) outgrow
// kBlockBytes, blocks of that size. A kernel's passes, the sums and then
// the element-wise one, run over a block before the next, so that the
// second pass reads the block from cache rather than memory. A channel's
// results do not depend on the blocks: its planes' sums are added in
// batch order, and each element's pass is its own. (Blocks of whole rows
// x[n, c0:c1, :], not single channels, whose N planes lie an image apart:
// one long contiguous run per image is what the prefetcher follows.)
constexpr int64_t kBlockBytes = 8 << 20;
template <typename Fn>
void ForEachChannelBlock(const ChannelLayout& l, int64_t bytes, Fn&& fn) {
  const int64_t per_channel = std::max<int64_t>(1, l.per_channel() * bytes);
  const int64_t block = l.s < kSumLanes ? l.c : std::max<int64_t>(1, kBlockBytes / per_channel);
  for (int64_t c0 = 0; c0 < l.c; c0 += block) fn(ChannelRange{c0, std::min(l.c, c0 + block)});
}

// Channel sums of one term over channels [c0, c1) (into out[c - c0]) when
// planes are shorter than kSumLanes (late layers' 2x2 and 1x1 maps; [N, C]
// inputs), in the order ChannelSums promises, walking rows x[n, c0:c1, :]
// so that neighbouring channels are summed side by side.
template <typename Term>
void SmallPlaneSums(const ChannelLayout& l, int64_t c0, int64_t c1, const Term& term, double* out) {
  const int64_t w = c1 - c0;
  if (l.s == 1) {  // LaneSum over the batch: sample i in lane i mod kSumLanes, then the tail, then the lanes
    const int64_t full = l.n - l.n % kSumLanes;
    std::vector<double> lanes(static_cast<size_t>(kSumLanes * w), 0.0);
    for (int64_t i = 0; i < full; ++i) {
      double* lane = lanes.data() + (i % kSumLanes) * w;
      const int64_t row = i * l.c;
      for (int64_t c = c0; c < c1; ++c) lane[c - c0] += term(row + c, c);
    }
    for (int64_t c = c0; c < c1; ++c) {
      double sum = 0;
      for (int64_t i = full; i < l.n; ++i) sum += term(i * l.c + c, c);
      for (int lane = 0; lane < kSumLanes; ++lane) sum += lanes[static_cast<size_t>(lane * w + c - c0)];
      out[c - c0] = sum;
    }
    return;
  }
  // Each plane summed from its first element (what LaneSum does with fewer
  // than kSumLanes), its sum added to its channel's in batch order. The
  // channels are the inner loop, each with its own running sums, so that
  // they go side by side in vector lanes (a plane's 2-7 elements do not).
  auto planes = [&](auto size) {
    constexpr int64_t kS = decltype(size)::value;
    std::fill(out, out + w, 0.0);
    std::vector<double> plane(static_cast<size_t>(w));
    for (int64_t i = 0; i < l.n; ++i) {
      std::fill(plane.begin(), plane.end(), 0.0);
      const int64_t row = (i * l.c + c0) * kS;
      for (int64_t j = 0; j < kS; ++j)
        for (int64_t c = 0; c < w; ++c) plane[c] += term(row + c * kS + j, c0 + c);
      for (int64_t c = 0; c < w; ++c) out[c] += plane[c];
    }
  };
  switch (l.s) {
    case 0: return std::fill(out, out + w, 0.0);  // empty planes
    case 2: return planes(std::integral_constant<int64_t, 2>());
    case 3: return planes(std::integral_constant<int64_t, 3>());
    case 4: return planes(std::integral_constant<int64_t, 4>());
    case 5: return planes(std::integral_constant<int64_t, 5>());
    case 6: return planes(std::integral_constant<int64_t, 6>());
    default: return planes(std::integral_constant<int64_t, 7>());  // l.s < kSumLanes
  }
}

// Planes of kSumLanes to kRowPlaneMax elements (MobileNetV3's 4x4 maps):
// a task takes a block of channels, kRowBlockElems positions of a row x[n,
// c0:c1, :], and walks the images in order, adding each element's terms
// into its position's running sums (contiguous, in vector lanes); then each
// channel's sums are its positions' sums in order. A task per plane costs
// more than a 4x4 plane's arithmetic (a [32, 672, 4, 4] map has 21,504
// planes): BatchNorm 1.30x and its backward 1.55x faster there. On 8x8
// planes the per-plane sums stayed faster (0.109 against 0.174 ms), and on
// 2x2 ones SmallPlaneSums (0.117 against 0.156 ms; docs/benchmarks.md,
// "BatchNorm on 4x4 maps"). The order, per position over the batch, then
// the positions, depends on the geometry only.
constexpr int64_t kRowPlaneMax = 16;
constexpr int64_t kRowBlockElems = 512;

template <size_t... kK, typename... Terms>
void AddTerms(std::index_sequence<kK...>, double* const* sums, int64_t at, int64_t i, int64_t c,
              const Terms&... terms) {
  ((sums[kK][at] += terms(i, c)), ...);
}

template <typename Sums, typename... Terms>
void RowSums(const ChannelLayout& l, ThreadPool* pool, ChannelRange r, std::vector<Sums>& channel,
             const Terms&... terms) {
  constexpr size_t kTerms = sizeof...(Terms);
  const int64_t block = std::max<int64_t>(1, kRowBlockElems / l.s);
  const int64_t tasks = (r.size() + block - 1) / block;
  WithSmallExtent(l.s, [&](auto size) {
    const int64_t s = size;
    ParallelRange(pool, tasks, [&](int64_t t0, int64_t t1) {
      std::vector<double> buffer(static_cast<size_t>(kTerms * block * s));
      double* sums[kTerms];
      for (size_t k = 0; k < kTerms; ++k) sums[k] = buffer.data() + k * block * s;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t c0 = r.c0 + t * block, c1 = std::min(r.c1, c0 + block);
        std::fill(buffer.begin(), buffer.end(), 0.0);
        for (int64_t n = 0; n < l.n; ++n) {
          const int64_t row = (n * l.c + c0) * s;
          for (int64_t c = c0; c < c1; ++c)
            for (int64_t j = (c - c0) * s; j < (c - c0 + 1) * s; ++j)
              AddTerms(std::index_sequence_for<Terms...>(), sums, j, row + j, c, terms...);
        }
        for (int64_t c = c0; c < c1; ++c)
          for (size_t k = 0; k < kTerms; ++k) {
            double total = 0;
            for (int64_t j = (c - c0) * s; j < (c - c0 + 1) * s; ++j) total += sums[k][j];
            channel[static_cast<size_t>(c - r.c0)][k] = total;
          }
      }
    }, 1);
  });
}

// Per channel c of the range, the sums over its elements of each
// term(offset, c), in double, at c - c0: planes shorter than kSumLanes as
// SmallPlaneSums does; planes of up to kRowPlaneMax elements as RowSums
// does; larger ones each plane's LaneSum, added per channel in batch
// order. So the result does not depend on threads. Planes are summed in
// memory order (a channel's planes lie a whole batch item apart: walking
// them channel by channel defeats the prefetcher).
template <typename... Terms>
std::vector<std::array<double, sizeof...(Terms)>> ChannelSums(const ChannelLayout& l, ThreadPool* pool,
                                                              ChannelRange r, const Terms&... terms) {
  using Sums = std::array<double, sizeof...(Terms)>;
  const int64_t w = r.size();
  std::vector<Sums> channel(w, Sums{});
  if (l.s >= kSumLanes && l.s <= kRowPlaneMax) {
    RowSums(l, pool, r, channel, terms...);
    return channel;
  }
  if (l.s < kSumLanes) {
    ParallelRange(pool, w, [&](int64_t i0, int64_t i1) {
      const int64_t c0 = r.c0 + i0, c1 = r.c0 + i1;
      std::vector<double> sums(static_cast<size_t>(c1 - c0));
      size_t k = 0;
      auto one_term = [&](const auto& term) {
        SmallPlaneSums(l, c0, c1, term, sums.data());
        for (int64_t c = c0; c < c1; ++c) channel[c - r.c0][k] = sums[static_cast<size_t>(c - c0)];
        ++k;
      };
      (one_term(terms), ...);
    }, GrainFor(l.per_channel()));
    return channel;
  }
  std::vector<Sums> plane(l.n * w);
  ForEachPlane(l, pool, r, [&](int64_t n, int64_t c, int64_t o, int64_t len) {
    plane[n * w + c - r.c0] = {LaneSum<double>(len, [&](int64_t j) { return terms(o + j, c); })...};
  });
  for (int64_t i = 0; i < l.n; ++i)
    for (int64_t c = 0; c < w; ++c)
      for (size_t k = 0; k < channel[c].size(); ++k) channel[c][k] += plane[i * w + c][k];
  return channel;
}

// An element-wise pass over the range's channels whose constants are per
// channel (`consts`, each [c1 - c0], from channel c0 on): fn(o, len, at)
// computes the elements [o, o + len), with at(i, j) the i-th constant of
// element o + j. Planes of kSumLanes or more elements are runs of one
// channel; smaller planes (2x2, 1x1 maps) go along whole rows x[n, c0:c1,
// :] with each constant repeated per element, since a loop of 1-4 elements
// per plane does not vectorise.
template <typename T, size_t K, typename Fn>
void ChannelPass(const ChannelLayout& l, ThreadPool* pool, ChannelRange r, const std::array<const T*, K>& consts,
                 Fn&& fn) {
  if (l.s < kSumLanes) {
    std::array<std::vector<T>, K> rows;
    for (size_t i = 0; i < K; ++i) {
      rows[i].reserve(static_cast<size_t>(r.size() * l.s));
      for (int64_t c = 0; c < r.size(); ++c) rows[i].insert(rows[i].end(), static_cast<size_t>(l.s), consts[i][c]);
    }
    const int64_t row = r.size() * l.s;
    ParallelRange(pool, l.n, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n)
        fn((n * l.c + r.c0) * l.s, row, [&](size_t i, int64_t j) { return rows[i][static_cast<size_t>(j)]; });
    }, GrainFor(row));
    return;
  }
  ForEachPlane(l, pool, r, [&](int64_t, int64_t c, int64_t o, int64_t len) {
    std::array<T, K> v;
    for (size_t i = 0; i < K; ++i) v[i] = consts[i][c - r.c0];
    fn(o, len, [&](size_t i, int64_t) { return v[i]; });
  });
}

const char* const kBatchNormInputs[] = {"x", "gamma", "beta", "running_mean", "running_var"};

// BatchNorm's ops split along the channels: axis 1 of x, dy and the [2, C]
// sums, axis 0 of every per-channel [C] tensor. Each channel's statistics
// are its own, so the parts are exact.
DimSplit ChannelsOf(const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  DimSplit d = SplitAlong(0, in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) d.inputs[i].axis = in[i].shape.rank() == 1 ? 0 : 1;
  for (size_t i = 0; i < out.size(); ++i) d.outputs[i].axis = out[i].shape.rank() == 1 ? 0 : 1;
  return d;
}

// Attr activation of the BatchNorm ops: an activation done in their own
// passes (the executors fold a following ReLU, ReLU6 or Hardswish into
// them).
enum class Epilogue { kNone, kRelu, kRelu6, kHardswish };

Epilogue EpilogueOf(const AttrMap& attrs) {
  const std::string a = attrs.Str("activation", "none");
  if (a == "relu") return Epilogue::kRelu;
  if (a == "relu6") return Epilogue::kRelu6;
  if (a == "hardswish") return Epilogue::kHardswish;
  return Epilogue::kNone;
}
bool HasEpilogue(const AttrMap& attrs) { return EpilogueOf(attrs) != Epilogue::kNone; }

Status ExpectActivation(const std::string& op, const AttrMap& attrs) {
  const std::string activation = attrs.Str("activation");
  if (activation != "none" && EpilogueOf(attrs) == Epilogue::kNone)
    return InvalidArgument(op, ": attribute activation must be \"none\", \"relu\", \"relu6\" or \"hardswish\", got \"",
                           activation, "\"");
  return Status::Ok();
}

// With an activation, input `beta` (the BatchNorm's, which the mask is
// rebuilt with) is shaped like gamma (input 2).
Status ExpectMaskInput(const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in, size_t beta,
                       const std::string& signature) {
  LOOM_RETURN_IF_ERROR(ExpectActivation(op, attrs));
  if (!HasEpilogue(attrs)) return ExpectInputs(in, static_cast<int>(beta), op + " (" + signature + ")");
  LOOM_RETURN_IF_ERROR(
      ExpectInputs(in, static_cast<int>(beta) + 1, op + " with the activation's mask (" + signature + ", beta)"));
  return ExpectSameType(in[2], in[beta], op + ": gamma and beta differ");
}

const char* const kActivationDoc =
    "\"relu\", \"relu6\" or \"hardswish\": that activation applied to y in the same pass";
const char* const kMaskDoc =
    "\"relu\", \"relu6\" or \"hardswish\": dy is the activation's output gradient, taken first through the "
    "activation's backward at the pre-activation value z, rebuilt from x and the last input, beta, as the forward "
    "pass made it";

class BatchNormOp : public OpDef {
 public:
  BatchNormOp() {
    DeclareAttrs()
        .Default("training", false, "normalize with the batch's statistics and update the running ones")
        .Default("momentum", 0.1, "weight of the batch statistics in the running-statistics update")
        .Default("eps", 1e-5, "added to the variance")
        .Default("activation", "none", kActivationDoc);
  }
  std::string name() const override { return "BatchNorm"; }
  // Parameter: the channels (axis 1 of x and y, every per-channel tensor's
  // rows); statistics are per channel, so the parts are exact. Sample: the
  // batch of x and y, every per-channel tensor whole. In eval that is
  // exact as it is; in training the parts need the batch's statistics, so
  // the split expands (Expand: partial sums, all-reduced, then each part
  // normalizes with the whole batch's statistics, as SyncBatchNorm does).
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    rules.parameter = ChannelsOf(in, out);
    rules.sample = SplitAlong(-1, in.size(), out.size());
    rules.sample->inputs[0].axis = 0;
    rules.sample->outputs[0].axis = 0;
    rules.sample->expands = attrs.Bool("training");
    return rules;
  }
  // Training: BatchNormPivot (the kernel's pivot, the batch's first value
  // per channel), BatchNormStats (per-part sums around it) and
  // BatchNormApply (the statistics of their all-reduced total): the parts
  // compute what the whole kernel does, up to the order of the sums.
  Status Expand(ExpandBuilder& b) const override {
    const int64_t count = ChannelLayoutOf(b.type(b.input(0)).shape).per_channel();
    const ValueId pivot = b.Emit("BatchNormPivot", {b.input(0)}, {}, "pivot").at(0);
    const ValueId sums = b.Emit("BatchNormStats", {b.input(0), pivot}, {}, "stats").at(0);
    const std::vector<ValueId> outs =
        b.Emit("BatchNormApply", {b.input(0), b.input(1), b.input(2), b.input(3), b.input(4), sums, pivot},
               AttrMap{{"momentum", b.attrs().Float("momentum")},
                       {"eps", b.attrs().Float("eps")},
                       {"count", count},
                       {"activation", b.attrs().Str("activation", "none")}},
               "apply");
    for (size_t i = 0; i < outs.size(); ++i) b.SetOutput(static_cast<int>(i), outs[i]);
    return Status::Ok();
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 5, "BatchNorm (x, gamma, beta, running_mean, running_var)"));
    LOOM_RETURN_IF_ERROR(ExpectActivation("BatchNorm", attrs));
    const TensorType& x = in[0];
    LOOM_RETURN_IF_ERROR(ExpectFloat(x, "BatchNorm x"));
    if (x.shape.rank() < 2 || x.shape.rank() > 4)
      return InvalidArgument("BatchNorm x must be [N, C], [N, C, L] or [N, C, H, W], got ", x.shape.ToString());
    const Shape channels{x.shape[1]};
    for (int i = 1; i < 5; ++i) {
      if (in[i].shape != channels || in[i].dtype != x.dtype)
        return InvalidArgument("BatchNorm ", kBatchNormInputs[i], " (input ", i, ") must be ", channels.ToString(), " ",
                               DTypeName(x.dtype), " to match x ", x.ToString(), ", got ", in[i].ToString());
    }
    const double momentum = attrs.Float("momentum");
    if (!(momentum >= 0 && momentum <= 1))
      return InvalidArgument("BatchNorm: attribute momentum must be in [0, 1], got ", momentum);
    LOOM_RETURN_IF_ERROR(ExpectEps("BatchNorm", attrs.Float("eps")));
    if (attrs.Bool("training") && ChannelLayoutOf(x.shape).per_channel() < 2)
      return InvalidArgument("BatchNorm: training needs more than one value per channel, got x ", x.shape.ToString());
    TensorType stat{channels, x.dtype};
    return std::vector<TensorType>{x, stat, stat, stat, stat};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const double n = static_cast<double>(in[0].shape.numel()), channels = static_cast<double>(in[0].shape[1]);
    if (a.Bool("training")) {
      // shifted sum (2), square-sum (2), scale and shift (2) per element;
      // per channel: mean, variances, invstd, running updates, scale, shift.
      c.flops = 6 * n + 14 * channels;
      c.bytes_read += Bytes(in[0]);  // x is read by two passes (statistics, normalize)
    } else {
      c.flops = 2 * n + 6 * channels;
    }
    if (HasEpilogue(a)) c.flops += n;
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    const ValueId dy = g.output_grad(0);
    if (dy == kNoValue) return Status::Ok();  // only the (non-differentiable) statistics are used
    // With an activation, the backward op takes dy through its gradient
    // itself, at the pre-activation values it rebuilds with beta (y holds
    // the activated ones).
    std::vector<ValueId> inputs{dy, g.input(0), g.input(1), g.output(3), g.output(4)};
    AttrMap attrs{{"training", g.attrs().Bool("training")}};
    if (HasEpilogue(g.attrs())) {
      inputs.push_back(g.input(2));
      attrs.Set("activation", g.attrs().Str("activation"));
    }
    std::vector<ValueId> grads = g.Emit("BatchNormBackward", inputs, attrs);
    for (int i = 0; i < 3; ++i) g.SetInputGrad(i, grads[i]);
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // BatchNorm over R*C channels; the per-channel outputs come back [R, C].
  Status Fuse(FusionBuilder& f) const override {
    const Shape xs = f.SingleShape(f.input(0));
    const int64_t c = xs[1];
    LOOM_ASSIGN_OR_RETURN(FusedValue x, f.MergeIntoDim1(f.input(0), f.name() + "/x"));
    std::vector<FusedValue> ins = {x};
    for (int i = 1; i < f.num_inputs(); ++i) {
      const std::string pname = f.name() + "/param" + std::to_string(i);
      LOOM_ASSIGN_OR_RETURN(FusedValue p, f.Replicated(f.input(i), 0, pname));
      LOOM_ASSIGN_OR_RETURN(
          p, f.Reshape(p, Shape({f.replicas() * c}), ReplicaLayout::Merged(0, c), pname + "/stacked"));
      ins.push_back(p);
    }
    std::vector<ReplicaLayout> merged(f.node().outputs.size(), ReplicaLayout::Merged(0, c));
    merged[0] = ReplicaLayout::Merged(1, c);
    LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit("BatchNorm", ins, f.attrs(), f.name(), merged));
    std::vector<FusedValue> split;
    LOOM_ASSIGN_OR_RETURN(FusedValue y, f.Reshape(outs[0], f.WithReplicaAxis(xs, 1), ReplicaLayout::Axis(1),
                                                  f.name() + "/split_replicas"));
    split.push_back(y);
    for (size_t i = 1; i < outs.size(); ++i) {
      LOOM_ASSIGN_OR_RETURN(FusedValue s, f.Reshape(outs[i], Shape({f.replicas(), c}), ReplicaLayout::Axis(0),
                                                    f.name() + "/stat" + std::to_string(i)));
      split.push_back(s);
    }
    return f.MapOutputs(split);
  }
};
LOOM_REGISTER_OP(BatchNormOp);

// y = x * scale + shift's coefficients of one channel, from its saved
// statistics as stored (rounded to T), not the double values they were
// rounded from: the backward ops rebuild y's pre-activation values from
// the same four numbers by the same arithmetic (ForwardAffine).
template <typename T>
void BatchNormAffine(T gamma, T beta, T saved_mean, T saved_invstd, T* scale, T* shift) {
  const double g = gamma, is = saved_invstd;
  *scale = static_cast<T>(g * is);
  *shift = static_cast<T>(static_cast<double>(beta) - static_cast<double>(saved_mean) * g * is);
}

// The pre-activation value of one element: what BatchNorm's pass computes
// from x (and, with an epilogue, applies the activation to).
template <typename T>
inline T Normalized(T x, T scale, T shift) {
  return x * scale + shift;
}

// The rest of BatchNorm once the batch's sums are known, for the range's
// channels: outputs 1..4 and y from inputs 0..4 (x, gamma, beta,
// running_mean, running_var). In training, sums[c - c0] = {sum of d, sum
// of d^2} over the m values of channel c, d = x - pivot[c]: centred on a
// value near the mean, squares - sum^2 / m cancels as little as a second
// pass around the mean would, even for large means, and x is read once
// less. Eval ignores them.
template <typename T>
void FinishBatchNorm(const KernelContext& ctx, const ChannelLayout& l, ChannelRange r, bool training,
                     const std::vector<double>& pivot, const std::vector<std::array<double, 2>>& sums, double m) {
  const double momentum = ctx.attrs->Float("momentum"), eps = ctx.attrs->Float("eps");
  const T* px = ctx.in(0).data<T>();        // [N, C, S]
  const T* gamma = ctx.in(1).data<T>();     // [C]
  const T* beta = ctx.in(2).data<T>();      // [C]
  const T* run_mean = ctx.in(3).data<T>();  // [C]
  const T* run_var = ctx.in(4).data<T>();   // [C]
  T* y = ctx.out(0).data<T>();              // [N, C, S]
  T* new_mean = ctx.out(1).data<T>();       // [C]
  T* new_var = ctx.out(2).data<T>();        // [C]
  T* save_mean = ctx.out(3).data<T>();      // [C]
  T* save_invstd = ctx.out(4).data<T>();    // [C]
  std::vector<T> scale(r.size()), shift(r.size());  // y = x * scale + shift per channel, from c0 on
  for (int64_t c = r.c0; c < r.c1; ++c) {
    double mean, invstd;
    if (training) {
      const std::array<double, 2>& sum = sums[c - r.c0];
      mean = pivot[c] + sum[0] / m;
      const double squares = std::max(0.0, sum[1] - sum[0] * sum[0] / m);
      invstd = 1.0 / std::sqrt(squares / m + eps);
      const double unbiased = squares / (m - 1);
      new_mean[c] = static_cast<T>((1 - momentum) * run_mean[c] + momentum * mean);
      new_var[c] = static_cast<T>((1 - momentum) * run_var[c] + momentum * unbiased);
    } else {
      mean = run_mean[c];
      invstd = 1.0 / std::sqrt(static_cast<double>(run_var[c]) + eps);
      new_mean[c] = run_mean[c];
      new_var[c] = run_var[c];
    }
    save_mean[c] = static_cast<T>(mean);
    save_invstd[c] = static_cast<T>(invstd);
    BatchNormAffine(gamma[c], beta[c], save_mean[c], save_invstd[c], &scale[c - r.c0], &shift[c - r.c0]);
  }
  // With an epilogue, each value as the activation's kernel would make it
  // from the plain one (the same bits as the two ops apart).
  const Epilogue epilogue = EpilogueOf(*ctx.attrs);
  ChannelPass<T, 2>(l, ctx.pool, r, {scale.data(), shift.data()}, [&](int64_t o, int64_t len, const auto& at) {
    switch (epilogue) {
      case Epilogue::kNone:
        for (int64_t j = 0; j < len; ++j) y[o + j] = Normalized(px[o + j], at(0, j), at(1, j));
        break;
      case Epilogue::kRelu:
        for (int64_t j = 0; j < len; ++j) y[o + j] = activation::Relu(Normalized(px[o + j], at(0, j), at(1, j)));
        break;
      case Epilogue::kRelu6:
        for (int64_t j = 0; j < len; ++j) y[o + j] = activation::Relu6(Normalized(px[o + j], at(0, j), at(1, j)));
        break;
      case Epilogue::kHardswish:
        for (int64_t j = 0; j < len; ++j)
          y[o + j] = activation::Hardswish(Normalized(px[o + j], at(0, j), at(1, j)));
        break;
    }
  });
}

// Per channel of the range, {sum of d, sum of d^2} with d = x - pivot[c].
template <typename T>
std::vector<std::array<double, 2>> PivotedSums(const ChannelLayout& l, ThreadPool* pool, ChannelRange r, const T* px,
                                               const std::vector<double>& pivot) {
  return ChannelSums(
      l, pool, r, [&](int64_t i, int64_t c) { return px[i] - pivot[c]; },
      [&](int64_t i, int64_t c) {
        const double d = px[i] - pivot[c];
        return d * d;
      });
}

LOOM_REGISTER_KERNEL("BatchNorm", DeviceType::kCpu, [](KernelContext& ctx) {
  const bool training = ctx.attrs->Bool("training");
  const ChannelLayout l = ChannelLayoutOf(ctx.in(0).shape());
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = ctx.in(0).data<T>();
    // The pivot: the channel's first value.
    std::vector<double> pivot(training ? l.c : 0);
    for (size_t c = 0; c < pivot.size(); ++c) pivot[c] = px[c * l.s];
    // x is read by both passes.
    ForEachChannelBlock(l, sizeof(T), [&](ChannelRange r) {
      std::vector<std::array<double, 2>> sums;
      if (training) sums = PivotedSums(l, ctx.pool, r, px, pivot);
      FinishBatchNorm<T>(ctx, l, r, training, pivot, sums, static_cast<double>(l.per_channel()));
    });
  });
});

// BatchNormBackward: (dy, x, gamma, saved_mean, saved_invstd[, beta]) ->
// (dx, dgamma, dbeta); attr training says whether the statistics were the
// batch's (then they depend on x) or the running ones (then they are
// constants). With attr activation (the forward's, folded), dy is the
// activation's output gradient, and beta rebuilds its mask.
class BatchNormBackwardOp : public OpDef {
 public:
  BatchNormBackwardOp() {
    DeclareAttrs()
        .Required("training", AttrType::kBool, "the forward op's: whether the statistics were the batch's")
        .Default("activation", "none", kMaskDoc);
  }
  std::string name() const override { return "BatchNormBackward"; }
  // As BatchNorm's. Sample in eval: dgamma and dbeta are partial sums over
  // the batch; in training dx needs the whole batch's sums: it expands.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    rules.parameter = ChannelsOf(in, out);
    rules.sample = SplitAlong(-1, in.size(), out.size());
    rules.sample->inputs[0].axis = rules.sample->inputs[1].axis = rules.sample->outputs[0].axis = 0;
    rules.sample->partial_sums = true;
    rules.sample->expands = attrs.Bool("training");
    return rules;
  }
  // Training: BatchNormBackwardStats (per-part sums) and
  // BatchNormBackwardApply (dx, dgamma and dbeta from their total), each
  // masking dy as this node does.
  Status Expand(ExpandBuilder& b) const override {
    const int64_t count = ChannelLayoutOf(b.type(b.input(1)).shape).per_channel();
    const std::string activation = b.attrs().Str("activation", "none");
    std::vector<ValueId> stats_in{b.input(0), b.input(1), b.input(2), b.input(3), b.input(4)};
    if (HasEpilogue(b.attrs())) stats_in.push_back(b.input(5));
    const ValueId sums = b.Emit("BatchNormBackwardStats", stats_in, AttrMap{{"activation", activation}}, "stats").at(0);
    std::vector<ValueId> apply_in{b.input(0), b.input(1), b.input(2), b.input(3), b.input(4), sums};
    if (HasEpilogue(b.attrs())) apply_in.push_back(b.input(5));
    const std::vector<ValueId> outs = b.Emit("BatchNormBackwardApply", apply_in,
                                             AttrMap{{"count", count}, {"activation", activation}}, "apply");
    for (size_t i = 0; i < outs.size(); ++i) b.SetOutput(static_cast<int>(i), outs[i]);
    return Status::Ok();
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(
        ExpectMaskInput("BatchNormBackward", attrs, in, 5, "dy, x, gamma, saved_mean, saved_invstd"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "BatchNormBackward dy"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], "BatchNormBackward: dy and x differ"));
    if (in[1].shape.rank() < 2) return InvalidArgument("BatchNormBackward: x must be [N, C, ...], got ", in[1].shape.ToString());
    const TensorType stat{Shape{in[1].shape[1]}, in[1].dtype};
    for (int i = 2; i < 5; ++i)
      LOOM_RETURN_IF_ERROR(ExpectSameType(in[i], stat, "BatchNormBackward input " + std::to_string(i) + " vs [C]"));
    return std::vector<TensorType>{in[1], stat, stat};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const double n = static_cast<double>(in[0].shape.numel());
    // Reductions: dy (1), xhat (2), dy * xhat (2); dx: xhat (2) and the
    // correction (4) in training, one multiply in eval.
    c.flops = a.Bool("training") ? 11 * n : 6 * n;
    c.bytes_read += Bytes(in[0]) + Bytes(in[1]);  // dy and x are read by two passes
    if (in.size() > 5) c.flops += 4 * n;  // z for the mask, in both passes
    return c;
  }
};
LOOM_REGISTER_OP(BatchNormBackwardOp);

// dy as the backward kernels read it, dy(i, scale, shift) for element i of
// a channel whose forward pass had coefficients scale and shift: as given
// (PlainDy), or masked by the folded activation's gradient (RebuiltMaskDy).
template <typename T>
struct PlainDy {
  const T* dy;
  T operator()(int64_t i, T, T) const { return dy[i]; }
};
// dy where the activation's gradient is 1, else +0: ReLU's z > 0, ReLU6's
// 0 < z < 6 at the pre-activation value z, rebuilt from x as the forward
// pass computed it (the same bits), which is where ReLUBackward's y > 0
// and ReLU6Backward's 0 < y < 6 select. An AND of dy's bits with the
// compare's mask: a select compiles to a branch per element inside LaneSum
// (5x slower on the CNN); the AND vectorises. Rebuilding z reads x, which
// the backward reads anyway, instead of y: a tensor fewer in both passes.
template <typename T, Epilogue kEpilogue>
struct RebuiltMaskDy {
  const T* dy;
  const T* x;
  T operator()(int64_t i, T scale, T shift) const {
    using Bits = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
    static_assert(sizeof(T) == sizeof(Bits), "f32 or f64");
    const T z = Normalized(x[i], scale, shift);
    const bool pass = kEpilogue == Epilogue::kRelu6 ? (z > T(0)) & (z < T(6)) : z > T(0);
    Bits bits;
    std::memcpy(&bits, dy + i, sizeof(T));
    bits &= Bits{0} - static_cast<Bits>(pass);
    T masked;
    std::memcpy(&masked, &bits, sizeof(T));
    return masked;
  }
};

// The forward pass's scale and shift for every channel, from the backward
// op's gamma, saved_mean and saved_invstd (inputs 2..4) and input `beta`
// with an activation; zeros (which PlainDy ignores) without one.
template <typename T>
struct ForwardAffine {
  std::vector<T> scale, shift;
  ForwardAffine(const KernelContext& ctx, int beta_input, int64_t channels)
      : scale(static_cast<size_t>(channels)), shift(static_cast<size_t>(channels)) {
    if (!HasEpilogue(*ctx.attrs)) return;
    const T* gamma = ctx.in(2).data<T>();
    const T* mean = ctx.in(3).data<T>();
    const T* invstd = ctx.in(4).data<T>();
    const T* beta = ctx.in(beta_input).data<T>();
    for (int64_t c = 0; c < channels; ++c) BatchNormAffine(gamma[c], beta[c], mean[c], invstd[c], &scale[c], &shift[c]);
  }
};

// dy through Hardswish's backward at z, rebuilt from x as in RebuiltMaskDy:
// activation::HardswishGrad's bits (+0 below -3, dy * slope up to 3, else
// dy, NaN z included), its pieces picked with ANDs, as RebuiltMaskDy's
// mask. Calling HardswishGrad, MobileNetV3's BatchNormBackward nodes ran
// 2-3x slower with its selects as branches, and 1.1-1.3x slower as
// blends (without trapping math).
template <typename T>
struct RebuiltHardswishDy {
  const T* dy;
  const T* x;
  T operator()(int64_t i, T scale, T shift) const {
    using Bits = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
    const T z = Normalized(x[i], scale, shift);
    const T sloped = dy[i] * activation::HardswishSlope(z);
    const bool above_low = !(z < T(-3)), up_to_high = z <= T(3);
    Bits middle, whole;
    std::memcpy(&middle, &sloped, sizeof(T));
    std::memcpy(&whole, dy + i, sizeof(T));
    const Bits bits = (middle & (Bits{0} - static_cast<Bits>(above_low & up_to_high))) |
                      (whole & (Bits{0} - static_cast<Bits>(above_low & !up_to_high)));
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
  }
};

// Calls run(dy) with dy input 0 as PlainDy, RebuiltMaskDy or
// RebuiltHardswishDy (x input 1), as attr activation says.
template <typename T, typename Run>
void WithDy(const KernelContext& ctx, Run&& run) {
  const T* dy = ctx.in(0).data<T>();
  const T* x = ctx.in(1).data<T>();
  switch (EpilogueOf(*ctx.attrs)) {
    case Epilogue::kNone: return run(PlainDy<T>{dy});
    case Epilogue::kRelu: return run(RebuiltMaskDy<T, Epilogue::kRelu>{dy, x});
    case Epilogue::kRelu6: return run(RebuiltMaskDy<T, Epilogue::kRelu6>{dy, x});
    case Epilogue::kHardswish: return run(RebuiltHardswishDy<T>{dy, x});
  }
}

// The rest of BatchNormBackward once the sums are known, for the range's
// channels: (dx, dgamma, dbeta) from dy and inputs 1..4 (x, gamma,
// saved_mean, saved_invstd) and sums[c - c0] = {sum of dy, sum of dy * (x
// - mean)} over the m values of channel c.
template <typename T, typename Dy>
void FinishBatchNormBackward(const KernelContext& ctx, const ChannelLayout& l, ChannelRange r, bool training,
                             const Dy& dy, const ForwardAffine<T>& affine,
                             const std::vector<std::array<double, 2>>& sums, double m) {
  const T* x = ctx.in(1).data<T>();       // [N, C, S]
  const T* gamma = ctx.in(2).data<T>();   // [C]
  const T* mean = ctx.in(3).data<T>();    // [C]
  const T* invstd = ctx.in(4).data<T>();  // [C]
  T* dx = ctx.out(0).data<T>();           // [N, C, S]
  T* dgamma = ctx.out(1).data<T>();       // [C]
  T* dbeta = ctx.out(2).data<T>();        // [C]
  // Per channel: dx = k * (dy - a - (x - mean) * invstd * b) in training,
  // that is gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), and
  // k * dy in eval.
  std::vector<T> k(r.size()), a(r.size()), b(r.size());  // from c0 on
  for (int64_t c = r.c0; c < r.c1; ++c) {
    const double is = invstd[c], sum_dy = sums[c - r.c0][0], sum_dy_xhat = sums[c - r.c0][1] * is;
    dbeta[c] = static_cast<T>(sum_dy);
    dgamma[c] = static_cast<T>(sum_dy_xhat);
    k[c - r.c0] = static_cast<T>(gamma[c] * is);
    a[c - r.c0] = static_cast<T>(sum_dy / m);
    b[c - r.c0] = static_cast<T>(sum_dy_xhat / m);
  }
  // at(i, j): element o + j's k, a, b, mean, invstd, and forward scale and
  // shift (i = 0 .. 6).
  ChannelPass<T, 7>(l, ctx.pool, r,
                    {k.data(), a.data(), b.data(), mean + r.c0, invstd + r.c0, affine.scale.data() + r.c0,
                     affine.shift.data() + r.c0},
                    [&](int64_t o, int64_t len, const auto& at) {
                      if (training) {
                        for (int64_t j = 0; j < len; ++j)
                          dx[o + j] = at(0, j) * (dy(o + j, at(5, j), at(6, j)) - at(1, j) -
                                                  (x[o + j] - at(3, j)) * at(4, j) * at(2, j));
                      } else {
                        for (int64_t j = 0; j < len; ++j) dx[o + j] = at(0, j) * dy(o + j, at(5, j), at(6, j));
                      }
                    });
}

// Per channel of the range, {sum of dy, sum of dy * (x - mean)}.
template <typename T, typename Dy>
std::vector<std::array<double, 2>> GradientSums(const ChannelLayout& l, ThreadPool* pool, ChannelRange r, const Dy& dy,
                                                const ForwardAffine<T>& affine, const T* x, const T* mean) {
  const T* scale = affine.scale.data();
  const T* shift = affine.shift.data();
  return ChannelSums(
      l, pool, r, [&](int64_t i, int64_t c) { return static_cast<double>(dy(i, scale[c], shift[c])); },
      [&](int64_t i, int64_t c) { return dy(i, scale[c], shift[c]) * (x[i] - static_cast<double>(mean[c])); });
}

template <typename T, typename Dy>
void BatchNormBackward(KernelContext& ctx, const ChannelLayout& l, const Dy& dy) {
  const ForwardAffine<T> affine(ctx, 5, l.c);
  // dy and x are read by both passes.
  ForEachChannelBlock(l, 2 * static_cast<int64_t>(sizeof(T)), [&](ChannelRange r) {
    const auto sums = GradientSums(l, ctx.pool, r, dy, affine, ctx.in(1).data<T>(), ctx.in(3).data<T>());
    FinishBatchNormBackward<T>(ctx, l, r, ctx.attrs->Bool("training"), dy, affine, sums,
                               static_cast<double>(l.per_channel()));
  });
}

LOOM_REGISTER_KERNEL("BatchNormBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  const ChannelLayout l = ChannelLayoutOf(ctx.in(1).shape());
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    WithDy<T>(ctx, [&](const auto& dy) { BatchNormBackward<T>(ctx, l, dy); });
  });
});

// ---------------------------------------------------------------------------
// BatchNorm split along the batch (BatchNorm::Expand, BatchNormBackward::Expand)
//
// BatchNormPivot: (x [N, C, ...]) attr first (default true) -> pivot [C]:
// x[0, c, 0...], the value BatchNorm's kernel centres its sums on; a part
// without the batch's first sample (first false) gives zeros, so the
// partial sums of a sample split add up to the whole's pivot.
// BatchNormStats: (x, pivot [C]) -> sums [2, C] f64: per channel, the sum
// of d and of d^2 over the part's values, d = x - pivot. Partial sums over
// a sample split, all-reduced into the whole batch's.
// BatchNormApply: (x, gamma, beta, running_mean, running_var, sums, pivot)
// attrs momentum, eps, count (values per channel in the whole batch),
// activation -> BatchNorm's training outputs, with the statistics of `sums`.
// BatchNormBackwardStats: BatchNormBackward's inputs (dy, x, gamma,
// saved_mean, saved_invstd[, beta]) -> sums [2, C] f64: sum of dy, of dy *
// (x - mean). BatchNormBackwardApply: (dy, x, gamma, saved_mean,
// saved_invstd, sums[, beta]) attr count -> (dx, dgamma, dbeta) of a
// training BatchNorm. With an activation they do BatchNorm's and
// BatchNormBackward's activation work as those do (dy masked by the
// activation's gradient, rebuilt with beta). The lowering emits these; they
// have no gradient.

Status ExpectSums(const std::string& op, const TensorType& sums, int64_t channels) {
  if (sums.shape != Shape({2, channels}) || sums.dtype != DType::kF64)
    return InvalidArgument(op, ": sums must be [2, ", channels, "] f64, got ", sums.ToString());
  return Status::Ok();
}

Status ExpectCount(const std::string& op, const AttrMap& attrs, const TensorType& x) {
  const int64_t count = attrs.Int("count"), here = ChannelLayoutOf(x.shape).per_channel();
  if (count < 2 || count < here)
    return InvalidArgument(op, ": attribute count (values per channel in the whole batch) must be >= 2 and >= the ",
                           here, " of x ", x.shape.ToString(), ", got ", count);
  return Status::Ok();
}

// The batch of every tensor of `batched`, the rest whole.
DimSplit BatchOf(size_t inputs, size_t outputs, std::initializer_list<int> batched_inputs, bool partial) {
  DimSplit d = SplitAlong(-1, inputs, outputs);
  for (int i : batched_inputs) d.inputs[static_cast<size_t>(i)].axis = 0;
  if (outputs > 0 && !partial) d.outputs[0].axis = 0;
  d.partial_sums = partial;
  return d;
}

class BatchNormPivotOp : public OpDef {
 public:
  BatchNormPivotOp() { DeclareAttrs().Default("first", true, "whether the part holds the batch's first sample"); }
  std::string name() const override { return "BatchNormPivot"; }
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    rules.sample = BatchOf(in.size(), out.size(), {0}, true);
    rules.parameter = ChannelsOf(in, out);
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    AttrMap out = attrs;
    out.Set("first", AttrValue(attrs.Bool("first") && in_regions[0].lo[0] == 0));
    return out;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "BatchNormPivot (x)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "BatchNormPivot x"));
    if (in[0].shape.rank() < 2) return InvalidArgument("BatchNormPivot: x must be [N, C, ...], got ", in[0].shape.ToString());
    return std::vector<TensorType>{{Shape{in[0].shape[1]}, in[0].dtype}};
  }
  // Reads one value per channel.
  OpCost Cost(const AttrMap&, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c;
    c.bytes_read = c.bytes_written = Bytes(out[0]);
    (void)in;
    return c;
  }
};
LOOM_REGISTER_OP(BatchNormPivotOp);

LOOM_REGISTER_KERNEL("BatchNormPivot", DeviceType::kCpu, [](KernelContext& ctx) {
  const ChannelLayout l = ChannelLayoutOf(ctx.in(0).shape());
  const bool first = ctx.attrs->Bool("first");
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = ctx.in(0).data<T>();
    T* pivot = ctx.out(0).data<T>();
    // An empty batch or empty planes have no first value: 0.
    const bool has_first = first && l.n > 0 && l.s > 0;
    for (int64_t c = 0; c < l.c; ++c) pivot[c] = has_first ? px[c * l.s] : T(0);
  });
});

class BatchNormStatsOp : public OpDef {
 public:
  BatchNormStatsOp() { DeclareAttrs(); }
  std::string name() const override { return "BatchNormStats"; }
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    rules.sample = BatchOf(in.size(), out.size(), {0}, true);
    rules.parameter = ChannelsOf(in, out);
    return rules;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, "BatchNormStats (x, pivot)"));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "BatchNormStats x"));
    if (in[0].shape.rank() < 2) return InvalidArgument("BatchNormStats: x must be [N, C, ...], got ", in[0].shape.ToString());
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[1], {Shape{in[0].shape[1]}, in[0].dtype}, "BatchNormStats pivot vs [C]"));
    return std::vector<TensorType>{{Shape{2, in[0].shape[1]}, DType::kF64}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 4 * static_cast<double>(in[0].shape.numel());  // d, sum, d^2, sum
    return c;
  }
};
LOOM_REGISTER_OP(BatchNormStatsOp);

LOOM_REGISTER_KERNEL("BatchNormStats", DeviceType::kCpu, [](KernelContext& ctx) {
  const ChannelLayout l = ChannelLayoutOf(ctx.in(0).shape());
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pivot_in = ctx.in(1).data<T>();
    const std::vector<double> pivot(pivot_in, pivot_in + l.c);
    const auto sums = PivotedSums(l, ctx.pool, AllChannels(l), ctx.in(0).data<T>(), pivot);
    double* out = ctx.out(0).data<double>();  // [2, C]
    for (int64_t c = 0; c < l.c; ++c) out[c] = sums[c][0], out[l.c + c] = sums[c][1];
  });
});

// The [2, C] sums input as per-channel pairs.
std::vector<std::array<double, 2>> ReadSums(const Tensor& sums) {
  const int64_t c = sums.shape()[1];
  const double* p = sums.data<double>();
  std::vector<std::array<double, 2>> out(static_cast<size_t>(c));
  for (int64_t i = 0; i < c; ++i) out[static_cast<size_t>(i)] = {p[i], p[c + i]};
  return out;
}

class BatchNormApplyOp : public OpDef {
 public:
  BatchNormApplyOp() {
    DeclareAttrs()
        .Default("momentum", 0.1, "as BatchNorm's")
        .Default("eps", 1e-5, "as BatchNorm's")
        .Required("count", AttrType::kInt, "values per channel in the whole batch")
        .Default("activation", "none", kActivationDoc);
  }
  std::string name() const override { return "BatchNormApply"; }
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    rules.sample = BatchOf(in.size(), out.size(), {0}, false);
    rules.parameter = ChannelsOf(in, out);
    return rules;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(
        ExpectInputs(in, 7, "BatchNormApply (x, gamma, beta, running_mean, running_var, sums, pivot)"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[6], in[3], "BatchNormApply pivot vs running_mean"));
    LOOM_RETURN_IF_ERROR(ExpectActivation("BatchNormApply", attrs));
    AttrMap bn{{"training", true}, {"momentum", attrs.Float("momentum")}, {"eps", attrs.Float("eps")}};
    LOOM_ASSIGN_OR_RETURN(auto out, InferOpTypes(*OpRegistry::Global().FindOp("BatchNorm"), bn,
                                                 std::vector<TensorType>(in.begin(), in.begin() + 5)));
    LOOM_RETURN_IF_ERROR(ExpectSums("BatchNormApply", in[5], in[0].shape[1]));
    LOOM_RETURN_IF_ERROR(ExpectCount("BatchNormApply", attrs, in[0]));
    return out;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 2 * static_cast<double>(in[0].shape.numel()) + 14 * static_cast<double>(in[0].shape[1]);
    if (HasEpilogue(a)) c.flops += static_cast<double>(in[0].shape.numel());
    return c;
  }
};
LOOM_REGISTER_OP(BatchNormApplyOp);

LOOM_REGISTER_KERNEL("BatchNormApply", DeviceType::kCpu, [](KernelContext& ctx) {
  const ChannelLayout l = ChannelLayoutOf(ctx.in(0).shape());
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pivot_in = ctx.in(6).data<T>();
    const std::vector<double> pivot(pivot_in, pivot_in + l.c);
    FinishBatchNorm<T>(ctx, l, AllChannels(l), true, pivot, ReadSums(ctx.in(5)),
                       static_cast<double>(ctx.attrs->Int("count")));
  });
});

class BatchNormBackwardStatsOp : public OpDef {
 public:
  BatchNormBackwardStatsOp() { DeclareAttrs().Default("activation", "none", kMaskDoc); }
  std::string name() const override { return "BatchNormBackwardStats"; }
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    rules.sample = BatchOf(in.size(), out.size(), {0, 1}, true);
    rules.parameter = ChannelsOf(in, out);
    return rules;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(
        ExpectMaskInput("BatchNormBackwardStats", attrs, in, 5, "dy, x, gamma, saved_mean, saved_invstd"));
    LOOM_RETURN_IF_ERROR(InferOpTypes(*OpRegistry::Global().FindOp("BatchNormBackward"), AttrMap{{"training", true}},
                                      std::vector<TensorType>(in.begin(), in.begin() + 5))
                             .status());
    return std::vector<TensorType>{{Shape{2, in[1].shape[1]}, DType::kF64}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 4 * static_cast<double>(in[0].shape.numel());  // sum dy; x - mean, times dy, sum
    if (in.size() > 5) c.flops += 2 * static_cast<double>(in[0].shape.numel());  // z for the mask
    return c;
  }
};
LOOM_REGISTER_OP(BatchNormBackwardStatsOp);

LOOM_REGISTER_KERNEL("BatchNormBackwardStats", DeviceType::kCpu, [](KernelContext& ctx) {
  const ChannelLayout l = ChannelLayoutOf(ctx.in(1).shape());
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const ForwardAffine<T> affine(ctx, 5, l.c);
    WithDy<T>(ctx, [&](const auto& dy) {
      const auto sums =
          GradientSums(l, ctx.pool, AllChannels(l), dy, affine, ctx.in(1).data<T>(), ctx.in(3).data<T>());
      double* out = ctx.out(0).data<double>();  // [2, C]
      for (int64_t c = 0; c < l.c; ++c) out[c] = sums[c][0], out[l.c + c] = sums[c][1];
    });
  });
});

class BatchNormBackwardApplyOp : public OpDef {
 public:
  BatchNormBackwardApplyOp() {
    DeclareAttrs()
        .Required("count", AttrType::kInt, "values per channel in the whole batch")
        .Default("activation", "none", kMaskDoc);
  }
  std::string name() const override { return "BatchNormBackwardApply"; }
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    rules.sample = BatchOf(in.size(), out.size(), {0, 1}, false);
    rules.parameter = ChannelsOf(in, out);
    return rules;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectMaskInput("BatchNormBackwardApply", attrs, in, 6,
                                         "dy, x, gamma, saved_mean, saved_invstd, sums"));
    LOOM_ASSIGN_OR_RETURN(auto out, InferOpTypes(*OpRegistry::Global().FindOp("BatchNormBackward"),
                                                 AttrMap{{"training", true}},
                                                 std::vector<TensorType>(in.begin(), in.begin() + 5)));
    LOOM_RETURN_IF_ERROR(ExpectSums("BatchNormBackwardApply", in[5], in[1].shape[1]));
    LOOM_RETURN_IF_ERROR(ExpectCount("BatchNormBackwardApply", attrs, in[1]));
    return out;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = 6 * static_cast<double>(in[0].shape.numel());  // xhat (2), the correction (4)
    if (in.size() > 6) c.flops += 2 * static_cast<double>(in[0].shape.numel());  // z for the mask
    return c;
  }
};
LOOM_REGISTER_OP(BatchNormBackwardApplyOp);

LOOM_REGISTER_KERNEL("BatchNormBackwardApply", DeviceType::kCpu, [](KernelContext& ctx) {
  const ChannelLayout l = ChannelLayoutOf(ctx.in(1).shape());
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const double count = static_cast<double>(ctx.attrs->Int("count"));
    const ForwardAffine<T> affine(ctx, 6, l.c);
    WithDy<T>(ctx, [&](const auto& dy) {
      FinishBatchNormBackward<T>(ctx, l, AllChannels(l), true, dy, affine, ReadSums(ctx.in(5)), count);
    });
  });
});

// ---------------------------------------------------------------------------
// LayerNorm

void DeclareLayerNormAttrs(AttrSchema& schema) {
  schema.Required("normalized_shape", AttrType::kInts, "the trailing dims of x that are normalized")
      .Default("replica_dim", int64_t{-1}, "x's dim that holds a fused array's replicas (-1: shared gamma and beta)")
      .Default("per_replica", int64_t{1}, "the extent of replica_dim per replica");
}

// Checks attr normalized_shape against x; returns the shape of the saved
// statistics (x's leading dims).
StatusOr<Shape> StatShape(const std::string& op, const AttrMap& attrs, const TensorType& x) {
  const std::vector<int64_t> norm = attrs.Ints("normalized_shape");
  const int k = static_cast<int>(norm.size());
  if (k == 0) return InvalidArgument(op, ": attribute normalized_shape must not be empty");
  for (int64_t d : norm)
    if (d <= 0) return InvalidArgument(op, ": normalized_shape ", Shape(norm).ToString(), " has a non-positive extent");
  bool matches = k <= x.shape.rank();
  for (int i = 0; matches && i < k; ++i) matches = x.shape[x.shape.rank() - k + i] == norm[i];
  if (!matches)
    return InvalidArgument(op, ": normalized_shape ", Shape(norm).ToString(), " is not the trailing dims of x ",
                           x.shape.ToString());
  return Shape(std::vector<int64_t>(x.shape.dims().begin(), x.shape.dims().end() - k));
}

// gamma's and beta's type: normalized_shape, led by the replicas when x's
// replica dim is named (one of its leading dims, R blocks of per_replica).
StatusOr<TensorType> AffineType(const std::string& op, const AttrMap& attrs, const TensorType& x) {
  std::vector<int64_t> dims = attrs.Ints("normalized_shape");
  const int64_t dim = attrs.Int("replica_dim"), per_replica = attrs.Int("per_replica");
  if (dim >= 0) {
    const int lead = x.shape.rank() - static_cast<int>(dims.size());
    if (dim >= lead)
      return InvalidArgument(op, ": replica_dim ", dim, " is not one of x ", x.shape.ToString(), "'s ", lead,
                             " leading dims");
    if (per_replica < 1 || x.shape[static_cast<int>(dim)] % per_replica != 0)
      return InvalidArgument(op, ": per_replica ", per_replica, " does not divide x ", x.shape.ToString(),
                             "'s dim ", dim);
    dims.insert(dims.begin(), x.shape[static_cast<int>(dim)] / per_replica);
  } else if (dim != -1) {
    return InvalidArgument(op, ": replica_dim ", dim, " must be -1 or one of x's leading dims");
  }
  return TensorType{Shape(dims), x.dtype};
}

class LayerNormOp : public OpDef {
 public:
  LayerNormOp() {
    DeclareLayerNormAttrs(DeclareAttrs());
    DeclareAttrs().Default("eps", 1e-5, "added to the variance");
  }
  std::string name() const override { return "LayerNorm"; }
  // Each row is normalized on its own: any of x's leading dims splits x, y
  // and the statistics alike (sample: dim 0), every part with the whole
  // gamma and beta, or its replicas' rows of them along the replica dim.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules;
    const int64_t replica_dim = attrs.Int("replica_dim");
    for (int a = 0; a < out[1].shape.rank(); ++a) {
      DimSplit d = SplitAlong(a, in.size(), out.size());
      for (size_t i = 1; i < in.size(); ++i) d.inputs[i].axis = a == replica_dim ? 0 : -1;
      if (a == 0) rules.sample = d;
      else rules.other.push_back(d);
    }
    return rules;
  }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (in.empty() || in.size() > 3)
      return InvalidArgument("LayerNorm takes (x[, gamma[, beta]]), got ", in.size(), " inputs");
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], "LayerNorm x"));
    LOOM_ASSIGN_OR_RETURN(Shape stat, StatShape("LayerNorm", attrs, in[0]));
    LOOM_ASSIGN_OR_RETURN(const TensorType affine, AffineType("LayerNorm", attrs, in[0]));
    const char* const names[] = {"x", "gamma", "beta"};
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i] != affine)
        return InvalidArgument("LayerNorm ", names[i], " (input ", i, ") must be ", affine.ToString(),
                               attrs.Int("replica_dim") >= 0 ? " (replicas, normalized_shape)" : " (normalized_shape)",
                               ", got ", in[i].ToString());
    LOOM_RETURN_IF_ERROR(ExpectEps("LayerNorm", attrs.Float("eps")));
    return std::vector<TensorType>{in[0], {stat, in[0].dtype}, {stat, in[0].dtype}};
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const double n = static_cast<double>(in[0].shape.numel()), rows = static_cast<double>(out[1].shape.numel());
    // sum (1), centred square-sum (3), normalize (2), gamma (1), beta (1).
    c.flops = (6 + static_cast<double>(in.size() - 1)) * n + 4 * rows;
    c.bytes_read += 2 * Bytes(in[0]);  // three passes over x
    return c;
  }
  Status Gradient(GradBuilder& g) const override {
    ValueId dy = g.output_grad(0);
    if (dy == kNoValue) return Status::Ok();  // only the saved statistics are used
    const size_t n = g.node().inputs.size();
    std::vector<ValueId> ins = {dy, g.input(0), g.output(1), g.output(2)};
    if (n >= 2) ins.push_back(g.input(1));
    std::vector<ValueId> grads = g.Emit("LayerNormBackward", ins,
                                        AttrMap{{"normalized_shape", g.attrs().Ints("normalized_shape")},
                                                {"replica_dim", g.attrs().Int("replica_dim")},
                                                {"per_replica", g.attrs().Int("per_replica")}});
    for (size_t i = 0; i < n; ++i) g.SetInputGrad(static_cast<int>(i), grads[i]);
    return Status::Ok();
  }
  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // The normalization over the last dims is per replica as long as the
  // replica axis is not among them. Per-replica gamma and beta are rows of
  // [R, normalized_shape] that LayerNorm reads by x's replica dim, so the
  // affine part stays in its own pass (a broadcast Mul and Add of their own,
  // with their gradients' reductions, had run transformer_lm's fused step
  // of 2 replicas at 0.96x of serial). One replica's are the single model's.
  Status Fuse(FusionBuilder& f) const override {
    const int k = static_cast<int>(f.attrs().Ints("normalized_shape").size());
    FusedValue x = f.input(0);
    const int rank = f.SingleShape(x).rank();
    if (x.replicated() && x.axis() > rank - k) {
      LOOM_ASSIGN_OR_RETURN(x, f.MoveAxis(x, 0, f.name() + "/x"));
    }
    bool per_replica_affine = false;
    for (int i = 1; i < f.num_inputs(); ++i) per_replica_affine |= f.input(i).replicated();
    if (f.replicas() == 1 || !per_replica_affine) {
      std::vector<FusedValue> ins = {x};
      for (int i = 1; i < f.num_inputs(); ++i) {
        FusedValue p = f.input(i);
        if (p.replicated()) {
          LOOM_ASSIGN_OR_RETURN(p, f.Reshape(p, f.SingleShape(p), ReplicaLayout::Shared(),
                                             f.name() + AffineName(i) + "/one_replica"));
        }
        ins.push_back(p);
      }
      LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit("LayerNorm", ins, f.attrs(), f.name(), {x.layout}));
      return f.MapOutputs(outs);
    }
    if (!x.replicated()) {
      LOOM_ASSIGN_OR_RETURN(x, f.Replicated(x, 0, f.name() + "/x"));
    }
    std::vector<FusedValue> ins = {x};
    for (int i = 1; i < f.num_inputs(); ++i) {
      LOOM_ASSIGN_OR_RETURN(FusedValue p, f.Replicated(f.input(i), 0, f.name() + AffineName(i)));
      ins.push_back(p);
    }
    AttrMap attrs = f.attrs();
    attrs.Set("replica_dim", int64_t{x.axis()});
    attrs.Set("per_replica", x.layout.per_replica);
    LOOM_ASSIGN_OR_RETURN(auto outs, f.Emit("LayerNorm", ins, attrs, f.name(), {x.layout}));
    return f.MapOutputs(outs);
  }

 private:
  static const char* AffineName(int input) { return input == 1 ? "/gamma" : "/beta"; }
};
LOOM_REGISTER_OP(LayerNormOp);

LOOM_REGISTER_KERNEL("LayerNorm", DeviceType::kCpu, [](KernelContext& ctx) {
  const double eps = ctx.attrs->Float("eps");
  const Tensor& x = ctx.in(0);
  const RowLayout l = LayerNormRowsOf(x.shape(), *ctx.attrs);
  return DispatchFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();                                                  // [rows, d]
    const T* gamma = ctx.inputs.size() > 1 ? ctx.in(1).data<T>() : nullptr;     // [replicas, d]
    const T* beta = ctx.inputs.size() > 2 ? ctx.in(2).data<T>() : nullptr;      // [replicas, d]
    T* y = ctx.out(0).data<T>();                                                // [rows, d]
    T* save_mean = ctx.out(1).data<T>();                                        // [rows]
    T* save_rstd = ctx.out(2).data<T>();                                        // [rows]
    ParallelRange(ctx.pool, l.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = px + r * l.d;
        T* yr = y + r * l.d;
        const double mean = LaneSum<double>(l.d, [&](int64_t j) { return static_cast<double>(xr[j]); }) /
                            static_cast<double>(l.d);
        const double squares = LaneSum<double>(l.d, [&](int64_t j) { return (xr[j] - mean) * (xr[j] - mean); });
        const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(l.d) + eps);
        save_mean[r] = static_cast<T>(mean);
        save_rstd[r] = static_cast<T>(rstd);
        const T tmean = static_cast<T>(mean), trstd = static_cast<T>(rstd);
        const int64_t affine = l.ReplicaOf(r) * l.d;
        for (int64_t j = 0; j < l.d; ++j) {
          T v = (xr[j] - tmean) * trstd;
          if (gamma) v *= gamma[affine + j];
          if (beta) v += beta[affine + j];
          yr[j] = v;
        }
      }
    }, GrainFor(l.d));
  });
});

// LayerNormBackward: (dy, x, saved_mean, saved_rstd[, gamma]) -> dx, plus
// (dgamma, dbeta) when gamma is given; the forward op's normalized_shape,
// replica_dim and per_replica.
class LayerNormBackwardOp : public OpDef {
 public:
  LayerNormBackwardOp() { DeclareLayerNormAttrs(DeclareAttrs()); }
  std::string name() const override { return "LayerNormBackward"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (in.size() != 4 && in.size() != 5)
      return InvalidArgument("LayerNormBackward takes (dy, x, saved_mean, saved_rstd[, gamma]), got ", in.size(),
                             " inputs");
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[1], "LayerNormBackward x"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[0], in[1], "LayerNormBackward: dy and x differ"));
    LOOM_ASSIGN_OR_RETURN(Shape stat, StatShape("LayerNormBackward", attrs, in[1]));
    const TensorType stat_type{stat, in[1].dtype};
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[2], stat_type, "LayerNormBackward saved_mean vs x's leading dims"));
    LOOM_RETURN_IF_ERROR(ExpectSameType(in[3], stat_type, "LayerNormBackward saved_rstd vs x's leading dims"));
    std::vector<TensorType> out = {in[1]};
    if (in.size() == 5) {
      LOOM_ASSIGN_OR_RETURN(const TensorType affine, AffineType("LayerNormBackward", attrs, in[1]));
      LOOM_RETURN_IF_ERROR(ExpectSameType(in[4], affine, "LayerNormBackward gamma vs normalized_shape"));
      out.push_back(affine);  // dgamma
      out.push_back(affine);  // dbeta
    }
    return out;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const double n = static_cast<double>(in[0].shape.numel());
    // dx: gamma (1), xhat (2), two row sums (3), correction (4); dgamma and
    // dbeta: xhat (2), dy * xhat accumulated (2), dy accumulated (1).
    c.flops = in.size() == 5 ? 15 * n : 9 * n;
    c.bytes_read += (in.size() == 5 ? 2 : 1) * (Bytes(in[0]) + Bytes(in[1]));  // extra passes over dy and x
    return c;
  }
};
LOOM_REGISTER_OP(LayerNormBackwardOp);

LOOM_REGISTER_KERNEL("LayerNormBackward", DeviceType::kCpu, [](KernelContext& ctx) {
  const RowLayout l = LayerNormRowsOf(ctx.in(1).shape(), *ctx.attrs);
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* dy = ctx.in(0).data<T>();                                         // [rows, d]
    const T* x = ctx.in(1).data<T>();                                          // [rows, d]
    const T* mean = ctx.in(2).data<T>();                                       // [rows]
    const T* rstd = ctx.in(3).data<T>();                                       // [rows]
    const T* gamma = ctx.inputs.size() == 5 ? ctx.in(4).data<T>() : nullptr;   // [replicas, d]
    T* dx = ctx.out(0).data<T>();                                              // [rows, d]
    // dx per row: with g = dy * gamma and xhat = (x - mean) * rstd,
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    ParallelRange(ctx.pool, l.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* dyr = dy + r * l.d;
        const T* xr = x + r * l.d;
        T* dxr = dx + r * l.d;
        const T mu = mean[r], rs = rstd[r];
        const T* gr = gamma ? gamma + l.ReplicaOf(r) * l.d : nullptr;
        auto g = [&](int64_t j) { return gr ? dyr[j] * gr[j] : dyr[j]; };
        const double sum_g = LaneSum<double>(l.d, g);
        const double sum_g_xhat = LaneSum<double>(l.d, [&](int64_t j) { return g(j) * ((xr[j] - mu) * rs); });
        const T a = static_cast<T>(sum_g / static_cast<double>(l.d));
        const T b = static_cast<T>(sum_g_xhat / static_cast<double>(l.d));
        for (int64_t j = 0; j < l.d; ++j) dxr[j] = rs * (g(j) - a - (xr[j] - mu) * rs * b);
      }
    }, GrainFor(l.d));
    if (!gamma) return;
    // dgamma = sum over a replica's rows of dy * xhat, dbeta = sum of dy:
    // split over the [replicas, d] outputs so each element has one writer,
    // summed in row order (a fused replica's sums are its single model's).
    T* dgamma = ctx.out(1).data<T>();  // [replicas, d]
    T* dbeta = ctx.out(2).data<T>();   // [replicas, d]
    const int64_t outer = l.rows == 0 ? 0 : l.rows / (l.replicas * l.block);
    ParallelRange(ctx.pool, l.replicas * l.d, [&](int64_t i0, int64_t i1) {
      std::vector<double> acc_gamma(i1 - i0, 0.0), acc_beta(i1 - i0, 0.0);
      for (int64_t i = i0; i < i1;) {
        // Columns [j0, j0 + len) of replica p, then on to the next replica's.
        const int64_t p = i / l.d, j0 = i % l.d, len = std::min(l.d - j0, i1 - i);
        double* sum_gamma = acc_gamma.data() + (i - i0);
        double* sum_beta = acc_beta.data() + (i - i0);
        for (int64_t o = 0; o < outer; ++o) {
          for (int64_t r = (o * l.replicas + p) * l.block, end = r + l.block; r < end; ++r) {
            const T* dyr = dy + r * l.d + j0;
            const T* xr = x + r * l.d + j0;
            const T mu = mean[r], rs = rstd[r];
            for (int64_t j = 0; j < len; ++j) {
              sum_gamma[j] += dyr[j] * ((xr[j] - mu) * rs);
              sum_beta[j] += dyr[j];
            }
          }
        }
        i += len;
      }
      for (int64_t i = i0; i < i1; ++i) {
        dgamma[i] = static_cast<T>(acc_gamma[i - i0]);
        dbeta[i] = static_cast<T>(acc_beta[i - i0]);
      }
    }, GrainFor(l.rows / l.replicas));
  });
});

}  // namespace
}  // namespace loom
