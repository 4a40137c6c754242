// CUDA kernels of ops/norm_ops.cc.
//
// Per-channel sums (BatchNorm's statistics and gradients, LayerNorm's dgamma
// and dbeta) view the input as [a, c, b] and sum over a and b per c: a block
// is a tile of `lanes` channels times `parts` threads per channel, threads
// walk the contiguous direction fastest (b when b > 1, else the channels),
// and the a planes are split over gridDim.y blocks when the tiles alone leave
// the GPU idle. Every split writes its partial sums; a second kernel adds them
// per channel in split order and finishes the channel. Sums live planar,
// [2, splits, c] doubles, so a split BatchNorm's [2, c] sums tensor is the
// partial sums of one split and the same finishing code runs on it (training
// BatchNorm = sums, then BatchNormApply's work). LayerNorm is one tile
// of rows per block, `parts` threads per row. No atomics: results depend only
// on the shapes and values.
#include "ops/cuda/norm_kernels.h"

#include <algorithm>

#include "ops/activation_formulas.h"
#include "ops/cuda/device_util.cuh"
#include "ops/cuda/tile_reduce.cuh"

namespace loom::cuda {
namespace {

struct Pair {
  double s0, s1;
};

__device__ inline Pair Add(Pair a, Pair b) { return {a.s0 + b.s0, a.s1 + b.s1}; }

// ------------------------------------------------------------ channel sums

// Channels c of [a, c, b], each summing its a * b elements: threads walk b
// when b > 1, else the channels; a's planes split over blocks.
TilePlan PlanChannels(int64_t a, int64_t c, int64_t b) {
  TilePlan p = b == 1 ? PlanTiles(c, a, /*contiguous=*/false) : PlanTiles(c, b, /*contiguous=*/true);
  SplitOver(p, a, a * b);
  return p;
}

// partial [2, splits, c]: partial[(j * splits + split) * c + ch] = component
// j of the sum over the split's planes i and k < b of term(term.Channel(ch),
// i, offset of (i, ch, k)).
template <typename Term>
__global__ void ChannelSumsKernel(int64_t a, int64_t c, int64_t b, Term term, TilePlan p, double* partial) {
  __shared__ Pair scratch[kThreads];
  int lane, part;
  LanePart(p, lane, part);
  const int64_t split = blockIdx.y;
  const int64_t i0 = split * p.split_len, i1 = i0 + p.split_len < a ? i0 + p.split_len : a;
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const int64_t ch = t * p.lanes + lane;
    Pair acc{0, 0};
    if (ch < c) {
      const auto channel = term.Channel(ch);
      if (b == 1) {
        for (int64_t i = i0 + part; i < i1; i += p.parts) acc = Add(acc, term(channel, i, i * c + ch));
      } else {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t plane = (i * c + ch) * b;
          for (int64_t k = part; k < b; k += p.parts) acc = Add(acc, term(channel, i, plane + k));
        }
      }
    }
    acc = TileReduce(acc, scratch, p, lane, part, [](Pair u, Pair v) { return Add(u, v); });
    if (part == 0 && ch < c) {
      partial[split * c + ch] = acc.s0;
      partial[(p.splits + split) * c + ch] = acc.s1;
    }
  }
}

// finish(ch, sums) with each channel's partial sums ([2, splits, c]) added
// in split order.
template <typename Finish>
__global__ void ChannelFinishKernel(const double* partial, int64_t splits, int64_t c, Finish finish) {
  for (int64_t ch = FirstIndex(); ch < c; ch += GridStride()) {
    Pair acc{0, 0};
    for (int64_t s = 0; s < splits; ++s) acc = Add(acc, Pair{partial[s * c + ch], partial[(splits + s) * c + ch]});
    finish(ch, acc);
  }
}

// Doubles of the partial sums of [a, c, b]'s channels.
int64_t PartialSize(int64_t a, int64_t c, int64_t b) { return 2 * PlanChannels(a, c, b).splits * c; }

// The partial sums (plan p = PlanChannels(a, c, b)) into `partial`.
template <typename Term>
cudaError_t LaunchChannelSums(int64_t a, int64_t c, int64_t b, const Term& term, const TilePlan& p, double* partial,
                              cudaStream_t stream) {
  const dim3 grid(BlocksPerItem(p.tiles), static_cast<unsigned>(p.splits));
  ChannelSumsKernel<<<grid, p.lanes * p.parts, 0, stream>>>(a, c, b, term, p, partial);
  return cudaGetLastError();
}

template <typename Finish>
cudaError_t LaunchChannelFinish(const double* partial, int64_t splits, int64_t c, const Finish& finish,
                                cudaStream_t stream) {
  ChannelFinishKernel<<<Blocks(c), kThreads, 0, stream>>>(partial, splits, c, finish);
  return cudaGetLastError();
}

// Sums, then finish: `partial` holds PartialSize(a, c, b) doubles.
template <typename Term, typename Finish>
cudaError_t RunChannelSums(int64_t a, int64_t c, int64_t b, const Term& term, const Finish& finish, double* partial,
                           cudaStream_t stream) {
  const TilePlan p = PlanChannels(a, c, b);
  const cudaError_t err = LaunchChannelSums(a, c, b, term, p, partial, stream);
  if (err != cudaSuccess) return err;
  return LaunchChannelFinish(partial, p.splits, c, finish, stream);
}

// Stores the channel's totals into sums [2, c].
struct StoreSums {
  double* sums;
  int64_t c;
  __device__ void operator()(int64_t ch, Pair total) const {
    sums[ch] = total.s0;
    sums[c + ch] = total.s1;
  }
};

// The totals alone, into sums [2, c]: one split's partial sums are the
// totals, written there directly; more are added in split order from
// `workspace` (PartialSize(a, c, b) doubles; unused with one split).
template <typename Term>
cudaError_t RunChannelTotals(int64_t a, int64_t c, int64_t b, const Term& term, double* sums, double* workspace,
                             cudaStream_t stream) {
  const TilePlan p = PlanChannels(a, c, b);
  if (p.splits == 1) return LaunchChannelSums(a, c, b, term, p, sums, stream);
  return RunChannelSums(a, c, b, term, StoreSums{sums, c}, workspace, stream);
}

// f(e, ch) for every element e of [n, c, s]; each thread takes 4 adjacent
// elements, so the channel is divided out once per 4.
template <typename F>
__global__ void ChannelMapKernel(ChannelDims d, int64_t total, F f) {
  constexpr int kRun = 4;
  for (int64_t chunk = FirstIndex(); chunk * kRun < total; chunk += GridStride()) {
    int64_t e = chunk * kRun;
    const int64_t plane = e / d.s;
    int64_t k = e - plane * d.s, ch = plane % d.c;
    for (int u = 0; u < kRun && e < total; ++u, ++e) {
      f(e, ch);
      if (++k == d.s) {
        k = 0;
        if (++ch == d.c) ch = 0;
      }
    }
  }
}

template <typename F>
cudaError_t RunChannelMap(const ChannelDims& d, F f, cudaStream_t stream) {
  const int64_t total = d.n * d.c * d.s;
  if (total == 0) return cudaSuccess;
  ChannelMapKernel<<<Blocks((total + 3) / 4), kThreads, 0, stream>>>(d, total, f);
  return cudaGetLastError();
}

// ------------------------------------------------------------------ BatchNorm

// Channel ch's pivot, at pivot[ch * stride]: x's first value of the channel
// (x, stride s) in BatchNorm, a BatchNormPivot output (stride 1) split.
template <typename T>
struct PivotOf {
  const T* pivot;
  int64_t stride;
  __device__ double operator()(int64_t ch) const { return static_cast<double>(pivot[ch * stride]); }
};

// Sums of d = x - pivot and d^2, the pivot being the channel's first value:
// as the CPU kernel, one pass in double that cancels as little as a second
// pass around the mean would.
template <typename T>
struct BatchNormStatsTerm {
  const T* x;
  PivotOf<T> pivot;
  __device__ double Channel(int64_t ch) const { return pivot(ch); }
  __device__ Pair operator()(double pivot, int64_t, int64_t at) const {
    const double d = static_cast<double>(x[at]) - pivot;
    return {d, d * d};
  }
};

// y = x * scale + shift's coefficients of one channel, from its saved
// statistics as stored (rounded to T), so that the backward rebuilds each
// pre-activation value from the same numbers (MaskedGrad).
template <typename T>
struct Affine {
  T scale, shift;
};
template <typename T>
__device__ Affine<T> BatchNormAffine(T gamma, T beta, T saved_mean, T saved_invstd) {
  const double g = static_cast<double>(gamma), is = static_cast<double>(saved_invstd);
  return {static_cast<T>(g * is), static_cast<T>(static_cast<double>(beta) - static_cast<double>(saved_mean) * g * is)};
}

// The pre-activation value: what the forward's pass computes from x.
template <typename T>
__device__ T Normalized(T x, Affine<T> f) {
  return x * f.scale + f.shift;
}

// The per-channel outputs, and y = x * scale + shift's coefficients.
template <typename T>
struct BatchNormChannel {
  const T* gamma;
  const T* beta;
  T* saved_mean;
  T* saved_invstd;
  T* scale;
  T* shift;
  __device__ void Store(int64_t ch, double mean, double invstd) const {
    const T m = static_cast<T>(mean), is = static_cast<T>(invstd);
    saved_mean[ch] = m;
    saved_invstd[ch] = is;
    const Affine<T> f = BatchNormAffine(gamma[ch], beta[ch], m, is);
    scale[ch] = f.scale;
    shift[ch] = f.shift;
  }
};

// Training statistics from the sums around the pivot over m values.
template <typename T>
struct BatchNormTrainFinish {
  BatchNormChannel<T> out;
  PivotOf<T> pivot;
  const T* running_mean;
  const T* running_var;
  T* new_mean;
  T* new_var;
  double m, momentum, eps;
  __device__ void operator()(int64_t ch, Pair sums) const {
    const double mean = pivot(ch) + sums.s0 / m;
    const double centred = sums.s1 - sums.s0 * sums.s0 / m;
    const double squares = 0.0 < centred ? centred : 0.0;
    const double invstd = 1.0 / sqrt(squares / m + eps);
    const double unbiased = squares / (m - 1);
    new_mean[ch] = static_cast<T>((1 - momentum) * static_cast<double>(running_mean[ch]) + momentum * mean);
    new_var[ch] = static_cast<T>((1 - momentum) * static_cast<double>(running_var[ch]) + momentum * unbiased);
    out.Store(ch, mean, invstd);
  }
};

template <typename T>
__global__ void BatchNormPivotKernel(int64_t c, int64_t s, bool first, const T* x, T* pivot) {
  for (int64_t ch = FirstIndex(); ch < c; ch += GridStride()) pivot[ch] = first ? x[ch * s] : T(0);
}

template <typename T>
__global__ void BatchNormEvalChannelsKernel(int64_t c, double eps, BatchNormChannel<T> out, const T* running_mean,
                                            const T* running_var, T* new_mean, T* new_var) {
  for (int64_t ch = FirstIndex(); ch < c; ch += GridStride()) {
    const T mean = running_mean[ch], var = running_var[ch];
    new_mean[ch] = mean;
    new_var[ch] = var;
    out.Store(ch, static_cast<double>(mean), 1.0 / sqrt(static_cast<double>(var) + eps));
  }
}

// The activation's value, as its own kernel makes it.
template <typename T>
__device__ T Activate(NormActivation activation, T v) {
  switch (activation) {
    case NormActivation::kRelu: return activation::Relu(v);
    case NormActivation::kRelu6: return activation::Relu6(v);
    case NormActivation::kHardswish: return activation::Hardswish(v);
    default: return v;
  }
}

template <typename T>
struct BatchNormNormalize {
  const T* x;
  const T* scale;
  const T* shift;
  T* y;
  NormActivation activation;
  __device__ void operator()(int64_t e, int64_t ch) const {
    const T v = Normalized(x[e], Affine<T>{scale[ch], shift[ch]});
    y[e] = Activate(activation, v);
  }
};

// dy as the backward ops read it, for element `at` of a channel whose
// forward coefficients were f: through the activation's backward at z, the
// pre-activation value rebuilt from x (ReLU's and ReLU6's masks are the
// same from z as from y, where their own kernels read it).
template <typename T>
struct MaskedGrad {
  const T* dy;
  const T* x;
  const T* gamma;
  const T* beta;
  const T* mean;
  const T* invstd;
  NormActivation activation;
  // The forward's coefficients of channel ch (unused without an activation).
  __device__ Affine<T> Channel(int64_t ch) const {
    if (activation == NormActivation::kNone) return {T(0), T(0)};
    return BatchNormAffine(gamma[ch], beta[ch], mean[ch], invstd[ch]);
  }
  __device__ T operator()(int64_t at, Affine<T> f) const {
    if (activation == NormActivation::kNone) return dy[at];
    const T z = Normalized(x[at], f);
    switch (activation) {
      case NormActivation::kRelu: return activation::ReluGrad(dy[at], z);
      case NormActivation::kRelu6: return activation::Relu6Grad(dy[at], z);
      default: return activation::HardswishGrad(dy[at], z);
    }
  }
};

// Sums of dy and dy * (x - mean).
template <typename T>
struct BatchNormGradTerm {
  MaskedGrad<T> dy;
  struct PerChannel {
    double mean;
    Affine<T> affine;
  };
  __device__ PerChannel Channel(int64_t ch) const { return {static_cast<double>(dy.mean[ch]), dy.Channel(ch)}; }
  __device__ Pair operator()(const PerChannel& channel, int64_t, int64_t at) const {
    const double g = static_cast<double>(dy(at, channel.affine));
    return {g, g * (static_cast<double>(dy.x[at]) - channel.mean)};
  }
};

// dgamma, dbeta and dx's per-channel coefficients: dx = k * (dy - a - (x -
// mean) * invstd * b) in training, k * dy in eval, dy taken through the
// activation at z = x * scale + shift (dy.Channel's, stored once per
// channel rather than rebuilt per element).
template <typename T>
struct BatchNormGradFinish {
  MaskedGrad<T> dy;
  T* dgamma;
  T* dbeta;
  T* k;
  T* a;
  T* b;
  T* scale;
  T* shift;
  double m;
  __device__ void operator()(int64_t ch, Pair sums) const {
    const Affine<T> f = dy.Channel(ch);
    scale[ch] = f.scale;
    shift[ch] = f.shift;
    const double is = static_cast<double>(dy.invstd[ch]), sum_dy = sums.s0, sum_dy_xhat = sums.s1 * is;
    dbeta[ch] = static_cast<T>(sum_dy);
    dgamma[ch] = static_cast<T>(sum_dy_xhat);
    k[ch] = static_cast<T>(static_cast<double>(dy.gamma[ch]) * is);
    a[ch] = static_cast<T>(sum_dy / m);
    b[ch] = static_cast<T>(sum_dy_xhat / m);
  }
};

template <typename T, bool kTraining>
struct BatchNormGradApply {
  MaskedGrad<T> dy;
  const T* k;
  const T* a;
  const T* b;
  const T* scale;
  const T* shift;
  T* dx;
  __device__ void operator()(int64_t e, int64_t ch) const {
    const T g = dy(e, Affine<T>{scale[ch], shift[ch]});
    if constexpr (kTraining) dx[e] = k[ch] * (g - a[ch] - (dy.x[e] - dy.mean[ch]) * dy.invstd[ch] * b[ch]);
    else dx[e] = k[ch] * g;
  }
};

// ------------------------------------------------------------------ LayerNorm

TilePlan PlanRows(int64_t rows, int64_t d) { return PlanTiles(rows, d, /*contiguous=*/true); }

// Where row r's gamma and beta start in [replicas, d].
__device__ inline int64_t AffineRow(const RowDims& dims, int64_t r) {
  return dims.replicas == 1 ? 0 : r / dims.block % dims.replicas * dims.d;
}

template <typename T>
__global__ void LayerNormKernel(RowDims dims, double eps, const T* x, const T* gamma, const T* beta, T* y,
                                T* saved_mean, T* saved_rstd, TilePlan p) {
  const int64_t rows = dims.rows, d = dims.d;
  __shared__ double scratch[kThreads];
  int lane, part;
  LanePart(p, lane, part);
  auto sum = [](double u, double v) { return u + v; };
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const int64_t r = t * p.lanes + lane;
    const bool valid = r < rows;
    const T* xr = x + (valid ? r : 0) * d;
    double s = 0;
    if (valid)
      for (int64_t j = part; j < d; j += p.parts) s += static_cast<double>(xr[j]);
    const double mean = TileReduce(s, scratch, p, lane, part, sum) / static_cast<double>(d);
    double q = 0;
    if (valid) {
      for (int64_t j = part; j < d; j += p.parts) {
        const double c = static_cast<double>(xr[j]) - mean;
        q += c * c;
      }
    }
    const double squares = TileReduce(q, scratch, p, lane, part, sum);
    if (!valid) continue;
    const double rstd = 1.0 / sqrt(squares / static_cast<double>(d) + eps);
    if (part == 0) {
      saved_mean[r] = static_cast<T>(mean);
      saved_rstd[r] = static_cast<T>(rstd);
    }
    const T tmean = static_cast<T>(mean), trstd = static_cast<T>(rstd);
    const int64_t affine = AffineRow(dims, r);
    T* yr = y + r * d;
    for (int64_t j = part; j < d; j += p.parts) {
      T v = (xr[j] - tmean) * trstd;
      if (gamma) v *= gamma[affine + j];
      if (beta) v += beta[affine + j];
      yr[j] = v;
    }
  }
}

// dx per row: with g = dy * gamma and xhat = (x - mean) * rstd,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
template <typename T>
__global__ void LayerNormGradKernel(RowDims dims, const T* dy, const T* x, const T* mean, const T* rstd,
                                    const T* gamma, T* dx, TilePlan p) {
  const int64_t rows = dims.rows, d = dims.d;
  __shared__ Pair scratch[kThreads];
  int lane, part;
  LanePart(p, lane, part);
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const int64_t r = t * p.lanes + lane;
    const bool valid = r < rows;
    const int64_t row = valid ? r : 0;
    const T* dyr = dy + row * d;
    const T* xr = x + row * d;
    const T mu = mean[row], rs = rstd[row];
    const T* gr = gamma ? gamma + AffineRow(dims, row) : nullptr;
    Pair acc{0, 0};
    if (valid) {
      for (int64_t j = part; j < d; j += p.parts) {
        const T g = gr ? dyr[j] * gr[j] : dyr[j];
        acc.s0 += static_cast<double>(g);
        acc.s1 += static_cast<double>(g * ((xr[j] - mu) * rs));
      }
    }
    acc = TileReduce(acc, scratch, p, lane, part, [](Pair u, Pair v) { return Add(u, v); });
    if (!valid) continue;
    const T a = static_cast<T>(acc.s0 / static_cast<double>(d));
    const T b = static_cast<T>(acc.s1 / static_cast<double>(d));
    T* dxr = dx + r * d;
    for (int64_t j = part; j < d; j += p.parts) {
      const T g = gr ? dyr[j] * gr[j] : dyr[j];
      dxr[j] = rs * (g - a - (xr[j] - mu) * rs * b);
    }
  }
}

// dgamma = sum over a replica's rows of dy * xhat, dbeta = sum of dy:
// channel sums over [rows / replicas, replicas * d, 1], where channel
// (q, j) of plane i reads the i-th of replica q's rows ([outer, replicas,
// block] rows; with one replica, row i).
template <typename T>
struct LayerNormAffineGradTerm {
  const T* dy;
  const T* x;
  const T* mean;
  const T* rstd;
  RowDims dims;
  __device__ double Channel(int64_t) const { return 0; }
  __device__ Pair operator()(double, int64_t i, int64_t at) const {
    int64_t row = i;
    if (dims.replicas > 1) {
      const int64_t ch = at - i * dims.replicas * dims.d, q = ch / dims.d;
      row = (i / dims.block * dims.replicas + q) * dims.block + i % dims.block;
      at = row * dims.d + (ch - q * dims.d);
    }
    return {static_cast<double>(dy[at] * ((x[at] - mean[row]) * rstd[row])), static_cast<double>(dy[at])};
  }
};

template <typename T>
struct LayerNormAffineGradFinish {
  T* dgamma;
  T* dbeta;
  __device__ void operator()(int64_t j, Pair sums) const {
    dgamma[j] = static_cast<T>(sums.s0);
    dbeta[j] = static_cast<T>(sums.s1);
  }
};

// ------------------------------------------- BatchNorm launchers' pieces

// The 2 (forward: scale, shift) or 5 (backward: k, a, b, scale, shift)
// per-channel coefficient arrays, T in double-sized slots.
int64_t CoefficientSize(int64_t c) { return 5 * c; }

template <typename T>
BatchNormChannel<T> BatchNormChannelOf(const BatchNormArgs& args, double* coefficients, int64_t c) {
  return {static_cast<const T*>(args.gamma),     static_cast<const T*>(args.beta),
          static_cast<T*>(args.saved_mean),      static_cast<T*>(args.saved_invstd),
          reinterpret_cast<T*>(coefficients), reinterpret_cast<T*>(coefficients + c)};
}

// y = act(x * scale + shift) with the coefficients `channel` stored.
template <typename T>
cudaError_t NormalizeBatchNorm(const ChannelDims& dims, const BatchNormArgs& args, const BatchNormChannel<T>& channel,
                               cudaStream_t stream) {
  return RunChannelMap(dims,
                       BatchNormNormalize<T>{static_cast<const T*>(args.x), channel.scale, channel.shift,
                                             static_cast<T*>(args.y), args.activation},
                       stream);
}

// Training BatchNorm once the sums around `pivot` over m values per channel
// are known, as partial sums [2, splits, c]: the statistics and running
// updates per channel, then y.
template <typename T>
cudaError_t FinishBatchNormTraining(double momentum, double eps, double m, const ChannelDims& dims,
                                    const BatchNormArgs& args, PivotOf<T> pivot, const double* partial,
                                    int64_t splits, double* coefficients, cudaStream_t stream) {
  const BatchNormChannel<T> channel = BatchNormChannelOf<T>(args, coefficients, dims.c);
  const BatchNormTrainFinish<T> finish{channel,
                                       pivot,
                                       static_cast<const T*>(args.running_mean),
                                       static_cast<const T*>(args.running_var),
                                       static_cast<T*>(args.new_running_mean),
                                       static_cast<T*>(args.new_running_var),
                                       m,
                                       momentum,
                                       eps};
  const cudaError_t err = LaunchChannelFinish(partial, splits, dims.c, finish, stream);
  if (err != cudaSuccess) return err;
  return NormalizeBatchNorm(dims, args, channel, stream);
}

template <typename T>
MaskedGrad<T> MaskedGradOf(const BatchNormBackwardArgs& args) {
  return {static_cast<const T*>(args.dy),         static_cast<const T*>(args.x),
          static_cast<const T*>(args.gamma),      static_cast<const T*>(args.beta),
          static_cast<const T*>(args.saved_mean), static_cast<const T*>(args.saved_invstd),
          args.activation};
}

// BatchNormBackward once the sums over m values per channel are known, as
// partial sums [2, splits, c]: dgamma, dbeta and dx's coefficients per
// channel, then dx.
template <typename T>
cudaError_t FinishBatchNormBackward(bool training, double m, const ChannelDims& dims,
                                    const BatchNormBackwardArgs& args, const double* partial, int64_t splits,
                                    double* coefficients, cudaStream_t stream) {
  const int64_t c = dims.c;
  T* k = reinterpret_cast<T*>(coefficients);
  T* a = reinterpret_cast<T*>(coefficients + c);
  T* b = reinterpret_cast<T*>(coefficients + 2 * c);
  T* scale = reinterpret_cast<T*>(coefficients + 3 * c);
  T* shift = reinterpret_cast<T*>(coefficients + 4 * c);
  const MaskedGrad<T> dy = MaskedGradOf<T>(args);
  T* dx = static_cast<T*>(args.dx);
  const BatchNormGradFinish<T> finish{dy, static_cast<T*>(args.dgamma), static_cast<T*>(args.dbeta), k, a, b, scale,
                                      shift, m};
  const cudaError_t err = LaunchChannelFinish(partial, splits, c, finish, stream);
  if (err != cudaSuccess) return err;
  if (training) return RunChannelMap(dims, BatchNormGradApply<T, true>{dy, k, a, b, scale, shift, dx}, stream);
  return RunChannelMap(dims, BatchNormGradApply<T, false>{dy, k, a, b, scale, shift, dx}, stream);
}

}  // namespace

// Partial sums ([2, splits, c] doubles), then the coefficients.
int64_t BatchNormWorkspaceSize(const ChannelDims& dims) {
  return PartialSize(dims.n, dims.c, dims.s) + CoefficientSize(dims.c);
}

int64_t BatchNormStatsWorkspaceSize(const ChannelDims& dims) {
  return PlanChannels(dims.n, dims.c, dims.s).splits > 1 ? PartialSize(dims.n, dims.c, dims.s) : 0;
}

int64_t BatchNormApplyWorkspaceSize(const ChannelDims& dims) { return CoefficientSize(dims.c); }

// Training: the sums around each channel's first value, then
// FinishBatchNormTraining (BatchNormApply's work on them).
template <typename T>
cudaError_t LaunchBatchNorm(bool training, double momentum, double eps, const ChannelDims& dims,
                            const BatchNormArgs& args, double* workspace, cudaStream_t stream) {
  const int64_t c = dims.c;
  if (c == 0) return cudaSuccess;
  const int64_t partial_size = PartialSize(dims.n, c, dims.s);
  double* coefficients = workspace + partial_size;
  if (training) {
    const T* x = static_cast<const T*>(args.x);
    const PivotOf<T> pivot{x, dims.s};
    const TilePlan plan = PlanChannels(dims.n, c, dims.s);
    const cudaError_t err = LaunchChannelSums(dims.n, c, dims.s, BatchNormStatsTerm<T>{x, pivot}, plan, workspace,
                                              stream);
    if (err != cudaSuccess) return err;
    return FinishBatchNormTraining<T>(momentum, eps, static_cast<double>(dims.n * dims.s), dims, args, pivot,
                                      workspace, plan.splits, coefficients, stream);
  }
  const BatchNormChannel<T> channel = BatchNormChannelOf<T>(args, coefficients, c);
  BatchNormEvalChannelsKernel<<<Blocks(c), kThreads, 0, stream>>>(
      c, eps, channel, static_cast<const T*>(args.running_mean), static_cast<const T*>(args.running_var),
      static_cast<T*>(args.new_running_mean), static_cast<T*>(args.new_running_var));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return NormalizeBatchNorm(dims, args, channel, stream);
}

template <typename T>
cudaError_t LaunchBatchNormPivot(bool first, const ChannelDims& dims, const void* x, void* pivot,
                                 cudaStream_t stream) {
  if (dims.c == 0) return cudaSuccess;
  BatchNormPivotKernel<<<Blocks(dims.c), kThreads, 0, stream>>>(dims.c, dims.s, first && dims.n > 0 && dims.s > 0,
                                                                static_cast<const T*>(x), static_cast<T*>(pivot));
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchBatchNormStats(const ChannelDims& dims, const void* x, const void* pivot, double* sums,
                                 double* workspace, cudaStream_t stream) {
  if (dims.c == 0) return cudaSuccess;
  const BatchNormStatsTerm<T> term{static_cast<const T*>(x), PivotOf<T>{static_cast<const T*>(pivot), 1}};
  return RunChannelTotals(dims.n, dims.c, dims.s, term, sums, workspace, stream);
}

// The sums are the partial sums of one split.
template <typename T>
cudaError_t LaunchBatchNormApply(double momentum, double eps, int64_t count, const ChannelDims& dims,
                                 const BatchNormArgs& args, const void* pivot, const double* sums, double* workspace,
                                 cudaStream_t stream) {
  if (dims.c == 0) return cudaSuccess;
  return FinishBatchNormTraining<T>(momentum, eps, static_cast<double>(count), dims, args,
                                    PivotOf<T>{static_cast<const T*>(pivot), 1}, sums, /*splits=*/1, workspace,
                                    stream);
}

// The sums of dy and dy * (x - mean), then FinishBatchNormBackward
// (BatchNormBackwardApply's work on them in training).
template <typename T>
cudaError_t LaunchBatchNormBackward(bool training, const ChannelDims& dims, const BatchNormBackwardArgs& args,
                                    double* workspace, cudaStream_t stream) {
  const int64_t c = dims.c;
  if (c == 0) return cudaSuccess;
  const TilePlan plan = PlanChannels(dims.n, c, dims.s);
  const cudaError_t err =
      LaunchChannelSums(dims.n, c, dims.s, BatchNormGradTerm<T>{MaskedGradOf<T>(args)}, plan, workspace, stream);
  if (err != cudaSuccess) return err;
  return FinishBatchNormBackward<T>(training, static_cast<double>(dims.n * dims.s), dims, args, workspace,
                                    plan.splits, workspace + PartialSize(dims.n, c, dims.s), stream);
}

template <typename T>
cudaError_t LaunchBatchNormBackwardStats(const ChannelDims& dims, const BatchNormBackwardArgs& args, double* sums,
                                         double* workspace, cudaStream_t stream) {
  if (dims.c == 0) return cudaSuccess;
  return RunChannelTotals(dims.n, dims.c, dims.s, BatchNormGradTerm<T>{MaskedGradOf<T>(args)}, sums, workspace,
                          stream);
}

template <typename T>
cudaError_t LaunchBatchNormBackwardApply(int64_t count, const ChannelDims& dims, const BatchNormBackwardArgs& args,
                                         const double* sums, double* workspace, cudaStream_t stream) {
  if (dims.c == 0) return cudaSuccess;
  return FinishBatchNormBackward<T>(/*training=*/true, static_cast<double>(count), dims, args, sums, /*splits=*/1,
                                    workspace, stream);
}

template <typename T>
cudaError_t LaunchLayerNorm(const RowDims& dims, double eps, const T* x, const T* gamma, const T* beta, T* y,
                            T* saved_mean, T* saved_rstd, cudaStream_t stream) {
  if (dims.rows == 0) return cudaSuccess;  // (d == 0: NaN statistics, as the CPU's 0 / 0)
  const TilePlan p = PlanRows(dims.rows, dims.d);
  LayerNormKernel<<<BlocksPerItem(p.tiles), p.lanes * p.parts, 0, stream>>>(dims, eps, x, gamma, beta, y, saved_mean,
                                                                              saved_rstd, p);
  return cudaGetLastError();
}

// The affine gradients' channel sums: planes of each replica's rows.
int64_t AffinePlanes(const RowDims& dims) { return dims.replicas == 0 ? 0 : dims.rows / dims.replicas; }

int64_t LayerNormBackwardWorkspaceSize(const RowDims& dims) {
  return PartialSize(AffinePlanes(dims), dims.replicas * dims.d, 1);
}

template <typename T>
cudaError_t LaunchLayerNormBackward(const RowDims& dims, const T* dy, const T* x, const T* mean, const T* rstd,
                                    const T* gamma, T* dx, T* dgamma, T* dbeta, double* workspace,
                                    cudaStream_t stream) {
  if (dims.d == 0) return cudaSuccess;
  if (dims.rows > 0) {
    const TilePlan p = PlanRows(dims.rows, dims.d);
    LayerNormGradKernel<<<BlocksPerItem(p.tiles), p.lanes * p.parts, 0, stream>>>(dims, dy, x, mean, rstd, gamma, dx,
                                                                                    p);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (!gamma || dims.replicas == 0) return cudaSuccess;
  const LayerNormAffineGradTerm<T> term{dy, x, mean, rstd, dims};
  return RunChannelSums(AffinePlanes(dims), dims.replicas * dims.d, 1, term,
                        LayerNormAffineGradFinish<T>{dgamma, dbeta}, workspace, stream);
}

#define LOOM_INSTANTIATE_NORM_KERNELS(T)                                                                           \
  template cudaError_t LaunchBatchNorm<T>(bool, double, double, const ChannelDims&, const BatchNormArgs&, double*, \
                                          cudaStream_t);                                                           \
  template cudaError_t LaunchBatchNormBackward<T>(bool, const ChannelDims&, const BatchNormBackwardArgs&, double*, \
                                                  cudaStream_t);                                                   \
  template cudaError_t LaunchBatchNormPivot<T>(bool, const ChannelDims&, const void*, void*, cudaStream_t);        \
  template cudaError_t LaunchBatchNormStats<T>(const ChannelDims&, const void*, const void*, double*, double*,     \
                                               cudaStream_t);                                                      \
  template cudaError_t LaunchBatchNormApply<T>(double, double, int64_t, const ChannelDims&, const BatchNormArgs&,  \
                                               const void*, const double*, double*, cudaStream_t);                 \
  template cudaError_t LaunchBatchNormBackwardStats<T>(const ChannelDims&, const BatchNormBackwardArgs&, double*,  \
                                                       double*, cudaStream_t);                                     \
  template cudaError_t LaunchBatchNormBackwardApply<T>(int64_t, const ChannelDims&, const BatchNormBackwardArgs&,  \
                                                       const double*, double*, cudaStream_t);                      \
  template cudaError_t LaunchLayerNorm<T>(const RowDims&, double, const T*, const T*, const T*, T*, T*, T*,        \
                                          cudaStream_t);                                                           \
  template cudaError_t LaunchLayerNormBackward<T>(const RowDims&, const T*, const T*, const T*, const T*, const T*, \
                                                  T*, T*, T*, double*, cudaStream_t);

LOOM_INSTANTIATE_NORM_KERNELS(float)
LOOM_INSTANTIATE_NORM_KERNELS(double)

}  // namespace loom::cuda
