// Pooling over the planes of NCHW tensors, PyTorch semantics:
//   MaxPool2d(x) -> (y, indices)
//     attrs kernel, stride (default: kernel), padding, dilation, ceil_mode.
//     indices [N, C, OH, OW] i64: the flat h * W + w of each maximum in its
//     input plane (torch's return_indices); -1 for a window that holds no
//     input element (possible only with dilation), whose y is -inf.
//     A part of a row split (graph/task_graph.h) pools rows of the plane:
//     attrs bottom_padding (its rows of padding below; padding's row value
//     is then the rows above it) and row_offset (its first row in the whole
//     plane, added to the indices' rows).
//   AvgPool2d(x) -> y
//     attrs kernel, stride (default: kernel), padding, ceil_mode,
//     count_include_pad (default true).
//   AdaptiveAvgPool2d(x) -> y
//     attr output_size; window i along an axis of extent H is
//     [floor(i * H / out), ceil((i + 1) * H / out)).
// kernel, stride, padding, dilation and output_size take an int or a list of
// two. Backward ops take the forward attrs plus input_shape:
//   MaxPool2dBackward(dy, indices) -> dx
//   AvgPool2dBackward(dy) -> dx
//   AdaptiveAvgPool2dBackward(dy) -> dx
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/op.h"
#include "ops/pool_geometry.h"

// MaxPool2d's lanes are 32-byte vectors; on a build without AVX (the
// portable x86-64-v2 one), GCC notes that returning one changes the
// calling convention (-Wpsabi). The functions that return them are
// internal to this file, so no call crosses between code built with
// different flags.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace loom {
namespace {

// Attributes and windows: ops/pool_geometry.h and ops/pool_window.h, shared
// with the CUDA kernels.
using pool::Pair;
using pool::PairAttr;
using pool::PairString;
using pool::PoolKind;
using pool::Window;

// The attributes of a pool op, declared once; the backward ops take the
// forward op's plus the input shape.
void DeclarePoolAttrs(PoolKind kind, AttrSchema& s) {
  if (kind == PoolKind::kAdaptiveAvg) {
    s.Required("output_size", AttrType::kIntOrInts, "the output's [H, W] (one int: square)");
    return;
  }
  s.Required("kernel", AttrType::kIntOrInts, "window [H, W] (one int: square)")
      .Optional("stride", AttrType::kIntOrInts, "window step; absent or []: the kernel, as stride=None in PyTorch")
      .Default("padding", AttrType::kIntOrInts, int64_t{0}, "implicit padding on both sides, at most half the kernel")
      .Default("ceil_mode", false, "round the output extent up");
  if (kind == PoolKind::kMax) {
    s.Default("dilation", AttrType::kIntOrInts, int64_t{1}, "spacing between window taps")
        .Default("bottom_padding", int64_t{-1},
                 "rows of padding below the input, -1: padding's row value (a part of a row split sets it)")
        .Default("row_offset", int64_t{0}, "the input's first row in the whole plane: indices count from row 0 of it");
  }
  if (kind == PoolKind::kAvg) s.Default("count_include_pad", true, "divide by the padded window size");
}

struct AxisWindows {
  int64_t step = 1;
  std::vector<Window> windows;  // one per output position
  // Sliding windows only: output o's taps start at o * stride - padding;
  // those whose window holds all `kernel` taps are [full_lo, full_hi).
  int64_t stride = 1, padding = 0, kernel = 0, full_lo = 0, full_hi = 0;
  int64_t Taps() const {
    int64_t n = 0;
    for (const Window& w : windows) n += w.count;
    return n;
  }
};

// Sliding windows: output o starts at o * stride - padding.
AxisWindows SlidingWindows(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d, bool include_pad) {
  AxisWindows a;
  a.step = d;
  a.stride = s;
  a.padding = p;
  a.kernel = k;
  for (int64_t o = 0; o < out; ++o) a.windows.push_back(pool::SlidingWindow(o, in, k, s, p, d, include_pad));
  // Whole windows are contiguous: the clipped ones sit at the two ends.
  a.full_lo = 0;
  while (a.full_lo < out && a.windows[a.full_lo].count != k) ++a.full_lo;
  a.full_hi = a.full_lo;
  while (a.full_hi < out && a.windows[a.full_hi].count == k) ++a.full_hi;
  return a;
}

AxisWindows AdaptiveWindows(int64_t in, int64_t out) {
  AxisWindows a;
  for (int64_t o = 0; o < out; ++o) {
    const int64_t begin = pool::AdaptiveBegin(o, in, out), end = pool::AdaptiveEnd(o, in, out);
    a.windows.push_back({begin, end - begin, end - begin});
  }
  return a;
}

// PyTorch's pooling_output_shape (p before the input, p_end after it): in
// ceil mode the last window must still start inside the input or its left
// padding.
int64_t PoolExtent(int64_t in, int64_t k, int64_t s, int64_t p, int64_t p_end, int64_t d, bool ceil_mode) {
  const int64_t num = in + p + p_end - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

// A validated pool on a given input: the output shape and both axes' windows.
struct PoolPlan {
  Shape out;
  AxisWindows rows, cols;
  int64_t index_offset = 0;  // added to max-pool indices: row_offset rows of the plane
  int64_t planes() const { return out[0] * out[1]; }
  // Window elements visited for the whole tensor.
  double Taps() const { return static_cast<double>(planes()) * rows.Taps() * cols.Taps(); }
};

StatusOr<PoolPlan> PlanSliding(PoolKind kind, const std::string& op, const AttrMap& attrs, const Shape& x) {
  const bool max = kind == PoolKind::kMax;
  LOOM_ASSIGN_OR_RETURN(pool::SlidingAttrs attr, pool::ParseSlidingAttrs(kind, op, attrs));
  const Pair &kernel = attr.kernel, &stride = attr.stride, &padding = attr.padding, &dilation = attr.dilation;
  const bool ceil_mode = attr.ceil_mode, include_pad = attr.include_pad;
  if (x.rank() != 4) return InvalidArgument(op, ": input x must be [N, C, H, W], got ", x.ToString());
  const Pair in{x[2], x[3]};
  const Pair padding_end{attr.bottom_padding, padding[1]};
  Pair span, padded;
  for (int a = 0; a < 2; ++a) {
    span[a] = dilation[a] * (kernel[a] - 1) + 1;
    padded[a] = in[a] + padding[a] + padding_end[a];
  }
  for (int a = 0; a < 2; ++a)
    if (span[a] > padded[a])
      return InvalidArgument(op, ": kernel ", PairString(kernel), (max ? " with dilation " + PairString(dilation) : ""),
                             " spans ", PairString(span), ", larger than the padded input ", PairString(padded), " (x ",
                             x.ToString(), ", padding ", PairString(padding), ")");
  PoolPlan plan;
  Pair out;
  for (int a = 0; a < 2; ++a)
    out[a] = PoolExtent(in[a], kernel[a], stride[a], padding[a], padding_end[a], dilation[a], ceil_mode);
  plan.out = Shape{x[0], x[1], out[0], out[1]};
  plan.index_offset = attr.row_offset * in[1];
  plan.rows = SlidingWindows(in[0], out[0], kernel[0], stride[0], padding[0], dilation[0], include_pad);
  plan.cols = SlidingWindows(in[1], out[1], kernel[1], stride[1], padding[1], dilation[1], include_pad);
  return plan;
}

StatusOr<PoolPlan> PlanAdaptive(const std::string& op, const AttrMap& attrs, const Shape& x) {
  LOOM_ASSIGN_OR_RETURN(Pair out, PairAttr(attrs, op, "output_size"));
  if (out[0] < 1 || out[1] < 1) return InvalidArgument(op, ": output_size must be >= 1, got ", PairString(out));
  if (x.rank() != 4) return InvalidArgument(op, ": input x must be [N, C, H, W], got ", x.ToString());
  if (x[2] < 1 || x[3] < 1) return InvalidArgument(op, ": input x ", x.ToString(), " has an empty plane");
  PoolPlan plan;
  plan.out = Shape{x[0], x[1], out[0], out[1]};
  plan.rows = AdaptiveWindows(x[2], out[0]);
  plan.cols = AdaptiveWindows(x[3], out[1]);
  return plan;
}

StatusOr<PoolPlan> PlanPool(PoolKind kind, const std::string& op, const AttrMap& attrs, const Shape& x) {
  return kind == PoolKind::kAdaptiveAvg ? PlanAdaptive(op, attrs, x) : PlanSliding(kind, op, attrs, x);
}

// Planes per parallel chunk, given the window elements one plane visits.
int64_t PlaneChunk(const PoolPlan& plan) {
  const double per_plane = std::max(1.0, plan.Taps() / std::max<int64_t>(1, plan.planes()));
  return std::max<int64_t>(1, static_cast<int64_t>(32768 / per_plane));
}

// ---------------------------------------------------------------------------
// CPU kernels. Every plane (n, c) is independent, forward and backward, so
// all of them split over planes.

// Folds tap x[i] into a running max and argmax: NaN wins, as in PyTorch,
// and ties keep the first maximum.
template <typename T>
void MaxTap(T v, int64_t i, T& best, int64_t& arg) {
  const bool take = (v > best) | std::isnan(v);
  best = take ? v : best;
  arg = take ? i : arg;
}

// kBytes of T lanes (GCC/Clang vector extensions) and integer lanes of the
// same width, which hold the argmax (plane offsets) and compare masks.
template <typename T, int kBytes>
struct Lanes {
  static constexpr int64_t kCount = kBytes / sizeof(T);
  using Int = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  typedef T Vec __attribute__((vector_size(kBytes)));
  typedef Int IntVec __attribute__((vector_size(kBytes)));
};

// y[ox], idx[ox] for the kCount outputs from ox0, whose column windows are
// whole (cols.kernel taps, output ox's first at ox * stride - padding), over
// row window r. The running max and argmax of all the outputs stay in SIMD
// registers and every tap updates them with one select, in the same tap
// order as MaxTap. Scalar selects on unpredictable maxima compile to
// mispredicted branches, and pooled rows are often too short (7 or 14) for
// auto-vectorised loops, which leave them in scalar tails.
// The even lanes of two vectors' elements side by side (low, then high).
// Two vectors of the result's width, not one twice as wide: a 64-byte
// vector has no register on AVX2, and GCC moves one through the stack.
template <typename Vec, size_t... kLane>
Vec EvenLanes(Vec low, Vec high, std::index_sequence<kLane...>) {
  return __builtin_shufflevector(low, high, (2 * kLane)...);
}

template <int kBytes, typename T, typename Stride>
void MaxPoolLanes(const T* plane, int64_t plane_size, int64_t w, const Window& r, int64_t row_step,
                  const AxisWindows& cols, int64_t ox0, Stride stride, T* y, int64_t* idx) {
  using L = Lanes<T, kBytes>;
  typedef T Unaligned __attribute__((vector_size(kBytes), aligned(alignof(T)), may_alias));
  typename L::Vec best{}, v{};
  typename L::IntVec arg{}, lane{};
  for (int64_t l = 0; l < L::kCount; ++l) lane[l] = static_cast<typename L::Int>(l * stride);
  for (int64_t a = 0; a < r.count; ++a) {
    for (int64_t b = 0; b < cols.kernel; ++b) {
      const int64_t line = (r.first + a * row_step) * w + b * cols.step - cols.padding + ox0 * stride;
      bool loaded = false;
      if constexpr (std::is_same_v<Stride, std::integral_constant<int64_t, 2>>) {
        // The run in two vector loads and a shuffle, not a load per lane
        // (where the run's last, unused element is still inside the plane).
        if (line + 2 * L::kCount <= plane_size) {
          const T* run = plane + line;
          v = EvenLanes<typename L::Vec>(*reinterpret_cast<const Unaligned*>(run),
                                         *reinterpret_cast<const Unaligned*>(run + L::kCount),
                                         std::make_index_sequence<L::kCount>());
          loaded = true;
        }
      }
      if (!loaded)
        for (int64_t l = 0; l < L::kCount; ++l) v[l] = plane[line + l * stride];
      const typename L::IntVec i = static_cast<typename L::Int>(line) + lane;
      const typename L::IntVec take = (a == 0 && b == 0) ? ~typename L::IntVec{} : (v > best) | (v != v);
      best = take ? v : best;
      arg = take ? i : arg;
    }
  }
  for (int64_t l = 0; l < L::kCount; ++l) {
    y[ox0 + l] = best[l];
    idx[ox0 + l] = arg[l];
  }
}

// The whole-window outputs [lo, hi) of one row in blocks of SIMD lanes (32
// or 16 bytes); the last block overlaps the one before it rather than
// leaving a scalar tail. Returns false (nothing done) for rows shorter than
// a 16-byte block.
template <typename T, typename Stride>
bool MaxPoolWhole(const T* plane, int64_t plane_size, int64_t w, const Window& r, int64_t row_step,
                  const AxisWindows& cols, int64_t lo, int64_t hi, Stride stride, T* y, int64_t* idx) {
  auto blocks = [&](auto lanes, auto block) {
    for (int64_t ox = lo; ox < hi; ox += lanes) block(std::min(ox, hi - lanes));
  };
  if (hi - lo >= Lanes<T, 32>::kCount) {
    blocks(Lanes<T, 32>::kCount,
           [&](int64_t ox0) { MaxPoolLanes<32>(plane, plane_size, w, r, row_step, cols, ox0, stride, y, idx); });
  } else if (hi - lo >= Lanes<T, 16>::kCount) {
    blocks(Lanes<T, 16>::kCount,
           [&](int64_t ox0) { MaxPoolLanes<16>(plane, plane_size, w, r, row_step, cols, ox0, stride, y, idx); });
  } else {
    return false;
  }
  return true;
}

// y [P, OH, OW], idx [P, OH, OW] = max and argmax of each window of x [P, H, W].
template <typename T>
void MaxPoolForward(const PoolPlan& plan, const Shape& xs, const T* x, T* y, int64_t* idx, ThreadPool* pool) {
  const int64_t h = xs[2], w = xs[3], oh = plan.out[2], ow = plan.out[3];
  const AxisWindows& cols = plan.cols;
  // f32 lanes hold plane offsets in 32 bits.
  const bool lanes_fit = sizeof(T) == 8 || h * w <= std::numeric_limits<int32_t>::max();
  ParallelRange(pool, plan.planes(), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* plane = x + p * h * w;
      for (int64_t oy = 0; oy < oh; ++oy) {
        const Window& r = plan.rows.windows[oy];
        T* yr = y + (p * oh + oy) * ow;
        int64_t* ir = idx + (p * oh + oy) * ow;
        // One output at a time: clipped windows at the edges, and rows the
        // SIMD blocks do not take.
        auto scan = [&](int64_t ox) {
          const Window& c = cols.windows[ox];
          if (r.count == 0 || c.count == 0) {
            yr[ox] = -std::numeric_limits<T>::infinity();
            ir[ox] = -1;
            return;
          }
          int64_t arg = r.first * w + c.first;
          T best = plane[arg];
          for (int64_t a = 0; a < r.count; ++a) {
            const int64_t line = (r.first + a * plan.rows.step) * w;
            for (int64_t b = 0; b < c.count; ++b) {
              const int64_t i = line + c.first + b * cols.step;
              MaxTap(plane[i], i, best, arg);
            }
          }
          yr[ox] = best;
          ir[ox] = arg;
        };
        int64_t lo = cols.full_lo, hi = cols.full_hi;
        bool done = false;
        if (r.count > 0 && lanes_fit) {
          if (cols.stride == 1) {
            done = MaxPoolWhole(plane, h * w, w, r, plan.rows.step, cols, lo, hi,
                                std::integral_constant<int64_t, 1>(), yr, ir);
          } else if (cols.stride == 2) {
            done = MaxPoolWhole(plane, h * w, w, r, plan.rows.step, cols, lo, hi,
                                std::integral_constant<int64_t, 2>(), yr, ir);
          } else {
            done = MaxPoolWhole(plane, h * w, w, r, plan.rows.step, cols, lo, hi, cols.stride, yr, ir);
          }
        }
        if (!done) lo = hi = ow;
        for (int64_t ox = 0; ox < lo; ++ox) scan(ox);
        for (int64_t ox = hi; ox < ow; ++ox) scan(ox);
        if (plan.index_offset != 0)  // a part of the rows: indices in the whole plane
          for (int64_t ox = 0; ox < ow; ++ox) ir[ox] += ir[ox] >= 0 ? plan.index_offset : 0;
      }
    }
  }, PlaneChunk(plan));
}

// dx [P, H, W] = dy scattered to the argmax of each window.
template <typename T>
void MaxPoolBackward(const PoolPlan& plan, const Shape& xs, const T* dy, const int64_t* idx, T* dx, ThreadPool* pool) {
  const int64_t hw = xs[2] * xs[3], ohw = plan.out[2] * plan.out[3];
  ParallelRange(pool, plan.planes(), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      T* plane = dx + p * hw;
      std::fill(plane, plane + hw, T(0));
      for (int64_t o = p * ohw; o < (p + 1) * ohw; ++o)
        if (idx[o] >= 0) plane[idx[o]] += dy[o];
    }
  }, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, hw + ohw)));
}

// Whether the pool is one window over each whole plane (a global pool: an
// SE block's squeeze); its divisor then.
std::optional<int64_t> GlobalWindow(const PoolPlan& plan, int64_t h, int64_t w) {
  if (plan.out[2] != 1 || plan.out[3] != 1) return std::nullopt;
  const Window& r = plan.rows.windows[0];
  const Window& c = plan.cols.windows[0];
  if (r.first != 0 || r.count != h || c.first != 0 || c.count != w) return std::nullopt;
  return r.extent * c.extent;
}

// y [P, OH, OW] = sum over each window of x [P, H, W] / its extents
// (average windows have unit steps: no dilation).
template <typename T>
void WindowMean(const PoolPlan& plan, const Shape& xs, const T* x, T* y, ThreadPool* pool) {
  const int64_t h = xs[2], w = xs[3], oh = plan.out[2], ow = plan.out[3];
  if (const std::optional<int64_t> divisor = GlobalWindow(plan, h, w)) {
    // Whole planes, each one span summed in independent lanes (ArraySum).
    WithSmallExtent(h * w, [&](auto size) {
      ParallelRange(pool, plan.planes(), [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) y[p] = ArraySum(x + p * size, size) / static_cast<T>(*divisor);
      }, PlaneChunk(plan));
    });
    return;
  }
  ParallelRange(pool, plan.planes(), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* plane = x + p * h * w;
      for (int64_t oy = 0; oy < oh; ++oy) {
        const Window& r = plan.rows.windows[oy];
        for (int64_t ox = 0; ox < ow; ++ox) {
          const Window& c = plan.cols.windows[ox];
          T sum = 0;
          if (c.first == 0 && c.count == w) {
            // Whole rows are one span, summed in independent lanes rather
            // than one chain of adds.
            sum = ArraySum(plane + r.first * w, r.count * w);
          } else {
            for (int64_t iy = r.first; iy < r.first + r.count; ++iy)
              for (int64_t ix = c.first; ix < c.first + c.count; ++ix) sum += plane[iy * w + ix];
          }
          y[(p * oh + oy) * ow + ox] = sum / static_cast<T>(r.extent * c.extent);
        }
      }
    }
  }, PlaneChunk(plan));
}

// dx [P, H, W] = each dy [P, OH, OW] spread evenly over its window.
template <typename T>
void WindowMeanBackward(const PoolPlan& plan, const Shape& xs, const T* dy, T* dx, ThreadPool* pool) {
  const int64_t h = xs[2], w = xs[3], oh = plan.out[2], ow = plan.out[3];
  if (const std::optional<int64_t> divisor = GlobalWindow(plan, h, w)) {
    // One window over each whole plane: every element its share.
    WithSmallExtent(h * w, [&](auto size) {
      ParallelRange(pool, plan.planes(), [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          const T share = dy[p] / static_cast<T>(*divisor);
          for (int64_t i = 0; i < size; ++i) dx[p * size + i] = share;
        }
      }, PlaneChunk(plan));
    });
    return;
  }
  ParallelRange(pool, plan.planes(), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      T* plane = dx + p * h * w;
      std::fill(plane, plane + h * w, T(0));
      for (int64_t oy = 0; oy < oh; ++oy) {
        const Window& r = plan.rows.windows[oy];
        for (int64_t ox = 0; ox < ow; ++ox) {
          const Window& c = plan.cols.windows[ox];
          const T g = dy[(p * oh + oy) * ow + ox] / static_cast<T>(r.extent * c.extent);
          for (int64_t iy = r.first; iy < r.first + r.count; ++iy)
            for (int64_t ix = c.first; ix < c.first + c.count; ++ix) plane[iy * w + ix] += g;
        }
      }
    }
  }, PlaneChunk(plan));
}

// ---------------------------------------------------------------------------
// Op definitions.

class PoolOp : public OpDef {
 public:
  PoolOp(const char* name, PoolKind kind) : name_(name), kind_(kind) { DeclarePoolAttrs(kind, DeclareAttrs()); }
  std::string name() const override { return name_; }
  // Sample: every image pooled on its own; parameter: the channels.
  // Attribute: output rows, each part reading its input rows and the
  // window's halo (graph/task_graph.h). An average pool's part reads its
  // padding rows as zeros, which holds only where every window divides by
  // its whole padded extent: no padding, or padding counted
  // (count_include_pad), and no window reaching past the padded input
  // (ceil mode can make one, whose divisor counts only the rows it covers,
  // not the zeros a part would read there). A max pool's part reads only
  // the rows inside and pads itself (-inf, as the whole op).
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& out) const override {
    SplitRules rules = SampleAlongBatch(in, out);
    rules.parameter = SplitAlong(1, in.size(), out.size());  // the channels
    // Adaptive windows vary with the extent.
    if (kind_ == PoolKind::kAdaptiveAvg) return rules;
    auto a = pool::ParseSlidingAttrs(kind_, name_, attrs);
    if (!a.ok() || in[0].shape.rank() != 4 || out[0].shape.rank() != 4) return rules;
    const int64_t span = a->dilation[0] * (a->kernel[0] - 1) + 1, padding = a->padding[0];
    const bool max = kind_ == PoolKind::kMax;
    const bool whole_windows = (out[0].shape[2] - 1) * a->stride[0] + span <= in[0].shape[2] + 2 * padding;
    if (!max && ((padding != 0 && !a->include_pad) || !whole_windows)) return rules;
    rules.attribute = SplitAlong(2, in.size(), out.size());
    rules.attribute->inputs[0] = AxisSplit{2, a->stride[0], padding, span, /*zero_padding=*/!max};
    return rules;
  }
  // A part of the rows: an average pool reads its padding rows as zeros,
  // so it runs with no padding along them (its windows divide by the same
  // extents); a max pool reads the rows inside, pads itself with the rows
  // its windows reach beyond the plane (above: padding, below:
  // bottom_padding) and counts its indices from the plane's row 0.
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in,
                              const std::vector<TensorType>& out, const std::vector<Region>& in_regions,
                              const std::vector<Region>& out_regions) const override {
    const Region& x = in_regions[0];
    const Region& y = out_regions[0];
    const bool all_rows = kind_ == PoolKind::kMax ? y.lo[2] == 0 && y.hi[2] == out[0].shape[2]
                                                   : x.lo[2] == 0 && x.hi[2] == in[0].shape[2];
    if (kind_ == PoolKind::kAdaptiveAvg || all_rows) return attrs;
    LOOM_ASSIGN_OR_RETURN(pool::SlidingAttrs a, pool::ParseSlidingAttrs(kind_, name_, attrs));
    AttrMap part = attrs;
    if (kind_ == PoolKind::kAvg) {
      part.Set("padding", std::vector<int64_t>{0, a.padding[1]});
      return part;
    }
    const int64_t span = a.dilation[0] * (a.kernel[0] - 1) + 1;
    const int64_t first = y.lo[2] * a.stride[0] - a.padding[0];     // its first window's first row
    const int64_t end = (y.hi[2] - 1) * a.stride[0] - a.padding[0] + span;  // past its last window's
    part.Set("padding", std::vector<int64_t>{std::max<int64_t>(0, -first), a.padding[1]});
    part.Set("bottom_padding", std::max<int64_t>(0, end - in[0].shape[2]));
    part.Set("row_offset", std::max<int64_t>(0, first));
    return part;
  }

  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, name_));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], name_ + " input x"));
    LOOM_ASSIGN_OR_RETURN(PoolPlan plan, PlanPool(kind_, name_, attrs, in[0].shape));
    std::vector<TensorType> out = {{plan.out, in[0].dtype}};
    if (kind_ == PoolKind::kMax) out.push_back({plan.out, DType::kI64});
    return out;
  }

  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    auto plan = PlanPool(kind_, name_, a, in[0].shape);
    // One compare or add per window element; averages also scale each output.
    if (plan.ok()) c.flops = plan->Taps() + (kind_ == PoolKind::kMax ? 0.0 : static_cast<double>(plan->out.numel()));
    return c;
  }

  Status Gradient(GradBuilder& g) const override {
    const ValueId dy = g.output_grad(0);
    if (dy == kNoValue) return Status::Ok();
    AttrMap attrs = g.attrs();
    attrs.Set("input_shape", g.type(g.input(0)).shape.dims());
    std::vector<ValueId> inputs = {dy};
    if (kind_ == PoolKind::kMax) inputs.push_back(g.output(1));
    g.SetInputGrad(0, g.Emit1(name_ + "Backward", inputs, attrs));
    return Status::Ok();
  }

  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // Pooling works per plane: over [N, R*C, H, W].
  Status Fuse(FusionBuilder& f) const override {
    LOOM_ASSIGN_OR_RETURN(FusedValue x, f.MergeIntoDim1(f.input(0), f.name() + "/x"));
    return f.EmitMergedAndMap({x});
  }

 private:
  std::string name_;
  PoolKind kind_;
};
LOOM_REGISTER_OP(PoolOp, "MaxPool2d", PoolKind::kMax);
LOOM_REGISTER_OP(PoolOp, "AvgPool2d", PoolKind::kAvg);
LOOM_REGISTER_OP(PoolOp, "AdaptiveAvgPool2d", PoolKind::kAdaptiveAvg);

// (dy[, indices]) -> dx with the forward attrs plus input_shape.
class PoolBackwardOp : public OpDef {
 public:
  PoolBackwardOp(const char* name, PoolKind kind) : name_(name), kind_(kind) {
    DeclarePoolAttrs(kind, DeclareAttrs());
    DeclareAttrs().Required("input_shape", AttrType::kInts, "the forward input's shape");
  }
  std::string name() const override { return name_; }

  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    const bool max = kind_ == PoolKind::kMax;
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, max ? 2 : 1, name_));
    LOOM_RETURN_IF_ERROR(ExpectFloat(in[0], name_ + " dy"));
    if (max && (in[1].dtype != DType::kI64 || in[1].shape != in[0].shape))
      return InvalidArgument(name_, ": indices must be i64 shaped like dy ", in[0].shape.ToString(), ", got ",
                             in[1].ToString());
    const Shape x(attrs.Ints("input_shape"));
    LOOM_ASSIGN_OR_RETURN(PoolPlan plan, PlanPool(kind_, name_, attrs, x));
    if (plan.out != in[0].shape)
      return InvalidArgument(name_, ": dy ", in[0].shape.ToString(), " is not the forward output ", plan.out.ToString(),
                             " of input_shape ", x.ToString());
    return std::vector<TensorType>{{x, in[0].dtype}};
  }
  // The batch and the channels (indices are offsets in their own plane).
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>& in,
                    const std::vector<TensorType>&) const override {
    SplitRules rules;
    rules.sample = SplitAlong(0, in.size(), 1);
    rules.parameter = SplitAlong(1, in.size(), 1);
    return rules;
  }
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>&, const std::vector<TensorType>&,
                              const std::vector<Region>&, const std::vector<Region>& out) const override {
    AttrMap part = attrs;
    part.Set("input_shape", out[0].shape().dims());
    return part;
  }

  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    if (kind_ == PoolKind::kMax) {
      c.flops = static_cast<double>(in[0].shape.numel());  // one add per scattered gradient
    } else if (auto plan = PlanPool(kind_, name_, a, out[0].shape); plan.ok()) {
      c.flops = plan->Taps() + static_cast<double>(in[0].shape.numel());
    }
    return c;
  }

 private:
  std::string name_;
  PoolKind kind_;
};
LOOM_REGISTER_OP(PoolBackwardOp, "MaxPool2dBackward", PoolKind::kMax);
LOOM_REGISTER_OP(PoolBackwardOp, "AvgPool2dBackward", PoolKind::kAvg);
LOOM_REGISTER_OP(PoolBackwardOp, "AdaptiveAvgPool2dBackward", PoolKind::kAdaptiveAvg);

// Kernels: the plan comes from the attrs and the input shape (the forward's
// x, or the backward's dx).
template <PoolKind kKind, bool kBackward>
Status PoolKernel(KernelContext& ctx) {
  const Shape& xs = kBackward ? ctx.out(0).shape() : ctx.in(0).shape();
  LOOM_ASSIGN_OR_RETURN(PoolPlan plan, PlanPool(kKind, "pool kernel", *ctx.attrs, xs));
  return DispatchFloat(ctx.in(0).dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = ctx.in(0).data<T>();
    T* out = ctx.out(0).data<T>();
    if constexpr (kKind == PoolKind::kMax && !kBackward) {
      MaxPoolForward(plan, xs, in, out, ctx.out(1).data<int64_t>(), ctx.pool);
    } else if constexpr (kKind == PoolKind::kMax) {
      MaxPoolBackward(plan, xs, in, ctx.in(1).data<int64_t>(), out, ctx.pool);
    } else if constexpr (!kBackward) {
      WindowMean(plan, xs, in, out, ctx.pool);
    } else {
      WindowMeanBackward(plan, xs, in, out, ctx.pool);
    }
  });
}

LOOM_REGISTER_KERNEL("MaxPool2d", DeviceType::kCpu, PoolKernel<PoolKind::kMax, false>);
LOOM_REGISTER_KERNEL("MaxPool2dBackward", DeviceType::kCpu, PoolKernel<PoolKind::kMax, true>);
LOOM_REGISTER_KERNEL("AvgPool2d", DeviceType::kCpu, PoolKernel<PoolKind::kAvg, false>);
LOOM_REGISTER_KERNEL("AvgPool2dBackward", DeviceType::kCpu, PoolKernel<PoolKind::kAvg, true>);
LOOM_REGISTER_KERNEL("AdaptiveAvgPool2d", DeviceType::kCpu, PoolKernel<PoolKind::kAdaptiveAvg, false>);
LOOM_REGISTER_KERNEL("AdaptiveAvgPool2dBackward", DeviceType::kCpu, PoolKernel<PoolKind::kAdaptiveAvg, true>);

}  // namespace
}  // namespace loom
