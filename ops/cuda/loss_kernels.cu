// CUDA kernels of ops/loss_ops.cc. The formulas are the CPU's, in the same
// precision: per-element terms in T, sums of exp and of the per-sample
// losses in double. Forward losses: per-sample terms, then per-block partial
// sums over a fixed grid, then one block adding the partials in order, so
// the bits never depend on timing. Counting targets uses integer atomics
// (exact, so order-free). Rows of class scores are reduced by a group of
// threads (8, a warp or the whole block, by C) with fixed shuffle/shared trees.
#include "ops/cuda/loss_kernels.h"

#include <algorithm>
#include <limits>

#include "ops/cuda/device_util.cuh"

namespace loom::cuda {
namespace {

constexpr int64_t kMaxPartials = 1024;

int64_t PartialBlocks(int64_t n) { return std::min<int64_t>(Blocks(n), kMaxPartials); }

template <typename T>
__device__ inline T QuietNaN() {
  return std::numeric_limits<T>::quiet_NaN();
}

// The larger of a and b; NaN wins (as BlockMax).
template <typename V>
__device__ inline V MaxOf(V a, V b) {
  return (b > a || b != b) ? b : a;
}

// Lanes of this thread's group when groups are narrower than a warp.
template <int kGroup>
__device__ inline unsigned GroupMask() {
  if constexpr (kGroup >= 32) {
    return 0xffffffffu;
  } else {
    return ((1u << kGroup) - 1) << ((threadIdx.x % 32) / kGroup * kGroup);
  }
}

// Sum / max over the kGroup threads of a group (kGroup <= 32: shuffles;
// kGroup == kThreads: the block's shared tree in `scratch`), returned to all.
template <int kGroup, typename V>
__device__ inline V GroupSum(V v, V* scratch) {
  static_assert(kGroup <= 32 || kGroup == kThreads, "a group is at most a warp, or the whole block");
  if constexpr (kGroup > 32) {
    return BlockSum(v, scratch);
  } else {
    (void)scratch;
    const unsigned mask = GroupMask<kGroup>();
    for (int offset = kGroup / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset, kGroup);
    return v;
  }
}

template <int kGroup, typename V>
__device__ inline V GroupMax(V v, V* scratch) {
  if constexpr (kGroup > 32) {
    return BlockMax(v, scratch);
  } else {
    (void)scratch;
    const unsigned mask = GroupMask<kGroup>();
    for (int offset = kGroup / 2; offset > 0; offset >>= 1) v = MaxOf(v, __shfl_xor_sync(mask, v, offset, kGroup));
    return v;
  }
}

__device__ inline int64_t ScoreOffset(const ClassShape& s, int64_t sample) {
  return (sample / s.inner) * s.classes * s.inner + sample % s.inner;
}

__device__ inline bool Counted(int64_t y, int64_t ignore, int64_t classes) {
  return y != ignore && y >= 0 && y < classes;
}

// The CPU's per-sample cross entropy from log(sum exp(x - max)), the
// target's shifted score and the sum of all shifted scores.
__device__ inline double SmoothedLoss(double log_sum, double target_shifted, double shifted, double eps,
                                      int64_t classes) {
  double loss = (1.0 - eps) * (log_sum - target_shifted);
  if (eps > 0) loss += eps / static_cast<double>(classes) * (static_cast<double>(classes) * log_sum - shifted);
  return loss;
}

// d loss / d (per-sample term): dy over the mean's count, as T.
template <typename T>
__device__ inline T LossScale(const T* dy, bool mean, double count) {
  const double g = static_cast<double>(dy[0]);
  return static_cast<T>(mean ? g / count : g);
}

// ---------------------------------------------------------- class losses

// One group of kGroup threads per contiguous row of C logits ([N, C]).
template <int kGroup, typename T, typename I>
__global__ void CrossEntropyRowsKernel(const T* x, const I* targets, int64_t rows, int64_t classes, int64_t ignore,
                                       double eps, double* sample_loss) {
  __shared__ T scratch_t[kGroup > 32 ? kThreads : 1];
  __shared__ double scratch_d[kGroup > 32 ? kThreads : 1];
  constexpr int kGroups = kThreads / kGroup;
  const int lane = threadIdx.x % kGroup;
  // Uniform over a group (and over the block when the group is the block).
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + threadIdx.x / kGroup; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t y = targets[row];
    if (!Counted(y, ignore, classes)) {
      if (lane == 0) sample_loss[row] = 0;
      continue;
    }
    const T* r = x + row * classes;
    T m = r[0];
    for (int64_t c = lane; c < classes; c += kGroup) m = MaxOf(m, r[c]);
    m = GroupMax<kGroup>(m, scratch_t);
    double sum = 0, shifted = 0;
    for (int64_t c = lane; c < classes; c += kGroup) {
      const T d = r[c] - m;
      sum += static_cast<double>(Exp(d));
      shifted += static_cast<double>(d);
    }
    sum = GroupSum<kGroup>(sum, scratch_d);
    if (eps > 0) shifted = GroupSum<kGroup>(shifted, scratch_d);
    if (lane == 0) sample_loss[row] = SmoothedLoss(Log(sum), static_cast<double>(r[y] - m), shifted, eps, classes);
  }
}

// One thread per sample of [N, C, d...] logits: neighbouring threads read
// neighbouring positions of each class plane.
template <typename T, typename I>
__global__ void CrossEntropySpatialKernel(const T* x, const I* targets, ClassShape shape, int64_t ignore, double eps,
                                          double* sample_loss) {
  const int64_t samples = shape.samples(), classes = shape.classes, stride = shape.inner;
  for (int64_t i = FirstIndex(); i < samples; i += GridStride()) {
    const int64_t y = targets[i];
    if (!Counted(y, ignore, classes)) {
      sample_loss[i] = 0;
      continue;
    }
    const T* r = x + ScoreOffset(shape, i);
    T m = r[0];
    for (int64_t c = 1; c < classes; ++c) m = r[c * stride] > m ? r[c * stride] : m;
    double sum = 0, shifted = 0;
    for (int64_t c = 0; c < classes; ++c) {
      const T d = r[c * stride] - m;
      sum += static_cast<double>(Exp(d));
      shifted += static_cast<double>(d);
    }
    sample_loss[i] = SmoothedLoss(Log(sum), static_cast<double>(r[y * stride] - m), shifted, eps, classes);
  }
}

// Per block of a fixed grid: the sum of the counted samples' losses (from
// sample_loss, or NLL's -log_probs[target]), their count, and the lowest
// position of an out-of-range target (samples if none).
template <bool kNll, typename T, typename I>
__global__ void ClassLossPartialsKernel(const double* sample_loss, const T* log_probs, const I* targets,
                                        ClassShape shape, int64_t ignore, double* part_sum, long long* part_count,
                                        long long* part_bad) {
  __shared__ double scratch_d[kThreads];
  __shared__ long long scratch_l[kThreads];
  const int64_t samples = shape.samples();
  double sum = 0;
  long long count = 0, bad = samples;
  for (int64_t i = FirstIndex(); i < samples; i += GridStride()) {
    const int64_t y = targets[i];
    if (y == ignore) continue;
    if (y < 0 || y >= shape.classes) {
      bad = std::min<long long>(bad, i);
      continue;
    }
    ++count;
    if constexpr (kNll) {
      sum -= static_cast<double>(log_probs[ScoreOffset(shape, i) + y * shape.inner]);
    } else {
      sum += sample_loss[i];
    }
  }
  sum = BlockSum(sum, scratch_d);
  count = BlockSum(count, scratch_l);
  bad = -BlockMax(-bad, scratch_l);
  if (threadIdx.x == 0) {
    part_sum[blockIdx.x] = sum;
    part_count[blockIdx.x] = count;
    part_bad[blockIdx.x] = bad;
  }
}

// One block: the partials added in order, the loss and the target check.
template <typename T, typename I>
__global__ void FinishClassLossKernel(const double* part_sum, const long long* part_count, const long long* part_bad,
                                      int64_t parts, const I* targets, int64_t samples, bool mean, T* loss,
                                      TargetCheck* check) {
  __shared__ double scratch_d[kThreads];
  __shared__ long long scratch_l[kThreads];
  double sum = 0;
  long long count = 0, bad = samples;
  for (int64_t j = threadIdx.x; j < parts; j += blockDim.x) {
    sum += part_sum[j];
    count += part_count[j];
    bad = std::min(bad, part_bad[j]);
  }
  sum = BlockSum(sum, scratch_d);
  count = BlockSum(count, scratch_l);
  bad = -BlockMax(-bad, scratch_l);
  if (threadIdx.x == 0) {
    loss[0] = static_cast<T>(mean ? sum / static_cast<double>(count) : sum);  // 0 / 0 = NaN: all ignored
    check->bad_position = bad < samples ? bad : -1;
    check->bad_value = bad < samples ? static_cast<int64_t>(targets[bad]) : 0;
  }
}

// count += the number of counted targets (integer atomics: exact in any order).
template <typename I>
__global__ void CountTargetsKernel(const I* targets, int64_t samples, int64_t classes, int64_t ignore,
                                   unsigned long long* count) {
  __shared__ long long scratch[kThreads];
  long long local = 0;
  for (int64_t i = FirstIndex(); i < samples; i += GridStride()) local += Counted(targets[i], ignore, classes);
  local = BlockSum(local, scratch);
  if (threadIdx.x == 0 && local != 0) atomicAdd(count, static_cast<unsigned long long>(local));
}

template <int kGroup, typename T, typename I>
__global__ void CrossEntropyBackwardRowsKernel(const T* x, const I* targets, const T* dy,
                                               const unsigned long long* count, int64_t rows, int64_t classes,
                                               int64_t ignore, bool mean, T smooth, T hit, T* dx) {
  __shared__ T scratch_t[kGroup > 32 ? kThreads : 1];
  __shared__ double scratch_d[kGroup > 32 ? kThreads : 1];
  constexpr int kGroups = kThreads / kGroup;
  const int lane = threadIdx.x % kGroup;
  const T scale = LossScale(dy, mean, static_cast<double>(*count));
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + threadIdx.x / kGroup; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kGroups) {
    const int64_t y = targets[row];
    const T* r = x + row * classes;
    T* out = dx + row * classes;
    if (!Counted(y, ignore, classes)) {
      const T fill = y == ignore ? T(0) : QuietNaN<T>();  // an out-of-range target poisons its row
      for (int64_t c = lane; c < classes; c += kGroup) out[c] = fill;
      continue;
    }
    T m = r[0];
    for (int64_t c = lane; c < classes; c += kGroup) m = MaxOf(m, r[c]);
    m = GroupMax<kGroup>(m, scratch_t);
    double sum = 0;
    for (int64_t c = lane; c < classes; c += kGroup) sum += static_cast<double>(Exp(r[c] - m));
    const T log_sum = static_cast<T>(Log(GroupSum<kGroup>(sum, scratch_d)));
    for (int64_t c = lane; c < classes; c += kGroup) {
      const T p = Exp((r[c] - m) - log_sum);
      out[c] = scale * (p - smooth - (c == y ? hit : T(0)));
    }
  }
}

template <typename T, typename I>
__global__ void CrossEntropyBackwardSpatialKernel(const T* x, const I* targets, const T* dy,
                                                  const unsigned long long* count, ClassShape shape, int64_t ignore,
                                                  bool mean, T smooth, T hit, T* dx) {
  const T scale = LossScale(dy, mean, static_cast<double>(*count));
  const int64_t samples = shape.samples(), classes = shape.classes, stride = shape.inner;
  for (int64_t i = FirstIndex(); i < samples; i += GridStride()) {
    const int64_t y = targets[i];
    const int64_t at = ScoreOffset(shape, i);
    const T* r = x + at;
    T* out = dx + at;
    if (!Counted(y, ignore, classes)) {
      const T fill = y == ignore ? T(0) : QuietNaN<T>();
      for (int64_t c = 0; c < classes; ++c) out[c * stride] = fill;
      continue;
    }
    T m = r[0];
    for (int64_t c = 1; c < classes; ++c) m = r[c * stride] > m ? r[c * stride] : m;
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += static_cast<double>(Exp(r[c * stride] - m));
    const T log_sum = static_cast<T>(Log(sum));
    for (int64_t c = 0; c < classes; ++c) {
      const T p = Exp((r[c * stride] - m) - log_sum);
      out[c * stride] = scale * (p - smooth - (c == y ? hit : T(0)));
    }
  }
}

template <typename T, typename I>
__global__ void NllBackwardKernel(const I* targets, const T* dy, const unsigned long long* count, ClassShape shape,
                                  int64_t ignore, bool mean, T* dlp) {
  const T g = -LossScale(dy, mean, static_cast<double>(*count));
  const int64_t n = shape.samples() * shape.classes, classes = shape.classes, inner = shape.inner;
  for (int64_t o = FirstIndex(); o < n; o += GridStride()) {
    const int64_t outer = o / inner;  // n * classes + c
    const int64_t c = outer % classes;
    const int64_t y = targets[(outer / classes) * inner + o % inner];
    T v = T(0);
    if (y != ignore) v = (y < 0 || y >= classes) ? QuietNaN<T>() : (y == c ? g : T(0));
    dlp[o] = v;
  }
}

// Launches the row kernel with the group width that suits C.
template <typename Launch>
void WithRowGroup(int64_t classes, Launch&& launch) {
  if (classes <= 128) {
    launch(std::integral_constant<int, 8>{});
  } else if (classes <= 4096) {
    launch(std::integral_constant<int, 32>{});
  } else {
    launch(std::integral_constant<int, kThreads>{});
  }
}

unsigned RowBlocks(int64_t rows, int group) {
  const int64_t per_block = kThreads / group;
  return BlocksPerItem((rows + per_block - 1) / per_block);
}

// Scratch words of the class-loss forward: the check, then per-block sums,
// counts and bad positions, then (cross entropy) one loss per sample.
struct ClassScratch {
  TargetCheck* check;
  double* part_sum;
  long long* part_count;
  long long* part_bad;
  double* sample_loss;
  int64_t parts;
};

ClassScratch CarveClassScratch(void* scratch, int64_t samples) {
  static_assert(sizeof(TargetCheck) == 16, "the check takes two words");
  int64_t* words = static_cast<int64_t*>(scratch);
  ClassScratch s;
  s.parts = PartialBlocks(samples);
  s.check = reinterpret_cast<TargetCheck*>(words);
  s.part_sum = reinterpret_cast<double*>(words + 2);
  s.part_count = reinterpret_cast<long long*>(words + 2 + s.parts);
  s.part_bad = reinterpret_cast<long long*>(words + 2 + 2 * s.parts);
  s.sample_loss = reinterpret_cast<double*>(words + 2 + 3 * s.parts);
  return s;
}

template <bool kNll, typename T, typename I>
cudaError_t FinishClassLoss(const ClassScratch& s, const T* log_probs, const I* targets, ClassShape shape,
                            int64_t ignore, bool mean, T* loss, cudaStream_t stream) {
  ClassLossPartialsKernel<kNll, T, I><<<static_cast<unsigned>(s.parts), kThreads, 0, stream>>>(
      s.sample_loss, log_probs, targets, shape, ignore, s.part_sum, s.part_count, s.part_bad);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  FinishClassLossKernel<T, I><<<1, kThreads, 0, stream>>>(s.part_sum, s.part_count, s.part_bad, s.parts, targets,
                                                           shape.samples(), mean, loss, s.check);
  return cudaGetLastError();
}

template <typename I>
cudaError_t CountTargets(const I* targets, ClassShape shape, int64_t ignore, void* count_scratch,
                         cudaStream_t stream) {
  auto* count = static_cast<unsigned long long*>(count_scratch);
  cudaError_t err = cudaMemsetAsync(count, 0, sizeof(*count), stream);
  if (err != cudaSuccess) return err;
  const int64_t samples = shape.samples();
  CountTargetsKernel<I><<<static_cast<unsigned>(PartialBlocks(samples)), kThreads, 0, stream>>>(
      targets, samples, shape.classes, ignore, count);
  return cudaGetLastError();
}

// ------------------------------------------------------- element losses

// Per block of a fixed grid: the sum in double of term(i) over its elements.
template <typename Term>
__global__ void SumPartialsKernel(int64_t n, Term term, double* part_sum) {
  __shared__ double scratch[kThreads];
  double sum = 0;
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) sum += term(i);
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) part_sum[blockIdx.x] = sum;
}

template <typename T>
__global__ void FinishSumKernel(const double* part_sum, int64_t parts, bool mean, double denominator, T* loss) {
  __shared__ double scratch[kThreads];
  double sum = 0;
  for (int64_t j = threadIdx.x; j < parts; j += blockDim.x) sum += part_sum[j];
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) loss[0] = static_cast<T>(mean ? sum / denominator : sum);
}

template <typename Term, typename T>
cudaError_t SumLoss(int64_t n, const Term& term, bool mean, T* loss, void* scratch, cudaStream_t stream) {
  const int64_t parts = PartialBlocks(n);
  double* part_sum = static_cast<double*>(scratch);
  SumPartialsKernel<Term><<<static_cast<unsigned>(parts), kThreads, 0, stream>>>(n, term, part_sum);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  FinishSumKernel<T><<<1, kThreads, 0, stream>>>(part_sum, parts, mean, static_cast<double>(n), loss);
  return cudaGetLastError();
}

template <typename T>
struct MseTerm {
  const T* prediction;
  const T* target;
  __device__ double operator()(int64_t i) const {
    const double d = static_cast<double>(prediction[i]) - static_cast<double>(target[i]);
    return d * d;
  }
};

template <typename T>
__global__ void MseBackwardKernel(const T* p, const T* t, const T* dy, int64_t n, bool mean, T* dp) {
  const T scale = 2 * LossScale(dy, mean, static_cast<double>(n));
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) dp[i] = scale * (p[i] - t[i]);
}

// softplus(-x) = log(1 + exp(-x)) without overflow; max(-x, 0) as std::max.
template <typename T>
__device__ inline T SoftplusNeg(T x) {
  const T neg = -x;
  return Log1p(Exp(-Abs(x))) + (neg < T(0) ? T(0) : neg);
}

template <typename T>
__device__ inline T SigmoidNeg(T x) {
  if (x >= 0) {
    const T e = Exp(-x);
    return e / (1 + e);
  }
  return 1 / (1 + Exp(x));
}

__device__ inline int64_t PosWeightOffset(const PosWeightIndex& index, int64_t i) {
  int64_t offset = 0;
  for (int d = index.rank - 1; d >= 0; --d) {
    offset += (i % index.dims[d]) * index.strides[d];
    i /= index.dims[d];
  }
  return offset;
}

template <typename T>
struct BceTerm {
  const T* x;
  const T* t;
  const T* pw;  // null: no pos_weight
  PosWeightIndex index;
  __device__ double operator()(int64_t i) const {
    const T log_weight = pw != nullptr ? 1 + (pw[PosWeightOffset(index, i)] - 1) * t[i] : T(1);
    return static_cast<double>((1 - t[i]) * x[i] + log_weight * SoftplusNeg(x[i]));
  }
};

template <BceWrt kWrt, typename T>
__global__ void BceBackwardKernel(const T* dy, const T* x, const T* t, const T* pw, PosWeightIndex index, int64_t n,
                                  bool mean, T* grad) {
  const T scale = LossScale(dy, mean, static_cast<double>(n));
  for (int64_t i = FirstIndex(); i < n; i += GridStride()) {
    const T weight = pw != nullptr ? pw[PosWeightOffset(index, i)] : T(1);
    if constexpr (kWrt == BceWrt::kLogits) {
      grad[i] = scale * ((1 - t[i]) - (1 + (weight - 1) * t[i]) * SigmoidNeg(x[i]));
    } else if constexpr (kWrt == BceWrt::kTargets) {
      grad[i] = scale * (-x[i] + (pw != nullptr ? (weight - 1) * SoftplusNeg(x[i]) : T(0)));
    } else {
      grad[i] = scale * t[i] * SoftplusNeg(x[i]);
    }
  }
}

}  // namespace

int64_t ClassLossScratchWords(int64_t samples, bool cross_entropy) {
  return 2 + 3 * PartialBlocks(samples) + (cross_entropy ? samples : 0);
}

int64_t SumLossScratchWords(int64_t n) { return PartialBlocks(n); }

template <typename T, typename I>
cudaError_t LaunchCrossEntropy(const T* logits, const I* targets, ClassShape shape, int64_t ignore_index,
                               double label_smoothing, bool mean, T* loss, void* scratch, cudaStream_t stream) {
  const ClassScratch s = CarveClassScratch(scratch, shape.samples());
  if (shape.samples() > 0) {
    if (shape.inner == 1) {
      WithRowGroup(shape.classes, [&](auto group) {
        constexpr int kGroup = decltype(group)::value;
        CrossEntropyRowsKernel<kGroup, T, I><<<RowBlocks(shape.batch, kGroup), kThreads, 0, stream>>>(
            logits, targets, shape.batch, shape.classes, ignore_index, label_smoothing, s.sample_loss);
      });
    } else {
      CrossEntropySpatialKernel<T, I><<<Blocks(shape.samples()), kThreads, 0, stream>>>(
          logits, targets, shape, ignore_index, label_smoothing, s.sample_loss);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return FinishClassLoss<false, T, I>(s, nullptr, targets, shape, ignore_index, mean, loss, stream);
}

template <typename T, typename I>
cudaError_t LaunchCrossEntropyBackward(const T* logits, const I* targets, const T* dy, ClassShape shape,
                                       int64_t ignore_index, double label_smoothing, bool mean, T* dlogits,
                                       void* count_scratch, cudaStream_t stream) {
  if (shape.samples() == 0) return cudaSuccess;
  cudaError_t err = CountTargets(targets, shape, ignore_index, count_scratch, stream);
  if (err != cudaSuccess) return err;
  const auto* count = static_cast<const unsigned long long*>(count_scratch);
  const T smooth = static_cast<T>(label_smoothing / static_cast<double>(shape.classes));
  const T hit = static_cast<T>(1.0 - label_smoothing);
  if (shape.inner == 1) {
    WithRowGroup(shape.classes, [&](auto group) {
      constexpr int kGroup = decltype(group)::value;
      CrossEntropyBackwardRowsKernel<kGroup, T, I><<<RowBlocks(shape.batch, kGroup), kThreads, 0, stream>>>(
          logits, targets, dy, count, shape.batch, shape.classes, ignore_index, mean, smooth, hit, dlogits);
    });
  } else {
    CrossEntropyBackwardSpatialKernel<T, I><<<Blocks(shape.samples()), kThreads, 0, stream>>>(
        logits, targets, dy, count, shape, ignore_index, mean, smooth, hit, dlogits);
  }
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t LaunchNll(const T* log_probs, const I* targets, ClassShape shape, int64_t ignore_index, bool mean, T* loss,
                      void* scratch, cudaStream_t stream) {
  const ClassScratch s = CarveClassScratch(scratch, shape.samples());
  return FinishClassLoss<true, T, I>(s, log_probs, targets, shape, ignore_index, mean, loss, stream);
}

template <typename T, typename I>
cudaError_t LaunchNllBackward(const I* targets, const T* dy, ClassShape shape, int64_t ignore_index, bool mean,
                              T* dlog_probs, void* count_scratch, cudaStream_t stream) {
  const int64_t n = shape.samples() * shape.classes;
  if (n == 0) return cudaSuccess;
  cudaError_t err = CountTargets(targets, shape, ignore_index, count_scratch, stream);
  if (err != cudaSuccess) return err;
  NllBackwardKernel<T, I><<<Blocks(n), kThreads, 0, stream>>>(
      targets, dy, static_cast<const unsigned long long*>(count_scratch), shape, ignore_index, mean, dlog_probs);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMse(const T* prediction, const T* target, int64_t n, bool mean, T* loss, void* scratch,
                      cudaStream_t stream) {
  return SumLoss(n, MseTerm<T>{prediction, target}, mean, loss, scratch, stream);
}

template <typename T>
cudaError_t LaunchMseBackward(const T* prediction, const T* target, const T* dy, int64_t n, bool mean,
                              T* dprediction, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MseBackwardKernel<T><<<Blocks(n), kThreads, 0, stream>>>(prediction, target, dy, n, mean, dprediction);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchBceWithLogits(const T* logits, const T* targets, const T* pos_weight, const PosWeightIndex& index,
                                int64_t n, bool mean, T* loss, void* scratch, cudaStream_t stream) {
  return SumLoss(n, BceTerm<T>{logits, targets, pos_weight, index}, mean, loss, scratch, stream);
}

template <typename T>
cudaError_t LaunchBceWithLogitsBackward(const T* dy, const T* logits, const T* targets, const T* pos_weight,
                                        const PosWeightIndex& index, int64_t n, bool mean, BceWrt wrt, T* grad,
                                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (wrt) {
    case BceWrt::kLogits:
      BceBackwardKernel<BceWrt::kLogits, T>
          <<<Blocks(n), kThreads, 0, stream>>>(dy, logits, targets, pos_weight, index, n, mean, grad);
      break;
    case BceWrt::kTargets:
      BceBackwardKernel<BceWrt::kTargets, T>
          <<<Blocks(n), kThreads, 0, stream>>>(dy, logits, targets, pos_weight, index, n, mean, grad);
      break;
    case BceWrt::kPosWeight:
      BceBackwardKernel<BceWrt::kPosWeight, T>
          <<<Blocks(n), kThreads, 0, stream>>>(dy, logits, targets, pos_weight, index, n, mean, grad);
      break;
  }
  return cudaGetLastError();
}

#define LOOM_INSTANTIATE_CLASS_LOSSES(T, I)                                                                          \
  template cudaError_t LaunchCrossEntropy<T, I>(const T*, const I*, ClassShape, int64_t, double, bool, T*, void*,    \
                                                cudaStream_t);                                                      \
  template cudaError_t LaunchCrossEntropyBackward<T, I>(const T*, const I*, const T*, ClassShape, int64_t, double,   \
                                                        bool, T*, void*, cudaStream_t);                             \
  template cudaError_t LaunchNll<T, I>(const T*, const I*, ClassShape, int64_t, bool, T*, void*, cudaStream_t);      \
  template cudaError_t LaunchNllBackward<T, I>(const I*, const T*, ClassShape, int64_t, bool, T*, void*, cudaStream_t);

LOOM_INSTANTIATE_CLASS_LOSSES(float, int32_t)
LOOM_INSTANTIATE_CLASS_LOSSES(float, int64_t)
LOOM_INSTANTIATE_CLASS_LOSSES(double, int32_t)
LOOM_INSTANTIATE_CLASS_LOSSES(double, int64_t)
#undef LOOM_INSTANTIATE_CLASS_LOSSES

#define LOOM_INSTANTIATE_ELEMENT_LOSSES(T)                                                                           \
  template cudaError_t LaunchMse<T>(const T*, const T*, int64_t, bool, T*, void*, cudaStream_t);                     \
  template cudaError_t LaunchMseBackward<T>(const T*, const T*, const T*, int64_t, bool, T*, cudaStream_t);          \
  template cudaError_t LaunchBceWithLogits<T>(const T*, const T*, const T*, const PosWeightIndex&, int64_t, bool, T*, \
                                              void*, cudaStream_t);                                                 \
  template cudaError_t LaunchBceWithLogitsBackward<T>(const T*, const T*, const T*, const T*, const PosWeightIndex&,  \
                                                      int64_t, bool, BceWrt, T*, cudaStream_t);

LOOM_INSTANTIATE_ELEMENT_LOSSES(float)
LOOM_INSTANTIATE_ELEMENT_LOSSES(double)
#undef LOOM_INSTANTIATE_ELEMENT_LOSSES

}  // namespace loom::cuda
