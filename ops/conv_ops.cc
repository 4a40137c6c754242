// Convolutions, NCHW / NCL with PyTorch semantics and weight layouts:
// Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d and their backward ops.
//
//   Conv2d(x [N, C, H, W], weight [O, C/groups, KH, KW][, bias [O]]) -> y
//   ConvTranspose2d(x [N, C, H, W], weight [C, O/groups, KH, KW][, bias [O]]) -> y
//   (Conv1d / ConvTranspose1d: the same with [N, C, L] and [.., .., K].)
// attrs: stride, padding, dilation (an int or one int per spatial dim;
// defaults 1, 0, 1), groups (default 1), and for transposed convolutions
// output_padding (default 0, smaller than stride or dilation).
//
// Every op here is one of three products over a single geometry: an "image"
// side [N, C, H, W] and a "column" side [N, O, OH, OW], joined by a weight
// [O, C/groups, KH, KW] (per group g: W_g is [O/g, K], K = C/g * KH * KW):
//   forward      cols_g  = W_g * im2col(image_g)          (+ bias on O)
//   adjoint      image_g = col2im(W_g^T * cols_g)         (+ bias on C)
//   weight grad  dW_g    = sum_n cols_{n,g} * im2col(image_{n,g})^T
// A convolution maps image -> cols, so its input gradient is the adjoint.
// A transposed convolution is the same pair seen from the other side: its
// input is the column side and its output the image, and PyTorch's layout
// for it, [C_in, C_out/groups, KH, KW], is exactly [O, C/groups, KH, KW] of
// that geometry. 1-D ops are 2-D ones with H = KH = 1. im2col is never
// written out: the GEMMs pack it straight from the planes (ImageColumns),
// and a unit-stride adjoint runs as the forward of the transposed
// convolution (AdjointAsForward) instead of through col2im.
//
// Backward ops (inputs -> output; attrs: the forward op's, plus the shape
// the backward op cannot infer):
//   ConvBackwardInput(dy, w) -> dx            + input_shape
//   ConvBackwardWeight(x, dy) -> dw           + weight_shape
//   ConvTransposeBackwardInput(dy, w) -> dx   + input_shape
//   ConvTransposeBackwardWeight(x, dy) -> dw  + weight_shape
//   ConvBackwardBias(dy) -> db                (sum over all dims but 1)
// They serve the 1-D and 2-D ops alike (the rank of dy decides).
#include <algorithm>
#include <array>
#include <cstring>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/inline_vector.h"
#include "ops/conv_geometry.h"
#include "ops/conv_winograd.h"
#include "ops/cpu_util.h"
#include "ops/fusion_builder.h"
#include "ops/gemm.h"
#include "ops/op.h"
#include "ops/transpose8.h"

// The f64 kernels' eight-lane vectors are 64 bytes; on a build without
// AVX-512, GCC notes that returning one changes the calling convention
// (-Wpsabi). The functions that return them are internal to this file, so
// no call crosses between code built with different flags.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace loom {
namespace {

// ---------------------------------------------------------------------------
// Attributes and shapes.

// Attribute parsing and the products' geometry: ops/conv_geometry.h, shared
// with the CUDA kernels.
using conv::ConvGeom;
namespace winograd = conv::winograd;
using conv::ConvParams;
using conv::Pair;
using conv::PairString;
using conv::ParseConvParams;
using conv::Product;
using conv::SpatialOf;
using conv::WithSpatial;

// Sets a part's `groups` when it holds `channels` of the op's `whole` input
// channels: a run of its `groups` groups gets its share of them.
Status SetGroupsOfRun(const std::string& op, int64_t groups, int64_t channels, int64_t whole, AttrMap* part) {
  if (channels == whole) return Status::Ok();
  if ((groups * channels) % whole != 0)
    return InvalidArgument(op, ": ", channels, " of ", whole, " input channels are not a run of its ", groups,
                           " groups");
  part->Set("groups", groups * channels / whole);
  return Status::Ok();
}

// The attributes of every convolution op, declared once. The backward ops
// take the forward op's plus the shape they produce.
void DeclareConvAttrs(AttrSchema& s, bool transpose) {
  s.Default("stride", AttrType::kIntOrInts, int64_t{1}, "step of the kernel: one int or one per spatial dim")
      .Default("padding", AttrType::kIntOrInts, int64_t{0}, "zeros added on both sides of each spatial dim")
      .Default("dilation", AttrType::kIntOrInts, int64_t{1}, "spacing between kernel taps")
      .Default("groups", int64_t{1}, "channel groups; the weight's input dim is C / groups");
  if (transpose)
    s.Default("output_padding", AttrType::kIntOrInts, int64_t{0}, "extra rows added on one side of the output");
}

StatusOr<std::vector<int64_t>> ShapeAttr(const AttrMap& attrs, const std::string& op, const char* name) {
  auto it = attrs.values().find(name);
  const auto* list = it == attrs.values().end() ? nullptr : std::get_if<std::vector<int64_t>>(&it->second);
  if (list == nullptr) return InvalidArgument(op, ": missing int-list attribute '", name, "'");
  return *list;
}

const char* LayoutName(int sd, bool weight) {
  if (weight) return sd == 2 ? "[O, C/groups, KH, KW]" : "[O, C/groups, K]";
  return sd == 2 ? "[N, C, H, W]" : "[N, C, L]";
}

Status CheckRanks(const std::string& op, const ConvParams& p, const Shape& x, const Shape& w, bool transpose) {
  if (x.rank() != p.sd + 2)
    return InvalidArgument(op, ": input x must be ", LayoutName(p.sd, false), ", got ", x.ToString());
  if (w.rank() != p.sd + 2)
    return InvalidArgument(op, ": weight must be ",
                           transpose ? (p.sd == 2 ? "[C, O/groups, KH, KW]" : "[C, O/groups, K]") : LayoutName(p.sd, true),
                           ", got ", w.ToString());
  for (int d = 2; d < w.rank(); ++d)
    if (w[d] < 1) return InvalidArgument(op, ": kernel extents must be positive, weight ", w.ToString());
  return Status::Ok();
}

// y of a convolution of x [N, C, *] by w [O, C/groups, *k].
StatusOr<Shape> ConvOutputShape(const std::string& op, const ConvParams& p, const Shape& x, const Shape& w) {
  LOOM_RETURN_IF_ERROR(CheckRanks(op, p, x, w, false));
  const int64_t c = x[1], o = w[0], g = p.groups;
  if (c % g != 0)
    return InvalidArgument(op, ": input channels ", c, " (x ", x.ToString(), ") are not divisible by groups=", g);
  if (o % g != 0)
    return InvalidArgument(op, ": output channels ", o, " (weight ", w.ToString(), ") are not divisible by groups=", g);
  if (w[1] * g != c)
    return InvalidArgument(op, ": weight ", w.ToString(), " takes ", w[1], " input channels per group, but x ",
                           x.ToString(), " has ", c, " channels in ", g, " group(s) (", c / g, " per group)");
  const Pair in = SpatialOf(x), k = SpatialOf(w);
  Pair span, padded, out;
  for (int a = 0; a < 2; ++a) {
    span[a] = p.dilation[a] * (k[a] - 1) + 1;
    padded[a] = in[a] + 2 * p.padding[a];
  }
  for (int a = 0; a < 2; ++a)
    if (span[a] > padded[a])
      return InvalidArgument(op, ": kernel ", PairString(k, p.sd), " with dilation ", PairString(p.dilation, p.sd),
                             " spans ", PairString(span, p.sd), ", larger than the padded input ",
                             PairString(padded, p.sd), " (x ", x.ToString(), ", padding ", PairString(p.padding, p.sd),
                             ")");
  for (int a = 0; a < 2; ++a) out[a] = (padded[a] - span[a]) / p.stride[a] + 1;
  return WithSpatial(x[0], o, out, p.sd);
}

// y of a transposed convolution of x [N, C, *] by w [C, O/groups, *k].
StatusOr<Shape> ConvTransposeOutputShape(const std::string& op, const ConvParams& p, const Shape& x, const Shape& w) {
  LOOM_RETURN_IF_ERROR(CheckRanks(op, p, x, w, true));
  const int64_t c = x[1], g = p.groups;
  if (w[0] != c)
    return InvalidArgument(op, ": weight ", w.ToString(), " has ", w[0], " input channels (dim 0 of [C, O/groups, ...]) but x ",
                           x.ToString(), " has ", c);
  if (c % g != 0)
    return InvalidArgument(op, ": input channels ", c, " (x ", x.ToString(), ") are not divisible by groups=", g);
  const Pair in = SpatialOf(x), k = SpatialOf(w);
  Pair out;
  for (int a = 0; a < 2; ++a)
    out[a] = (in[a] - 1) * p.stride[a] - 2 * p.padding[a] + p.dilation[a] * (k[a] - 1) + p.output_padding[a] + 1;
  for (int a = 0; a < 2; ++a)
    if (in[a] < 1 || out[a] < 1)
      return InvalidArgument(op, ": output would be ", PairString(out, p.sd), " for x ", x.ToString(), ", weight ",
                             w.ToString(), ", padding ", PairString(p.padding, p.sd), ": needs positive extents");
  return WithSpatial(x[0], w[1] * g, out, p.sd);
}

StatusOr<Shape> OutputShape(bool transpose, const std::string& op, const ConvParams& p, const Shape& x, const Shape& w) {
  return transpose ? ConvTransposeOutputShape(op, p, x, w) : ConvOutputShape(op, p, x, w);
}

// f32, f64, or (mixed precision) bf16 / f16 computed in f32.
Status ExpectSameDType(const std::string& op, const std::vector<TensorType>& in, const char* const* names) {
  LOOM_RETURN_IF_ERROR(ExpectFloatOrHalf(in[0], op + " " + names[0]));
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype)
      return InvalidArgument(op, ": ", names[i], " is ", DTypeName(in[i].dtype), " but ", names[0], " is ",
                             DTypeName(in[0].dtype));
  return Status::Ok();
}

// Multiply-adds of any of the three products: one per column-side element
// per weight element of its output channel (weight dim 0 is always the
// column side's channel count).
double ConvFlops(const Shape& cols, const Shape& weight) {
  if (weight.numel() == 0) return 0;
  return 2.0 * static_cast<double>(cols.numel()) * static_cast<double>(weight.numel() / weight[0]);
}

// ---------------------------------------------------------------------------
// CPU machinery.

// Enough channels per chunk that a hand-off pays for itself.
int64_t ChannelChunk(int64_t per_channel) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, per_channel)); }

// Groups with a single image channel and few output channels (depthwise
// convolutions) skip im2col and GEMM: with a GEMM depth of just KH * KW and
// a handful of rows, the product is a memory-bound GEMV, and walking the
// kernel taps directly over the planes (PhasePlan below) moves far less data.
constexpr int64_t kDirectMaxGroupOutputs = 2;
bool Direct(const ConvGeom& g) { return g.cg() == 1 && g.og() <= kDirectMaxGroupOutputs; }

// Convolutions on small planes (the late stages of a ResNet or a
// MobileNet) put a batch of images side by side in one GEMM: alone, an
// image gives the product only OH * OW columns, and each of its GEMMs reads
// the whole weight for them (a 3x3 convolution on 512 channels of 4x4
// planes: 9.4 MB for 16 columns); side by side, the image block [K, images
// * OH * OW] (the images' planes for a 1x1 convolution, their im2col blocks
// otherwise) is as wide as a large plane.
constexpr int64_t kBatchedPlaneBelow = 256;
constexpr int64_t kBatchColumns = 1024;
constexpr int64_t kBatchBlockElems = int64_t{1} << 21;  // a task's image and column blocks: 8 MiB of f32
bool Batched(const ConvGeom& g) { return g.ohw() < kBatchedPlaneBelow && (g.pointwise() || !Direct(g)); }
// Images per batch: up to kBatchColumns columns in blocks of at most
// kBatchBlockElems, the batches as equal as they can be and as many as a
// power of two (so that they share out evenly over the usual thread
// counts). A function of the geometry alone: the weight gradient sums over
// a batch's columns.
int64_t BatchImages(const ConvGeom& g) {
  const int64_t n = std::max<int64_t>(1, g.n);
  const int64_t columns = std::min(kBatchColumns, kBatchBlockElems / std::max<int64_t>(1, g.k() + g.og()));
  const int64_t most = std::clamp<int64_t>(columns / std::max<int64_t>(1, g.ohw()), 1, n);
  int64_t batches = 1;
  while (batches * most < n) batches *= 2;
  batches = std::min(batches, n);
  return (n + batches - 1) / batches;
}

// Otherwise the column side is processed in tiles of output rows [y0, y1)
// of about kTileElems im2col elements. The forward's GEMMs pack their
// image side straight from the planes (ImageColumns), so its tiles only
// size the GEMMs (small enough to read the weight in place; they grow with
// the pool that works on one tile together); the weight gradient does the
// same with a whole image per GEMM. The adjoints that still go through
// col2im write a tile's block [K, (y1 - y0) * OW] and add it into the
// planes: those tiles, which decide the order of the sums, are functions
// of the geometry alone, so results never depend on the thread count.
// 1x1 convolutions need no block and take the image whole.
constexpr int64_t kTileElems = 64 * 1024;

int64_t ForwardTileElems(ThreadPool* inner) { return kTileElems * (inner ? inner->num_threads() : 1); }

// Output rows per tile of about `elems` im2col elements.
int64_t TileRows(const ConvGeom& g, int64_t elems) {
  if (g.pointwise()) return std::max<int64_t>(1, g.oh);
  return std::clamp<int64_t>(elems / std::max<int64_t>(1, g.k() * g.ow), 1, std::max<int64_t>(1, g.oh));
}

// A unit-stride convolution's adjoint is a convolution too, the forward
// of the transposed one: of dy's planes padded by dilation * (kernel - 1)
// - padding, by the weight with its kernel flipped and its channel axes
// swapped (AdjointWeights). Run as the forward runs, packed straight from
// dy's planes, it needs no col2im and no [K, len] block in between. The
// geometry of one (image, group) of it, when it applies (the other
// adjoints run W^T * dy and col2im). Not on images narrower than
// kMinAdjointRow: the packing copies runs of one image row, and on 4x4
// planes those runs of 4 cost more than col2im (ResNet-18's 4x4 stage:
// 0.95x; 8x8 1.02x, 14x14 1.28x, 32x32 1.13x). A 1x1 convolution's runs
// are whole planes, but their copies cost the same: on 4x4 planes its
// adjoint as a forward took 1.2x the time of W^T times gathered planes
// (docs/benchmarks.md, "1x1 convolutions packed from their planes").
constexpr int64_t kMinAdjointRow = 8;
std::optional<ConvGeom> TransposedForward(const ConvGeom& g) {
  if (Direct(g) || g.sh != 1 || g.sw != 1) return std::nullopt;
  const int64_t ph = g.dh * (g.kh - 1) - g.ph, pw = g.dw * (g.kw - 1) - g.pw;
  // Its output must be the image exactly (a transposed convolution's
  // output_padding adds rows that no tap reaches).
  if (ph < 0 || pw < 0 || g.oh + 2 * ph - g.dh * (g.kh - 1) != g.h || g.ow + 2 * pw - g.dw * (g.kw - 1) != g.w)
    return std::nullopt;
  return ConvGeom{1, g.og(), g.oh, g.ow, g.cg(), g.h, g.w, g.kh, g.kw, 1, 1, ph, pw, g.dh, g.dw, 1};
}
std::optional<ConvGeom> AdjointAsForward(const ConvGeom& g) {
  if (g.w < kMinAdjointRow) return std::nullopt;
  return TransposedForward(g);
}

// Scratch elements for the block of an adjoint that goes through col2im.
int64_t TileScratch(const ConvGeom& g) {
  if (g.pointwise() || Direct(g) || Batched(g) || AdjointAsForward(g)) return 0;
  return g.k() * g.ow * TileRows(g, kTileElems);
}

// Scratch elements for one group's padded planes (PadPlanes), or for the
// adjoint's padded dy.
int64_t PlanesScratch(const ConvGeom& g) { return g.padded() ? g.cg() * g.hp() * g.wp() : 0; }
int64_t PadScratch(const ConvGeom& g) {
  if (Direct(g)) return 0;
  const std::optional<ConvGeom> adjoint = AdjointAsForward(g);
  if (Batched(g)) return adjoint ? 0 : PlanesScratch(g);  // col2im's planes (BatchPlanes holds the rest)
  return std::max(PlanesScratch(g), adjoint ? PlanesScratch(*adjoint) : 0);
}

// A Batched() task's scratch, per image of a batch, in two parts. Its
// images' side: their padded planes, dy's padded planes for an input
// gradient run as a forward, or the input gradient's block [K, OH * OW]
// for col2im (for a 1x1 convolution, the input gradient's planes). Its
// GEMM's output: the column side [O/g, OH * OW], or the input gradient's
// planes [C/g, H * W].
int64_t BatchPlanes(const ConvGeom& g) {
  if (!Batched(g)) return 0;
  const std::optional<ConvGeom> adjoint = AdjointAsForward(g);
  return BatchImages(g) * std::max({g.k() * g.ohw(), PlanesScratch(g), adjoint ? PlanesScratch(*adjoint) : 0});
}
int64_t BatchOutputs(const ConvGeom& g) {
  return Batched(g) ? BatchImages(g) * std::max(g.og() * g.ohw(), g.cg() * g.hw()) : 0;
}

// fn(y0, y1, len) for each tile of about `elems` im2col elements; len =
// (y1 - y0) * OW.
template <typename Fn>
void ForEachTile(const ConvGeom& g, int64_t elems, Fn&& fn) {
  const int64_t rows = TileRows(g, elems);
  for (int64_t y0 = 0; y0 < g.oh; y0 += rows) {
    const int64_t y1 = std::min(g.oh, y0 + rows);
    fn(y0, y1, (y1 - y0) * g.ow);
  }
}

// Calls fn(stride) with a compile-time 1 for unit strides, so that the
// loops stepping by it vectorise, and with the value otherwise.
template <typename Fn>
void WithStride(int64_t stride, Fn&& fn) {
  if (stride == 1) {
    fn(std::integral_constant<int64_t, 1>());
  } else {
    fn(stride);
  }
}

// xp [C/g, HP, WP] = one group's planes x [C/g, H, W] inside a zero border of
// the padding: every kernel tap of every output then lands inside xp, and
// the packing of the image side and col2im are plain strided row copies
// (per-row bounds and short library copies cost more than the copy itself
// on small planes).
template <typename T>
void PadPlanes(const ConvGeom& g, const T* x, T* xp) {
  std::fill(xp, xp + g.cg() * g.hp() * g.wp(), T(0));
  for (int64_t c = 0; c < g.cg(); ++c)
    for (int64_t iy = 0; iy < g.h; ++iy) {
      const T* src = x + (c * g.h + iy) * g.w;
      T* dst = xp + (c * g.hp() + iy + g.ph) * g.wp() + g.pw;
      for (int64_t ix = 0; ix < g.w; ++ix) dst[ix] = src[ix];
    }
}

// x [C/g, H, W] = the inside of xp [C/g, HP, WP] (+ bias [C/g]), the adjoint
// of PadPlanes after col2im has accumulated into xp.
template <typename T>
void UnpadPlanes(const ConvGeom& g, const T* xp, const T* bias, T* x) {
  for (int64_t c = 0; c < g.cg(); ++c) {
    const T b = bias ? bias[c] : T(0);
    for (int64_t iy = 0; iy < g.h; ++iy) {
      const T* src = xp + (c * g.hp() + iy + g.ph) * g.wp() + g.pw;
      T* dst = x + (c * g.h + iy) * g.w;
      for (int64_t ix = 0; ix < g.w; ++ix) dst[ix] = b + src[ix];
    }
  }
}

// Calls fn(row, at, col) for channel c's rows of the im2col block of output
// rows [y0, y1), once per output row oy: `at` is the offset in planes xp of
// the tap of oy's first output (xp holds the padding, if any), `col` the
// offset of oy's OW columns in the block row.
template <typename Fn>
void ForEachTapLine(const ConvGeom& g, int64_t c, int64_t y0, int64_t y1, Fn&& fn) {
  const int64_t hp = g.padded() ? g.hp() : g.h, wp = g.padded() ? g.wp() : g.w;
  for (int64_t ki = 0; ki < g.kh; ++ki)
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const int64_t r = (c * g.kh + ki) * g.kw + kj;
      for (int64_t oy = y0; oy < y1; ++oy)
        fn(r, (c * hp + oy * g.sh + ki * g.dh) * wp + kj * g.dw, (oy - y0) * g.ow);
    }
}

// xp += col2im(col [C/g * KH * KW, (y1 - y0) * OW], rows ld apart): each
// tap's row of the block added into the planes where im2col would have
// read it (the adjoint of ImageColumns). Channels own disjoint rows and
// planes, so they split freely.
template <typename T>
void Col2Im(const ConvGeom& g, const T* col, int64_t y0, int64_t y1, int64_t ld, T* xp, ThreadPool* pool) {
  const int64_t len = (y1 - y0) * g.ow;
  WithStride(g.sw, [&](auto sw) {
    WithSmallExtent(g.ow, [&](auto ow) {  // col2im of 4x4 planes adds rows of 4
      ParallelRange(pool, g.cg(), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c)
          ForEachTapLine(g, c, y0, y1, [&](int64_t r, int64_t at, int64_t cols) {
            const T* in = col + r * ld + cols;
            T* out = xp + at;
            for (int64_t ox = 0; ox < ow; ++ox) out[ox * sw] += in[ox];
          });
      }, ChannelChunk(g.kh * g.kw * len));
    });
  });
}

// The direct walk of Direct() groups. The zero-padded plane xp [HP, WP] is
// split into its SH x SW stride phases: phase (py % SH, px % SW) holds
// xp[py][px] at (py / SH) * WQ + px / SW. Tap (ki, kj) of output (oy, ox)
// reads xp[oy * SH + ki * DH][ox * SW + kj * DW], which is element
// oy * WQ + ox of its phase shifted by (ki * DH / SH) * WQ + kj * DW / SW: each
// tap is then one unit-stride stream over a "wide" output [OH, WQ] whose
// columns past OW are scratch. The products walk each row's OW real
// columns only, and skip the taps that would read padding rows (a 5x5
// kernel on an 8x8 plane computes 34 of 40 row products, on 8 of 12
// columns).
//
// The channels (one per group) go kLanes at a time, interleaved element by
// element ([position][lane], a "blocked" layout): a tap is then a
// multiply-add of whole vectors, one weight per lane, however small the
// plane (MobileNet's late planes are 4x4 and 2x2, a few elements per row).
// The products keep their sums in registers across the taps (SumTaps,
// GatherTaps, TapDots): each stream is read once and each sum written once.
//
// The layout is planned once per kernel call (integer divisions per task
// cost more than a small plane's arithmetic).
constexpr int64_t kLanes = 8;

struct PhasePlan {
  int64_t wq = 0;      // a phase row: ceil(WP / SW)
  int64_t plane = 0;   // positions per phase: ceil(HP / SH) * WQ plus one
                       // row, for the wide output's scratch columns
  int64_t phases = 0;  // SH * SW
  int64_t wide = 0;    // OH * WQ
  std::vector<int64_t> taps;  // tap ki * KW + kj's stream offset in the phases
  // The pixels of a plane [H, W] as runs contiguous in a phase: pixels
  // image + j * SW, j < count, of one image row land at phase + j.
  // [tap_lo, tap_hi): the entries of its phase's PhaseTaps::taps that reach
  // an output row inside the plane (the input gradient skips the rest).
  struct Run {
    int64_t image, phase, count;
    int64_t tap_lo = 0, tap_hi = 0;
  };
  std::vector<Run> runs;
  // Output row oy's kernel rows that read an image row, not padding:
  // [first, last).
  std::vector<std::pair<int64_t, int64_t>> row_taps;
  // The kernel columns that read an image column for some output column,
  // [first, last): on planes narrower than the kernel's reach (a 5x5 on 2x2
  // planes reads 3 of its 5 columns) the others only ever read padding.
  std::pair<int64_t, int64_t> columns;
  // With unit stride and dilation along the rows, a kernel row's live taps
  // read consecutive positions: their number (SumTaps and GatherTaps then
  // load each position once for all of them); 0 otherwise.
  int64_t consecutive = 0;
  // The taps that read an image pixel for some output (the weight
  // gradient's products; the others stay zero).
  std::vector<int64_t> live;
  // The input gradient gathers into each phase from the taps that read it:
  // position q of phase p is the sum over its taps of weight times the
  // wide plane at q - shift, for q in the phase's runs.
  struct PhaseTaps {
    std::vector<std::pair<int64_t, int64_t>> taps;  // (tap, shift)
  };
  std::vector<PhaseTaps> by_phase;
  int64_t margin = 0;  // the largest shift: zero positions before a gathered wide plane
  int64_t numel() const { return phases * plane; }  // positions
  // Positions of the wide plane's buffer: the margin, then a whole phase.
  int64_t wide_span() const { return phases ? margin + plane : 0; }
};

PhasePlan PlanPhases(const ConvGeom& g) {
  PhasePlan l;
  if (!Direct(g)) return l;
  const int64_t hq = (g.hp() + g.sh - 1) / g.sh;
  l.wq = (g.wp() + g.sw - 1) / g.sw;
  l.plane = (hq + 1) * l.wq;
  l.phases = g.sh * g.sw;
  l.wide = g.oh * l.wq;
  for (int64_t ki = 0; ki < g.kh; ++ki)
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const int64_t ry = ki * g.dh, rx = kj * g.dw;
      l.taps.push_back(((ry % g.sh) * g.sw + rx % g.sw) * l.plane + (ry / g.sh) * l.wq + rx / g.sw);
    }
  for (int64_t iy = 0; iy < g.h; ++iy) {
    const int64_t py = iy + g.ph;
    const int64_t row = (py % g.sh) * g.sw * l.plane + (py / g.sh) * l.wq;
    for (int64_t pc = 0; pc < g.sw; ++pc) {
      const int64_t ix0 = ((pc - g.pw) % g.sw + g.sw) % g.sw;  // the first column with (ix + PW) % SW == pc
      if (ix0 < g.w)
        l.runs.push_back({iy * g.w + ix0, row + pc * l.plane + (ix0 + g.pw) / g.sw, (g.w - ix0 + g.sw - 1) / g.sw});
    }
  }
  auto column_inside = [&](int64_t kj) {
    for (int64_t ox = 0; ox < g.ow; ++ox)
      if (const int64_t ix = ox * g.sw + kj * g.dw - g.pw; ix >= 0 && ix < g.w) return true;
    return false;
  };
  l.columns = {0, g.kw};
  while (l.columns.first < l.columns.second && !column_inside(l.columns.first)) ++l.columns.first;
  while (l.columns.second > l.columns.first && !column_inside(l.columns.second - 1)) --l.columns.second;
  if (g.sw == 1 && g.dw == 1) l.consecutive = l.columns.second - l.columns.first;
  auto live_column = [&](size_t r) {
    const int64_t kj = static_cast<int64_t>(r) % g.kw;
    return kj >= l.columns.first && kj < l.columns.second;
  };
  l.by_phase.assign(static_cast<size_t>(l.phases), PhasePlan::PhaseTaps{});
  for (size_t r = 0; r < l.taps.size(); ++r) {
    if (!live_column(r)) continue;  // every position it would gather from is padding
    const int64_t shift = l.taps[r] % l.plane;
    l.by_phase[static_cast<size_t>(l.taps[r] / l.plane)].taps.push_back({static_cast<int64_t>(r), shift});
    l.margin = std::max(l.margin, shift);
  }
  for (PhasePlan::Run& r : l.runs) {
    const PhasePlan::PhaseTaps& p = l.by_phase[static_cast<size_t>(r.phase / l.plane)];
    // The run's image row reaches output row (py - ki * DH) / SH through
    // row ki of the kernel, exactly (the phase has the taps whose offsets
    // divide); the taps of rows out of [0, OH) read zeros.
    const int64_t py = r.image / g.w + g.ph;
    auto reaches = [&](int64_t tap) { return (py - (tap / g.kw) * g.dh) / g.sh; };
    r.tap_lo = 0;
    r.tap_hi = static_cast<int64_t>(p.taps.size());
    while (r.tap_lo < r.tap_hi && reaches(p.taps[r.tap_lo].first) >= g.oh) ++r.tap_lo;
    while (r.tap_hi > r.tap_lo && reaches(p.taps[r.tap_hi - 1].first) < 0) --r.tap_hi;
  }
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    auto inside = [&](int64_t ki) { return oy * g.sh + ki * g.dh - g.ph >= 0 && oy * g.sh + ki * g.dh - g.ph < g.h; };
    int64_t lo = 0, hi = g.kh;
    while (lo < hi && !inside(lo)) ++lo;
    while (hi > lo && !inside(hi - 1)) --hi;
    l.row_taps.push_back({lo, hi});
  }
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    const bool reads = std::any_of(l.row_taps.begin(), l.row_taps.end(),
                                   [&](const auto& rows) { return ki >= rows.first && ki < rows.second; });
    for (int64_t kj = l.columns.first; reads && kj < l.columns.second; ++kj) l.live.push_back(ki * g.kw + kj);
  }
  return l;
}

// Channels [c0, c0 + lanes) of a Direct() convolution, lane v = channel c0 + v.
struct ChannelBlock {
  int64_t c0, lanes;
};
int64_t ChannelBlocks(const ConvGeom& g) { return (g.groups + kLanes - 1) / kLanes; }
ChannelBlock BlockOf(const ConvGeom& g, int64_t block) {
  return {block * kLanes, std::min(kLanes, g.groups - block * kLanes)};
}

// A position's kLanes channels as one vector (GCC/Clang vector extensions):
// a tap is one multiply-add of whole vectors, its weights loaded once.
// Loads and stores go through an unaligned, aliasing twin of the type, so
// each is one vector move: a memcpy is split into 16-byte pieces under
// .bazelrc's -mmove-max=128, and the sums then round-trip through the stack.
template <typename T>
struct LaneVector {
  typedef T Type __attribute__((vector_size(kLanes * sizeof(T))));
  typedef T Unaligned __attribute__((vector_size(kLanes * sizeof(T)), aligned(alignof(T)), may_alias));
  static Type Load(const T* p) { return *reinterpret_cast<const Unaligned*>(p); }
  static void Store(T* p, const Type& v) { *reinterpret_cast<Unaligned*>(p) = v; }
};

// The copies into and out of the blocked layout are transposes: channel v
// of a block is a row of positions, and the layout is its columns.
#if defined(__AVX__)
#if defined(__AVX2__)
// A stride-2 convolution's image rows in its two column phases, eight
// channels at a time: pixel 2j of a row is position j of its even phase,
// pixel 2j + 1 position j of its odd one. Each channel's 16 pixels are
// loaded whole and transposed 8 x 8 twice; each transposed position, a
// pixel of the eight channels, is stored straight into its phase.
// even / odd [j * 8 + v] = src[v * ld + 2j] / src[v * ld + 2j + 1], j < 8.
inline void SplitColumns8x8(const float* src, int64_t ld, float* even, float* odd) {
  for (int h = 0; h < 16; h += 8)
    Transpose8([&](int v) { return _mm256_loadu_ps(src + v * ld + h); },
               [&](int i, __m256 c) { _mm256_storeu_ps(((h + i) % 2 ? odd : even) + (h + i) / 2 * 8, c); });
}
// Its adjoint: dst[v * ld + 2j] = (add[v] +) even[j * 8 + v], dst[v * ld +
// 2j + 1] = (add[v] +) odd[j * 8 + v], j < 8. Each phase transposed whole,
// then each channel's halves interleaved in registers: its 16 pixels are
// stored together (storing straight from the transposes, half a row at a
// time, ran the 32x32 stride-2 input gradient 2-6% slower).
inline void MergeColumns8x8(const float* even, const float* odd, const float* add, float* dst, int64_t ld) {
  __m256 e[8], o[8];
  Transpose8([&](int j) { return _mm256_loadu_ps(even + j * 8); }, [&](int v, __m256 c) { e[v] = c; });
  Transpose8([&](int j) { return _mm256_loadu_ps(odd + j * 8); }, [&](int v, __m256 c) { o[v] = c; });
  for (int v = 0; v < 8; ++v) {
    const __m256 lo = _mm256_unpacklo_ps(e[v], o[v]), hi = _mm256_unpackhi_ps(e[v], o[v]);  // e0 o0 e1 o1 | e4 ...
    __m256 first = _mm256_permute2f128_ps(lo, hi, 0x20), second = _mm256_permute2f128_ps(lo, hi, 0x31);
    if (add) {
      first = _mm256_add_ps(_mm256_set1_ps(add[v]), first);
      second = _mm256_add_ps(_mm256_set1_ps(add[v]), second);
    }
    _mm256_storeu_ps(dst + v * ld, first);
    _mm256_storeu_ps(dst + v * ld + 8, second);
  }
}
#endif

// Transpose4(row, emit): emit(i, c) for i < 4, c[k] = row(k)[i] for k < 8
// (rows of four), as Transpose8.
template <typename Row, typename Emit>
inline void Transpose4(Row&& row, Emit&& emit) {
  __m128 r[8];
  for (int k = 0; k < 8; ++k) r[k] = row(k);
  _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]);
  _MM_TRANSPOSE4_PS(r[4], r[5], r[6], r[7]);
  for (int i = 0; i < 4; ++i) emit(i, _mm256_set_m128(r[i + 4], r[i]));
}

// Four positions of eight rows: blocked[i * 8 + k] = src[k * ld + i] for i < 4, k < 8
// (the rows of a small plane, 4 wide, or what is left of a longer one).
// Whole 8-lane stores: the taps read each position as one 32-byte load,
// which two 16-byte stores in flight could not forward to.
inline void Interleave8x4(const float* src, int64_t ld, float* blocked) {
  Transpose4([&](int k) { return _mm_loadu_ps(src + k * ld); },
             [&](int i, __m256 c) { _mm256_storeu_ps(blocked + i * 8, c); });
}

// Its adjoint: dst[k * ld + i] = (add[k] +) blocked[i * 8 + k].
inline void Deinterleave4x8(const float* blocked, const float* add, float* dst, int64_t ld) {
  __m128 r[8];
  for (int i = 0; i < 4; ++i) {
    const __m256 position = _mm256_loadu_ps(blocked + i * 8);
    r[i] = _mm256_castps256_ps128(position);
    r[i + 4] = _mm256_extractf128_ps(position, 1);
  }
  _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]);
  _MM_TRANSPOSE4_PS(r[4], r[5], r[6], r[7]);
  for (int k = 0; k < 8; ++k) _mm_storeu_ps(dst + k * ld, add ? _mm_add_ps(_mm_set1_ps(add[k]), r[k]) : r[k]);
}
// Two positions of eight rows (the rows of a 2-wide plane, or what is left
// of a longer one): blocked[i * 8 + k] = src[k * ld + i] for i < 2, k < 8.
inline void Interleave8x2(const float* src, int64_t ld, float* blocked) {
  __m128 half[2][2];  // [position][channels 0-3, 4-7]
  for (int k = 0; k < 8; k += 4) {
    auto pair = [&](int row) { return _mm_castsi128_ps(_mm_loadu_si64(src + (k + row) * ld)); };
    const __m128 t0 = _mm_unpacklo_ps(pair(0), pair(1)), t1 = _mm_unpacklo_ps(pair(2), pair(3));  // k0 k+1,0 k1 k+1,1
    half[0][k / 4] = _mm_movelh_ps(t0, t1);
    half[1][k / 4] = _mm_movehl_ps(t1, t0);
  }
  for (int i = 0; i < 2; ++i) _mm256_storeu_ps(blocked + i * 8, _mm256_set_m128(half[i][1], half[i][0]));
}

// Its adjoint: dst[k * ld + i] = (add[k] +) blocked[i * 8 + k].
inline void Deinterleave2x8(const float* blocked, const float* add, float* dst, int64_t ld) {
  const __m256 first = _mm256_loadu_ps(blocked), second = _mm256_loadu_ps(blocked + 8);
  for (int k = 0; k < 8; k += 4) {
    const __m128 a = k ? _mm256_extractf128_ps(first, 1) : _mm256_castps256_ps128(first);
    const __m128 b = k ? _mm256_extractf128_ps(second, 1) : _mm256_castps256_ps128(second);
    for (int h = 0; h < 2; ++h) {  // channels k + 2h and k + 2h + 1, each a pair of positions
      __m128 rows = h ? _mm_unpackhi_ps(a, b) : _mm_unpacklo_ps(a, b);
      if (add) {
        const float lo = add[k + 2 * h], hi = add[k + 2 * h + 1];
        rows = _mm_add_ps(_mm_set_ps(hi, hi, lo, lo), rows);
      }
      _mm_storeu_si64(dst + (k + 2 * h) * ld, _mm_castps_si128(rows));
      _mm_storeu_si64(dst + (k + 2 * h + 1) * ld, _mm_castps_si128(_mm_movehl_ps(rows, rows)));
    }
  }
}
#endif

// blocked[j * kLanes + v] = src[v * ld + j * step] for positions j < count
// and lanes v < lanes.
template <typename T>
void Interleave(const T* src, int64_t ld, int64_t step, int64_t count, int64_t lanes, T* blocked) {
  int64_t j = 0;
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float> && kLanes == 8)
    if (step == 1 && lanes == kLanes) {
      for (; j + 8 <= count; j += 8) Transpose8x8(src + j, ld, blocked + j * kLanes, kLanes, nullptr);
      for (; j + 4 <= count; j += 4) Interleave8x4(src + j, ld, blocked + j * kLanes);
      for (; j + 2 <= count; j += 2) Interleave8x2(src + j, ld, blocked + j * kLanes);
    }
#endif
  for (; j < count; ++j)
    for (int64_t v = 0; v < lanes; ++v) blocked[j * kLanes + v] = src[v * ld + j * step];
}

// dst[v * ld + j * step] = (add[v] +) blocked[j * kLanes + v]: the adjoint
// of Interleave (a bias added on the way).
template <typename T>
void Deinterleave(const T* blocked, int64_t count, int64_t lanes, const T* add, T* dst, int64_t ld, int64_t step) {
  int64_t j = 0;
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float> && kLanes == 8)
    if (step == 1 && lanes == kLanes) {
      for (; j + 8 <= count; j += 8) Transpose8x8(blocked + j * kLanes, kLanes, dst + j, ld, add);
      for (; j + 4 <= count; j += 4) Deinterleave4x8(blocked + j * kLanes, add, dst + j, ld);
      for (; j + 2 <= count; j += 2) Deinterleave2x8(blocked + j * kLanes, add, dst + j, ld);
    }
#endif
  for (; j < count; ++j)
    for (int64_t v = 0; v < lanes; ++v) {
      const T x = blocked[j * kLanes + v];
      dst[v * ld + j * step] = add ? add[v] + x : x;
    }
}

// A stride-2 image row of kLanes channels, eight column pairs: blocked
// even / odd [j * kLanes + v] = src[v * ld + 2j] / src[v * ld + 2j + 1],
// j < 8, each channel's 16 pixels read once (Interleave would read them
// once per phase, and most of them one at a time).
template <typename T>
void SplitColumns8(const T* src, int64_t ld, T* even, T* odd) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float> && kLanes == 8) {
    SplitColumns8x8(src, ld, even, odd);
    return;
  }
#endif
  for (int64_t j = 0; j < 8; ++j)
    for (int64_t v = 0; v < kLanes; ++v) {
      even[j * kLanes + v] = src[v * ld + 2 * j];
      odd[j * kLanes + v] = src[v * ld + 2 * j + 1];
    }
}

// Its adjoint: dst[v * ld + 2j] = (add[v] +) even[j * kLanes + v] and
// dst[v * ld + 2j + 1] = (add[v] +) odd[j * kLanes + v], each channel's 16
// pixels stored whole.
template <typename T>
void MergeColumns8(const T* even, const T* odd, const T* add, T* dst, int64_t ld) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float> && kLanes == 8) {
    MergeColumns8x8(even, odd, add, dst, ld);
    return;
  }
#endif
  for (int64_t j = 0; j < 8; ++j)
    for (int64_t v = 0; v < kLanes; ++v) {
      const T a = add ? add[v] : T(0);
      dst[v * ld + 2 * j] = add ? a + even[j * kLanes + v] : even[j * kLanes + v];
      dst[v * ld + 2 * j + 1] = add ? a + odd[j * kLanes + v] : odd[j * kLanes + v];
    }
}

// Walks the runs of ToPhases and FromPhases: whole(run) copies a run. A
// stride-2 convolution's image row has two runs, its even and its odd
// columns; for a block of whole lanes, row(even, odd, j, pixels) instead
// copies pixels [2j, 2j + pixels) of the row, kRowPixels at a time and
// then what is left, both runs together.
constexpr int64_t kRowPixels = 16;
template <typename Row, typename Whole>
void ForEachRunPiece(const ConvGeom& g, const PhasePlan& l, int64_t lanes, Row&& row, Whole&& whole) {
  const bool paired = g.sw == 2 && lanes == kLanes;
  for (size_t i = 0; i < l.runs.size(); ++i) {
    const PhasePlan::Run& r = l.runs[i];
    if (!paired || i + 1 == l.runs.size() || l.runs[i + 1].image / g.w != r.image / g.w) {
      whole(r);
      continue;
    }
    const PhasePlan::Run& next = l.runs[++i];
    const bool r_even = r.image % g.w == 0;
    for (int64_t j = 0; 2 * j < g.w; j += kRowPixels / 2)
      row(r_even ? r : next, r_even ? next : r, j, std::min(kRowPixels, g.w - 2 * j));
  }
}

// The blocked phases of planes x [lanes, H, W] (lane v's plane at
// x + v * H * W), zero wherever padding, slack or a missing lane. `zeroed`:
// whether `phases` holds zeros there already (an earlier call on it left
// them: the pixels' positions are the same for every block), so only a
// block of fewer lanes clears it again. A stride-2 row's pixels are read
// once: 16 at a time split in registers, the rest (a row shorter than 16,
// or its end) through a line of blocked pixels that the unit-stride
// transposes make, whose positions go to the two phases whole.
template <typename T>
void ToPhases(const ConvGeom& g, const PhasePlan& l, const T* x, int64_t lanes, T* phases, bool* zeroed) {
  using V = LaneVector<T>;
  if (!*zeroed || lanes < kLanes) std::fill(phases, phases + l.numel() * kLanes, T(0));
  *zeroed = true;
  ForEachRunPiece(
      g, l, lanes,
      [&](const PhasePlan::Run& even, const PhasePlan::Run& odd, int64_t j, int64_t pixels) {
        T* to_even = phases + (even.phase + j) * kLanes;
        T* to_odd = phases + (odd.phase + j) * kLanes;
        if (pixels == kRowPixels) {
          SplitColumns8(x + even.image + 2 * j, g.hw(), to_even, to_odd);
          return;
        }
        T line[kRowPixels * kLanes];
        Interleave(x + even.image + 2 * j, g.hw(), 1, pixels, kLanes, line);
        for (int64_t p = 0; p < pixels; ++p)
          V::Store((p % 2 ? to_odd : to_even) + p / 2 * kLanes, V::Load(line + p * kLanes));
      },
      [&](const PhasePlan::Run& r) {
        Interleave(x + r.image, g.hw(), g.sw, r.count, lanes, phases + r.phase * kLanes);
      });
}

// x [lanes, H, W] = bias[v] + the pixels of `phases` (the adjoint of ToPhases).
template <typename T>
void FromPhases(const ConvGeom& g, const PhasePlan& l, const T* phases, const T* bias, int64_t lanes, T* x) {
  using V = LaneVector<T>;
  ForEachRunPiece(
      g, l, lanes,
      [&](const PhasePlan::Run& even, const PhasePlan::Run& odd, int64_t j, int64_t pixels) {
        const T* from_even = phases + (even.phase + j) * kLanes;
        const T* from_odd = phases + (odd.phase + j) * kLanes;
        if (pixels == kRowPixels) {
          MergeColumns8(from_even, from_odd, bias, x + even.image + 2 * j, g.hw());
          return;
        }
        T line[kRowPixels * kLanes];
        for (int64_t p = 0; p < pixels; ++p)
          V::Store(line + p * kLanes, V::Load((p % 2 ? from_odd : from_even) + p / 2 * kLanes));
        Deinterleave(line, pixels, kLanes, bias, x + even.image + 2 * j, g.hw(), 1);
      },
      [&](const PhasePlan::Run& r) {
        Deinterleave(phases + r.phase * kLanes, r.count, lanes, bias, x + r.image, g.hw(), g.sw);
      });
}

// The blocked wide form [OH, WQ, kLanes] of output planes [OH, OW], lane v's
// at y + v * stride; zero past OW and in missing lanes (`zeroed` as for
// ToPhases).
template <typename T>
void ToWide(const ConvGeom& g, const PhasePlan& l, const T* y, int64_t stride, int64_t lanes, T* wide, bool* zeroed) {
  if (!*zeroed || lanes < kLanes) std::fill(wide, wide + l.wide * kLanes, T(0));
  *zeroed = true;
  for (int64_t oy = 0; oy < g.oh; ++oy)
    Interleave(y + oy * g.ow, stride, 1, g.ow, lanes, wide + oy * l.wq * kLanes);
}

template <typename T>
void FromWide(const ConvGeom& g, const PhasePlan& l, const T* wide, int64_t stride, int64_t lanes, T* y) {
  for (int64_t oy = 0; oy < g.oh; ++oy)
    Deinterleave(wide + oy * l.wq * kLanes, g.ow, lanes, static_cast<const T*>(nullptr), y + oy * g.ow, stride, 1);
}

// Calls fn(std::integral_constant<int64_t, n>, i) over [begin, end) in
// blocks of 8, then of 4, 2 and 1: the tap loops below hold a block's sums
// in registers, so its size is a compile-time constant.
template <int64_t kMax = 8, typename Fn>
void ForEachBlock(int64_t begin, int64_t end, Fn&& fn) {
  int64_t i = begin;
  for (; i + kMax <= end; i += kMax) fn(std::integral_constant<int64_t, kMax>(), i);
  if constexpr (kMax > 1) ForEachBlock<kMax / 2>(i, end, fn);
}

// wide[i0, i0 + kCount) = bias + the weights times the streams of the
// taps of kernel rows [ki0, ki1) and the live columns, lane by lane, the
// positions' sums held in registers over the taps (each stream read once,
// each sum written once) in the taps' order.
template <int64_t kCount, typename T>
void SumTapsBlock(const ConvGeom& g, const PhasePlan& l, const T* phases, const T* weights, const T* bias,
                  int64_t ki0, int64_t ki1, int64_t i0, T* wide) {
  using V = LaneVector<T>;
  typename V::Type acc[kCount];
  for (int64_t p = 0; p < kCount; ++p) acc[p] = V::Load(bias);
  for (int64_t ki = ki0; ki < ki1; ++ki)
    for (int64_t r = ki * g.kw + l.columns.first; r < ki * g.kw + l.columns.second; ++r) {
      const T* in = phases + (l.taps[r] + i0) * kLanes;
      const typename V::Type w = V::Load(weights + r * kLanes);
      for (int64_t p = 0; p < kCount; ++p) acc[p] += w * V::Load(in + p * kLanes);
    }
  for (int64_t p = 0; p < kCount; ++p) V::Store(wide + (i0 + p) * kLanes, acc[p]);
}

// The same where a kernel row's kCols live taps read consecutive positions
// (unit stride and dilation along the rows): position j of the row's
// window feeds the sums of positions j - c through tap c, so it is loaded
// once for all of them (kCount + kCols - 1 loads a kernel row instead of
// kCount * kCols). Each sum still takes its taps in order: the same bits.
template <int64_t kCount, int64_t kCols, typename T>
void SumTapsBlockSliding(const ConvGeom& g, const PhasePlan& l, const T* phases, const T* weights, const T* bias,
                         int64_t ki0, int64_t ki1, int64_t i0, T* wide) {
  using V = LaneVector<T>;
  typename V::Type acc[kCount];
  for (int64_t p = 0; p < kCount; ++p) acc[p] = V::Load(bias);
  for (int64_t ki = ki0; ki < ki1; ++ki) {
    const int64_t r0 = ki * g.kw + l.columns.first;
    const T* in = phases + (l.taps[r0] + i0) * kLanes;
    typename V::Type w[kCols];
    for (int64_t c = 0; c < kCols; ++c) w[c] = V::Load(weights + (r0 + c) * kLanes);
#pragma GCC unroll 16
    for (int64_t j = 0; j < kCount + kCols - 1; ++j) {
      const typename V::Type x = V::Load(in + j * kLanes);
#pragma GCC unroll 8
      for (int64_t c = 0; c < kCols; ++c)
        if (j - c >= 0 && j - c < kCount) acc[j - c] += w[c] * x;
    }
  }
  for (int64_t p = 0; p < kCount; ++p) V::Store(wide + (i0 + p) * kLanes, acc[p]);
}

// The wide plane's OW real columns of each row, from the taps that read
// image rows and columns (the others would add products with padding
// zeros; the scratch columns past OW are never read).
template <typename T>
void SumTaps(const ConvGeom& g, const PhasePlan& l, const T* phases, const T* weights, const T* bias, T* wide) {
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const int64_t ki0 = l.row_taps[oy].first, ki1 = l.row_taps[oy].second;  // (a lambda cannot capture a binding)
    ForEachBlock(oy * l.wq, oy * l.wq + g.ow, [&](auto count, int64_t i) {
      constexpr int64_t kCount = decltype(count)::value;
      if (l.consecutive == 3) return SumTapsBlockSliding<kCount, 3>(g, l, phases, weights, bias, ki0, ki1, i, wide);
      if (l.consecutive == 5) return SumTapsBlockSliding<kCount, 5>(g, l, phases, weights, bias, ki0, ki1, i, wide);
      SumTapsBlock<kCount>(g, l, phases, weights, bias, ki0, ki1, i, wide);
    });
  }
}

// The input gradient's gather into phase positions [q0, q0 + kCount):
// out (+)= the sum over taps [t0, t1) of the phase's list of their weights
// times the wide plane at q - shift (`wide` points at the plane's position
// 0, with `margin` zero positions before it and zeros past its end).
template <int64_t kCount, typename T>
void GatherTapsBlock(const PhasePlan::PhaseTaps& p, int64_t t0, int64_t t1, const T* wide, const T* weights,
                     bool accumulate, int64_t q0, T* out) {
  using V = LaneVector<T>;
  typename V::Type acc[kCount];
  for (int64_t j = 0; j < kCount; ++j) acc[j] = accumulate ? V::Load(out + (q0 + j) * kLanes) : typename V::Type{};
  for (int64_t t = t0; t < t1; ++t) {
    const auto [r, shift] = p.taps[t];
    const T* in = wide + (q0 - shift) * kLanes;
    const typename V::Type w = V::Load(weights + r * kLanes);
    for (int64_t j = 0; j < kCount; ++j) acc[j] += w * V::Load(in + j * kLanes);
  }
  for (int64_t j = 0; j < kCount; ++j) V::Store(out + (q0 + j) * kLanes, acc[j]);
}

// The same where the taps [t0, t1) are whole kernel rows of kCols taps
// each, reading consecutive positions (PhasePlan::consecutive): a row's
// window of kCount + kCols - 1 positions is loaded once, as in
// SumTapsBlockSliding, each sum still taking its taps in list order (the
// same bits).
template <int64_t kCount, int64_t kCols, typename T>
void GatherTapsBlockSliding(const PhasePlan::PhaseTaps& p, int64_t t0, int64_t t1, const T* wide, const T* weights,
                            bool accumulate, int64_t q0, T* out) {
  using V = LaneVector<T>;
  typename V::Type acc[kCount];
  for (int64_t j = 0; j < kCount; ++j) acc[j] = accumulate ? V::Load(out + (q0 + j) * kLanes) : typename V::Type{};
  for (int64_t t = t0; t < t1; t += kCols) {
    // Tap c of the row reads position j - c of the window for sum j: its
    // weight is row r0's + c, its shift shift0 + c.
    const auto [r0, shift0] = p.taps[t];
    const T* in = wide + (q0 - shift0) * kLanes;
    typename V::Type w[kCols];
    for (int64_t c = 0; c < kCols; ++c) w[c] = V::Load(weights + (r0 + c) * kLanes);
#pragma GCC unroll 16
    for (int64_t m = kCount - 1; m > -kCols; --m) {  // descending: each sum gets its taps in list order
      const typename V::Type x = V::Load(in + m * kLanes);
#pragma GCC unroll 8
      for (int64_t c = 0; c < kCols; ++c)
        if (m + c >= 0 && m + c < kCount) acc[m + c] += w[c] * x;
    }
  }
  for (int64_t j = 0; j < kCount; ++j) V::Store(out + (q0 + j) * kLanes, acc[j]);
}

// The image pixels of the phases (their runs, not the padding between
// them, which FromPhases never reads), each from the taps that reach an
// output row. A run's taps are whole kernel rows (its row reaches an output
// row through all of a kernel row's taps or none).
template <typename T>
void GatherTaps(const PhasePlan& l, const T* wide, const T* weights, bool accumulate, T* phases) {
  for (const PhasePlan::Run& run : l.runs) {
    const PhasePlan::PhaseTaps& p = l.by_phase[static_cast<size_t>(run.phase / l.plane)];
    T* out = phases + (run.phase / l.plane) * l.plane * kLanes;
    const int64_t q = run.phase % l.plane, t0 = run.tap_lo, t1 = run.tap_hi;
    ForEachBlock(q, q + run.count, [&](auto count, int64_t q0) {
      constexpr int64_t kCount = decltype(count)::value;
      if (l.consecutive == 3) return GatherTapsBlockSliding<kCount, 3>(p, t0, t1, wide, weights, accumulate, q0, out);
      if (l.consecutive == 5) return GatherTapsBlockSliding<kCount, 5>(p, t0, t1, wide, weights, accumulate, q0, out);
      GatherTapsBlock<kCount>(p, t0, t1, wide, weights, accumulate, q0, out);
    });
  }
}

// The weight gradient's products of live taps live[0, kGroup): per tap
// and lane, the sum over the wide plane's real columns of dy times the
// tap's stream, each a running sum in registers (the group's taps are
// independent chains; dy is read once for all of them), added to its row
// of sums [taps, kLanes]. Rows where every tap of the group reads padding
// add nothing and are skipped.
template <int64_t kGroup, typename T>
void TapDotsGroup(const ConvGeom& g, const PhasePlan& l, const T* phases, const T* dyw, const int64_t* live,
                  T* sums) {
  using V = LaneVector<T>;
  typename V::Type acc[kGroup] = {};
  const T* in[kGroup];
  for (int64_t t = 0; t < kGroup; ++t) in[t] = phases + l.taps[live[t]] * kLanes;
  auto add = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const typename V::Type d = V::Load(dyw + i * kLanes);
      for (int64_t t = 0; t < kGroup; ++t) acc[t] += d * V::Load(in[t] + i * kLanes);
    }
  };
  // Taps go row by row: the group's kernel rows are [first, last].
  const int64_t first = live[0] / g.kw, last = live[kGroup - 1] / g.kw;
  auto reads_image = [&](int64_t oy) { return l.row_taps[oy].second > first && l.row_taps[oy].first <= last; };
  for (int64_t oy = 0; oy < g.oh; ++oy)
    if (reads_image(oy)) add(oy * l.wq, oy * l.wq + g.ow);
  for (int64_t t = 0; t < kGroup; ++t) {
    T* out = sums + live[t] * kLanes;
    V::Store(out, V::Load(out) + acc[t]);
  }
}

// sums [taps, kLanes] += every live tap's product with dy (the others read
// only padding), in groups of at most eight taps (enough chains to hide
// the multiply-add latency, few enough registers), as even as the tap
// count allows.
template <typename T>
void TapDots(const ConvGeom& g, const PhasePlan& l, const T* phases, const T* dyw, T* sums) {
  const int64_t taps = static_cast<int64_t>(l.live.size());
  const int64_t groups = (taps + 7) / 8;
  for (int64_t gi = 0, t0 = 0; gi < groups; ++gi) {
    const int64_t size = (taps - t0) / (groups - gi) + ((taps - t0) % (groups - gi) ? 1 : 0);
    const int64_t* live = l.live.data() + t0;
    switch (size) {
      case 1: TapDotsGroup<1>(g, l, phases, dyw, live, sums); break;
      case 2: TapDotsGroup<2>(g, l, phases, dyw, live, sums); break;
      case 3: TapDotsGroup<3>(g, l, phases, dyw, live, sums); break;
      case 4: TapDotsGroup<4>(g, l, phases, dyw, live, sums); break;
      case 5: TapDotsGroup<5>(g, l, phases, dyw, live, sums); break;
      case 6: TapDotsGroup<6>(g, l, phases, dyw, live, sums); break;
      case 7: TapDotsGroup<7>(g, l, phases, dyw, live, sums); break;
      default: TapDotsGroup<8>(g, l, phases, dyw, live, sums); break;
    }
    t0 += size;
  }
}

// The weights of a Direct() convolution in the blocked layout, [channel
// blocks, O/g, taps, kLanes]: lane v of block b, output oc, tap r holds
// w [O, 1, KH, KW] at channel b * kLanes + v; zero in missing lanes. Made
// once per call (the tasks of a block read its rows).
template <typename T>
std::vector<T> BlockedWeights(const ConvGeom& g, const T* w) {
  const int64_t og = g.og(), k = g.k();
  std::vector<T> blocked(static_cast<size_t>(ChannelBlocks(g) * og * k * kLanes), T(0));
  for (int64_t c = 0; c < g.groups; ++c)
    for (int64_t oc = 0; oc < og; ++oc)
      for (int64_t r = 0; r < k; ++r) {
        const int64_t at = (((c / kLanes) * og + oc) * k + r) * kLanes + c % kLanes;
        blocked[static_cast<size_t>(at)] = w[(c * og + oc) * k + r];
      }
  return blocked;
}
// Block b's rows [taps, kLanes] for output oc.
template <typename T>
const T* TapWeights(const ConvGeom& g, const std::vector<T>& blocked, ChannelBlock b, int64_t oc) {
  return blocked.data() + ((b.c0 / kLanes) * g.og() + oc) * g.k() * kLanes;
}

// Planes [p0, p0 + planes) of images [n0, n1) of a tensor [N, P, size].
struct PlaneBlock {
  int64_t p, p0, planes, size, n0, n1;
  int64_t cols() const { return (n1 - n0) * size; }
};

// dst[0, n) = src[0, n) for the planes below kBatchedPlaneBelow: whole
// vectors, then a tail of fixed bound (a plane of 16 or 4 elements costs
// memmove, which GCC makes of any plain copy loop, more in the call than
// in the copy).
template <typename T>
void CopyPlane(const T* src, int64_t n, T* dst) {
  using V = LaneVector<T>;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) V::Store(dst + j, V::Load(src + j));
  for (int64_t t = 0; t < kLanes - 1; ++t)
    if (j + t < n) dst[j + t] = src[j + t];
}

// dst [planes, cols] = the block's planes, its images side by side.
template <typename T>
void GatherPlanes(const T* src, const PlaneBlock& b, T* dst) {
  for (int64_t n = b.n0; n < b.n1; ++n)
    for (int64_t i = 0; i < b.planes; ++i)
      CopyPlane(src + (n * b.p + b.p0 + i) * b.size, b.size, dst + i * b.cols() + (n - b.n0) * b.size);
}

// The block's planes = src [planes, cols] (+ bias[i] on plane i).
template <typename T>
void ScatterPlanes(const T* src, const T* bias, const PlaneBlock& b, T* dst) {
  for (int64_t n = b.n0; n < b.n1; ++n)
    for (int64_t i = 0; i < b.planes; ++i) {
      const T* from = src + i * b.cols() + (n - b.n0) * b.size;
      T* to = dst + (n * b.p + b.p0 + i) * b.size;
      const T add = bias ? bias[i] : T(0);
      for (int64_t j = 0; j < b.size; ++j) to[j] = add + from[j];
    }
}

// Fills `planes` planes of `size` with bias[i] (or zero without one).
template <typename T>
void InitPlanes(T* p, int64_t planes, int64_t size, const T* bias) {
  for (int64_t i = 0; i < planes; ++i) std::fill(p + i * size, p + (i + 1) * size, bias ? bias[i] : T(0));
}

// Rows of kLanes a Direct() task keeps per tap: the weight gradient's sums
// of every output of the group.
int64_t TapScratch(const ConvGeom& g, const PhasePlan& plan) {
  return static_cast<int64_t>(plan.taps.size()) * g.og();
}

// out[0, count) = in[0], in[stride], ...; unit strides in whole vectors.
template <typename T, typename Stride>
void CopyStrided(const T* in, Stride stride, int64_t count, T* out) {
  int64_t e = 0;
  if constexpr (std::is_same_v<Stride, std::integral_constant<int64_t, 1>>) {
    using V = LaneVector<T>;
    for (; e + kLanes <= count; e += kLanes) V::Store(out + e, V::Load(in + e));
  }
  for (; e < count; ++e) out[e] = in[e * stride];
}

// The im2col block of one group's planes xp (padded, or the image when the
// convolution does not pad) from output row y0 on, as a GEMM's B that
// packs itself (gemm.h, BPanels) straight from the planes: the block is
// never written out to be read back and packed. Its rows are the taps r =
// (c, ki, kj) of K, its columns the positions q = (oy - y0) * OW + ox,
// running on into the next image's planes (`image_stride` elements on)
// when a batch of images stands side by side (Batched()). Forward: op(B)
// is the block [K, len], the product W * block. Weight gradient: op(B) is
// its transpose [len, K], the product dy * block^T.
template <typename T>
class ImageColumns {
 public:
  ImageColumns(const ConvGeom& g, const T* xp, int64_t y0, int64_t image_stride = 0)
      : g_(g), xp_(xp), y0_(y0), image_stride_(image_stride), wp_(g.padded() ? g.wp() : g.w),
        plane_((g.padded() ? g.hp() : g.h) * wp_), rows_join_(g.sw == 1 && g.sh * wp_ == g.ow) {}
  BPanels<T> Block() const { return {&PackBlock, this}; }
  BPanels<T> Transposed() const { return {&PackTransposed, this}; }

 private:
  // Offset in xp of tap r for the output (0, 0), and of output q's taps
  // from their tap's offset.
  int64_t TapOffset(int64_t r) const {
    const int64_t taps = g_.kh * g_.kw, c = r / taps, ki = r % taps / g_.kw, kj = r % g_.kw;
    return c * plane_ + ki * g_.dh * wp_ + kj * g_.dw;
  }
  // Calls fn(q, at, count) for the runs of positions [q0, q0 + n) that
  // share an output row: positions q .. q + count - 1 at xp offsets at,
  // at + SW, ... from their tap's.
  template <typename Fn>
  void ForEachRun(int64_t q0, int64_t n, Fn&& fn) const {
    for (int64_t q = q0; q < q0 + n;) {
      const int64_t position = y0_ * g_.ow + q, image = position / g_.ohw(), row = position % g_.ohw() / g_.ow,
                    ox = position % g_.ow;
      const int64_t count = std::min(rows_join_ ? g_.ohw() - position % g_.ohw() : g_.ow - ox, q0 + n - q);
      fn(q, image * image_stride_ + row * g_.sh * wp_ + ox * g_.sw, count);
      q += count;
    }
  }

  // op(B) = the block: row p is tap p's positions j0 .. j0 + nc - 1. The
  // runs, cut where they cross from one panel into the next, are the same
  // for every tap: they are planned once per call.
  static void PackBlock(const void* ctx, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t nr, T* dst) {
    const ImageColumns& self = *static_cast<const ImageColumns*>(ctx);
    struct Piece {
      int64_t out, at, count;  // offset from a row's start in dst, from the tap's in xp, positions
    };
    InlineVector<Piece, 64> pieces;
    self.ForEachRun(j0, nc, [&](int64_t q, int64_t at, int64_t count) {
      for (int64_t i = 0; i < count;) {
        const int64_t j = q - j0 + i, lane = j % nr, piece = std::min(count - i, nr - lane);
        pieces.push_back({(j / nr) * kc * nr + lane, at + i * self.g_.sw, piece});
        i += piece;
      }
    });
    const int64_t tail = nc % nr ? (nc / nr) * kc * nr + nc % nr : -1;  // the last panel's zero columns
    WithStride(self.g_.sw, [&](auto sw) {
      for (int64_t p = 0; p < kc; ++p) {
        const T* tap = self.xp_ + self.TapOffset(p0 + p);
        T* row = dst + p * nr;
        for (const Piece& piece : pieces) CopyStrided(tap + piece.at, sw, piece.count, row + piece.out);
        if (tail >= 0) std::fill(row + tail, row + tail - nc % nr + nr, T(0));
      }
    });
  }

  // op(B) = the block's transpose: row p is position p0 + p's taps j0 ..
  // j0 + nc - 1, a panel's taps its lanes. Eight taps of eight positions
  // at a time are an 8 x 8 transpose of rows read from the planes.
  static void PackTransposed(const void* ctx, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t nr, T* dst) {
    const ImageColumns& self = *static_cast<const ImageColumns*>(ctx);
    for (int64_t jp = 0; jp < nc; jp += nr) {
      T* panel = dst + (jp / nr) * kc * nr;
      const int64_t lanes = std::min(nr, nc - jp);
      int64_t taps[8];
      for (int64_t v0 = 0; v0 < nr; v0 += 8) {
        // The group's lanes, `group` of them taps and the rest (past nc) zeros.
        const int64_t width = std::min<int64_t>(8, nr - v0), group = std::clamp<int64_t>(lanes - v0, 0, width);
        for (int64_t v = 0; v < group; ++v) taps[v] = self.TapOffset(j0 + jp + v0 + v);
        self.ForEachRun(p0, kc, [&](int64_t q, int64_t at, int64_t count) {
          T* out = panel + (q - p0) * nr + v0;
          int64_t i = 0;
#if defined(__AVX__)
          if constexpr (std::is_same_v<T, float>)
            if (group == 8 && self.g_.sw == 1) {
              const float* rows[8];
              for (int v = 0; v < 8; ++v) rows[v] = self.xp_ + taps[v] + at;
              for (; i + 8 <= count; i += 8)
                Transpose8([&](int v) { return _mm256_loadu_ps(rows[v] + i); },
                           [&](int p, __m256 c) { _mm256_storeu_ps(out + (i + p) * nr, c); });
              // Runs of 4 (a 1x1 convolution's 2x2 planes) or a longer run's end.
              for (; i + 4 <= count; i += 4)
                Transpose4([&](int v) { return _mm_loadu_ps(rows[v] + i); },
                           [&](int p, __m256 c) { _mm256_storeu_ps(out + (i + p) * nr, c); });
            }
#endif
          for (; i < count; ++i) {
            T* o = out + i * nr;
            for (int64_t v = 0; v < group; ++v) o[v] = self.xp_[taps[v] + at + i * self.g_.sw];
            for (int64_t v = group; v < width; ++v) o[v] = T(0);
          }
        });
      }
    }
  }

  const ConvGeom& g_;
  const T* xp_;
  int64_t y0_, image_stride_, wp_, plane_;
  bool rows_join_;  // each output row's taps continue where the last row's stop (a 1x1 convolution's planes)
};

// A task's scratch: its group's padded planes (and dy's, for an input
// gradient run as a forward) and the block col2im adds in, a Direct()
// task's phases and wide plane, or a Batched() task's planes and outputs.
template <typename T>
struct Workspace {
  Workspace(const ConvGeom& g, const PhasePlan& plan)
      : buf(Scratch<T>(TileScratch(g) + PadScratch(g) +
                         (plan.numel() + plan.wide_span() + TapScratch(g, plan)) * kLanes +
                         BatchPlanes(g) + BatchOutputs(g))),
        col(buf.get()),
        pad(col + TileScratch(g)),
        phases(pad + PadScratch(g)),
        wide(phases + plan.numel() * kLanes),
        tap_sums(wide + plan.wide_span() * kLanes),
        gathered_image(tap_sums + TapScratch(g, plan) * kLanes),
        gathered_cols(gathered_image + BatchPlanes(g)) {}
  // The planes a product reads: x [C/g, H, W] padded into `pad`, or x itself.
  const T* Planes(const ConvGeom& g, const T* x) {
    if (!g.padded()) return x;
    PadPlanes(g, x, pad);
    return pad;
  }
  // Its adjoint: x [C/g, H, W] = bias [C/g] (or zero) + what add(planes)
  // accumulates into them by col2im (the padded planes in `pad`, or x).
  template <typename Fn>
  void AccumulatePlanes(const ConvGeom& g, const T* bias, T* x, Fn&& add) {
    if (!g.padded()) {
      InitPlanes(x, g.cg(), g.hw(), bias);
      add(x);
      return;
    }
    std::fill(pad, pad + PlanesScratch(g), T(0));
    add(pad);
    UnpadPlanes(g, pad, bias, x);
  }
  std::unique_ptr<T[]> buf;
  T* col;
  T* pad;
  T* phases;
  T* wide;            // Direct(): [margin + plane, kLanes], the wide plane first or after the margin
  T* tap_sums;        // Direct(): the weight gradient's sums [O/g, taps, kLanes]
  bool phases_zeroed = false, wide_zeroed = false;  // Direct(): see ToPhases, ToWide
  T* gathered_image;  // Batched(): BatchImages(): the images' planes, or the input gradient's block
  T* gathered_cols;   // Batched(): BatchOutputs(): the GEMM's output planes
};

// The image side of a batch of `images` images, their im2col blocks side
// by side [K, images * OH * OW], packed straight from their planes: one
// group's [C/g, H, W] at `first`, the next image's `stride` elements on
// (padded into ws.gathered_image when the convolution pads). A 1x1
// convolution's block is its images' planes, packed in runs of whole planes.
template <typename T>
ImageColumns<T> BatchColumns(const ConvGeom& g, const T* first, int64_t stride, int64_t images, Workspace<T>& ws) {
  if (!g.padded()) return ImageColumns<T>(g, first, 0, stride);
  const int64_t padded = g.cg() * g.hp() * g.wp();
  for (int64_t i = 0; i < images; ++i) PadPlanes(g, first + i * stride, ws.gathered_image + i * padded);
  return ImageColumns<T>(g, ws.gathered_image, 0, padded);
}

// Images [n0, n1) of group grp = col2im of the block [K, (n1 - n0) * OH *
// OW] in ws.gathered_image (+ bias [C/g], that group's): the adjoint of
// BatchColumns; for a 1x1 convolution the block is the planes.
template <typename T>
void ScatterImages(const ConvGeom& g, Workspace<T>& ws, const T* bias, int64_t grp, int64_t n0, int64_t n1, T* image,
                   ThreadPool* inner) {
  if (g.pointwise()) {
    ScatterPlanes(ws.gathered_image, bias, PlaneBlock{g.c, grp * g.cg(), g.cg(), g.ohw(), n0, n1}, image);
    return;
  }
  const int64_t ld = (n1 - n0) * g.ohw();
  for (int64_t n = n0; n < n1; ++n)
    ws.AccumulatePlanes(g, bias, image + (n * g.c + grp * g.cg()) * g.hw(), [&](T* xp) {
      Col2Im(g, ws.gathered_image + (n - n0) * g.ohw(), 0, g.oh, ld, xp, inner);
    });
}

// Runs fn(task, inner_pool, workspace) for each task in [0, tasks). With at
// least as many tasks as threads, workers take whole tasks as they finish
// others (ParallelTasks), each with its own workspace and single-threaded
// GEMMs (inner_pool null); otherwise tasks run one by one and fn gets the
// pool for its im2col and GEMM.
template <typename T, typename Fn>
void RunTasks(ThreadPool* pool, const ConvGeom& g, const PhasePlan& plan, int64_t tasks, Fn&& fn) {
  const int threads = pool ? pool->num_threads() : 1;
  if (threads > 1 && tasks >= threads) {
    ParallelTasks(pool, tasks, [&](auto next) {
      Workspace<T> ws(g, plan);
      for (int64_t t; (t = next()) >= 0;) fn(t, nullptr, ws);
    });
    return;
  }
  Workspace<T> ws(g, plan);
  for (int64_t t = 0; t < tasks; ++t) fn(t, pool, ws);
}

// Runs fn(grp, n0, n1, inner_pool, workspace) for each group and batch of
// at most BatchImages() images, as tasks of RunTasks: for the forward and
// adjoint products, whose results do not depend on how images share a
// GEMM, with the batches of a single group split further to give every
// thread its share.
template <typename T, typename Fn>
void ForEachBatch(ThreadPool* pool, const ConvGeom& g, Fn&& fn) {
  int64_t per = BatchImages(g), batches = (g.n + per - 1) / per;
  const int64_t threads = pool ? pool->num_threads() : 1;
  if (g.groups == 1 && batches % threads != 0) {
    batches = std::min(g.n, (batches + threads - 1) / threads * threads);
    per = (g.n + batches - 1) / batches;
    batches = (g.n + per - 1) / per;
  }
  RunTasks<T>(pool, g, PhasePlan{}, batches * g.groups, [&](int64_t task, ThreadPool* inner, Workspace<T>& ws) {
    const int64_t b = task / g.groups, grp = task % g.groups;
    fn(grp, b * per, std::min(g.n, (b + 1) * per), inner, ws);
  });
}

// Runs fn(image, channel_block, workspace) for each image and block of
// kLanes channels of a Direct() convolution, as tasks of RunTasks.
// A task takes several consecutive (image, block) pairs when planes are
// small: handing out one costs about as much as a 4x4 plane's arithmetic.
// (The pairs are independent: how they group never changes a result.)
constexpr int64_t kTaskPositions = 256;
int64_t ImagesPerTask(const ConvGeom& g) {
  return std::max<int64_t>(1, kTaskPositions / std::max<int64_t>(1, std::max(g.hw(), g.ohw())));
}
template <typename T, typename Fn>
void ForEachChannelBlock(ThreadPool* pool, const ConvGeom& g, const PhasePlan& l, Fn&& fn) {
  const int64_t pairs = g.n * ChannelBlocks(g);
  const int64_t per_task = ImagesPerTask(g);
  RunTasks<T>(pool, g, l, (pairs + per_task - 1) / per_task, [&](int64_t task, ThreadPool*, Workspace<T>& ws) {
    for (int64_t pair = task * per_task; pair < std::min(pairs, (task + 1) * per_task); ++pair)
      fn(pair / ChannelBlocks(g), BlockOf(g, pair % ChannelBlocks(g)), ws);
  });
}

// ---------------------------------------------------------------------------
// Depthwise convolutions on planes where every output reads every input
// (PlaneMatrix()): MobileNetV3's last stage, a 5x5 kernel on 2x2 planes,
// or any kernel centred on 1x1 planes. Channel c's product is then a dense
// [P, P] matrix over its plane (P = H * W = OH * OW), M_c[p][q] = w[c,
// tap(p, q)], and an image's planes [C, P] lie back to back, kLanes / P
// channels to a vector:
//   forward       y[c, p]  = bias[c] + sum_q M_c[p][q] x[c, q]
//   adjoint       dx[c, q] = bias[c] + sum_p M_c[p][q] dy[c, p]
//   weight grad   dM_c[p][q] = sum_n dy[n, c, p] x[n, c, q],
//                 dw[c, t] = the sum of dM_c over the pairs (p, q) of tap t
// Each term is one vector multiply-add, the source plane's element spread
// over its plane's lanes by one shuffle. The phase walk of Direct() took
// 3-5x longer on such planes, in per-image bookkeeping and transposes.

// The tap (ki * KW + kj) through which output p reads image element q, or
// -1 when none does.
int64_t TapOf(const ConvGeom& g, int64_t p, int64_t q) {
  const int64_t dy = q / g.w + g.ph - p / g.ow * g.sh, dx = q % g.w + g.pw - p % g.ow * g.sw;
  if (dy < 0 || dx < 0 || dy % g.dh != 0 || dx % g.dw != 0 || dy / g.dh >= g.kh || dx / g.dw >= g.kw) return -1;
  return dy / g.dh * g.kw + dx / g.dw;
}

// TapOf for every pair, at [p * P + q] (P <= kLanes: at most 64 pairs).
struct PlaneTaps {
  int64_t tap[kLanes * kLanes];
  explicit PlaneTaps(const ConvGeom& g) {
    for (int64_t p = 0; p < g.hw(); ++p)
      for (int64_t q = 0; q < g.hw(); ++q) tap[p * g.hw() + q] = TapOf(g, p, q);
  }
};

// A depthwise convolution (one channel per group each side) whose output
// planes are its image planes' size, P elements dividing kLanes, and whose
// every output reads every element of its plane (so no pair of M is a
// structural zero, which would turn an inf or NaN in x into a NaN the
// convolution never reads).
bool PlaneMatrix(const ConvGeom& g) {
  const int64_t p = g.hw();
  if (g.cg() != 1 || g.og() != 1 || g.oh != g.h || g.ow != g.w || p == 0 || kLanes % p != 0) return false;
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = 0; j < p; ++j)
      if (TapOf(g, i, j) < 0) return false;
  return true;
}

// Calls fn(std::integral_constant<int64_t, i>()) for i in [0, kN).
template <typename Fn, int64_t... kI>
void ForEachIndexOf(Fn&& fn, std::integer_sequence<int64_t, kI...>) {
  (fn(std::integral_constant<int64_t, kI>()), ...);
}
template <int64_t kN, typename Fn>
void ForEachIndex(Fn&& fn) {
  ForEachIndexOf(fn, std::make_integer_sequence<int64_t, kN>());
}

// v's element kS of each plane of kP lanes, spread over that plane's lanes.
template <int64_t kP, int64_t kS, typename T>
typename LaneVector<T>::Type SpreadInPlanes(const typename LaneVector<T>::Type& v) {
  static_assert(kLanes == 8, "one index per lane below");
  constexpr auto lane = [](int l) { return static_cast<int>(l / kP * kP + kS); };
  return __builtin_shufflevector(v, v, lane(0), lane(1), lane(2), lane(3), lane(4), lane(5), lane(6), lane(7));
}

// One image's planes [C, P] as whole vectors: `row` = C * P elements, then
// zeros up to the next multiple of kLanes (a row's last vector holds whole
// planes, since P divides kLanes).
int64_t PaddedRow(const ConvGeom& g) { return (g.c * g.hw() + kLanes - 1) / kLanes * kLanes; }

// The coefficients of the forward (adjoint = false: destination p, source
// q) or the adjoint (destination q, source p), [P sources, PaddedRow]:
// coef[s][c * P + d] = M_c entry of destination d and source s.
template <typename T>
std::vector<T> PlaneCoefficients(const ConvGeom& g, const T* w, bool adjoint) {
  const int64_t p = g.hw(), row = PaddedRow(g), taps = g.kh * g.kw;
  const PlaneTaps pairs(g);
  std::vector<T> coef(static_cast<size_t>(p * row), T(0));
  for (int64_t s = 0; s < p; ++s)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t d = 0; d < p; ++d)
        coef[static_cast<size_t>(s * row + c * p + d)] = w[c * taps + pairs.tap[adjoint ? s * p + d : d * p + s]];
  return coef;
}

// dst [N, C, P] = bias + the coefficients' matrices times src [N, C, P],
// plane by plane, each sum in source order.
template <int64_t kP, typename T>
void ApplyPlaneMatrices(const ConvGeom& g, const std::vector<T>& coef, const T* bias, const T* src, T* dst,
                        ThreadPool* pool) {
  using V = LaneVector<T>;
  const int64_t used = g.c * kP, row = PaddedRow(g);
  std::vector<T> bias_row(static_cast<size_t>(row), T(0));
  if (bias)
    for (int64_t e = 0; e < used; ++e) bias_row[static_cast<size_t>(e)] = bias[e / kP];
  auto vector_at = [&](const T* in, T* out, int64_t e) {
    typename V::Type acc = V::Load(bias_row.data() + e);
    const typename V::Type x = V::Load(in);
    ForEachIndex<kP>([&](auto s) {
      acc += V::Load(coef.data() + s * row + e) * SpreadInPlanes<kP, decltype(s)::value, T>(x);
    });
    V::Store(out, acc);
  };
  ParallelRange(pool, g.n, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* in = src + n * used;
      T* out = dst + n * used;
      int64_t e = 0;
      for (; e + kLanes <= used; e += kLanes) vector_at(in + e, out + e, e);
      if (e < used) {  // the last planes, through a vector of zeros
        T tail_in[kLanes] = {}, tail_out[kLanes];
        std::copy(in + e, in + used, tail_in);
        vector_at(tail_in, tail_out, e);
        std::copy(tail_out, tail_out + (used - e), out + e);
      }
    }
  }, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, used)));
}

// Vectors of a row per weight gradient task: its sums [vectors, P] stay in
// L1 while it walks the images.
constexpr int64_t kPlaneMatrixTaskVectors = 16;

// dw [C, 1, KH, KW] = per channel, the sum of dM over the pairs of each
// tap (zero for taps no pair reads), dM summed over the images in order.
template <int64_t kP, typename T>
void PlaneMatrixWeightGrad(const ConvGeom& g, const T* image, const T* cols, T* dw, ThreadPool* pool) {
  using V = LaneVector<T>;
  const int64_t used = g.c * kP, taps = g.kh * g.kw;
  const int64_t vectors = PaddedRow(g) / kLanes;
  const PlaneTaps pairs(g);
  std::fill(dw, dw + g.c * taps, T(0));
  auto task = [&](int64_t v0, int64_t v1) {
    typename V::Type sums[kPlaneMatrixTaskVectors][kP] = {};  // lane c * P + p of source s: dM_c[p][s]
    auto add = [&](int64_t i, const T* x, const T* dy) {
      const typename V::Type xv = V::Load(x), dyv = V::Load(dy);
      ForEachIndex<kP>([&](auto s) { sums[i][s] += dyv * SpreadInPlanes<kP, decltype(s)::value, T>(xv); });
    };
    for (int64_t n = 0; n < g.n; ++n) {
      const T* x = image + n * used;
      const T* dy = cols + n * used;
      for (int64_t v = v0; v < v1; ++v) {
        const int64_t e = v * kLanes;
        if (e + kLanes <= used) {
          add(v - v0, x + e, dy + e);
        } else {  // the last planes, through vectors of zeros
          T tail_x[kLanes] = {}, tail_dy[kLanes] = {};
          std::copy(x + e, x + used, tail_x);
          std::copy(dy + e, dy + used, tail_dy);
          add(v - v0, tail_x, tail_dy);
        }
      }
    }
    for (int64_t v = v0; v < v1; ++v)
      for (int64_t lane = 0; lane < kLanes && v * kLanes + lane < used; ++lane) {
        const int64_t c = (v * kLanes + lane) / kP, p = lane % kP;
        for (int64_t s = 0; s < kP; ++s) dw[c * taps + pairs.tap[p * kP + s]] += sums[v - v0][s][lane];
      }
  };
  ParallelRange(pool, vectors, [&](int64_t v0, int64_t v1) {
    for (int64_t b = v0; b < v1; b += kPlaneMatrixTaskVectors) task(b, std::min(v1, b + kPlaneMatrixTaskVectors));
  }, kPlaneMatrixTaskVectors);
}

// Calls fn(std::integral_constant<int64_t, P>()) for a PlaneMatrix() plane size.
template <typename Fn>
void WithPlaneSize(const ConvGeom& g, Fn&& fn) {
  switch (g.hw()) {
    case 1: return fn(std::integral_constant<int64_t, 1>());
    case 2: return fn(std::integral_constant<int64_t, 2>());
    case 4: return fn(std::integral_constant<int64_t, 4>());
    default: return fn(std::integral_constant<int64_t, 8>());
  }
}

// ---------------------------------------------------------------------------
// 1x1 convolutions on 1x1 planes (a squeeze-and-excitation block's): the
// planes [N, C] are rows of a matrix, so each group's products run on them
// in place, images as the GEMM's rows (y = x W^T, as Linear), with none of
// the batched path's gathers and scatters of one-element planes. Each
// element is the same sum as there (the same products in the same order of
// the channels), so the results are the same bits.
bool OnePixel(const ConvGeom& g) { return g.pointwise() && g.hw() == 1; }

// rows [N, width] += bias [width] (bias + sum, as ScatterPlanes adds it).
template <typename T>
void AddRowBias(const T* bias, int64_t n, int64_t width, T* rows) {
  if (!bias) return;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < width; ++j) rows[i * width + j] = bias[j] + rows[i * width + j];
}

// One (image, group) of a forward product that neither batches nor walks
// taps directly: y [O/g, OH * OW] (+)= wg [O/g, K] * im2col(xp), xp the
// group's planes (padded when the convolution pads), tile by tile.
template <typename T>
void ForwardTiles(const ConvGeom& g, const T* xp, const T* wg, T beta, T* y, ThreadPool* inner) {
  ForEachTile(g, ForwardTileElems(inner), [&](int64_t y0, int64_t, int64_t len) {
    const ImageColumns<T> block(g, xp, y0);  // [K, len]
    Gemm<T>(false, g.og(), len, g.k(), T(1), wg, g.k(), block.Block(), beta, y + y0 * g.ow, g.ohw(), inner);
  });
}

// The weight of AdjointAsForward(g), per group [C/g, O/g, KH, KW]: w [O,
// C/g, KH, KW] with its channel axes swapped and its kernel flipped.
template <typename T>
std::vector<T> AdjointWeights(const ConvGeom& g, const T* w) {
  const int64_t og = g.og(), cg = g.cg(), taps = g.kh * g.kw;
  std::vector<T> flipped(static_cast<size_t>(g.weight_numel()));
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t o = 0; o < og; ++o)
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t t = 0; t < taps; ++t)
          flipped[static_cast<size_t>(((grp * cg + c) * og + o) * taps + taps - 1 - t)] =
              w[((grp * og + o) * cg + c) * taps + t];
  return flipped;
}

// cols [N, O, OH, OW] = W * im2col(image [N, C, H, W]) (+ bias [O]); one
// task per (image, group), per batch of images (Batched) or per image and
// block of channels (Direct).
template <typename T>
void ConvForward(const ConvGeom& g, const T* image, const T* w, const T* bias, T* cols, ThreadPool* pool) {
  const int64_t k = g.k(), ohw = g.ohw(), og = g.og(), cg = g.cg();
  if (winograd::Applies(g)) {
    for (int64_t grp = 0; grp < g.groups; ++grp)
      winograd::Conv3x3(winograd::GroupOf(g), g.n, image + grp * cg * g.hw(), g.c * g.hw(), w + grp * og * k,
                        bias ? bias + grp * og : nullptr, cols + grp * og * ohw, g.o * ohw, pool);
    return;
  }
  if (OnePixel(g)) {  // cols [N, O] = image [N, C] W^T, group by group
    for (int64_t grp = 0; grp < g.groups; ++grp)
      Gemm<T>(false, true, g.n, og, cg, T(1), image + grp * cg, g.c, w + grp * og * cg, cg, T(0), cols + grp * og, g.o,
              pool);
    AddRowBias(bias, g.n, g.o, cols);
    return;
  }
  if (Batched(g)) {
    ForEachBatch<T>(pool, g, [&](int64_t grp, int64_t n0, int64_t n1, ThreadPool* inner, Workspace<T>& ws) {
      const PlaneBlock out{g.o, grp * og, og, ohw, n0, n1};
      const T* wg = w + grp * og * k;
      const ImageColumns<T> block =
          BatchColumns(g, image + (n0 * g.c + grp * cg) * g.hw(), g.c * g.hw(), n1 - n0, ws);
      Gemm<T>(false, og, out.cols(), k, T(1), wg, k, block.Block(), T(0), ws.gathered_cols, out.cols(), inner);
      ScatterPlanes(ws.gathered_cols, bias ? bias + grp * og : nullptr, out, cols);
    });
    return;
  }
  if (PlaneMatrix(g)) {
    WithPlaneSize(g, [&](auto size) {
      ApplyPlaneMatrices<decltype(size)::value>(g, PlaneCoefficients(g, w, false), bias, image, cols, pool);
    });
    return;
  }
  if (Direct(g)) {
    const PhasePlan l = PlanPhases(g);
    const std::vector<T> weights = BlockedWeights(g, w);
    ForEachChannelBlock<T>(pool, g, l, [&](int64_t n, ChannelBlock b, Workspace<T>& ws) {
      ToPhases(g, l, image + (n * g.c + b.c0) * g.hw(), b.lanes, ws.phases, &ws.phases_zeroed);
      for (int64_t oc = 0; oc < og; ++oc) {
        T lane_bias[kLanes] = {};
        if (bias)
          for (int64_t v = 0; v < b.lanes; ++v) lane_bias[v] = bias[(b.c0 + v) * og + oc];
        SumTaps(g, l, ws.phases, TapWeights(g, weights, b, oc), lane_bias, ws.wide);
        FromWide(g, l, ws.wide, og * ohw, b.lanes, cols + (n * g.o + b.c0 * og + oc) * ohw);
      }
    });
    return;
  }
  RunTasks<T>(pool, g, PhasePlan{}, g.n * g.groups, [&](int64_t task, ThreadPool* inner, Workspace<T>& ws) {
    const int64_t n = task / g.groups, grp = task % g.groups;
    const T* x = image + (n * g.c + grp * cg) * g.hw();  // [C/g, H, W]
    const T* wg = w + grp * og * k;                      // [O/g, K]
    T* y = cols + (n * g.o + grp * og) * ohw;            // [O/g, OH * OW]
    const T* bg = bias ? bias + grp * og : nullptr;
    if (bg) InitPlanes(y, og, ohw, bg);  // the GEMMs then accumulate onto the bias
    const T beta = bg ? T(1) : T(0);
    if (g.pointwise()) {
      Gemm<T>(false, false, og, ohw, k, T(1), wg, k, x, ohw, beta, y, ohw, inner);
      return;
    }
    ForwardTiles(g, ws.Planes(g, x), wg, beta, y, inner);
  });
}

// image [N, C, H, W] = col2im(W^T * cols [N, O, OH, OW]) (+ bias [C]).
template <typename T>
void ConvAdjoint(const ConvGeom& g, const T* cols, const T* w, const T* bias, T* image, ThreadPool* pool) {
  const int64_t k = g.k(), ohw = g.ohw(), og = g.og(), cg = g.cg();
  if (OnePixel(g)) {  // image [N, C] = cols [N, O] W, group by group
    for (int64_t grp = 0; grp < g.groups; ++grp)
      Gemm<T>(false, false, g.n, cg, og, T(1), cols + grp * og, g.o, w + grp * og * cg, cg, T(0), image + grp * cg, g.c,
              pool);
    AddRowBias(bias, g.n, g.c, image);
    return;
  }
  // A 3x3 unit-stride adjoint is a 3x3 forward, whatever the planes' width.
  if (const std::optional<ConvGeom> t = TransposedForward(g); t && winograd::Applies(*t)) {
    const std::vector<T> flipped = AdjointWeights(g, w);  // per group [C/g, O/g, 3, 3]
    for (int64_t grp = 0; grp < g.groups; ++grp)
      winograd::Conv3x3(*t, g.n, cols + grp * og * ohw, g.o * ohw, flipped.data() + grp * cg * t->k(),
                        bias ? bias + grp * cg : nullptr, image + grp * cg * g.hw(), g.c * g.hw(), pool);
    return;
  }
  const std::optional<ConvGeom> adjoint = AdjointAsForward(g);
  const std::vector<T> flipped = adjoint ? AdjointWeights(g, w) : std::vector<T>();
  if (Batched(g)) {
    ForEachBatch<T>(pool, g, [&](int64_t grp, int64_t n0, int64_t n1, ThreadPool* inner, Workspace<T>& ws) {
      if (adjoint) {
        const PlaneBlock out{g.c, grp * cg, cg, g.hw(), n0, n1};
        const ImageColumns<T> block =
            BatchColumns(*adjoint, cols + (n0 * g.o + grp * og) * ohw, g.o * ohw, n1 - n0, ws);
        Gemm<T>(false, cg, out.cols(), adjoint->k(), T(1), flipped.data() + grp * cg * adjoint->k(), adjoint->k(),
                block.Block(), T(0), ws.gathered_cols, out.cols(), inner);
        ScatterPlanes(ws.gathered_cols, bias ? bias + grp * cg : nullptr, out, image);
        return;
      }
      const PlaneBlock in{g.o, grp * og, og, ohw, n0, n1};
      GatherPlanes(cols, in, ws.gathered_cols);
      Gemm<T>(true, false, k, in.cols(), og, T(1), w + grp * og * k, k, ws.gathered_cols, in.cols(), T(0),
              ws.gathered_image, in.cols(), inner);
      ScatterImages(g, ws, bias ? bias + grp * cg : nullptr, grp, n0, n1, image, inner);
    });
    return;
  }
  if (PlaneMatrix(g)) {
    WithPlaneSize(g, [&](auto size) {
      ApplyPlaneMatrices<decltype(size)::value>(g, PlaneCoefficients(g, w, true), bias, cols, image, pool);
    });
    return;
  }
  if (Direct(g)) {
    const PhasePlan l = PlanPhases(g);
    const std::vector<T> weights = BlockedWeights(g, w);
    ForEachChannelBlock<T>(pool, g, l, [&](int64_t n, ChannelBlock b, Workspace<T>& ws) {
      // The wide plane after a margin of zeros, and zeros to a phase's end:
      // every shifted read lands in the buffer, outside the plane on zeros.
      T* dyw = ws.wide + l.margin * kLanes;
      if (!ws.wide_zeroed) {
        std::fill(ws.wide, dyw, T(0));
        std::fill(dyw + l.wide * kLanes, ws.wide + l.wide_span() * kLanes, T(0));
      }
      for (int64_t oc = 0; oc < og; ++oc) {
        // Zero past OW and in missing lanes: those positions add nothing.
        ToWide(g, l, cols + (n * g.o + b.c0 * og + oc) * ohw, og * ohw, b.lanes, dyw, &ws.wide_zeroed);
        GatherTaps(l, dyw, TapWeights(g, weights, b, oc), oc > 0, ws.phases);
      }
      FromPhases(g, l, ws.phases, bias ? bias + b.c0 : nullptr, b.lanes, image + (n * g.c + b.c0) * g.hw());
    });
    return;
  }
  RunTasks<T>(pool, g, PhasePlan{}, g.n * g.groups, [&](int64_t task, ThreadPool* inner, Workspace<T>& ws) {
    const int64_t n = task / g.groups, grp = task % g.groups;
    const T* dy = cols + (n * g.o + grp * og) * ohw;  // [O/g, OH * OW]
    const T* wg = w + grp * og * k;                   // [O/g, K]
    const T* bg = bias ? bias + grp * cg : nullptr;
    T* x = image + (n * g.c + grp * cg) * g.hw();     // [C/g, H, W]
    if (g.pointwise()) {  // col2im is the identity: multiply straight into the image
      if (bg) InitPlanes(x, cg, g.hw(), bg);
      Gemm<T>(true, false, k, ohw, og, T(1), wg, k, dy, ohw, bg ? T(1) : T(0), x, ohw, inner);
      return;
    }
    if (adjoint) {
      if (bg) InitPlanes(x, cg, g.hw(), bg);
      ForwardTiles(*adjoint, ws.Planes(*adjoint, dy), flipped.data() + grp * cg * adjoint->k(), bg ? T(1) : T(0), x,
                   inner);
      return;
    }
    ws.AccumulatePlanes(g, bg, x, [&](T* xp) {
      ForEachTile(g, kTileElems, [&](int64_t y0, int64_t y1, int64_t len) {
        Gemm<T>(true, false, k, len, og, T(1), wg, k, dy + y0 * g.ow, ohw, T(0), ws.col, len, inner);  // [K, len]
        Col2Im(g, ws.col, y0, y1, len, xp, inner);
      });
    });
  });
}

// Asks for the cache lines of p [0, count) ahead of their use.
constexpr int64_t kPrefetchBytes = 4096;
template <typename T>
void PrefetchSpan(const T* p, int64_t count) {
  const char* begin = reinterpret_cast<const char*>(p);
  const char* end = reinterpret_cast<const char*>(p + count);
  for (const char* line = begin; line < end; line += 64) __builtin_prefetch(line);
  __builtin_prefetch(end - 1);
}

// Weight gradients sum over the batch in up to kMaxBatchBlocks blocks of
// images, each into its own partial dW (at most kMaxPartialElems elements in
// all), added up in block order: the blocks share out over the threads, and
// the result depends on the batch and weight sizes only, never on threads.
constexpr int64_t kMaxBatchBlocks = 32;
constexpr int64_t kMaxPartialElems = 4 << 20;

// dW [O, C/g, KH, KW] = sum_n cols_n * im2col(image_n)^T, per group.
template <typename T>
void ConvWeightGrad(const ConvGeom& g, const T* image, const T* cols, T* dw, ThreadPool* pool) {
  const int64_t k = g.k(), ohw = g.ohw(), og = g.og(), cg = g.cg();
  if (OnePixel(g)) {  // dW_g [O/g, C/g] = cols_g^T image_g, the images as the depth
    for (int64_t grp = 0; grp < g.groups; ++grp)
      Gemm<T>(true, false, og, cg, g.n, T(1), cols + grp * og, g.o, image + grp * cg, g.c, T(0), dw + grp * og * cg, cg,
              pool);
    return;
  }
  if (winograd::Applies(g)) {
    for (int64_t grp = 0; grp < g.groups; ++grp)
      winograd::WeightGrad3x3(winograd::GroupOf(g), g.n, image + grp * cg * g.hw(), g.c * g.hw(),
                              cols + grp * og * ohw, g.o * ohw, dw + grp * og * k, pool);
    return;
  }
  if (PlaneMatrix(g)) {
    WithPlaneSize(g, [&](auto size) { PlaneMatrixWeightGrad<decltype(size)::value>(g, image, cols, dw, pool); });
    return;
  }
  const PhasePlan l = PlanPhases(g);
  // Direct(): dw's rows of block b's channels [O, K] = the sum over images
  // [n0, n1), gathered per output in [taps, kLanes] (TapDots) and written
  // out once.
  auto accumulate_direct = [&](ChannelBlock b, int64_t n0, int64_t n1, T* dwb, Workspace<T>& ws) {
    T* sums = ws.tap_sums;  // [O/g, taps, kLanes]
    std::fill(sums, sums + og * k * kLanes, T(0));
    // A block's planes of one image are contiguous, but the next image's
    // lie a whole image on, past where the hardware prefetches: small
    // ones are fetched one image ahead.
    const int64_t x_span = b.lanes * g.hw(), dy_span = b.lanes * og * ohw;
    const bool prefetch = (x_span + dy_span) * static_cast<int64_t>(sizeof(T)) <= kPrefetchBytes;
    for (int64_t n = n0; n < n1; ++n) {
      if (prefetch && n + 1 < n1) {
        PrefetchSpan(image + ((n + 1) * g.c + b.c0) * g.hw(), x_span);
        PrefetchSpan(cols + ((n + 1) * g.o + b.c0 * og) * ohw, dy_span);
      }
      ToPhases(g, l, image + (n * g.c + b.c0) * g.hw(), b.lanes, ws.phases, &ws.phases_zeroed);
      for (int64_t oc = 0; oc < og; ++oc) {
        // Zero past OW and in missing lanes: those positions add nothing.
        ToWide(g, l, cols + (n * g.o + b.c0 * og + oc) * ohw, og * ohw, b.lanes, ws.wide, &ws.wide_zeroed);
        TapDots(g, l, ws.phases, ws.wide, sums + oc * k * kLanes);
      }
    }
    for (int64_t v = 0; v < b.lanes; ++v)
      for (int64_t oc = 0; oc < og; ++oc)
        for (int64_t r = 0; r < k; ++r) dwb[((b.c0 + v) * og + oc) * k + r] = sums[(oc * k + r) * kLanes + v];
  };
  // dwg [O/g, K] = the sum over images [n0, n1) of group grp.
  auto accumulate = [&](int64_t grp, int64_t n0, int64_t n1, T* dwg, ThreadPool* inner, Workspace<T>& ws) {
    bool first = true;
    // dwg (+)= dy [O/g, len] * src [K, len]^T, dy's rows ld apart: src
    // the planes of a 1x1 convolution, or the im2col block packed straight
    // from the planes (ImageColumns).
    auto product = [&](const T* dy, int64_t ld, const T* src, int64_t len) {
      Gemm<T>(false, true, og, k, len, T(1), dy, ld, src, len, first ? T(0) : T(1), dwg, k, inner);
      first = false;
    };
    auto product_of_block = [&](const T* dy, int64_t ld, const ImageColumns<T>& block, int64_t len) {
      Gemm<T>(false, og, k, len, T(1), dy, ld, block.Transposed(), first ? T(0) : T(1), dwg, k, inner);
      first = false;
    };
    if (Batched(g)) {
      for (int64_t b0 = n0; b0 < n1; b0 += BatchImages(g)) {
        const int64_t b1 = std::min(n1, b0 + BatchImages(g));
        const PlaneBlock dy_block{g.o, grp * og, og, ohw, b0, b1};
        GatherPlanes(cols, dy_block, ws.gathered_cols);
        const ImageColumns<T> block =
            BatchColumns(g, image + (b0 * g.c + grp * cg) * g.hw(), g.c * g.hw(), b1 - b0, ws);
        product_of_block(ws.gathered_cols, dy_block.cols(), block, dy_block.cols());
      }
      n1 = n0;  // done
    }
    for (int64_t n = n0; n < n1; ++n) {
      const T* x = image + (n * g.c + grp * cg) * g.hw();  // [C/g, H, W]
      const T* dy = cols + (n * g.o + grp * og) * ohw;     // [O/g, OH * OW]
      if (g.pointwise()) {
        product(dy, ohw, x, ohw);
        continue;
      }
      product_of_block(dy, ohw, ImageColumns<T>(g, ws.Planes(g, x), 0), ohw);
    }
    if (first) std::fill(dwg, dwg + og * k, T(0));  // no images
  };
  const int64_t size = g.o * k;
  // Batched() blocks hold whole batches: a block of fewer images would
  // throw away the point of gathering them.
  // Direct() blocks of small planes take several images, as its forward
  // tasks take several pairs (ImagesPerTask).
  const int64_t images = Batched(g)  ? (g.n + BatchImages(g) - 1) / BatchImages(g)
                         : Direct(g) ? (g.n + ImagesPerTask(g) - 1) / ImagesPerTask(g)
                                     : g.n;
  const int64_t blocks = std::clamp<int64_t>(std::min(kMaxPartialElems / std::max<int64_t>(1, size), images), 1,
                                             kMaxBatchBlocks);
  // [blocks, O, K], every element written by its block before it is read.
  const std::unique_ptr<T[]> partial = Scratch<T>(blocks > 1 ? blocks * size : 0);
  T* const out = blocks > 1 ? partial.get() : dw;
  // A task: a block of images and a group, or for Direct() a block of channels.
  const int64_t units = Direct(g) ? ChannelBlocks(g) : g.groups;
  RunTasks<T>(pool, g, l, blocks * units, [&](int64_t task, ThreadPool* inner, Workspace<T>& ws) {
    const int64_t b = task / units, unit = task % units;
    const int64_t n0 = g.n * b / blocks, n1 = g.n * (b + 1) / blocks;
    if (Direct(g)) {
      accumulate_direct(BlockOf(g, unit), n0, n1, out + b * size, ws);
    } else {
      accumulate(unit, n0, n1, out + b * size + unit * og * k, inner, ws);
    }
  });
  if (blocks == 1) return;
  ParallelRange(pool, size, [&](int64_t i0, int64_t i1) {
    std::copy(partial.get() + i0, partial.get() + i1, dw + i0);
    for (int64_t b = 1; b < blocks; ++b)
      for (int64_t i = i0; i < i1; ++i) dw[i] += partial[b * size + i];
  });
}

// db [C] = sum of dy [N, C, S] over N and S.
template <typename T>
void BiasGrad(const T* dy, int64_t n, int64_t c, int64_t s, T* db, ThreadPool* pool) {
  // Per plane first (shorter sums round less), each in ArraySum's lanes,
  // the planes in memory order: a channel's planes lie an image apart,
  // where the prefetcher does not follow (PointNet's 4 MiB). Then each
  // channel's plane sums in batch order.
  std::vector<T> planes(static_cast<size_t>(n * c));
  WithSmallExtent(s, [&](auto size) {  // the 1x1 planes of an SE block's convolutions
    ParallelRange(pool, n * c, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) planes[static_cast<size_t>(p)] = ArraySum(dy + p * size, size);
    }, ChannelChunk(s));
  });
  // Image by image, every channel's running sum a lane.
  std::fill(db, db + c, T(0));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) db[ch] += planes[static_cast<size_t>(i * c + ch)];
}

Status ConvKernel(KernelContext& ctx, Product product, bool transpose) {
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  const Tensor* bias = ctx.inputs.size() > 2 ? &ctx.in(2) : nullptr;
  Tensor& out = ctx.out(0);
  const int sd = a.shape().rank() - 2;
  LOOM_ASSIGN_OR_RETURN(ConvParams p, ParseConvParams(*ctx.attrs, "convolution kernel", sd, transpose));
  const ConvGeom g = conv::ProductGeom(p, product, transpose, a.shape(), b.shape(), out.shape());
  return DispatchFloat(out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pb = bias ? bias->data<T>() : nullptr;
    switch (product) {
      case Product::kForward:  // (image, w[, bias]) -> cols
        ConvForward(g, a.data<T>(), b.data<T>(), pb, out.data<T>(), ctx.pool);
        break;
      case Product::kAdjoint:  // (cols, w[, bias]) -> image
        ConvAdjoint(g, a.data<T>(), b.data<T>(), pb, out.data<T>(), ctx.pool);
        break;
      case Product::kWeightGrad: {  // (x, dy) -> dw
        const Tensor& image = transpose ? b : a;
        const Tensor& cols = transpose ? a : b;
        ConvWeightGrad(g, image.data<T>(), cols.data<T>(), out.data<T>(), ctx.pool);
        break;
      }
    }
  });
}

// ---------------------------------------------------------------------------
// Op definitions.

// Conv1d / Conv2d / ConvTranspose1d / ConvTranspose2d: (x, weight[, bias]) -> y.
class ConvOp : public OpDef {
 public:
  ConvOp(const char* name, int sd, bool transpose) : name_(name), sd_(sd), transpose_(transpose) {
    DeclareConvAttrs(DeclareAttrs(), transpose);
  }
  std::string name() const override { return name_; }

  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    if (in.size() != 2 && in.size() != 3)
      return InvalidArgument(name_, " takes (x, weight[, bias]), got ", in.size(), " inputs");
    static const char* const kNames[] = {"input x", "weight", "bias"};
    LOOM_RETURN_IF_ERROR(ExpectSameDType(name_, in, kNames));
    LOOM_ASSIGN_OR_RETURN(ConvParams p, ParseConvParams(attrs, name_, sd_, transpose_));
    LOOM_ASSIGN_OR_RETURN(Shape y, OutputShape(transpose_, name_, p, in[0].shape, in[1].shape));
    if (in.size() == 3 && in[2].shape != Shape({y[1]}))
      return InvalidArgument(name_, ": bias must be [", y[1], "] (one per output channel), got ", in[2].shape.ToString());
    return std::vector<TensorType>{{y, in[0].dtype}};
  }

  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = ConvFlops(transpose_ ? in[0].shape : out[0].shape, in[1].shape);
    if (in.size() == 3) c.flops += static_cast<double>(out[0].shape.numel());
    return c;
  }

  Status Gradient(GradBuilder& g) const override {
    const ValueId dy = g.output_grad(0);
    if (dy == kNoValue) return Status::Ok();
    const ValueId x = g.input(0), w = g.input(1);
    const std::string family = transpose_ ? "ConvTranspose" : "Conv";
    if (g.NeedsInputGrad(0)) {
      AttrMap a = g.attrs();
      a.Set("input_shape", g.type(x).shape.dims());
      g.SetInputGrad(0, g.Emit1(family + "BackwardInput", {dy, w}, a));
    }
    if (g.NeedsInputGrad(1)) {
      AttrMap a = g.attrs();
      a.Set("weight_shape", g.type(w).shape.dims());
      g.SetInputGrad(1, g.Emit1(family + "BackwardWeight", {x, dy}, a));
    }
    if (g.node().inputs.size() == 3 && g.NeedsInputGrad(2)) g.SetInputGrad(2, g.Emit1("ConvBackwardBias", {dy}));
    return Status::Ok();
  }

  // Convolutions (not the transposed ones yet). Sample: the images, every
  // part with the whole weight. Parameter (one group): the output channels,
  // every part reading the whole x. Attribute: output rows (H, or L in 1-D),
  // each part reading its input rows and a halo of kernel - stride rows.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>& /*out*/) const override {
    SplitRules rules;
    if (transpose_) return rules;
    auto p = conv::ParseConvParams(attrs, name_, sd_, false);
    if (!p.ok()) return rules;
    rules.sample = SplitAlong(-1, in.size(), 1);
    rules.sample->inputs[0].axis = 0;
    rules.sample->outputs[0].axis = 0;
    rules.parameter = SplitAlong(0, in.size(), 1);
    rules.parameter->outputs[0].axis = 1;
    // One group: every part reads all of x. Groups: a part is a run of
    // groups, with their input channels (PartAttrs counts them).
    rules.parameter->inputs[0].axis = p->groups == 1 ? -1 : 1;
    const int a = sd_ == 2 ? 0 : 1;  // the Pair entry of the split axis (H, or L of a 1-D op)
    const int64_t kernel = in[1].shape[2];
    rules.attribute = SplitAlong(-1, in.size(), 1);
    rules.attribute->inputs[0] = AxisSplit{2, p->stride[a], p->padding[a], p->dilation[a] * (kernel - 1) + 1};
    rules.attribute->outputs[0].axis = 2;
    return rules;
  }
  // A part of the rows reads its halo with the padding rows as zeros
  // (graph/task_graph.h), so it runs unpadded along them; a run of groups
  // has its share of the groups.
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>&) const override {
    LOOM_ASSIGN_OR_RETURN(conv::ConvParams p, conv::ParseConvParams(attrs, name_, sd_, transpose_));
    AttrMap part = attrs;
    const Region& x = in_regions[0];
    if (x.lo[2] != 0 || x.hi[2] != in[0].shape[2]) {
      p.padding[sd_ == 2 ? 0 : 1] = 0;
      part.Set("padding", sd_ == 2 ? std::vector<int64_t>{p.padding[0], p.padding[1]} : std::vector<int64_t>{p.padding[1]});
    }
    LOOM_RETURN_IF_ERROR(SetGroupsOfRun(name_, p.groups, x.hi[1] - x.lo[1], in[0].shape[1], &part));
    return part;
  }

  FusionKind fusion_kind() const override { return FusionKind::kFused; }
  // A grouped convolution over x as [N, R*C, ...] with R times the groups
  // and the weights (and biases) of the replicas stacked on dim 0. A shared
  // x with one group needs no copies: one convolution into R*O channels.
  Status Fuse(FusionBuilder& f) const override {
    const int64_t groups = f.attrs().Int("groups");
    const bool shared_x = !f.input(0).replicated() && groups == 1 && !transpose_;
    FusedValue x = f.input(0);
    if (!shared_x) {
      LOOM_ASSIGN_OR_RETURN(x, f.MergeIntoDim1(x, f.name() + "/x"));
    }
    std::vector<FusedValue> ins = {x};
    for (int i = 1; i < f.num_inputs(); ++i) {
      const std::string pname = f.name() + "/param" + std::to_string(i);
      LOOM_ASSIGN_OR_RETURN(FusedValue p, f.Replicated(f.input(i), 0, pname));
      std::vector<int64_t> d = f.SingleShape(f.input(i)).dims();
      const int64_t per_replica = d[0];
      d[0] *= f.replicas();
      LOOM_ASSIGN_OR_RETURN(p, f.Reshape(p, Shape(d), ReplicaLayout::Merged(0, per_replica), pname + "/stacked"));
      ins.push_back(p);
    }
    AttrMap attrs = f.attrs();
    if (!shared_x) attrs.Set("groups", groups * f.replicas());
    const Shape& ys = f.output_shape(0);
    LOOM_ASSIGN_OR_RETURN(FusedValue y, f.Emit1(name_, ins, attrs, f.name(), ReplicaLayout::Merged(1, ys[1])));
    LOOM_ASSIGN_OR_RETURN(FusedValue out, f.Reshape(y, f.WithReplicaAxis(ys, 1), ReplicaLayout::Axis(1),
                                                    f.name() + "/split_replicas"));
    return f.MapOutputs({out});
  }

 private:
  std::string name_;
  int sd_;
  bool transpose_;
};
LOOM_REGISTER_OP(ConvOp, "Conv1d", 1, false);
LOOM_REGISTER_OP(ConvOp, "Conv2d", 2, false);
LOOM_REGISTER_OP(ConvOp, "ConvTranspose1d", 1, true);
LOOM_REGISTER_OP(ConvOp, "ConvTranspose2d", 2, true);

// The backward ops of x and w. Each rebuilds the forward geometry from its
// attributes and the given shape and checks dy against the forward output.
class ConvBackwardOp : public OpDef {
 public:
  ConvBackwardOp(const char* name, bool weight, bool transpose) : name_(name), weight_(weight), transpose_(transpose) {
    DeclareConvAttrs(DeclareAttrs(), transpose);
    DeclareAttrs().Required(weight ? "weight_shape" : "input_shape", AttrType::kInts,
                            weight ? "the forward weight's shape" : "the forward input's shape");
  }
  std::string name() const override { return name_; }

  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap& attrs, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 2, name_));
    static const char* const kInputNames[] = {"dy", "weight"};
    static const char* const kWeightNames[] = {"x", "dy"};
    LOOM_RETURN_IF_ERROR(ExpectSameDType(name_, in, weight_ ? kWeightNames : kInputNames));
    const Shape& dy = in[weight_ ? 1 : 0].shape;
    const int sd = dy.rank() - 2;
    if (sd != 1 && sd != 2) return InvalidArgument(name_, ": dy must have rank 3 or 4, got ", dy.ToString());
    LOOM_ASSIGN_OR_RETURN(ConvParams p, ParseConvParams(attrs, name_, sd, transpose_));
    LOOM_ASSIGN_OR_RETURN(std::vector<int64_t> given, ShapeAttr(attrs, name_, weight_ ? "weight_shape" : "input_shape"));
    const Shape x = weight_ ? in[0].shape : Shape(given);
    const Shape w = weight_ ? Shape(given) : in[1].shape;
    LOOM_ASSIGN_OR_RETURN(Shape expected, OutputShape(transpose_, name_, p, x, w));
    if (expected != dy)
      return InvalidArgument(name_, ": dy ", dy.ToString(), " is not the forward output ", expected.ToString(),
                             " of x ", x.ToString(), " and weight ", w.ToString());
    return std::vector<TensorType>{{Shape(given), in[0].dtype}};
  }
  // Sample: the batch of x, dy and dx; the weight gradient of a batch part
  // is a partial sum. Parameter (a convolution's): the forward's output
  // channels, dy's channels with the weight's rows, so that the backward
  // pass of a parameter-split layer keeps its weight split as the forward
  // reads it (with only a sample rule every part would need the whole
  // weight, and make a partial sum of all of its gradient). With one group
  // every part reads all of x and its input gradient is a partial sum; with
  // groups a part is a run of groups and their input channels.
  SplitRules Splits(const AttrMap& attrs, const std::vector<TensorType>& in,
                    const std::vector<TensorType>&) const override {
    SplitRules rules;
    rules.sample = SplitAlong(0, in.size(), 1);
    if (weight_) {
      rules.sample->outputs[0].axis = -1;
      rules.sample->partial_sums = true;
    } else {
      rules.sample->inputs[1].axis = -1;
    }
    if (transpose_ || in.size() != 2) return rules;
    auto p = ParseConvParams(attrs, name_, in[weight_ ? 1 : 0].shape.rank() - 2, transpose_);
    if (!p.ok()) return rules;
    const bool grouped = p->groups > 1;
    rules.parameter = SplitAlong(-1, in.size(), 1);
    if (weight_) {  // (x, dy) -> dw
      rules.parameter->inputs[0].axis = grouped ? 1 : -1;
      rules.parameter->inputs[1].axis = 1;
      rules.parameter->outputs[0].axis = 0;
    } else {  // (dy, w) -> dx
      rules.parameter->inputs[0].axis = 1;
      rules.parameter->inputs[1].axis = 0;
      rules.parameter->outputs[0].axis = grouped ? 1 : -1;
      rules.parameter->partial_sums = !grouped;
    }
    return rules;
  }
  // A part's shape attribute is its output's; a run of groups has its share
  // of the groups (its x or dx channels over the whole's).
  StatusOr<AttrMap> PartAttrs(const AttrMap& attrs, const std::vector<TensorType>& in, const std::vector<TensorType>&,
                              const std::vector<Region>& in_regions, const std::vector<Region>& out) const override {
    AttrMap part = attrs;
    part.Set(weight_ ? "weight_shape" : "input_shape", out[0].shape().dims());
    if (transpose_) return part;
    const Region& image = weight_ ? in_regions[0] : out[0];  // x, or dx
    const int64_t whole = weight_ ? in[0].shape[1] : attrs.Ints("input_shape")[1];
    LOOM_RETURN_IF_ERROR(SetGroupsOfRun(name_, attrs.Int("groups", 1), image.hi[1] - image.lo[1], whole, &part));
    return part;
  }

  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    const Shape& w = weight_ ? out[0].shape : in[1].shape;
    // The column side: dy of a convolution, x of a transposed one.
    const Shape& cols = weight_ ? (transpose_ ? in[0].shape : in[1].shape) : (transpose_ ? out[0].shape : in[0].shape);
    c.flops = ConvFlops(cols, w);
    return c;
  }

 private:
  std::string name_;
  bool weight_;
  bool transpose_;
};
LOOM_REGISTER_OP(ConvBackwardOp, "ConvBackwardInput", false, false);
LOOM_REGISTER_OP(ConvBackwardOp, "ConvBackwardWeight", true, false);
LOOM_REGISTER_OP(ConvBackwardOp, "ConvTransposeBackwardInput", false, true);
LOOM_REGISTER_OP(ConvBackwardOp, "ConvTransposeBackwardWeight", true, true);

// ConvBackwardBias: dy [N, C, spatial...] -> [C].
class ConvBackwardBiasOp : public OpDef {
 public:
  ConvBackwardBiasOp() { DeclareAttrs(); }
  std::string name() const override { return "ConvBackwardBias"; }
  StatusOr<std::vector<TensorType>> InferTypes(const AttrMap&, const std::vector<TensorType>& in) const override {
    LOOM_RETURN_IF_ERROR(ExpectInputs(in, 1, "ConvBackwardBias"));
    LOOM_RETURN_IF_ERROR(ExpectFloatOrHalf(in[0], "ConvBackwardBias dy"));
    if (in[0].shape.rank() < 3)
      return InvalidArgument("ConvBackwardBias: dy must be [N, C, spatial...], got ", in[0].shape.ToString());
    return std::vector<TensorType>{{Shape({in[0].shape[1]}), in[0].dtype}};
  }
  // Sample: a batch part's bias gradient is a partial sum; parameter: the
  // channels.
  SplitRules Splits(const AttrMap&, const std::vector<TensorType>&, const std::vector<TensorType>&) const override {
    SplitRules rules;
    rules.sample = SplitAlong(0, 1, 1);
    rules.sample->outputs[0].axis = -1;
    rules.sample->partial_sums = true;
    rules.parameter = SplitAlong(1, 1, 1);
    rules.parameter->outputs[0].axis = 0;
    return rules;
  }
  OpCost Cost(const AttrMap& a, const std::vector<TensorType>& in, const std::vector<TensorType>& out) const override {
    OpCost c = OpDef::Cost(a, in, out);
    c.flops = static_cast<double>(in[0].shape.numel());
    return c;
  }
};
LOOM_REGISTER_OP(ConvBackwardBiasOp);

// ---------------------------------------------------------------------------
// CPU kernels.

// The kernels of conv::kKernelRoles (which product each op runs). bf16 /
// f16 run the f32 kernel on widened copies and round each output once.
const bool kConvKernelsRegistered = [] {
  for (const conv::KernelRole& role : conv::kKernelRoles) {
    const KernelFn f32_kernel = [role](KernelContext& ctx) { return ConvKernel(ctx, role.product, role.transpose); };
    OpRegistry::Global().RegisterKernel(role.op, DeviceType::kCpu, [f32_kernel](KernelContext& ctx) {
      return IsHalf(ctx.out(0).dtype()) ? RunHalfInF32(ctx, f32_kernel) : f32_kernel(ctx);
    });
    OpRegistry::Global().RegisterKernelSupport(role.op, DeviceType::kCpu, HalfFloatKernelSupport());
  }
  return true;
}();

Status BiasGradKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.in(0);
  Tensor& db = ctx.out(0);
  const int64_t n = dy.shape()[0], c = dy.shape()[1], s = c * n == 0 ? 0 : dy.numel() / (n * c);
  return DispatchFloat(db.dtype(), [&](auto zero) {
    using T = decltype(zero);
    BiasGrad(dy.data<T>(), n, c, s, db.data<T>(), ctx.pool);
  });
}
LOOM_REGISTER_KERNEL("ConvBackwardBias", DeviceType::kCpu, [](KernelContext& ctx) {
  return IsHalf(ctx.out(0).dtype()) ? RunHalfInF32(ctx, BiasGradKernel) : BiasGradKernel(ctx);
});
LOOM_REGISTER_KERNEL_SUPPORT("ConvBackwardBias", DeviceType::kCpu, HalfFloatKernelSupport());

}  // namespace
}  // namespace loom
