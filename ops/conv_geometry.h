// Host-side geometry of the convolution ops, shared by the CPU kernels
// (ops/conv_ops.cc) and the CUDA kernels (ops/cuda/conv_kernels.cc): the
// attributes (stride, padding, dilation, groups, output_padding), the
// image / column / weight geometry of the three products, and which product
// each kernel runs. See ops/conv_ops.cc for the products themselves.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/attrs.h"

namespace loom::conv {

using Pair = std::array<int64_t, 2>;  // (h, w); 1-D ops use w and keep h neutral

inline std::string PairString(const Pair& p, int sd) {
  return sd == 2 ? StrCat("[", p[0], ", ", p[1], "]") : StrCat("[", p[1], "]");
}

// An int or a list of `sd` ints (present: the node is canonical). The h
// axis of 1-D ops is an extent-1 axis, and keeps `neutral`, the value that
// leaves it as it is.
inline StatusOr<Pair> SpatialAttr(const AttrMap& attrs, const std::string& op, const char* name, int sd,
                                  int64_t neutral) {
  Pair v = {neutral, neutral};
  auto it = attrs.values().find(name);
  if (it == attrs.values().end()) return InvalidArgument(op, ": missing attribute '", name, "'");
  if (const int64_t* i = std::get_if<int64_t>(&it->second)) {
    v[1] = *i;
    if (sd == 2) v[0] = *i;
    return v;
  }
  const auto* list = std::get_if<std::vector<int64_t>>(&it->second);
  if (list == nullptr || static_cast<int>(list->size()) != sd)
    return InvalidArgument(op, ": attribute '", name, "' must be an int or a list of ", sd, " int", sd == 1 ? "" : "s",
                           ", got ", AttrValueToString(it->second));
  v[1] = list->back();
  if (sd == 2) v[0] = list->front();
  return v;
}

struct ConvParams {
  int sd = 2;  // spatial dims
  Pair stride{1, 1}, padding{0, 0}, dilation{1, 1}, output_padding{0, 0};
  int64_t groups = 1;
};

inline StatusOr<ConvParams> ParseConvParams(const AttrMap& attrs, const std::string& op, int sd, bool transpose) {
  ConvParams p;
  p.sd = sd;
  LOOM_ASSIGN_OR_RETURN(p.stride, SpatialAttr(attrs, op, "stride", sd, /*neutral=*/1));
  LOOM_ASSIGN_OR_RETURN(p.padding, SpatialAttr(attrs, op, "padding", sd, /*neutral=*/0));
  LOOM_ASSIGN_OR_RETURN(p.dilation, SpatialAttr(attrs, op, "dilation", sd, /*neutral=*/1));
  if (transpose) {
    LOOM_ASSIGN_OR_RETURN(p.output_padding, SpatialAttr(attrs, op, "output_padding", sd, /*neutral=*/0));
  }
  p.groups = attrs.Int("groups");
  if (p.groups < 1) return InvalidArgument(op, ": groups must be >= 1, got ", p.groups);
  for (int a = 0; a < 2; ++a) {
    if (p.stride[a] < 1) return InvalidArgument(op, ": stride must be >= 1, got ", PairString(p.stride, sd));
    if (p.dilation[a] < 1) return InvalidArgument(op, ": dilation must be >= 1, got ", PairString(p.dilation, sd));
    if (p.padding[a] < 0) return InvalidArgument(op, ": padding must be >= 0, got ", PairString(p.padding, sd));
    // PyTorch's rule: an output_padding of s or more would add rows that no
    // input reaches, unless dilation spreads the kernel that far.
    if (p.output_padding[a] < 0 || (p.output_padding[a] >= p.stride[a] && p.output_padding[a] >= p.dilation[a]))
      return InvalidArgument(op, ": output_padding ", PairString(p.output_padding, sd),
                             " must be >= 0 and smaller than either stride ", PairString(p.stride, sd),
                             " or dilation ", PairString(p.dilation, sd));
  }
  return p;
}

// Spatial extents of [N, C, spatial...] as (h, w).
inline Pair SpatialOf(const Shape& s) { return s.rank() == 4 ? Pair{s[2], s[3]} : Pair{1, s[2]}; }
inline Shape WithSpatial(int64_t n, int64_t c, const Pair& sp, int sd) {
  return sd == 2 ? Shape{n, c, sp[0], sp[1]} : Shape{n, c, sp[1]};
}

// One product's geometry: the image side [N, C, H, W], the column side
// [N, O, OH, OW] and the weight [O, C/groups, KH, KW].
struct ConvGeom {
  int64_t n, c, h, w;  // image  [N, C, H, W]
  int64_t o, oh, ow;   // cols   [N, O, OH, OW]
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups;
  int64_t cg() const { return c / groups; }
  int64_t og() const { return o / groups; }
  int64_t k() const { return cg() * kh * kw; }  // GEMM depth: rows of im2col
  int64_t hw() const { return h * w; }
  int64_t ohw() const { return oh * ow; }
  int64_t image_numel() const { return n * c * h * w; }
  int64_t cols_numel() const { return n * o * oh * ow; }
  int64_t weight_numel() const { return o * cg() * kh * kw; }
  // im2col of a 1x1, stride-1, unpadded conv is the image itself.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && oh == h && ow == w; }
  // The planes im2col reads and col2im writes: zero-padded copies when the
  // convolution pads (see PadPlanes), else the image's own.
  bool padded() const { return ph > 0 || pw > 0; }
  int64_t hp() const { return h + 2 * ph; }
  int64_t wp() const { return w + 2 * pw; }
};

inline ConvGeom MakeGeom(const ConvParams& p, const Shape& image, const Shape& weight, const Shape& cols) {
  const Pair in = SpatialOf(image), k = SpatialOf(weight), out = SpatialOf(cols);
  return ConvGeom{image[0],     image[1],     in[0],        in[1],          // image
                  cols[1],      out[0],       out[1],                       // cols
                  k[0],         k[1],         p.stride[0],  p.stride[1],    // kernel
                  p.padding[0], p.padding[1], p.dilation[0], p.dilation[1], p.groups};
}

// Which of the three products a kernel runs. `transpose` says the op is of
// the ConvTranspose family, which only changes which input is the image in
// the weight gradient: (x = cols, dy = image) instead of (x = image, dy = cols).
enum class Product { kForward, kAdjoint, kWeightGrad };

// Every convolution kernel but ConvBackwardBias: the op, its product and
// its family. A transposed convolution runs the adjoint, and its input
// gradient the forward product.
struct KernelRole {
  const char* op;
  Product product;
  bool transpose;
};
inline constexpr KernelRole kKernelRoles[] = {
    {"Conv1d", Product::kForward, false},
    {"Conv2d", Product::kForward, false},
    {"ConvBackwardInput", Product::kAdjoint, false},
    {"ConvBackwardWeight", Product::kWeightGrad, false},
    {"ConvTranspose1d", Product::kAdjoint, true},
    {"ConvTranspose2d", Product::kAdjoint, true},
    {"ConvTransposeBackwardInput", Product::kForward, true},
    {"ConvTransposeBackwardWeight", Product::kWeightGrad, true},
};

// The geometry of a kernel's product from its inputs (a, b) and output:
//   forward      (image, w[, bias]) -> cols
//   adjoint      (cols, w[, bias])  -> image
//   weight grad  (x, dy) -> dw, x the image (cols when transposed).
inline ConvGeom ProductGeom(const ConvParams& p, Product product, bool transpose, const Shape& a, const Shape& b,
                            const Shape& out) {
  switch (product) {
    case Product::kForward: return MakeGeom(p, a, b, out);
    case Product::kAdjoint: return MakeGeom(p, out, b, a);
    case Product::kWeightGrad: break;
  }
  return transpose ? MakeGeom(p, b, out, a) : MakeGeom(p, a, out, b);
}

}  // namespace loom::conv
