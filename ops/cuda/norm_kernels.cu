// CUDA kernels of ops/norm_ops.cc.
//
// Per-channel sums (BatchNorm's statistics and gradients, LayerNorm's dgamma
// and dbeta) view the input as [a, c, b] and sum over a and b per c: a block
// is a tile of `lanes` channels times `parts` threads per channel, threads
// walk the contiguous direction fastest (b when b > 1, else the channels),
// and the a planes are split over gridDim.y blocks when the tiles alone leave
// the GPU idle. Every split writes its partial sums; a second kernel adds them
// per channel in split order and finishes the channel. LayerNorm is one tile
// of rows per block, `parts` threads per row. No atomics: results depend only
// on the shapes and values.
#include "ops/cuda/norm_kernels.h"

#include <algorithm>

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

// partial[split * c + ch] = sum over the split's planes i and k < b of
// term(term.Channel(ch), i, offset of (i, ch, k)).
template <typename Term>
__global__ void ChannelSumsKernel(int64_t a, int64_t c, int64_t b, Term term, TilePlan p, Pair* partial) {
  __shared__ Pair scratch[kThreads];
  int lane, part;
  LanePart(p, lane, part);
  const int64_t split = blockIdx.y;
  const int64_t i0 = split * p.split_len, i1 = i0 + p.split_len < a ? i0 + p.split_len : a;
  for (int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const int64_t ch = t * p.lanes + lane;
    Pair acc{0, 0};
    if (ch < c) {
      const double channel = term.Channel(ch);
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
    if (part == 0 && ch < c) partial[split * c + ch] = acc;
  }
}

// finish(ch, sums) with each channel's partial sums added in split order.
template <typename Finish>
__global__ void ChannelFinishKernel(const Pair* partial, int64_t splits, int64_t c, Finish finish) {
  for (int64_t ch = FirstIndex(); ch < c; ch += GridStride()) {
    Pair acc{0, 0};
    for (int64_t s = 0; s < splits; ++s) acc = Add(acc, partial[s * c + ch]);
    finish(ch, acc);
  }
}

template <typename Term, typename Finish>
cudaError_t RunChannelSums(int64_t a, int64_t c, int64_t b, const Term& term, const Finish& finish, Pair* partial,
                           cudaStream_t stream) {
  const TilePlan p = PlanChannels(a, c, b);
  const dim3 grid(BlocksPerItem(p.tiles), static_cast<unsigned>(p.splits));
  ChannelSumsKernel<<<grid, p.lanes * p.parts, 0, stream>>>(a, c, b, term, p, partial);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  ChannelFinishKernel<<<Blocks(c), kThreads, 0, stream>>>(partial, p.splits, c, finish);
  return cudaGetLastError();
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

// Sums of d = x - pivot and d^2, the pivot being the channel's first value:
// as the CPU kernel, one pass in double that cancels as little as a second
// pass around the mean would.
template <typename T>
struct BatchNormStatsTerm {
  const T* x;
  int64_t s;
  __device__ double Channel(int64_t ch) const { return static_cast<double>(x[ch * s]); }
  __device__ Pair operator()(double pivot, int64_t, int64_t at) const {
    const double d = static_cast<double>(x[at]) - pivot;
    return {d, d * d};
  }
};

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
    const double g = static_cast<double>(gamma[ch]);
    saved_mean[ch] = static_cast<T>(mean);
    saved_invstd[ch] = static_cast<T>(invstd);
    scale[ch] = static_cast<T>(g * invstd);
    shift[ch] = static_cast<T>(static_cast<double>(beta[ch]) - mean * g * invstd);
  }
};

template <typename T>
struct BatchNormTrainFinish {
  BatchNormChannel<T> out;
  const T* x;
  const T* running_mean;
  const T* running_var;
  T* new_mean;
  T* new_var;
  int64_t s;
  double m, momentum, eps;
  __device__ void operator()(int64_t ch, Pair sums) const {
    const double mean = static_cast<double>(x[ch * s]) + sums.s0 / m;
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
__global__ void BatchNormEvalChannelsKernel(int64_t c, double eps, BatchNormChannel<T> out, const T* running_mean,
                                            const T* running_var, T* new_mean, T* new_var) {
  for (int64_t ch = FirstIndex(); ch < c; ch += GridStride()) {
    const T mean = running_mean[ch], var = running_var[ch];
    new_mean[ch] = mean;
    new_var[ch] = var;
    out.Store(ch, static_cast<double>(mean), 1.0 / sqrt(static_cast<double>(var) + eps));
  }
}

template <typename T>
struct BatchNormApply {
  const T* x;
  const T* scale;
  const T* shift;
  T* y;
  __device__ void operator()(int64_t e, int64_t ch) const { y[e] = x[e] * scale[ch] + shift[ch]; }
};

// Sums of dy and dy * (x - mean).
template <typename T>
struct BatchNormGradTerm {
  const T* dy;
  const T* x;
  const T* mean;
  __device__ double Channel(int64_t ch) const { return static_cast<double>(mean[ch]); }
  __device__ Pair operator()(double mu, int64_t, int64_t at) const {
    const double g = static_cast<double>(dy[at]);
    return {g, g * (static_cast<double>(x[at]) - mu)};
  }
};

// dgamma, dbeta and dx's per-channel coefficients: dx = k * (dy - a - (x -
// mean) * invstd * b) in training, k * dy in eval.
template <typename T>
struct BatchNormGradFinish {
  const T* gamma;
  const T* invstd;
  T* dgamma;
  T* dbeta;
  T* k;
  T* a;
  T* b;
  double m;
  __device__ void operator()(int64_t ch, Pair sums) const {
    const double is = static_cast<double>(invstd[ch]), sum_dy = sums.s0, sum_dy_xhat = sums.s1 * is;
    dbeta[ch] = static_cast<T>(sum_dy);
    dgamma[ch] = static_cast<T>(sum_dy_xhat);
    k[ch] = static_cast<T>(static_cast<double>(gamma[ch]) * is);
    a[ch] = static_cast<T>(sum_dy / m);
    b[ch] = static_cast<T>(sum_dy_xhat / m);
  }
};

template <typename T, bool kTraining>
struct BatchNormGradApply {
  const T* dy;
  const T* x;
  const T* mean;
  const T* invstd;
  const T* k;
  const T* a;
  const T* b;
  T* dx;
  __device__ void operator()(int64_t e, int64_t ch) const {
    if constexpr (kTraining) dx[e] = k[ch] * (dy[e] - a[ch] - (x[e] - mean[ch]) * invstd[ch] * b[ch]);
    else dx[e] = k[ch] * dy[e];
  }
};

// ------------------------------------------------------------------ LayerNorm

TilePlan PlanRows(int64_t rows, int64_t d) { return PlanTiles(rows, d, /*contiguous=*/true); }

template <typename T>
__global__ void LayerNormKernel(int64_t rows, int64_t d, double eps, const T* x, const T* gamma, const T* beta, T* y,
                                T* saved_mean, T* saved_rstd, TilePlan p) {
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
    T* yr = y + r * d;
    for (int64_t j = part; j < d; j += p.parts) {
      T v = (xr[j] - tmean) * trstd;
      if (gamma) v *= gamma[j];
      if (beta) v += beta[j];
      yr[j] = v;
    }
  }
}

// dx per row: with g = dy * gamma and xhat = (x - mean) * rstd,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
template <typename T>
__global__ void LayerNormGradKernel(int64_t rows, int64_t d, const T* dy, const T* x, const T* mean, const T* rstd,
                                    const T* gamma, T* dx, TilePlan p) {
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
    Pair acc{0, 0};
    if (valid) {
      for (int64_t j = part; j < d; j += p.parts) {
        const T g = gamma ? dyr[j] * gamma[j] : dyr[j];
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
      const T g = gamma ? dyr[j] * gamma[j] : dyr[j];
      dxr[j] = rs * (g - a - (xr[j] - mu) * rs * b);
    }
  }
}

// dgamma = sum over rows of dy * xhat, dbeta = sum of dy: channel sums over
// [rows, d, 1].
template <typename T>
struct LayerNormAffineGradTerm {
  const T* dy;
  const T* x;
  const T* mean;
  const T* rstd;
  __device__ double Channel(int64_t) const { return 0; }
  __device__ Pair operator()(double, int64_t row, int64_t at) const {
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

}  // namespace

// Partial sums (2 doubles per channel and split), then 3 per-channel
// coefficient arrays (T in double-sized slots).
int64_t BatchNormWorkspaceSize(const ChannelDims& dims) {
  return 2 * PlanChannels(dims.n, dims.c, dims.s).splits * dims.c + 3 * dims.c;
}

template <typename T>
cudaError_t LaunchBatchNorm(bool training, double momentum, double eps, const ChannelDims& dims,
                            const BatchNormArgs& args, double* workspace, cudaStream_t stream) {
  const int64_t c = dims.c;
  if (c == 0) return cudaSuccess;
  const TilePlan plan = PlanChannels(dims.n, c, dims.s);
  Pair* partial = reinterpret_cast<Pair*>(workspace);
  T* scale = reinterpret_cast<T*>(workspace + 2 * plan.splits * c);
  T* shift = reinterpret_cast<T*>(workspace + 2 * plan.splits * c + c);
  const T* x = static_cast<const T*>(args.x);
  const T* running_mean = static_cast<const T*>(args.running_mean);
  const T* running_var = static_cast<const T*>(args.running_var);
  T* new_mean = static_cast<T*>(args.new_running_mean);
  T* new_var = static_cast<T*>(args.new_running_var);
  const BatchNormChannel<T> out{static_cast<const T*>(args.gamma), static_cast<const T*>(args.beta),
                                static_cast<T*>(args.saved_mean),  static_cast<T*>(args.saved_invstd),
                                scale,                             shift};
  cudaError_t err;
  if (training) {
    const double m = static_cast<double>(dims.n * dims.s);
    err = RunChannelSums(dims.n, c, dims.s, BatchNormStatsTerm<T>{x, dims.s},
                         BatchNormTrainFinish<T>{out, x, running_mean, running_var, new_mean, new_var, dims.s, m,
                                                 momentum, eps},
                         partial, stream);
  } else {
    BatchNormEvalChannelsKernel<<<Blocks(c), kThreads, 0, stream>>>(c, eps, out, running_mean, running_var, new_mean,
                                                                    new_var);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess) return err;
  return RunChannelMap(dims, BatchNormApply<T>{x, scale, shift, static_cast<T*>(args.y)}, stream);
}

template <typename T>
cudaError_t LaunchBatchNormBackward(bool training, const ChannelDims& dims, const BatchNormBackwardArgs& args,
                                    double* workspace, cudaStream_t stream) {
  const int64_t c = dims.c;
  if (c == 0) return cudaSuccess;
  const TilePlan plan = PlanChannels(dims.n, c, dims.s);
  Pair* partial = reinterpret_cast<Pair*>(workspace);
  T* k = reinterpret_cast<T*>(workspace + 2 * plan.splits * c);
  T* a = reinterpret_cast<T*>(workspace + 2 * plan.splits * c + c);
  T* b = reinterpret_cast<T*>(workspace + 2 * plan.splits * c + 2 * c);
  const T* dy = static_cast<const T*>(args.dy);
  const T* x = static_cast<const T*>(args.x);
  const T* mean = static_cast<const T*>(args.saved_mean);
  const T* invstd = static_cast<const T*>(args.saved_invstd);
  T* dx = static_cast<T*>(args.dx);
  const double m = static_cast<double>(dims.n * dims.s);
  cudaError_t err = RunChannelSums(dims.n, c, dims.s, BatchNormGradTerm<T>{dy, x, mean},
                                   BatchNormGradFinish<T>{static_cast<const T*>(args.gamma), invstd,
                                                          static_cast<T*>(args.dgamma), static_cast<T*>(args.dbeta), k,
                                                          a, b, m},
                                   partial, stream);
  if (err != cudaSuccess) return err;
  if (training) return RunChannelMap(dims, BatchNormGradApply<T, true>{dy, x, mean, invstd, k, a, b, dx}, stream);
  return RunChannelMap(dims, BatchNormGradApply<T, false>{dy, x, mean, invstd, k, a, b, dx}, stream);
}

template <typename T>
cudaError_t LaunchLayerNorm(int64_t rows, int64_t d, double eps, const T* x, const T* gamma, const T* beta, T* y,
                            T* saved_mean, T* saved_rstd, cudaStream_t stream) {
  if (rows == 0 || d == 0) return cudaSuccess;
  const TilePlan p = PlanRows(rows, d);
  LayerNormKernel<<<BlocksPerItem(p.tiles), p.lanes * p.parts, 0, stream>>>(rows, d, eps, x, gamma, beta, y,
                                                                              saved_mean, saved_rstd, p);
  return cudaGetLastError();
}

int64_t LayerNormBackwardWorkspaceSize(int64_t rows, int64_t d) { return 2 * PlanChannels(rows, d, 1).splits * d; }

template <typename T>
cudaError_t LaunchLayerNormBackward(int64_t rows, int64_t d, const T* dy, const T* x, const T* mean, const T* rstd,
                                    const T* gamma, T* dx, T* dgamma, T* dbeta, double* workspace,
                                    cudaStream_t stream) {
  if (d == 0) return cudaSuccess;
  if (rows > 0) {
    const TilePlan p = PlanRows(rows, d);
    LayerNormGradKernel<<<BlocksPerItem(p.tiles), p.lanes * p.parts, 0, stream>>>(rows, d, dy, x, mean, rstd, gamma,
                                                                                    dx, p);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (!gamma) return cudaSuccess;
  return RunChannelSums(rows, d, 1, LayerNormAffineGradTerm<T>{dy, x, mean, rstd},
                        LayerNormAffineGradFinish<T>{dgamma, dbeta}, reinterpret_cast<Pair*>(workspace), stream);
}

#define LOOM_INSTANTIATE_NORM_KERNELS(T)                                                                           \
  template cudaError_t LaunchBatchNorm<T>(bool, double, double, const ChannelDims&, const BatchNormArgs&, double*, \
                                          cudaStream_t);                                                           \
  template cudaError_t LaunchBatchNormBackward<T>(bool, const ChannelDims&, const BatchNormBackwardArgs&, double*, \
                                                  cudaStream_t);                                                   \
  template cudaError_t LaunchLayerNorm<T>(int64_t, int64_t, double, const T*, const T*, const T*, T*, T*, T*,      \
                                          cudaStream_t);                                                           \
  template cudaError_t LaunchLayerNormBackward<T>(int64_t, int64_t, const T*, const T*, const T*, const T*,        \
                                                  const T*, T*, T*, T*, double*, cudaStream_t);

LOOM_INSTANTIATE_NORM_KERNELS(float)
LOOM_INSTANTIATE_NORM_KERNELS(double)

}  // namespace loom::cuda
