#include <catch2/catch.hpp>

#include <array>
#include <variant>

#include "core/thread_pool.h"
#include "ops/op.h"
#include "tests/half_harness.h"
#include "tests/op_harness.h"

namespace loom::testing {
namespace {

using Ints = std::vector<int64_t>;

// Attributes as the reference reads them: (h, w), 1-D ops fill w only.
std::array<int64_t, 2> Spatial(const AttrMap& attrs, const char* name, int sd, int64_t def) {
  std::array<int64_t, 2> v = {def, def};
  if (!attrs.Has(name)) return v;
  const AttrValue& a = attrs.values().at(name);
  if (const int64_t* i = std::get_if<int64_t>(&a)) {
    v[1] = *i;
    if (sd == 2) v[0] = *i;
  } else {
    const Ints& l = std::get<Ints>(a);
    v[1] = l.back();
    if (sd == 2) v[0] = l.front();
  }
  return v;
}

struct RefConv {
  int sd;
  std::array<int64_t, 2> stride, pad, dil, out_pad;
  int64_t groups;
  RefConv(const AttrMap& a, int sd_)
      : sd(sd_),
        stride(Spatial(a, "stride", sd_, 1)),
        pad(Spatial(a, "padding", sd_, 0)),
        dil(Spatial(a, "dilation", sd_, 1)),
        out_pad(Spatial(a, "output_padding", sd_, 0)),
        groups(a.Int("groups")) {}
};

// [N, C, H, W] extents of a rank-3 or rank-4 tensor (H = 1 for rank 3).
std::array<int64_t, 4> Dims4(const Shape& s) {
  return s.rank() == 4 ? std::array<int64_t, 4>{s[0], s[1], s[2], s[3]} : std::array<int64_t, 4>{s[0], s[1], 1, s[2]};
}

Shape OutShape(int sd, int64_t n, int64_t c, int64_t h, int64_t w) { return sd == 2 ? Shape{n, c, h, w} : Shape{n, c, w}; }

// Direct convolution: every output sums its window (gather form).
std::vector<Tensor> ConvRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const int sd = in[0].shape().rank() - 2;
  RefConv p(attrs, sd);
  auto [n_, c_, h_, w_] = Dims4(in[0].shape());
  auto [o_, cg, kh, kw] = Dims4(in[1].shape());
  const int64_t og = o_ / p.groups;
  const int64_t oh = (h_ + 2 * p.pad[0] - p.dil[0] * (kh - 1) - 1) / p.stride[0] + 1;
  const int64_t ow = (w_ + 2 * p.pad[1] - p.dil[1] * (kw - 1) - 1) / p.stride[1] + 1;
  Tensor y = ZerosF64(OutShape(sd, n_, o_, oh, ow));
  for (int64_t n = 0; n < n_; ++n)
    for (int64_t o = 0; o < o_; ++o)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double s = in.size() == 3 ? At(in[2], o) : 0.0;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t c = (o / og) * cg + ci;
            for (int64_t ki = 0; ki < kh; ++ki)
              for (int64_t kj = 0; kj < kw; ++kj) {
                const int64_t iy = oy * p.stride[0] - p.pad[0] + ki * p.dil[0];
                const int64_t ix = ox * p.stride[1] - p.pad[1] + kj * p.dil[1];
                if (iy < 0 || iy >= h_ || ix < 0 || ix >= w_) continue;
                s += At(in[0], ((n * c_ + c) * h_ + iy) * w_ + ix) * At(in[1], ((o * cg + ci) * kh + ki) * kw + kj);
              }
          }
          At(y, ((n * o_ + o) * oh + oy) * ow + ox) = s;
        }
  return {y};
}

// Transposed convolution as PyTorch defines it: every input element scatters
// its weighted kernel into the output (scatter form).
std::vector<Tensor> ConvTransposeRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const int sd = in[0].shape().rank() - 2;
  RefConv p(attrs, sd);
  auto [n_, c_, h_, w_] = Dims4(in[0].shape());
  auto [wc, og, kh, kw] = Dims4(in[1].shape());
  (void)wc;
  const int64_t o_ = og * p.groups, cg = c_ / p.groups;
  const int64_t oh = (h_ - 1) * p.stride[0] - 2 * p.pad[0] + p.dil[0] * (kh - 1) + p.out_pad[0] + 1;
  const int64_t ow = (w_ - 1) * p.stride[1] - 2 * p.pad[1] + p.dil[1] * (kw - 1) + p.out_pad[1] + 1;
  Tensor y = ZerosF64(OutShape(sd, n_, o_, oh, ow));
  for (int64_t n = 0; n < n_; ++n)
    for (int64_t o = 0; o < o_; ++o)
      for (int64_t i = 0; i < oh * ow; ++i) At(y, (n * o_ + o) * oh * ow + i) = in.size() == 3 ? At(in[2], o) : 0.0;
  for (int64_t n = 0; n < n_; ++n)
    for (int64_t c = 0; c < c_; ++c)
      for (int64_t iy = 0; iy < h_; ++iy)
        for (int64_t ix = 0; ix < w_; ++ix) {
          const double xv = At(in[0], ((n * c_ + c) * h_ + iy) * w_ + ix);
          for (int64_t oc = 0; oc < og; ++oc)
            for (int64_t ki = 0; ki < kh; ++ki)
              for (int64_t kj = 0; kj < kw; ++kj) {
                const int64_t oy = iy * p.stride[0] - p.pad[0] + ki * p.dil[0];
                const int64_t ox = ix * p.stride[1] - p.pad[1] + kj * p.dil[1];
                if (oy < 0 || oy >= oh || ox < 0 || ox >= ow) continue;
                const int64_t o = (c / cg) * og + oc;
                At(y, ((n * o_ + o) * oh + oy) * ow + ox) += xv * At(in[1], ((c * og + oc) * kh + ki) * kw + kj);
              }
        }
  return {y};
}

InputSpec U(Shape s) { return InputSpec::Uniform(std::move(s)); }

std::vector<OpCase> Conv2dCases() {
  return {
      {"conv2d 3x3 bias", "Conv2d", {}, {U({2, 3, 5, 5}), U({4, 3, 3, 3}), U({4})}, ConvRef},
      {"conv2d stride 2 padding 1 no bias", "Conv2d", {{"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}},
       {U({2, 2, 6, 5}), U({3, 2, 3, 3})}, ConvRef},
      {"conv2d dilation 2 padding 2", "Conv2d", {{"dilation", Ints{2, 2}}, {"padding", Ints{2, 2}}},
       {U({1, 2, 7, 6}), U({2, 2, 3, 3}), U({2})}, ConvRef},
      {"conv2d non-square kernel, stride and padding, groups 2", "Conv2d",
       {{"stride", Ints{2, 1}}, {"padding", Ints{1, 0}}, {"groups", int64_t{2}}},
       {U({2, 4, 5, 6}), U({6, 2, 3, 2}), U({6})}, ConvRef},
      {"conv2d depthwise (groups = C) multiplier 2", "Conv2d", {{"padding", Ints{1, 1}}, {"groups", int64_t{3}}},
       {U({2, 3, 5, 4}), U({6, 1, 3, 3}), U({6})}, ConvRef},
      {"conv2d three fused convs (groups 3) stride 2", "Conv2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"groups", int64_t{3}}},
       {U({2, 6, 5, 5}), U({9, 2, 3, 3}), U({9})}, ConvRef},
      {"conv2d pointwise 1x1 groups 2", "Conv2d", {{"groups", int64_t{2}}}, {U({2, 4, 3, 3}), U({6, 2, 1, 1}), U({6})},
       ConvRef},
      // Small planes: the images of a batch side by side in one GEMM, here
      // in two batches of 3 images (720 columns each).
      {"conv2d pointwise on small planes, images gathered in batches", "Conv2d", {},
       {U({6, 4, 16, 15}), U({5, 4, 1, 1}), U({5})}, ConvRef},
      // 2x2 planes (MobileNet's last stage at CIFAR size): the GEMMs pack
      // the planes in runs of 4, and eight channels' runs at a time into
      // the weight gradient's transposed panels.
      {"conv2d pointwise on 2x2 planes, 12 channels", "Conv2d", {}, {U({5, 12, 2, 2}), U({9, 12, 1, 1}), U({9})},
       ConvRef},
      // 1x1 planes (a squeeze-and-excitation block's convolutions): the
      // bias gradient's planes of one element.
      {"conv2d on 1x1 planes with bias", "Conv2d", {}, {U({6, 8, 1, 1}), U({5, 8, 1, 1}), U({5})}, ConvRef},
      // ... which run as Linear layers, images as rows: also grouped (a
      // fused array's), and transposed.
      {"conv2d on 1x1 planes, groups 3 (a fused squeeze-and-excitation block)", "Conv2d", {{"groups", int64_t{3}}},
       {U({4, 6, 1, 1}), U({9, 2, 1, 1}), U({9})}, ConvRef},
      // The same for a 3x3 convolution: the images' im2col blocks side by
      // side (batches of 3 and 2 images of 225 columns), and col2im out of
      // them, padded; then stride, dilation and groups, unpadded.
      {"conv2d 3x3 on small planes, im2col blocks gathered in batches", "Conv2d", {{"padding", int64_t{1}}},
       {U({5, 3, 15, 15}), U({4, 3, 3, 3}), U({4})}, ConvRef},
      {"conv2d small planes gathered, stride 2, dilation 2, groups 2", "Conv2d",
       {{"stride", Ints{2, 1}}, {"dilation", int64_t{2}}, {"groups", int64_t{2}}},
       {U({3, 4, 9, 7}), U({6, 2, 3, 2}), U({6})}, ConvRef},
      // im2col and col2im copy rows of 4, 8 and 16 outputs with widths
      // known at compile time (unit stride and stride 2).
      {"conv2d rows of 4 outputs, stride 2", "Conv2d", {{"stride", int64_t{2}}, {"padding", int64_t{1}}},
       {U({2, 3, 8, 8}), U({4, 3, 3, 3}), U({4})}, ConvRef},
      {"conv2d rows of 8 outputs", "Conv2d", {{"padding", int64_t{1}}}, {U({2, 3, 5, 8}), U({2, 3, 3, 3})}, ConvRef},
      {"conv2d rows of 16 outputs, one GEMM an image", "Conv2d", {{"padding", int64_t{1}}},
       {U({1, 2, 17, 16}), U({3, 2, 3, 3}), U({3})}, ConvRef},
      // The direct walk over stride phases: strides 2 and 3, dilation,
      // kernels as large as the padded plane.
      {"conv2d depthwise 5x5 stride 2 on a 3x3 plane", "Conv2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{2}}, {"groups", int64_t{3}}},
       {U({2, 3, 3, 3}), U({3, 1, 5, 5}), U({3})}, ConvRef},
      // Channels go 8 lanes at a time: two blocks, the second partial.
      {"conv2d depthwise 11 channels, stride 2", "Conv2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"groups", int64_t{11}}},
       {U({2, 11, 5, 6}), U({11, 1, 3, 3}), U({11})}, ConvRef},
      {"conv2d depthwise 9 channels, multiplier 2", "Conv2d", {{"padding", int64_t{1}}, {"groups", int64_t{9}}},
       {U({2, 9, 4, 4}), U({18, 1, 3, 3}), U({18})}, ConvRef},
      // Rows of 8 or more positions of whole blocks of 8 channels go into
      // and out of the blocked layout as 8 x 8 transposes, the rest element
      // by element.
      {"conv2d depthwise 16 channels on 13 x 12 planes", "Conv2d", {{"padding", int64_t{1}}, {"groups", int64_t{16}}},
       {U({2, 16, 13, 12}), U({16, 1, 3, 3}), U({16})}, ConvRef},
      // Rows of 2 (MobileNetV3's last planes, a 5x5 kernel on 2x2) and
      // rows of 4 + 2 go as 8 x 2 transposes.
      {"conv2d depthwise 8 channels on 2x2 planes, 5x5", "Conv2d", {{"padding", int64_t{2}}, {"groups", int64_t{8}}},
       {U({3, 8, 2, 2}), U({8, 1, 5, 5}), U({8})}, ConvRef},
      // Planes where every output reads every input: each channel's
      // product a dense matrix over its plane, kLanes / P planes to a vector
      // (planes of 4, 1, 2 and 8; rows of whole vectors and a last vector
      // of fewer planes; stride and dilation on 1x1 planes).
      {"conv2d depthwise 5 channels on 2x2 planes, 3x3", "Conv2d", {{"padding", int64_t{1}}, {"groups", int64_t{5}}},
       {U({3, 5, 2, 2}), U({5, 1, 3, 3}), U({5})}, ConvRef},
      {"conv2d depthwise 11 channels on 1x1 planes, stride 2, dilation 2", "Conv2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{2}}, {"dilation", int64_t{2}}, {"groups", int64_t{11}}},
       {U({2, 11, 1, 1}), U({11, 1, 3, 3}), U({11})}, ConvRef},
      {"conv2d depthwise 6 channels on 1x2 planes", "Conv2d", {{"padding", int64_t{1}}, {"groups", int64_t{6}}},
       {U({2, 6, 1, 2}), U({6, 1, 3, 3})}, ConvRef},
      {"conv2d depthwise 3 channels on 2x4 planes, a 3x7 kernel", "Conv2d",
       {{"padding", Ints{1, 3}}, {"groups", int64_t{3}}}, {U({2, 3, 2, 4}), U({3, 1, 3, 7}), U({3})}, ConvRef},
      // No output column reads an image column (padding 1, stride 2, one
      // column): every tap is dead, the output is the bias and the
      // gradients of x and w are zeros.
      {"conv2d depthwise 1x1, stride 2, padding 1 on 3x1 planes", "Conv2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"groups", int64_t{3}}},
       {U({2, 3, 3, 1}), U({3, 1, 1, 1}), U({3})}, ConvRef},
      {"conv2d depthwise 8 channels on 3x6 planes", "Conv2d", {{"padding", int64_t{1}}, {"groups", int64_t{8}}},
       {U({2, 8, 3, 6}), U({8, 1, 3, 3})}, ConvRef},
      {"conv2d depthwise 9 channels, multiplier 2, rows of 17", "Conv2d",
       {{"padding", int64_t{1}}, {"groups", int64_t{9}}}, {U({1, 9, 5, 17}), U({18, 1, 3, 3}), U({18})}, ConvRef},
      {"conv2d depthwise strides 2 x 3, dilation 2 x 3, multiplier 2", "Conv2d",
       {{"stride", Ints{2, 3}}, {"padding", Ints{2, 1}}, {"dilation", Ints{2, 3}}, {"groups", int64_t{2}}},
       {U({2, 2, 7, 8}), U({4, 1, 3, 2}), U({4})}, ConvRef},
      // Each output row sums only the taps that read image rows, and each
      // image row gathers only from the output rows it reaches: rows of
      // bias alone where the padding is past the kernel's reach, and image
      // rows no output reads (the last of a stride-2 walk).
      {"conv2d depthwise padding past the kernel's reach", "Conv2d",
       {{"padding", Ints{3, 1}}, {"groups", int64_t{3}}}, {U({2, 3, 3, 4}), U({3, 1, 3, 3}), U({3})}, ConvRef},
      {"conv2d depthwise stride 2 leaves the last image row unread", "Conv2d",
       {{"stride", int64_t{2}}, {"groups", int64_t{3}}}, {U({2, 3, 6, 6}), U({3, 1, 3, 3}), U({3})}, ConvRef},
      // Stride-2 rows of whole blocks go into and out of the blocked layout
      // 8 column pairs at a time, both phases together, the row's last
      // elements one by one: the odd columns' phase first (padding 1) or
      // the even columns' (padding 2), a row's pairs in one block and a
      // tail, or in two whole blocks.
      {"conv2d depthwise 16 channels, stride 2, rows of 31", "Conv2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"groups", int64_t{16}}},
       {U({2, 16, 5, 31}), U({16, 1, 3, 3}), U({16})}, ConvRef},
      {"conv2d depthwise 8 channels, 5x5 stride 2, rows of 32", "Conv2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{2}}, {"groups", int64_t{8}}},
       {U({1, 8, 3, 32}), U({8, 1, 5, 5}), U({8})}, ConvRef},
      {"conv2d 1x1 stride 2 (not pointwise)", "Conv2d", {{"stride", Ints{2, 2}}}, {U({1, 3, 5, 5}), U({2, 3, 1, 1})},
       ConvRef},
      {"conv2d kernel as large as the padded input", "Conv2d", {{"padding", Ints{1, 0}}},
       {U({2, 2, 3, 4}), U({3, 2, 5, 4}), U({3})}, ConvRef},
      {"conv2d single image (threaded GEMM)", "Conv2d", {{"padding", Ints{1, 1}}},
       {U({1, 8, 12, 12}), U({16, 8, 3, 3}), U({16})}, ConvRef},
      {"conv2d single input channel, many outputs (GEMM, not the direct walk)", "Conv2d", {},
       {U({2, 1, 6, 6}), U({4, 1, 3, 3}), U({4})}, ConvRef},
      {"conv2d image processed in several row tiles", "Conv2d", {{"padding", Ints{1, 1}}},
       {U({1, 16, 40, 40}), U({4, 16, 3, 3}), U({4})}, ConvRef},
      // Unit-stride input gradients of planes too large to batch run as
      // the forward of the transposed convolution, from dy's padded planes
      // with the kernel flipped: one output channel of two (dy's planes
      // padded, the image's not), dilation and a non-square kernel, and
      // padding past the kernel's reach (then W^T * dy and col2im).
      {"conv2d one output channel from two, unpadded", "Conv2d", {}, {U({2, 2, 18, 18}), U({1, 2, 3, 3})}, ConvRef},
      {"conv2d unit stride, dilation 2, a 3x2 kernel", "Conv2d", {{"dilation", Ints{2, 1}}, {"padding", Ints{2, 1}}},
       {U({2, 4, 20, 20}), U({3, 4, 3, 2}), U({3})}, ConvRef},
      {"conv2d padding past the kernel's reach", "Conv2d", {{"padding", int64_t{3}}},
       {U({1, 2, 16, 16}), U({2, 2, 3, 3})}, ConvRef},
      // A bias gradient of over 4096 elements per channel: reduced in slices, then added up (CUDA).
      {"conv2d long bias gradient", "Conv2d", {}, {U({4, 2, 36, 36}), U({3, 2, 3, 3}), U({3})}, ConvRef},
      // 3x3 unit-stride convolutions of 128 channels each side run by
      // Winograd's F(2x2, 3x3) (ops/conv_winograd.h), their input and weight
      // gradients too: odd planes (cut tiles at the bottom and right), no
      // padding, padding 2 (the input gradient of an unpadded one), 4x4
      // planes, and planes with more tiles than a block holds (one image a
      // block).
      {"conv2d Winograd, padding 1, odd planes", "Conv2d", {{"padding", int64_t{1}}},
       {U({2, 128, 7, 9}), U({130, 128, 3, 3}), U({130})}, ConvRef},
      {"conv2d Winograd, unpadded", "Conv2d", {}, {U({2, 128, 6, 5}), U({136, 128, 3, 3})}, ConvRef},
      {"conv2d Winograd, padding 2 on one axis, 4x4 planes", "Conv2d", {{"padding", Ints{2, 1}}},
       {U({3, 132, 4, 4}), U({128, 132, 3, 3}), U({128})}, ConvRef},
      {"conv2d Winograd, more tiles than a block", "Conv2d", {{"padding", int64_t{1}}},
       {U({2, 128, 24, 23}), U({128, 128, 3, 3}), U({128})}, ConvRef},
      // One image's tiles over a block: bands of tile rows (the second band
      // reads from inside the plane; unpadded, its input gradient pads by 2).
      {"conv2d Winograd, bands of tile rows", "Conv2d", {{"padding", int64_t{1}}},
       {U({1, 64, 48, 47}), U({64, 64, 3, 3}), U({64})}, ConvRef},
      {"conv2d Winograd, bands of tile rows, unpadded", "Conv2d", {}, {U({1, 64, 50, 49}), U({64, 64, 3, 3})},
       ConvRef},
      // A fused array's: each replica a group, each group by Winograd.
      {"conv2d Winograd, two groups", "Conv2d", {{"padding", int64_t{1}}, {"groups", int64_t{2}}},
       {U({2, 256, 5, 6}), U({260, 128, 3, 3}), U({260})}, ConvRef},
  };
}

std::vector<OpCase> Conv1dCases() {
  return {
      {"conv1d bias", "Conv1d", {}, {U({2, 3, 7}), U({4, 3, 3}), U({4})}, ConvRef},
      {"conv1d stride 2 padding 1 dilation 2 groups 2 (int attrs)", "Conv1d",
       {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"dilation", int64_t{2}}, {"groups", int64_t{2}}},
       {U({2, 4, 9}), U({6, 2, 3})}, ConvRef},
      {"conv1d depthwise (1-element list attrs)", "Conv1d",
       {{"stride", Ints{1}}, {"padding", Ints{2}}, {"groups", int64_t{3}}}, {U({3, 3, 6}), U({3, 1, 5}), U({3})},
       ConvRef},
  };
}

std::vector<OpCase> ConvTransposeCases() {
  return {
      {"conv transpose 2d bias", "ConvTranspose2d", {}, {U({2, 3, 4, 4}), U({3, 2, 3, 3}), U({2})}, ConvTransposeRef},
      {"conv transpose 2d stride 2 padding 1 output_padding 1", "ConvTranspose2d",
       {{"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"output_padding", Ints{1, 1}}},
       {U({2, 2, 3, 4}), U({2, 3, 3, 3}), U({3})}, ConvTransposeRef},
      {"conv transpose 2d groups 2 dilation 2 non-square", "ConvTranspose2d",
       {{"groups", int64_t{2}}, {"dilation", Ints{2, 1}}, {"stride", Ints{1, 2}}, {"padding", Ints{0, 1}}},
       {U({2, 4, 3, 3}), U({4, 3, 2, 3}), U({6})}, ConvTransposeRef},
      {"conv transpose 2d depthwise stride 2", "ConvTranspose2d", {{"stride", int64_t{2}}, {"groups", int64_t{3}}},
       {U({1, 3, 3, 3}), U({3, 1, 2, 2})}, ConvTransposeRef},
      {"conv transpose 2d 1x1 on 1x1 planes, groups 2, bias", "ConvTranspose2d", {{"groups", int64_t{2}}},
       {U({3, 4, 1, 1}), U({4, 3, 1, 1}), U({6})}, ConvTransposeRef},
      {"conv transpose 2d depthwise on 2x2 planes, 5x5, bias", "ConvTranspose2d",
       {{"padding", int64_t{2}}, {"groups", int64_t{6}}}, {U({2, 6, 2, 2}), U({6, 1, 5, 5}), U({6})},
       ConvTransposeRef},
      // Its image leaves the blocked layout with the bias added, 8 + 4 positions a row.
      {"conv transpose 2d depthwise 8 channels, rows of 12, bias", "ConvTranspose2d",
       {{"padding", int64_t{1}}, {"groups", int64_t{8}}}, {U({2, 8, 6, 12}), U({8, 1, 3, 3}), U({8})},
       ConvTransposeRef},
      {"conv transpose 2d depthwise 8 channels, rows of 6, bias", "ConvTranspose2d",
       {{"padding", int64_t{1}}, {"groups", int64_t{8}}}, {U({2, 8, 3, 6}), U({8, 1, 3, 3}), U({8})},
       ConvTransposeRef},
      // ... and with stride 2, 8 column pairs at a time (rows of 34: two
      // blocks and a pair left).
      {"conv transpose 2d depthwise 8 channels, stride 2, rows of 34, bias", "ConvTranspose2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"output_padding", int64_t{1}}, {"groups", int64_t{8}}},
       {U({1, 8, 3, 17}), U({8, 1, 3, 3}), U({8})}, ConvTransposeRef},
      // output_padding >= stride is allowed when smaller than dilation: the
      // extra output row is reached by no input.
      {"conv transpose 2d output_padding below dilation", "ConvTranspose2d",
       {{"dilation", Ints{2, 2}}, {"output_padding", Ints{1, 1}}}, {U({1, 2, 3, 3}), U({2, 2, 2, 2}), U({2})},
       ConvTransposeRef},
      // The same with padding, on one axis only: the padded rows past the
      // inputs' reach are output rows again.
      {"conv transpose 2d output_padding below dilation, padded, one axis", "ConvTranspose2d",
       {{"stride", Ints{1, 2}}, {"padding", Ints{1, 1}}, {"dilation", Ints{3, 1}}, {"output_padding", Ints{2, 1}}},
       {U({2, 2, 4, 3}), U({2, 3, 3, 3}), U({3})}, ConvTransposeRef},
      // Planes too large to batch: its forward product (the adjoint) cannot
      // run as a convolution's forward, whose output misses that row.
      {"conv transpose 2d output_padding below dilation, large planes", "ConvTranspose2d",
       {{"dilation", Ints{2, 2}}, {"output_padding", Ints{1, 1}}}, {U({1, 2, 16, 16}), U({2, 2, 2, 2}), U({2})},
       ConvTransposeRef},
      {"conv transpose 1d output_padding below dilation, padded", "ConvTranspose1d",
       {{"dilation", int64_t{2}}, {"padding", int64_t{1}}, {"output_padding", int64_t{1}}},
       {U({2, 2, 5}), U({2, 2, 3}), U({2})}, ConvTransposeRef},
      {"conv transpose 2d 1x1", "ConvTranspose2d", {}, {U({2, 4, 3, 2}), U({4, 3, 1, 1}), U({3})}, ConvTransposeRef},
      {"conv transpose 2d output in several row tiles", "ConvTranspose2d", {{"stride", int64_t{2}}},
       {U({1, 4, 40, 40}), U({4, 16, 3, 3})}, ConvTransposeRef},
      {"conv transpose 1d stride 3 padding 1 output_padding 2", "ConvTranspose1d",
       {{"stride", int64_t{3}}, {"padding", int64_t{1}}, {"output_padding", int64_t{2}}},
       {U({2, 3, 4}), U({3, 2, 3}), U({2})}, ConvTransposeRef},
  };
}

TEST_CASE("conv ops pass the op harness") {
  std::vector<OpCase> cases = Conv2dCases();
  for (auto& c : Conv1dCases()) cases.push_back(c);
  for (auto& c : ConvTransposeCases()) cases.push_back(c);
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { RunOpCase(c); }
}

// bf16 / f16 (mixed precision): every case of the harness above, forward
// and backward on every device, against the f64 result of the same
// half-exact inputs. The terms' magnitudes (for the f32 accumulation bound)
// are the same products of the inputs' absolute values: every output of a
// convolution and of its backward ops is bilinear in its two operands.
TEST_CASE("conv ops in bf16 and f16 match the f64 result rounded once, forward and backward") {
  std::vector<OpCase> cases = Conv2dCases();
  for (auto& c : Conv1dCases()) cases.push_back(c);
  for (auto& c : ConvTransposeCases()) cases.push_back(c);
  for (const OpCase& c : cases) {
    std::vector<Shape> shapes;
    std::vector<TensorType> types;
    for (const InputSpec& in : c.inputs) {
      shapes.push_back(in.shape);
      types.push_back({in.shape, DType::kF64});
    }
    const OpDef* def = OpRegistry::Global().FindOp(c.op);
    AttrMap attrs = c.attrs;
    REQUIRE(CanonicalizeAttrs(*def, &attrs).ok());
    auto out = def->InferTypes(attrs, types);
    REQUIRE(out.ok());
    const Shape y_shape = (*out)[0].shape;
    // The longest sum of any output: forward C/groups * K (+ the bias),
    // backward data O/groups * K, the weight and bias gradients N * OH * OW.
    const Shape& w = shapes[1];
    int64_t k = 1 + w.numel() / w[0] * (w[0] + y_shape[1]);
    k = std::max(k, y_shape.numel() / y_shape[1]);
    for (DType low : {DType::kBF16, DType::kF16}) {
      Rng rng = Rng::Stream(c.seed, 7);
      std::vector<std::vector<double>> values, magnitudes;
      for (const Shape& sh : shapes) values.push_back(RandomHalfValues(sh.numel(), low, rng));
      const std::vector<double> g = RandomHalfValues(y_shape.numel(), low, rng);
      auto abs_of = [](std::vector<double> v) {
        for (double& x : v) x = std::abs(x);
        return v;
      };
      for (const auto& v : values) magnitudes.push_back(abs_of(v));
      const HalfOpRun exact = RunHalfOp(c.op, attrs, shapes, values, y_shape, g, DType::kF64, Device::Cpu());
      const HalfOpRun bound = RunHalfOp(c.op, attrs, shapes, magnitudes, y_shape, abs_of(g), DType::kF64, Device::Cpu());
      auto want = [&](const std::string& name) {
        const std::vector<double> v = exact.outputs.at(name).ToDoubleVector(), m = bound.outputs.at(name).ToDoubleVector();
        Exact e(static_cast<int64_t>(v.size()));
        e.value = v;
        e.magnitude = m;
        return e;
      };
      for (Device device : TestDevices()) {
        const std::string what = c.name + " in " + DTypeName(low) + " on " + device.ToString();
        HalfOpRun run = RunHalfOp(c.op, attrs, shapes, values, y_shape, g, low, device);
        CheckHalf(run.outputs.at("y"), want("y"), low, k, what + ": y");
        for (size_t i = 0; i < shapes.size(); ++i) {
          const std::string d = "d" + std::to_string(i);
          CheckHalf(run.outputs.at(d), want(d), low, k, what + ": " + d);
        }
      }
    }
  }
}

// The kernels split work differently by thread count (whole images and
// groups per worker, batch-split weight gradients with partial sums, or one
// task at a time with threaded GEMM); each split must give the same result.
TEST_CASE("conv kernels agree across thread counts") {
  std::vector<OpCase> cases = {
      {"batch 5 groups 1", "Conv2d", {{"padding", int64_t{1}}}, {U({5, 3, 6, 6}), U({4, 3, 3, 3}), U({4})}, ConvRef},
      {"batch 1 groups 4", "Conv2d", {{"stride", int64_t{2}}, {"groups", int64_t{4}}}, {U({1, 8, 7, 7}), U({4, 2, 3, 3})},
       ConvRef},
      {"transpose batch 3", "ConvTranspose2d", {{"stride", int64_t{2}}}, {U({3, 4, 3, 3}), U({4, 2, 3, 3}), U({2})},
       ConvTransposeRef},
      {"depthwise batch 3", "Conv2d", {{"padding", int64_t{1}}, {"groups", int64_t{2}}},
       {U({3, 2, 5, 5}), U({4, 1, 3, 3}), U({4})}, ConvRef},
      {"depthwise stride 2 batch 5", "Conv2d", {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"groups", int64_t{3}}},
       {U({5, 3, 6, 7}), U({3, 1, 3, 3})}, ConvRef},
      {"depthwise 19 channels batch 5", "Conv2d", {{"padding", int64_t{2}}, {"groups", int64_t{19}}},
       {U({5, 19, 4, 4}), U({19, 1, 5, 5}), U({19})}, ConvRef},
      {"pointwise small planes in 3 batches", "Conv2d", {}, {U({9, 3, 16, 15}), U({4, 3, 1, 1}), U({4})}, ConvRef},
      // Forward and adjoint split a batch further to give each thread one;
      // the weight gradient keeps it.
      {"3x3 small planes in batches", "Conv2d", {{"padding", int64_t{1}}}, {U({5, 3, 9, 9}), U({4, 3, 3, 3}), U({4})},
       ConvRef},
      {"row tiles stride 2 dilation 2", "Conv2d",
       {{"stride", int64_t{2}}, {"padding", int64_t{2}}, {"dilation", int64_t{2}}},
       {U({2, 16, 48, 48}), U({3, 16, 3, 3})}, ConvRef},
  };
  for (int threads : {1, 3, 4}) {
    ThreadPool::SetDefaultThreads(threads);
    for (const OpCase& c : cases) DYNAMIC_SECTION(c.name << " on " << threads << " threads") { RunOpCase(c); }
  }
  ThreadPool::SetDefaultThreads(0);
}

// Tolerances above cannot see the order of a sum: each product's f32 bits
// must not depend on the thread count either. A weight gradient sums over
// images and positions, and its blocks of images and tiles of rows decide
// the order: they must be functions of the geometry alone.
TEST_CASE("conv results are the same bits on any thread count") {
  const std::vector<OpCase> cases = {
      // One image: one block of the weight gradient, its GEMMs on the pool.
      {"one image, row tiles", "Conv2d", {{"padding", int64_t{1}}}, {U({1, 16, 40, 40}), U({8, 16, 3, 3}), U({8})},
       ConvRef},
      {"batch 5, row tiles", "Conv2d", {{"padding", int64_t{1}}}, {U({5, 8, 24, 24}), U({8, 8, 3, 3})}, ConvRef},
      {"small planes in batches", "Conv2d", {{"padding", int64_t{1}}}, {U({7, 3, 9, 9}), U({4, 3, 3, 3}), U({4})},
       ConvRef},
      {"pointwise", "Conv2d", {}, {U({3, 8, 20, 20}), U({6, 8, 1, 1})}, ConvRef},
      {"depthwise", "Conv2d", {{"padding", int64_t{1}}, {"groups", int64_t{8}}},
       {U({3, 8, 12, 12}), U({8, 1, 3, 3}), U({8})}, ConvRef},
      // GEMMs of images by channels, split into panels by the pool.
      {"1x1 on 1x1 planes, groups 2", "Conv2d", {{"groups", int64_t{2}}},
       {U({40, 240, 1, 1}), U({480, 120, 1, 1}), U({480})}, ConvRef},
      // Split over images (forward, adjoint) and over vectors of channels
      // (weight gradient).
      {"depthwise on 2x2 planes", "Conv2d", {{"padding", int64_t{2}}, {"groups", int64_t{150}}},
       {U({48, 150, 2, 2}), U({150, 1, 5, 5}), U({150})}, ConvRef},
      {"grouped, strided", "Conv2d", {{"stride", int64_t{2}}, {"groups", int64_t{2}}},
       {U({2, 8, 33, 33}), U({8, 4, 3, 3})}, ConvRef},
      {"transposed", "ConvTranspose2d", {{"stride", int64_t{2}}}, {U({2, 8, 15, 15}), U({8, 4, 3, 3}), U({4})},
       ConvTransposeRef},
      // Winograd's tiles, in blocks of images: 2 blocks of 4 and 1 (every
      // thread count shares each block's phases); 4 blocks of 2 (two
      // threads take whole blocks, and the weight gradient's groups).
      {"Winograd in blocks of images", "Conv2d", {{"padding", int64_t{1}}},
       {U({5, 128, 16, 16}), U({128, 128, 3, 3}), U({128})}, ConvRef},
      {"Winograd, whole blocks per thread", "Conv2d", {{"padding", int64_t{1}}},
       {U({8, 64, 32, 32}), U({64, 64, 3, 3}), U({64})}, ConvRef},
      {"Winograd, bands of tile rows per thread", "Conv2d", {{"padding", int64_t{1}}},
       {U({2, 64, 48, 48}), U({64, 64, 3, 3}), U({64})}, ConvRef},
  };
  for (const OpCase& c : cases) DYNAMIC_SECTION(c.name) { CheckSameAcrossThreads(c); }
}

TensorType F32(Shape s) { return {std::move(s), DType::kF32}; }

// The message of InferTypes' error, or "" when it succeeds.
std::string InferError(const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in) {
  auto r = InferOpTypes(*OpRegistry::Global().GetOp(op).value(), attrs, in);
  return r.ok() ? "" : r.status().message();
}

Shape InferShape(const std::string& op, const AttrMap& attrs, const std::vector<TensorType>& in) {
  auto r = InferOpTypes(*OpRegistry::Global().GetOp(op).value(), attrs, in);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return r->at(0).shape;
}

TEST_CASE("conv shape inference follows PyTorch") {
  CHECK(InferShape("Conv2d", {{"stride", int64_t{2}}, {"padding", int64_t{1}}}, {F32({2, 3, 7, 9}), F32({8, 3, 3, 3})}) ==
        Shape({2, 8, 4, 5}));
  CHECK(InferShape("Conv2d", {{"dilation", Ints{2, 3}}, {"groups", int64_t{2}}}, {F32({1, 4, 9, 9}), F32({6, 2, 3, 3})}) ==
        Shape({1, 6, 5, 3}));
  CHECK(InferShape("Conv1d", {{"stride", Ints{3}}}, {F32({2, 2, 10}), F32({5, 2, 4})}) == Shape({2, 5, 3}));
  CHECK(InferShape("ConvTranspose2d", {{"stride", int64_t{2}}, {"padding", int64_t{1}}, {"output_padding", int64_t{1}}},
                   {F32({1, 4, 5, 5}), F32({4, 3, 3, 3})}) == Shape({1, 3, 10, 10}));
  CHECK(InferShape("ConvTranspose2d", {{"groups", int64_t{2}}}, {F32({1, 4, 5, 5}), F32({4, 3, 3, 3})}) ==
        Shape({1, 6, 7, 7}));
  CHECK(InferShape("ConvBackwardBias", {}, {F32({2, 5, 3, 3})}) == Shape({5}));
}

TEST_CASE("conv shape errors name the problem") {
  using Catch::Matchers::Contains;
  // Channels per group of the weight do not match x.
  CHECK_THAT(InferError("Conv2d", {{"groups", int64_t{2}}}, {F32({1, 4, 8, 8}), F32({4, 4, 3, 3})}),
             Contains("takes 4 input channels per group") && Contains("[1, 4, 8, 8]") && Contains("2 per group"));
  CHECK_THAT(InferError("Conv2d", {{"groups", int64_t{2}}}, {F32({1, 3, 8, 8}), F32({4, 1, 3, 3})}),
             Contains("input channels 3") && Contains("not divisible by groups=2"));
  CHECK_THAT(InferError("Conv2d", {{"groups", int64_t{2}}}, {F32({1, 4, 8, 8}), F32({3, 2, 3, 3})}),
             Contains("output channels 3") && Contains("not divisible by groups=2"));
  // Kernel larger than the padded input, plain and through dilation.
  CHECK_THAT(InferError("Conv2d", {}, {F32({1, 1, 4, 4}), F32({1, 1, 5, 5})}),
             Contains("larger than the padded input [4, 4]"));
  CHECK(InferError("Conv2d", {{"padding", int64_t{1}}}, {F32({1, 1, 4, 4}), F32({1, 1, 5, 5})}).empty());
  CHECK_THAT(InferError("Conv1d", {{"dilation", int64_t{3}}}, {F32({1, 1, 6}), F32({1, 1, 3})}),
             Contains("spans [7]") && Contains("padded input [6]"));
  // Ranks, bias, dtypes and attributes.
  CHECK_THAT(InferError("Conv2d", {}, {F32({1, 4, 8}), F32({4, 4, 3, 3})}),
             Contains("input x must be [N, C, H, W]") && Contains("[1, 4, 8]"));
  CHECK_THAT(InferError("Conv2d", {}, {F32({1, 4, 8, 8}), F32({4, 4, 3, 3}), F32({3})}),
             Contains("bias must be [4]") && Contains("[3]"));
  CHECK_THAT(InferError("Conv2d", {}, {F32({1, 4, 8, 8}), {Shape({4, 4, 3, 3}), DType::kF64}}),
             Contains("weight is f64 but input x is f32"));
  CHECK_THAT(InferError("Conv2d", {{"stride", Ints{0, 1}}}, {F32({1, 1, 4, 4}), F32({1, 1, 3, 3})}),
             Contains("stride must be >= 1"));
  CHECK_THAT(InferError("Conv2d", {{"padding", Ints{1, 1, 1}}}, {F32({1, 1, 4, 4}), F32({1, 1, 3, 3})}),
             Contains("'padding' must be an int or a list of 2 ints"));
  CHECK_THAT(InferError("Conv1d", {{"stride", Ints{1, 1}}}, {F32({1, 1, 4}), F32({1, 1, 3})}),
             Contains("'stride' must be an int or a list of 1 int"));
  CHECK_THAT(InferError("Conv2d", {{"output_padding", int64_t{1}}}, {F32({1, 1, 4, 4}), F32({1, 1, 3, 3})}),
             Contains("unknown attribute 'output_padding'"));
  CHECK_THAT(InferError("Conv2d", {}, {F32({1, 1, 4, 4})}), Contains("takes (x, weight[, bias]), got 1"));
  // Transposed: weight layout [C_in, C_out/groups, ...] and output_padding.
  CHECK_THAT(InferError("ConvTranspose2d", {}, {F32({1, 4, 5, 5}), F32({3, 4, 3, 3})}),
             Contains("weight [3, 4, 3, 3] has 3 input channels") && Contains("x [1, 4, 5, 5] has 4"));
  CHECK_THAT(InferError("ConvTranspose2d", {{"stride", int64_t{2}}, {"output_padding", int64_t{2}}},
                        {F32({1, 4, 5, 5}), F32({4, 3, 3, 3})}),
             Contains("output_padding [2, 2] must be >= 0 and smaller than either stride [2, 2] or dilation [1, 1]"));
  CHECK_THAT(InferError("ConvTranspose2d", {{"padding", int64_t{3}}}, {F32({1, 4, 2, 2}), F32({4, 3, 3, 3})}),
             Contains("output would be [-2, -2]"));
  // Backward ops check dy against the forward geometry.
  CHECK_THAT(InferError("ConvBackwardInput", {{"input_shape", Ints{1, 4, 8, 8}}}, {F32({1, 4, 5, 5}), F32({4, 4, 3, 3})}),
             Contains("dy [1, 4, 5, 5] is not the forward output [1, 4, 6, 6]"));
  CHECK_THAT(InferError("ConvBackwardWeight", {}, {F32({1, 4, 8, 8}), F32({1, 4, 6, 6})}),
             Contains("missing required attribute 'weight_shape'"));
}

TEST_CASE("conv cost counts multiply-adds of the product") {
  const OpDef* conv = OpRegistry::Global().GetOp("Conv2d").value();
  AttrMap attrs{{"groups", int64_t{2}}, {"padding", int64_t{1}}};
  std::vector<TensorType> in = {F32({2, 4, 8, 8}), F32({6, 2, 3, 3}), F32({6})};
  LOOM_CHECK_OK(CanonicalizeAttrs(*conv, &attrs));
  auto out = conv->InferTypes(attrs, in).value();
  // 2 * N * O * OH * OW * (C / groups) * KH * KW, plus one add per output for the bias.
  CHECK(conv->Cost(attrs, in, out).flops == 2.0 * 2 * 6 * 8 * 8 * 2 * 3 * 3 + 2 * 6 * 8 * 8);
  const OpDef* tconv = OpRegistry::Global().GetOp("ConvTranspose2d").value();
  std::vector<TensorType> tin = {F32({1, 4, 5, 5}), F32({4, 3, 3, 3})};
  AttrMap tattrs;
  LOOM_CHECK_OK(CanonicalizeAttrs(*tconv, &tattrs));
  auto tout = tconv->InferTypes(tattrs, tin).value();
  // Every input element meets every weight of its channel: 2 * N * C * H * W * (O / groups) * KH * KW.
  CHECK(tconv->Cost(tattrs, tin, tout).flops == 2.0 * 4 * 5 * 5 * 3 * 3 * 3);
}

}  // namespace
}  // namespace loom::testing
