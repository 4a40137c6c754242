#include "tests/reference_ops.h"

#include <algorithm>

namespace loom::testing {

int64_t BroadcastOffset(const Shape& in, const Shape& out, int64_t flat) {
  int64_t offset = 0, stride = 1;
  for (int d = out.rank() - 1, di = in.rank() - 1; d >= 0; --d, --di) {
    int64_t coord = flat % out[d];
    flat /= out[d];
    if (di >= 0) {
      if (in[di] != 1) offset += coord * stride;
      stride *= in[di];
    }
  }
  return offset;
}

// op(A) op(B) over any number of leading batch dims.
std::vector<Tensor> MatMulRef(const std::vector<Tensor>& in, const AttrMap& attrs, const std::vector<Tensor>&) {
  const bool ta = attrs.Bool("transpose_a"), tb = attrs.Bool("transpose_b");
  const Shape& sa = in[0].shape();
  const Shape& sb = in[1].shape();
  const int r = std::max(sa.rank(), sb.rank());  // a 2-D operand of a BatchMatMul is every batch entry's
  const int64_t ra = sa.dim(-2), ca = sa.dim(-1), rb = sb.dim(-2), cb = sb.dim(-1);
  const int64_t m = ta ? ca : ra, k = ta ? ra : ca, n = tb ? rb : cb;
  const int64_t stride_a = sa.rank() == r ? ra * ca : 0, stride_b = sb.rank() == r ? rb * cb : 0;
  std::vector<int64_t> out = (sa.rank() == r ? sa : sb).dims();
  out[r - 2] = m;
  out[r - 1] = n;
  Tensor y = ZerosF64(Shape(out));
  const int64_t batch = y.numel() / std::max<int64_t>(1, m * n);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          double a = ta ? At(in[0], b * stride_a + p * ca + i) : At(in[0], b * stride_a + i * ca + p);
          double bv = tb ? At(in[1], b * stride_b + j * cb + p) : At(in[1], b * stride_b + p * cb + j);
          s += a * bv;
        }
        At(y, b * m * n + i * n + j) = s;
      }
  return {y};
}

std::vector<Tensor> LinearRef(const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
  const Shape& x = in[0].shape();
  const Shape& w = in[1].shape();
  // Batched: w [B, out, in], bias [B, out], x [B, rows, in] or a shared [rows, in].
  const int64_t batch = w.rank() == 3 ? w[0] : 1;
  const bool shared_x = w.rank() == 3 && x.rank() == 2;
  std::vector<int64_t> out = x.dims();
  out.back() = w.dim(-2);
  if (shared_x) out.insert(out.begin(), batch);
  const int64_t in_f = x.dim(-1), out_f = w.dim(-2), rows = Shape(out).numel() / std::max<int64_t>(1, out_f) / batch;
  Tensor y = ZerosF64(Shape(out));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = b * rows; r < (b + 1) * rows; ++r)
      for (int64_t o = 0; o < out_f; ++o) {
        double s = in.size() == 3 ? At(in[2], b * out_f + o) : 0.0;
        const int64_t xr = shared_x ? r - b * rows : r;
        for (int64_t i = 0; i < in_f; ++i) s += At(in[0], xr * in_f + i) * At(in[1], (b * out_f + o) * in_f + i);
        At(y, r * out_f + o) = s;
      }
  return {y};
}

ReferenceFn BinaryRef(double (*f)(double, double)) {
  return [f](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
    Shape out = BroadcastShapes(in[0].shape(), in[1].shape()).value();
    Tensor y = ZerosF64(out);
    for (int64_t i = 0; i < out.numel(); ++i)
      At(y, i) = f(At(in[0], BroadcastOffset(in[0].shape(), out, i)), At(in[1], BroadcastOffset(in[1].shape(), out, i)));
    return std::vector<Tensor>{y};
  };
}

ReferenceFn UnaryRef(std::function<double(double)> f) {
  return [f](const std::vector<Tensor>& in, const AttrMap&, const std::vector<Tensor>&) {
    Tensor y = ZerosF64(in[0].shape());
    for (int64_t i = 0; i < y.numel(); ++i) At(y, i) = f(At(in[0], i));
    return std::vector<Tensor>{y};
  };
}

}  // namespace loom::testing
