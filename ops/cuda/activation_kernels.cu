// CUDA kernels of ops/activation_ops.cc: one element-wise kernel per table row
// and direction, with the CPU's formulas written the same way (comparisons
// that let NaN through, the derivative conventions at the breakpoints).
// Aligned tensors move 16 bytes per thread and step; the rest element-wise.
#include "ops/cuda/activation_kernels.h"

#include <type_traits>

#include "ops/activation_formulas.h"
#include "ops/cuda/device_util.cuh"
#include "ops/cuda/pack16.cuh"

namespace loom::cuda {
namespace {

using K = ActivationKind;

// The CPU's M_2_SQRTPI * M_SQRT1_2 and 0.5 * M_2_SQRTPI * M_SQRT1_2 (glibc's
// literals), so both sides round the same double constants.
constexpr double kSqrt2OverPi = 1.12837916709551257390 * 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.5 * 1.12837916709551257390 * 0.70710678118654752440;
constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kGeluCubic = 0.044715;

template <typename T>
__device__ inline T StableSigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + Exp(-x));
  const T e = Exp(x);
  return e / (T(1) + e);
}

template <K kKind, typename T>
__device__ inline T Forward(T x, const ActivationParams& p) {
  if constexpr (kKind == K::kRelu) return activation::Relu(x);
  if constexpr (kKind == K::kRelu6) return activation::Relu6(x);
  if constexpr (kKind == K::kLeakyRelu) return x < T(0) ? static_cast<T>(p.negative_slope) * x : x;
  if constexpr (kKind == K::kGelu) {
    if (p.gelu_tanh) {
      const T u = static_cast<T>(kSqrt2OverPi) * (x + static_cast<T>(kGeluCubic) * x * x * x);
      return T(0.5) * x * (T(1) + Tanh(u));
    }
    return T(0.5) * x * Erfc(-x * static_cast<T>(kSqrtHalf));  // x Phi(x), as the CPU: no cancellation for x < 0
  }
  if constexpr (kKind == K::kSigmoid) return StableSigmoid(x);
  if constexpr (kKind == K::kTanh) return Tanh(x);
  if constexpr (kKind == K::kHardswish) return activation::Hardswish(x);
  if constexpr (kKind == K::kHardsigmoid) return x <= T(-3) ? T(0) : (x >= T(3) ? T(1) : x / T(6) + T(0.5));
  if constexpr (kKind == K::kSilu) return x * StableSigmoid(x);
  if constexpr (kKind == K::kExp) return Exp(x);
  if constexpr (kKind == K::kLog) return Log(x);
  if constexpr (kKind == K::kSqrt) return Sqrt(x);
  if constexpr (kKind == K::kRsqrt) return T(1) / Sqrt(x);  // not rsqrt(): the CPU divides
  if constexpr (kKind == K::kAbs) return Abs(x);
}

// s is x or y, per the CPU table (ReLU, Sigmoid, Tanh, Exp, Sqrt, Rsqrt save y).
template <K kKind, typename T>
__device__ inline T Backward(T dy, T s, const ActivationParams& p) {
  if constexpr (kKind == K::kRelu) return activation::ReluGrad(dy, s);
  if constexpr (kKind == K::kRelu6) return activation::Relu6Grad(dy, s);
  if constexpr (kKind == K::kLeakyRelu) return s > T(0) ? dy : static_cast<T>(p.negative_slope) * dy;
  if constexpr (kKind == K::kGelu) {
    if (p.gelu_tanh) {
      const T x2 = s * s;
      const T t = Tanh(static_cast<T>(kSqrt2OverPi) * s * (T(1) + static_cast<T>(kGeluCubic) * x2));
      const T du = static_cast<T>(kSqrt2OverPi) * (T(1) + static_cast<T>(3 * kGeluCubic) * x2);
      return dy * (T(0.5) * (T(1) + t) + T(0.5) * s * (T(1) - t * t) * du);
    }
    const T cdf = T(0.5) * Erfc(-s * static_cast<T>(kSqrtHalf));
    const T pdf = static_cast<T>(kInvSqrt2Pi) * Exp(T(-0.5) * s * s);
    return dy * (cdf + s * pdf);
  }
  if constexpr (kKind == K::kSigmoid) return dy * s * (T(1) - s);
  if constexpr (kKind == K::kTanh) return dy * (T(1) - s * s);
  if constexpr (kKind == K::kHardswish) return activation::HardswishGrad(dy, s);
  if constexpr (kKind == K::kHardsigmoid) return (s > T(-3) && s < T(3)) ? dy / T(6) : T(0);
  if constexpr (kKind == K::kSilu) {
    const T sig = StableSigmoid(s);
    return dy * sig * (T(1) + s * (T(1) - sig));
  }
  if constexpr (kKind == K::kExp) return dy * s;
  if constexpr (kKind == K::kLog) return dy / s;
  if constexpr (kKind == K::kSqrt) return dy / (T(2) * s);
  if constexpr (kKind == K::kRsqrt) return T(-0.5) * dy * s * s * s;
  if constexpr (kKind == K::kAbs) return s > T(0) ? dy : (s < T(0) ? -dy : T(0));
}

// y[i] = op(a[i]) or op(a[i], b[i]) for i < n; `packed` (every pointer
// 16-byte aligned) walks whole packs, then the tail of fewer than a pack.
template <bool kBinary, typename T, typename Op>
__device__ inline void Map(const T* a, const T* b, T* y, int64_t n, bool packed, Op op) {
  int64_t done = 0;
  if (packed) {
    constexpr int kSize = Pack<T>::kLanes;
    const int64_t packs = n / kSize;
    const Pack<T>* pa = reinterpret_cast<const Pack<T>*>(a);
    const Pack<T>* pb = reinterpret_cast<const Pack<T>*>(b);
    Pack<T>* py = reinterpret_cast<Pack<T>*>(y);
    for (int64_t v = FirstIndex(); v < packs; v += GridStride()) {
      const Pack<T> va = pa[v];
      Pack<T> out;
      if constexpr (kBinary) {
        const Pack<T> vb = pb[v];
#pragma unroll
        for (int j = 0; j < kSize; ++j) out.v[j] = op(va.v[j], vb.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kSize; ++j) out.v[j] = op(va.v[j], T(0));
      }
      py[v] = out;
    }
    done = packs * kSize;
  }
  for (int64_t i = done + FirstIndex(); i < n; i += GridStride()) {
    if constexpr (kBinary) y[i] = op(a[i], b[i]);
    else y[i] = op(a[i], T(0));
  }
}

template <K kKind, typename T>
__global__ void ForwardKernel(const T* x, T* y, int64_t n, ActivationParams p, bool packed) {
  Map<false, T>(x, nullptr, y, n, packed, [&](T v, T) { return Forward<kKind>(v, p); });
}

template <K kKind, typename T>
__global__ void BackwardKernel(const T* dy, const T* saved, T* dx, int64_t n, ActivationParams p, bool packed) {
  Map<true, T>(dy, saved, dx, n, packed, [&](T g, T s) { return Backward<kKind>(g, s, p); });
}

__global__ void ReluInt64Kernel(const int64_t* x, int64_t* y, int64_t n, bool packed) {
  Map<false, int64_t>(x, nullptr, y, n, packed, [](int64_t v, int64_t) { return v < 0 ? int64_t{0} : v; });
}

template <typename T>
unsigned GridFor(int64_t n, bool packed) {
  return Blocks(packed ? std::max<int64_t>(1, n / Pack<T>::kLanes) : n);
}

// Calls fn(std::integral_constant<K, kind>) for the runtime kind.
template <typename Fn>
cudaError_t WithKind(ActivationKind kind, Fn&& fn) {
  switch (kind) {
    case K::kRelu: fn(std::integral_constant<K, K::kRelu>{}); break;
    case K::kRelu6: fn(std::integral_constant<K, K::kRelu6>{}); break;
    case K::kLeakyRelu: fn(std::integral_constant<K, K::kLeakyRelu>{}); break;
    case K::kGelu: fn(std::integral_constant<K, K::kGelu>{}); break;
    case K::kSigmoid: fn(std::integral_constant<K, K::kSigmoid>{}); break;
    case K::kTanh: fn(std::integral_constant<K, K::kTanh>{}); break;
    case K::kHardswish: fn(std::integral_constant<K, K::kHardswish>{}); break;
    case K::kHardsigmoid: fn(std::integral_constant<K, K::kHardsigmoid>{}); break;
    case K::kSilu: fn(std::integral_constant<K, K::kSilu>{}); break;
    case K::kExp: fn(std::integral_constant<K, K::kExp>{}); break;
    case K::kLog: fn(std::integral_constant<K, K::kLog>{}); break;
    case K::kSqrt: fn(std::integral_constant<K, K::kSqrt>{}); break;
    case K::kRsqrt: fn(std::integral_constant<K, K::kRsqrt>{}); break;
    case K::kAbs: fn(std::integral_constant<K, K::kAbs>{}); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t LaunchActivationForward(ActivationKind kind, const T* x, T* y, int64_t n, ActivationParams params,
                                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool packed = Aligned16(x) && Aligned16(y);
  return WithKind(kind, [&](auto k) {
    ForwardKernel<decltype(k)::value, T><<<GridFor<T>(n, packed), kThreads, 0, stream>>>(x, y, n, params, packed);
  });
}

template <typename T>
cudaError_t LaunchActivationBackward(ActivationKind kind, const T* dy, const T* saved, T* dx, int64_t n,
                                     ActivationParams params, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool packed = Aligned16(dy) && Aligned16(saved) && Aligned16(dx);
  return WithKind(kind, [&](auto k) {
    BackwardKernel<decltype(k)::value, T>
        <<<GridFor<T>(n, packed), kThreads, 0, stream>>>(dy, saved, dx, n, params, packed);
  });
}

cudaError_t LaunchReluInt64(const int64_t* x, int64_t* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool packed = Aligned16(x) && Aligned16(y);
  ReluInt64Kernel<<<GridFor<int64_t>(n, packed), kThreads, 0, stream>>>(x, y, n, packed);
  return cudaGetLastError();
}

template cudaError_t LaunchActivationForward<float>(ActivationKind, const float*, float*, int64_t, ActivationParams,
                                                    cudaStream_t);
template cudaError_t LaunchActivationForward<double>(ActivationKind, const double*, double*, int64_t,
                                                     ActivationParams, cudaStream_t);
template cudaError_t LaunchActivationBackward<float>(ActivationKind, const float*, const float*, float*, int64_t,
                                                     ActivationParams, cudaStream_t);
template cudaError_t LaunchActivationBackward<double>(ActivationKind, const double*, const double*, double*, int64_t,
                                                      ActivationParams, cudaStream_t);

}  // namespace loom::cuda
