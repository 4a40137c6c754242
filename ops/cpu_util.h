// Small helpers shared by CPU kernels.
#pragma once

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/shape.h"
#include "core/thread_pool.h"

namespace loom {

// Before an element-wise loop over several arrays, some written in place
// (iteration i touches element i of each, nothing else): GCC checks each
// pair of a written and another array for overlap at run time before it
// vectorises, and past 10 pairs (Adam's update has more) it keeps the loop
// scalar. `ivdep` tells it no iteration depends on another.
#define LOOM_ELEMENTWISE_LOOP _Pragma("GCC ivdep")

// n elements of scratch, uninitialized (at least one, so the pointer is
// never null): for buffers whose every element is written before it is
// read, where zeroing megabytes each call would cost more than the work.
template <typename T>
std::unique_ptr<T[]> Scratch(int64_t n) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(std::max<int64_t>(n, 1))]);
}

// Runs fn(begin, end) over [0, n) on the pool in chunks big enough to pay
// for the hand-off (element-wise work of ~32k items per chunk).
template <typename Fn>
void ParallelRange(ThreadPool* pool, int64_t n, Fn&& fn, int64_t min_chunk = 32768) {
  if (!pool || n < 2 * min_chunk) {
    fn(int64_t{0}, n);
    return;
  }
  pool->ParallelFor(n, min_chunk, fn);
}

// Runs worker(next) once per thread of the pool, where next() hands out the
// tasks [0, tasks) one at a time and -1 when none are left. Faster threads
// take more tasks, so a core slowed by a neighbouring process delays the
// others by one task at most (a static split waits for its whole share).
// Results must not depend on which thread runs which task.
template <typename Worker>
void ParallelTasks(ThreadPool* pool, int64_t tasks, Worker&& worker) {
  std::atomic<int64_t> counter{0};
  auto next = [&] {
    const int64_t t = counter.fetch_add(1, std::memory_order_relaxed);
    return t < tasks ? t : int64_t{-1};
  };
  const int64_t threads = pool ? std::min<int64_t>(pool->num_threads(), tasks) : 1;
  if (threads <= 1) {
    worker(next);
    return;
  }
  pool->ParallelFor(threads, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) worker(next);
  });
}

// Calls fn(extent) with a compile-time extent for the short runs of small
// maps (1, 2, 4, 8 or 16 elements: 1x1, 2x2, 4x4 planes, rows of 4, 8,
// 16), else with the run-time value: a loop of a known few elements
// unrolls into a few vector moves, where a loop of a run-time count spends
// more on its bounds and tail than on its work (a squeeze-and-excitation
// pool over 2x2 planes ran 5-10x slower so).
template <typename Fn>
void WithSmallExtent(int64_t extent, Fn&& fn) {
  switch (extent) {
    case 1: return fn(std::integral_constant<int64_t, 1>());
    case 2: return fn(std::integral_constant<int64_t, 2>());
    case 4: return fn(std::integral_constant<int64_t, 4>());
    case 8: return fn(std::integral_constant<int64_t, 8>());
    case 16: return fn(std::integral_constant<int64_t, 16>());
    default: return fn(extent);
  }
}

// Sum of term(i) for i in [0, n), accumulated in Acc in kSumLanes independent
// partial sums (a single running sum is a chain of dependent adds, which
// neither vectorises nor pipelines) combined in a fixed order: the result
// depends on n and the terms only, never on threads.
constexpr int kSumLanes = 8;
template <typename Acc, typename Term>
Acc LaneSum(int64_t n, Term&& term) {
  Acc part[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) part[l] += term(i + l);
  Acc sum = 0;
  for (; i < n; ++i) sum += term(i);
  for (int l = 0; l < kSumLanes; ++l) sum += part[l];
  return sum;
}

// LaneSum<T> of p[0, n): the same partial sums in the same order (lane l
// holds the elements l mod kSumLanes), spelt as vectors, which GCC does not
// always make of LaneSum's array of partial sums.
template <typename T>
T ArraySum(const T* p, int64_t n) {
  typedef T Lanes __attribute__((vector_size(kSumLanes * sizeof(T))));
  typedef T UnalignedLanes __attribute__((vector_size(kSumLanes * sizeof(T)), aligned(alignof(T)), may_alias));
  Lanes part = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) part += *reinterpret_cast<const UnalignedLanes*>(p + i);
  T sum = 0;
  for (; i < n; ++i) sum += p[i];
  for (int l = 0; l < kSumLanes; ++l) sum += part[l];
  return sum;
}

// c[0] x^(N-1) + c[1] x^(N-2) + ... + c[N-1] by Horner's rule, for the
// vector-lane functions below (a loop that unrolls: the same FMAs as
// written out).
template <size_t N>
inline float Horner(float x, const float (&c)[N]) {
  float p = c[0];
  for (size_t i = 1; i < N; ++i) p = p * x + c[i];
  return p;
}

// e^x in float arithmetic that vectorises (glibc's expf is a call per
// element): x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, so r
// is exact), Cephes' degree-6 polynomial for e^r (about 1 ulp), times 2^n
// in two halves (so results down to the smallest subnormal come out).
// The same operations in every lane and on every CPU: the same bits on
// AVX2 and AVX-512 and at any thread count. e^-inf = 0, e^+inf = inf,
// NaN stays NaN.
inline float ExpF(float x) {
  const float clamped = std::min(std::max(x, -104.0f), 88.75f);  // (NaN stays NaN)
  // Round to nearest by adding 1.5 * 2^23: exact for |x / ln 2| < 2^22.
  const float n = (clamped * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = clamped - n * 0.693359375f;  // ln 2's high part: n times it is exact
  r = r + n * 2.12194440e-4f;            // minus its low part (-2.12e-4)
  static constexpr float kExpTerms[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                                        1.6666665459e-1f, 5.0000001201e-1f};
  float p = Horner(r, kExpTerms);
  p = p * (r * r) + r + 1.0f;
  const int32_t k = n == n ? static_cast<int32_t>(n) : 0;  // (NaN: p carries it)
  const int32_t k1 = k / 2, k2 = k - k1;  // each in [-75, 65]: normal powers of two
  float s1, s2;
  const int32_t b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  std::memcpy(&s1, &b1, sizeof(float));
  std::memcpy(&s2, &b2, sizeof(float));
  const float e = p * s1 * s2;
  return x < -104.0f ? 0.0f : (x > 88.72283905f ? std::numeric_limits<float>::infinity() : e);
}

// ln(x) in float arithmetic that vectorises (glibc's logf is a call per
// element): x = 2^e m with m in [sqrt(1/2), sqrt(2)) read off x's bits
// (subnormals scaled by 2^23 first), ln(1 + f) for f = m - 1 (exact) by
// Cephes' polynomial, plus e ln 2 in two parts. Within 1 ulp (tested); the
// same bits in vector lanes as one at a time. ln(0) = -inf, ln(+inf) =
// +inf, NaN for x < 0 and for NaN. Every value is computed whatever x is
// and the special ones are blended in by bits: GCC otherwise sinks the
// polynomial into a branch, where its int-to-float conversion (which may
// raise inexact) keeps the loop from being if-converted.
inline float LogF(float x) {
  const float up = x * 8388608.0f;  // 2^23: a subnormal as a normal
  const bool tiny = x < std::numeric_limits<float>::min();
  const float scaled = tiny ? up : x;
  int32_t bits;
  std::memcpy(&bits, &scaled, sizeof(float));
  bits &= 0x7fffffff;  // |scaled|: x < 0 gives NaN below, and no sum here leaves int32's range
  const int32_t offset = bits - 0x3f3504f3;  // from sqrt(1/2)'s bits: its exponent field is e
  const int32_t e = (offset >> 23) - (tiny ? 23 : 0);
  const int32_t m_bits = bits - (offset & static_cast<int32_t>(0xff800000u));
  float m;
  std::memcpy(&m, &m_bits, sizeof(float));
  const float f = m - 1.0f, z = f * f, ef = static_cast<float>(e);
  static constexpr float kLogTerms[] = {7.0376836292e-2f, -1.1514610310e-1f, 1.1676998740e-1f, -1.2420140846e-1f,
                                        1.4249322787e-1f, -1.6668057665e-1f, 2.0000714765e-1f, -2.4999993993e-1f,
                                        3.3333331174e-1f};
  float p = Horner(f, kLogTerms);
  float y = f * z * p;
  y = y + ef * -2.12194440e-4f;  // ln 2's low part
  y = y - 0.5f * z;
  const float r = f + y + ef * 0.693359375f;  // ln 2's high part: e times it is exact
  const float inf = std::numeric_limits<float>::infinity();
  const float special = x == 0.0f ? -inf : (x == inf ? inf : std::numeric_limits<float>::quiet_NaN());
  const int32_t keep = -static_cast<int32_t>((x > 0.0f) & (x < inf));
  int32_t r_bits, special_bits;
  std::memcpy(&r_bits, &r, sizeof(float));
  std::memcpy(&special_bits, &special, sizeof(float));
  r_bits = (r_bits & keep) | (special_bits & ~keep);
  float result;
  std::memcpy(&result, &r_bits, sizeof(float));
  return result;
}

// 1 / (1 + e^-x) for f32 in vector lanes (ExpF): 0 for x below -88.7,
// 1 above 17.
inline float SigmoidF(float x) { return 1.0f / (1.0f + ExpF(-x)); }

// tanh(x) for f32 in vector lanes: Cephes' odd polynomial where |x| <
// 0.625 (no cancellation near 0), 1 - 2 / (e^2|x| + 1) with x's sign
// elsewhere; within 2 ulp; tanh(+-inf) = +-1, NaN stays NaN.
inline float TanhF(float x) {
  const float a = std::abs(x), z = x * x;
  static constexpr float kTanhTerms[] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f,
                                         -3.33332819422e-1f};
  float p = Horner(z, kTanhTerms);
  const float small = a == 0.0f ? x : p * z * x + x;  // (tanh(-0) = -0)
  const float large = 1.0f - 2.0f / (ExpF(2.0f * a) + 1.0f);
  return a < 0.625f ? small : std::copysign(large, x);
}

// Phi(x), the standard normal distribution function, and phi(x), its
// density, for f32 in vector lanes (GELU and its gradient: glibc's erff is
// a call per element, and 1 + erf(x / sqrt(2)) cancels for x < 0). The
// lower tail is Phi(-a) = e^(-a^2 / 2) t P(s) with s = a / (a + 4) and
// t = 1 - s, both from one division and so both precise where small (near
// a = 0 and for large a), and P of degree 10 from tools/fit_normal_tail.py.
// e^(-a^2 / 2) carries a^2's rounding error (an fma) into the tails.
// Within 5 ulp of Phi wherever Phi is normal (x > -13.1; it is subnormal
// below, and 0 from x = -14.4); Phi(x) = 1 from x = 5.42; Phi(+-inf) = 1, 0
// with phi = 0; NaN stays NaN. Tested in ops/cpu_util_test.cc.
struct NormalCdfPdf {
  float cdf, pdf;
};
inline NormalCdfPdf NormalCdfPdfF(float x) {
  const float a = std::min(std::abs(x), 15.0f);  // past 14.4 the tail is 0 (NaN stays NaN)
  const float inverse = 1.0f / (a + 4.0f);
  const float s = a * inverse, t = 4.0f * inverse;
  const float u = s - 3.918918919e-01f;  // about the middle of s's range: terms of falling size
  static constexpr float kTailTerms[] = {-1.347728634e-02f, -1.546154613e-02f, 3.297054306e-02f, 3.271518868e-02f,
                                         -8.932854454e-02f, -1.246534715e-02f, 2.622587172e-01f, -4.829189070e-01f,
                                         5.256980682e-01f, -4.019900646e-01f, 2.267103086e-01f};
  float p = Horner(u, kTailTerms);
  const float square = a * a, square_error = std::fma(a, a, -square);  // a^2 exactly, in two parts
  const float gauss = ExpF(-0.5f * square) * (1.0f - 0.5f * square_error);  // e^(-a^2 / 2)
  const float tail = gauss * (t * p);
  return {x < 0.0f ? tail : 1.0f - tail, gauss * 0.3989422804f};  // 1 / sqrt(2 pi)
}

// e^x, ln(x), 1 / (1 + e^-x) and tanh(x) in vector lanes for f32 (above),
// the library's for f64 (the gradient checks' reference precision).
inline float Exp(float x) { return ExpF(x); }
inline double Exp(double x) { return std::exp(x); }
inline float Log(float x) { return LogF(x); }
inline double Log(double x) { return std::log(x); }
inline float Sigmoid(float x) { return SigmoidF(x); }
inline double Sigmoid(double x) {
  if (x >= 0) return 1 / (1 + std::exp(-x));
  const double e = std::exp(x);  // never e^(large positive)
  return e / (1 + e);
}
inline float Tanh(float x) { return TanhF(x); }
inline double Tanh(double x) { return std::tanh(x); }

// Four doubles: 32 bytes, a register on AVX2 as on AVX-512. Wider vector
// types have no register on AVX2, where GCC keeps a loop-carried one on
// the stack (docs/ops.md, "CPU kernels on every x86 machine").
typedef double Double4 __attribute__((vector_size(4 * sizeof(double))));

// *out = p[0, 4) in double. Floats widen by one vcvtps2pd from memory
// where AVX has it: GCC made __builtin_convertvector of them two
// half-width converts, two loads and an insert. An out-parameter, not a
// return: returning a 32-byte vector is a -Wpsabi note without AVX.
inline void WidenFour(const float* p, Double4* out) {
#if defined(__AVX__)
  *out = (Double4)_mm256_cvtps_pd(_mm_loadu_ps(p));
#else
  typedef float Loaded __attribute__((vector_size(4 * sizeof(float)), aligned(alignof(float)), may_alias));
  *out = __builtin_convertvector(*reinterpret_cast<const Loaded*>(p), Double4);
#endif
}
inline void WidenFour(const double* p, Double4* out) {
  typedef double Loaded __attribute__((vector_size(4 * sizeof(double)), aligned(alignof(double)), may_alias));
  *out = *reinterpret_cast<const Loaded*>(p);
}

// The sum of p[0, n) in double, in kSumLanes lanes (lane l takes the
// elements l mod kSumLanes), then the tail, then the lanes in order: a sum
// of floats that rounds once per add in double and vectorises. The lanes
// are two Double4s.
inline double SumAsDouble(const float* p, int64_t n) {
  static_assert(kSumLanes == 8, "the lanes are two Double4s");
  Double4 low = {}, high = {}, v;
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    WidenFour(p + i, &v);
    low += v;
    WidenFour(p + i + 4, &v);
    high += v;
  }
  double sum = 0;
  for (; i < n; ++i) sum += p[i];
  for (int l = 0; l < 4; ++l) sum += low[l];
  for (int l = 0; l < 4; ++l) sum += high[l];
  return sum;
}

// Strides (in elements) of `in` broadcast against `out`: 0 on broadcast dims.
// `in` is right-aligned to `out`'s rank.
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out);

// The iteration space of `out` against operands with strides sa and sb, with
// extent-1 dims dropped and adjacent dims merged wherever both operands step
// through them as through one (contiguous or broadcast alike): the same
// elements in the same order, as fewer and longer rows for ForEachBroadcast
// (a [N, C, H, W] * [N, C, 1, 1] product becomes [N * C, H * W] * [N * C, 1]).
// Never rank 0: a single element is [1].
struct BroadcastSpace {
  Shape shape;
  std::vector<int64_t> sa, sb;
};
BroadcastSpace CollapseBroadcast(const Shape& out, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb);

// Visits every element of `out` in row-major order with the matching offsets
// into two broadcast operands: fn(out_index, offset_a, offset_b) in chunks of
// the innermost dimension, for [begin, end) of the outer rows.
template <typename Fn>
void ForEachBroadcast(const Shape& out, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb,
                      int64_t row_begin, int64_t row_end, Fn&& fn) {
  const int rank = out.rank();
  if (rank == 0) {
    fn(0, 0, 0, 1, 0, 0);
    return;
  }
  const int64_t inner = out[rank - 1];
  std::vector<int64_t> idx(rank - 1, 0);
  // Position the counter at row_begin.
  int64_t r = row_begin;
  for (int d = rank - 2; d >= 0; --d) {
    idx[d] = r % out[d];
    r /= out[d];
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < rank - 1; ++d) {
      oa += idx[d] * sa[d];
      ob += idx[d] * sb[d];
    }
    fn(row * inner, oa, ob, inner, sa[rank - 1], sb[rank - 1]);
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace loom
