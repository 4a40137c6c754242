// CUDA kernels of ops/conv_ops.cc: Conv1d, Conv2d, ConvTranspose1d,
// ConvTranspose2d and their backward ops, through cuDNN's convolutions.
//
// The CPU ops are three products over one geometry: an image side
// [N, C, H, W], a column side [N, O, OH, OW] and a weight [O, C/groups, KH,
// KW]. They are exactly cuDNN's three calls: forward (image -> cols),
// backward data (cols -> image, the adjoint) and backward filter (the weight
// gradient). A transposed convolution is the adjoint seen from the column
// side, and PyTorch's weight layout for it is already [O, C/groups, ...] of
// that geometry. 1-D ops are 2-D ones with H = KH = 1.
//
// f32 runs in CUDNN_FMA_MATH (true FP32, no TF32), f64 in CUDNN_DATA_DOUBLE,
// bf16 / f16 (mixed precision) on tensor cores with f32 accumulation (the
// convolution descriptor's compute type), rounded once: a bias is written
// into the output first and the convolution accumulates onto it (beta = 1),
// as the CPU rounds conv + bias once.
// Algorithms come from cuDNN's heuristics (cudnnGet*_v7), not from timing
// (cudnnFind*): a choice made by timing could differ between runs and
// processes, and with it the rounding of every result. Only deterministic
// algorithms within kMaxWorkspaceBytes are taken, and the choice is cached
// per device, dtype, direction and every dim and attribute.
#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "ops/cuda/conv_kernels.h"

#include "core/logging.h"
#include "ops/conv_geometry.h"
#include "ops/cuda/cuda_kernel_util.h"

namespace loom::cuda {
namespace {

// ---------------------------------------------------------------------------
// Attributes and geometry: the CPU kernels' own (ops/conv_geometry.h).

using conv::ConvGeom;
using conv::ConvParams;
using conv::Product;

// cuDNN derives the column extent from the image: (H + 2P - span) / S + 1.
// The CPU geometry takes both as given, and they differ for transposed
// convolutions whose output_padding is at least the stride (allowed below
// the dilation): the image then has rows no column reaches. On such an axis
// cuDNN gets a zero-padded copy of the image instead, unpadded and exactly
// as long as the columns reach: row e of the copy is image row e - P.
struct CudnnView {
  ConvGeom geom;
  int64_t off_h = 0, off_w = 0;  // image row = copy row - off
  bool copied = false;
};

CudnnView ViewForCudnn(const ConvGeom& g) {
  CudnnView v{g};
  auto fit = [&](int64_t extent, int64_t k, int64_t s, int64_t p, int64_t d, int64_t cols, int64_t* copy_extent,
                 int64_t* pad, int64_t* off) {
    const int64_t span = d * (k - 1) + 1;
    if ((extent + 2 * p - span) / s + 1 == cols) return;
    *copy_extent = (cols - 1) * s + span;
    *pad = 0;
    *off = p;
    v.copied = true;
  };
  fit(g.h, g.kh, g.sh, g.ph, g.dh, g.oh, &v.geom.h, &v.geom.ph, &v.off_h);
  fit(g.w, g.kw, g.sw, g.pw, g.dw, g.ow, &v.geom.w, &v.geom.pw, &v.off_w);
  return v;
}

// ---------------------------------------------------------------------------
// cuDNN descriptors (RAII: every error path destroys what was created).

template <typename D, cudnnStatus_t (*kCreate)(D*), cudnnStatus_t (*kDestroy)(D)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() = default;
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  ~CudnnDescriptor() {
    if (desc_) kDestroy(desc_);
  }
  Status Create() {
    LOOM_CUDNN_RETURN_IF_ERROR(kCreate(&desc_));
    return Status::Ok();
  }
  D get() const { return desc_; }

 private:
  D desc_ = nullptr;
};
using TensorDescriptor =
    CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor =
    CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor = CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                              cudnnDestroyConvolutionDescriptor>;

struct ConvDescriptors {
  TensorDescriptor image, cols;
  FilterDescriptor filter;
  ConvolutionDescriptor conv;
};

// cuDNN's sizes and (NCHW-packed) strides are int.
Status CheckCudnnSizes(const ConvGeom& g) {
  const int64_t dims[] = {g.c, g.h, g.w, g.o, g.oh, g.ow, g.kh, g.kw, g.ph, g.pw, g.sh, g.sw, g.dh, g.dw, g.groups,
                          g.c * g.h * g.w, g.o * g.oh * g.ow, g.weight_numel()};
  for (int64_t d : dims)
    if (d > INT_MAX)
      return Unimplemented("cuDNN convolution: image [", g.n, ", ", g.c, ", ", g.h, ", ", g.w, "], columns [", g.n,
                           ", ", g.o, ", ", g.oh, ", ", g.ow, "]: a size or per-image stride exceeds cuDNN's 32 bits");
  return Status::Ok();
}

// What the heuristics may pick: f32 only FMA math (no TF32), f64 and the
// half types anything but down-conversion.
enum class ConvPrecision { kF32, kF64, kHalf };

template <typename T>
constexpr cudnnDataType_t CudnnDataType() {
  if constexpr (std::is_same_v<T, float>) return CUDNN_DATA_FLOAT;
  if constexpr (std::is_same_v<T, double>) return CUDNN_DATA_DOUBLE;
  if constexpr (std::is_same_v<T, BFloat16>) return CUDNN_DATA_BFLOAT16;
  if constexpr (std::is_same_v<T, Float16>) return CUDNN_DATA_HALF;
}

template <typename T>
constexpr ConvPrecision PrecisionOf() {
  if constexpr (std::is_same_v<T, float>) return ConvPrecision::kF32;
  if constexpr (std::is_same_v<T, double>) return ConvPrecision::kF64;
  return ConvPrecision::kHalf;
}

cudnnMathType_t DefaultMath(ConvPrecision p) {
  switch (p) {
    case ConvPrecision::kF32: return CUDNN_FMA_MATH;
    case ConvPrecision::kF64: return CUDNN_DEFAULT_MATH;
    case ConvPrecision::kHalf: return CUDNN_TENSOR_OP_MATH;
  }
  return CUDNN_DEFAULT_MATH;
}

Status MakeDescriptors(const ConvGeom& g, int64_t batch, cudnnDataType_t dt, ConvPrecision precision,
                       ConvDescriptors* d) {
  auto i = [](int64_t v) { return static_cast<int>(v); };
  LOOM_RETURN_IF_ERROR(d->image.Create());
  LOOM_RETURN_IF_ERROR(d->cols.Create());
  LOOM_RETURN_IF_ERROR(d->filter.Create());
  LOOM_RETURN_IF_ERROR(d->conv.Create());
  LOOM_CUDNN_RETURN_IF_ERROR(
      cudnnSetTensor4dDescriptor(d->image.get(), CUDNN_TENSOR_NCHW, dt, i(batch), i(g.c), i(g.h), i(g.w)));
  LOOM_CUDNN_RETURN_IF_ERROR(
      cudnnSetTensor4dDescriptor(d->cols.get(), CUDNN_TENSOR_NCHW, dt, i(batch), i(g.o), i(g.oh), i(g.ow)));
  LOOM_CUDNN_RETURN_IF_ERROR(cudnnSetFilter4dDescriptor(d->filter.get(), dt, CUDNN_TENSOR_NCHW, i(g.o),
                                                        i(g.c / g.groups), i(g.kh), i(g.kw)));
  // Half data accumulates in f32 (cuDNN's "pseudo half" configurations).
  const cudnnDataType_t compute = precision == ConvPrecision::kHalf ? CUDNN_DATA_FLOAT : dt;
  LOOM_CUDNN_RETURN_IF_ERROR(cudnnSetConvolution2dDescriptor(d->conv.get(), i(g.ph), i(g.pw), i(g.sh), i(g.sw),
                                                             i(g.dh), i(g.dw), CUDNN_CROSS_CORRELATION, compute));
  LOOM_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionGroupCount(d->conv.get(), i(g.groups)));
  // Heuristics answer for the math type set here: FMA keeps f32 off TF32.
  LOOM_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(d->conv.get(), DefaultMath(precision)));
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Algorithm choice.

enum class Direction { kForward, kBackwardData, kBackwardFilter };

constexpr size_t kMaxWorkspaceBytes = size_t{512} << 20;

struct AlgoChoice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

struct Candidate {
  int algo;
  cudnnMathType_t math;
};

using AlgoKey = std::array<int64_t, 19>;

AlgoKey KeyOf(int device, cudnnDataType_t dt, Direction dir, const ConvGeom& g, int64_t batch) {
  return {device, static_cast<int64_t>(dt), static_cast<int64_t>(dir), batch, g.c, g.h, g.w, g.o, g.oh, g.ow, g.kh,
          g.kw, g.ph, g.pw, g.sh, g.sw, g.dh, g.dw, g.groups};
}

// Process-wide, never freed (kernels may run during static destruction).
std::mutex& AlgoCacheMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<AlgoKey, AlgoChoice>& AlgoCache() {
  static auto* cache = new std::map<AlgoKey, AlgoChoice>;
  return *cache;
}

// Deterministic, succeeded, and in the precision the CPU computes in:
// f32 only FMA; f64 and half anything but down-conversion.
template <typename Perf>
bool Acceptable(const Perf& perf, ConvPrecision precision) {
  if (perf.status != CUDNN_STATUS_SUCCESS || perf.determinism != CUDNN_DETERMINISTIC) return false;
  return precision == ConvPrecision::kF32 ? perf.mathType == CUDNN_FMA_MATH
                                          : perf.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

template <typename Perf, typename GetCount, typename Get>
Status Heuristics(ConvPrecision precision, GetCount get_count, Get get, std::vector<Candidate>* out) {
  int max_count = 0;
  LOOM_CUDNN_RETURN_IF_ERROR(get_count(&max_count));
  std::vector<Perf> perf(static_cast<size_t>(std::max(max_count, 1)));
  int returned = 0;
  LOOM_CUDNN_RETURN_IF_ERROR(get(static_cast<int>(perf.size()), &returned, perf.data()));
  for (int i = 0; i < returned; ++i)
    if (Acceptable(perf[i], precision)) out->push_back({static_cast<int>(perf[i].algo), perf[i].mathType});
  return Status::Ok();
}

// The heuristics' deterministic candidates, best first, then the classic
// deterministic algorithms as a fallback should none of them fit.
Status Candidates(cudnnHandle_t h, Direction dir, const ConvDescriptors& d, ConvPrecision precision,
                  std::vector<Candidate>* out) {
  const cudnnMathType_t math = DefaultMath(precision);
  switch (dir) {
    case Direction::kForward:
      LOOM_RETURN_IF_ERROR(Heuristics<cudnnConvolutionFwdAlgoPerf_t>(
          precision, [&](int* n) { return cudnnGetConvolutionForwardAlgorithmMaxCount(h, n); },
          [&](int req, int* ret, cudnnConvolutionFwdAlgoPerf_t* p) {
            return cudnnGetConvolutionForwardAlgorithm_v7(h, d.image.get(), d.filter.get(), d.conv.get(),
                                                          d.cols.get(), req, ret, p);
          },
          out));
      for (auto algo : {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                        CUDNN_CONVOLUTION_FWD_ALGO_GEMM})
        out->push_back({static_cast<int>(algo), math});
      break;
    case Direction::kBackwardData:
      LOOM_RETURN_IF_ERROR(Heuristics<cudnnConvolutionBwdDataAlgoPerf_t>(
          precision, [&](int* n) { return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, n); },
          [&](int req, int* ret, cudnnConvolutionBwdDataAlgoPerf_t* p) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.filter.get(), d.cols.get(), d.conv.get(),
                                                               d.image.get(), req, ret, p);
          },
          out));
      out->push_back({static_cast<int>(CUDNN_CONVOLUTION_BWD_DATA_ALGO_1), math});
      break;
    case Direction::kBackwardFilter:
      LOOM_RETURN_IF_ERROR(Heuristics<cudnnConvolutionBwdFilterAlgoPerf_t>(
          precision, [&](int* n) { return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, n); },
          [&](int req, int* ret, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.image.get(), d.cols.get(), d.conv.get(),
                                                                 d.filter.get(), req, ret, p);
          },
          out));
      out->push_back({static_cast<int>(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1), math});
      break;
  }
  return Status::Ok();
}

// The workspace of `algo` under the descriptor's current math type; an
// error status means the algorithm cannot run this problem.
cudnnStatus_t WorkspaceSize(cudnnHandle_t h, Direction dir, const ConvDescriptors& d, int algo, size_t* bytes) {
  switch (dir) {
    case Direction::kForward:
      return cudnnGetConvolutionForwardWorkspaceSize(h, d.image.get(), d.filter.get(), d.conv.get(), d.cols.get(),
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
    case Direction::kBackwardData:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.filter.get(), d.cols.get(), d.conv.get(),
                                                          d.image.get(),
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
    case Direction::kBackwardFilter:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.image.get(), d.cols.get(), d.conv.get(),
                                                            d.filter.get(),
                                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

StatusOr<AlgoChoice> ChooseAlgo(cudnnHandle_t h, Direction dir, const ConvDescriptors& d, ConvPrecision precision,
                                const AlgoKey& key) {
  {
    std::lock_guard<std::mutex> lock(AlgoCacheMutex());
    auto it = AlgoCache().find(key);
    if (it != AlgoCache().end()) return it->second;
  }
  std::vector<Candidate> candidates;
  LOOM_RETURN_IF_ERROR(Candidates(h, dir, d, precision, &candidates));
  for (const Candidate& c : candidates) {
    LOOM_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(d.conv.get(), c.math));
    size_t bytes = 0;
    if (WorkspaceSize(h, dir, d, c.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kMaxWorkspaceBytes) continue;
    const AlgoChoice choice{c.algo, c.math, bytes};
    std::lock_guard<std::mutex> lock(AlgoCacheMutex());
    if (AlgoCache().emplace(key, choice).second)  // a racing thread's equal choice may already be there
      LOOM_LOG_INFO("cuDNN {} {} image [{}, {}, {}, {}]: algorithm {}, math type {}, {} bytes of workspace",
                    dir == Direction::kForward ? "forward" : dir == Direction::kBackwardData ? "backward data"
                                                                                             : "backward filter",
                    precision == ConvPrecision::kF32 ? "f32" : precision == ConvPrecision::kF64 ? "f64" : "half",
                    key[3], key[4], key[5], key[6], c.algo, static_cast<int>(c.math), bytes);
    return choice;
  }
  const char* kind = precision == ConvPrecision::kF32 ? "FP32 (FMA)"
                     : precision == ConvPrecision::kF64 ? "f64"
                                                        : "bf16 / f16";
  return Unimplemented("cuDNN has no deterministic ", kind, " convolution algorithm for ",
                       dir == Direction::kForward        ? "the forward pass"
                       : dir == Direction::kBackwardData ? "backward data"
                                                         : "backward filter",
                       " of image [", key[3], ", ", key[4], ", ", key[5], ", ", key[6], "] within ",
                       kMaxWorkspaceBytes >> 20, " MiB of workspace");
}

// One cuDNN convolution call of direction `dir` over g; the image and cols
// pointers are the whole batch, `out` is the image (backward data), the
// cols (forward) or the weight gradient (backward filter). Batches too
// large for cuDNN's int strides run in slices (the weight gradient adds the
// slices up in order). With `accumulate` the forward and backward-data
// results add onto what `out` holds.
template <typename T>
Status CudnnConvolution(const KernelContext& ctx, cudaStream_t stream, Direction dir, const ConvGeom& g,
                        const T* image, const T* weight, const T* cols, T* out, bool accumulate = false) {
  LOOM_RETURN_IF_ERROR(CheckCudnnSizes(g));
  constexpr ConvPrecision kPrecision = PrecisionOf<T>();
  constexpr cudnnDataType_t dt = CudnnDataType<T>();
  const int64_t image_per = g.c * g.h * g.w, cols_per = g.o * g.oh * g.ow;
  const int64_t slice = std::max<int64_t>(1, std::min<int64_t>(g.n, INT_MAX / std::max({image_per, cols_per,
                                                                                          int64_t{1}})));
  LOOM_ASSIGN_OR_RETURN(CudnnLease lease, AcquireCudnn(ctx.device.index, stream));
  const cudnnHandle_t h = lease.handle();
  for (int64_t n0 = 0; n0 < g.n; n0 += slice) {
    const int64_t batch = std::min(slice, g.n - n0);
    ConvDescriptors d;
    LOOM_RETURN_IF_ERROR(MakeDescriptors(g, batch, dt, kPrecision, &d));
    LOOM_ASSIGN_OR_RETURN(AlgoChoice choice,
                          ChooseAlgo(h, dir, d, kPrecision, KeyOf(ctx.device.index, dt, dir, g, batch)));
    LOOM_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(d.conv.get(), choice.math));
    Tensor workspace;
    if (choice.workspace > 0) {
      LOOM_ASSIGN_OR_RETURN(workspace, Tensor::Empty(Shape({static_cast<int64_t>((choice.workspace + 7) / 8)}),
                                                     DType::kF64, ctx.device));
    }
    void* ws = choice.workspace > 0 ? workspace.raw_data() : nullptr;
    // Scaling factors are double for double data, float otherwise.
    using Scale = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const Scale one = 1, zero = 0;
    const Scale* beta = accumulate ? &one : &zero;
    switch (dir) {
      case Direction::kForward:
        LOOM_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(
            h, &one, d.image.get(), image + n0 * image_per, d.filter.get(), weight, d.conv.get(),
            static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo), ws, choice.workspace, beta, d.cols.get(),
            out + n0 * cols_per));
        break;
      case Direction::kBackwardData:
        LOOM_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(
            h, &one, d.filter.get(), weight, d.cols.get(), cols + n0 * cols_per, d.conv.get(),
            static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo), ws, choice.workspace, beta, d.image.get(),
            out + n0 * image_per));
        break;
      case Direction::kBackwardFilter:
        LOOM_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
            h, &one, d.image.get(), image + n0 * image_per, d.cols.get(), cols + n0 * cols_per, d.conv.get(),
            static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo), ws, choice.workspace, n0 == 0 ? &zero : &one,
            d.filter.get(), out));
        break;
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// The three products, with the CPU ops' biases and empty-tensor results.

// The zero-padded copy of `image` that cuDNN reads for view v.
template <typename T>
StatusOr<Tensor> CopyIntoView(const KernelContext& ctx, cudaStream_t stream, const ConvGeom& g, const CudnnView& v,
                              const T* image) {
  LOOM_ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(Shape({g.n, g.c, v.geom.h, v.geom.w}), DTypeOf<T>::value,
                                                   ctx.device));
  PlaneWindow win;
  win.planes = g.n * g.c;
  win.src_h = g.h;
  win.src_w = g.w;
  win.dst_h = v.geom.h;
  win.dst_w = v.geom.w;
  win.off_h = -v.off_h;
  win.off_w = -v.off_w;
  LOOM_CUDA_RETURN_IF_ERROR(LaunchPlaneWindowCopy<T>(win, image, nullptr, copy.data<T>(), stream));
  return copy;
}

// cols [N, O, OH, OW] = conv(image) (+ bias [O]).
template <typename T>
Status Forward(const KernelContext& ctx, cudaStream_t stream, const ConvGeom& g, const T* image, const T* weight,
               const T* bias, T* cols) {
  if (g.cols_numel() == 0) return Status::Ok();
  if (g.image_numel() == 0 || g.weight_numel() == 0) {  // empty sums
    LOOM_CUDA_RETURN_IF_ERROR(LaunchChannelBias<T>(cols, bias, g.n, g.o, g.oh * g.ow, false, stream));
    return Status::Ok();
  }
  const CudnnView v = ViewForCudnn(g);
  Tensor copy;
  if (v.copied) {
    LOOM_ASSIGN_OR_RETURN(copy, CopyIntoView(ctx, stream, g, v, image));
  }
  // The bias first, the convolution onto it: one rounding.
  if (bias) LOOM_CUDA_RETURN_IF_ERROR(LaunchChannelBias<T>(cols, bias, g.n, g.o, g.oh * g.ow, false, stream));
  return CudnnConvolution<T>(ctx, stream, Direction::kForward, v.geom, v.copied ? copy.data<T>() : image, weight,
                             nullptr, cols, /*accumulate=*/bias != nullptr);
}

// image [N, C, H, W] = the adjoint of conv applied to cols (+ bias [C]).
template <typename T>
Status Adjoint(const KernelContext& ctx, cudaStream_t stream, const ConvGeom& g, const T* cols, const T* weight,
               const T* bias, T* image) {
  if (g.image_numel() == 0) return Status::Ok();
  if (g.cols_numel() == 0 || g.weight_numel() == 0) {
    LOOM_CUDA_RETURN_IF_ERROR(LaunchChannelBias<T>(image, bias, g.n, g.c, g.h * g.w, false, stream));
    return Status::Ok();
  }
  const CudnnView v = ViewForCudnn(g);
  if (!v.copied) {
    if (bias) LOOM_CUDA_RETURN_IF_ERROR(LaunchChannelBias<T>(image, bias, g.n, g.c, g.h * g.w, false, stream));
    return CudnnConvolution<T>(ctx, stream, Direction::kBackwardData, g, nullptr, weight, cols, image,
                               /*accumulate=*/bias != nullptr);
  }
  // Into the view's planes, then back to the image (rows past the view's
  // reach get zero) with the bias on the way. (Half types round twice here,
  // the planes and then the bias: within one ulp of the CPU.)
  LOOM_ASSIGN_OR_RETURN(Tensor planes, Tensor::Empty(Shape({g.n, g.c, v.geom.h, v.geom.w}), DTypeOf<T>::value,
                                                     ctx.device));
  LOOM_RETURN_IF_ERROR(
      CudnnConvolution<T>(ctx, stream, Direction::kBackwardData, v.geom, nullptr, weight, cols, planes.data<T>()));
  PlaneWindow win;
  win.planes = g.n * g.c;
  win.channels = g.c;
  win.src_h = v.geom.h;
  win.src_w = v.geom.w;
  win.dst_h = g.h;
  win.dst_w = g.w;
  win.off_h = v.off_h;
  win.off_w = v.off_w;
  LOOM_CUDA_RETURN_IF_ERROR(LaunchPlaneWindowCopy<T>(win, planes.data<T>(), bias, image, stream));
  return Status::Ok();
}

// dw [O, C/groups, KH, KW] = the weight gradient of conv over the batch.
template <typename T>
Status WeightGrad(const KernelContext& ctx, cudaStream_t stream, const ConvGeom& g, const T* image, const T* cols,
                  T* dw) {
  if (g.weight_numel() == 0) return Status::Ok();
  if (g.image_numel() == 0 || g.cols_numel() == 0) {
    LOOM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(dw, 0, static_cast<size_t>(g.weight_numel()) * sizeof(T), stream));
    return Status::Ok();
  }
  const CudnnView v = ViewForCudnn(g);
  Tensor copy;
  if (v.copied) {
    LOOM_ASSIGN_OR_RETURN(copy, CopyIntoView(ctx, stream, g, v, image));
  }
  return CudnnConvolution<T>(ctx, stream, Direction::kBackwardFilter, v.geom, v.copied ? copy.data<T>() : image,
                             nullptr, cols, dw);
}

// The product of conv::kKernelRoles; `transpose` (the ConvTranspose family)
// only swaps which input is the image in the weight gradient, as on the CPU.
Status ConvKernel(KernelContext& ctx, Product product, bool transpose) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  const Tensor* bias = ctx.inputs.size() > 2 ? &ctx.in(2) : nullptr;
  Tensor& out = ctx.out(0);
  const int sd = a.shape().rank() - 2;
  if (sd != 1 && sd != 2) return InvalidArgument("convolution kernel: expected 1 or 2 spatial dims, got ", sd);
  LOOM_ASSIGN_OR_RETURN(ConvParams p, conv::ParseConvParams(*ctx.attrs, "convolution kernel", sd, transpose));
  const ConvGeom g = conv::ProductGeom(p, product, transpose, a.shape(), b.shape(), out.shape());
  const char* op = ctx.node ? ctx.node->op.c_str() : "convolution";
  return DispatchCudaFloatOrHalf(out.dtype(), op, [&](auto zero) -> Status {
    using T = decltype(zero);
    const T* pb = bias ? bias->data<T>() : nullptr;
    switch (product) {
      case Product::kForward:  // (image, w[, bias]) -> cols
        return Forward<T>(ctx, stream, g, a.data<T>(), b.data<T>(), pb, out.data<T>());
      case Product::kAdjoint:  // (cols, w[, bias]) -> image
        return Adjoint<T>(ctx, stream, g, a.data<T>(), b.data<T>(), pb, out.data<T>());
      case Product::kWeightGrad: {  // (x, dy) -> dw
        const Tensor& image = transpose ? b : a;
        const Tensor& cols = transpose ? a : b;
        return WeightGrad<T>(ctx, stream, g, image.data<T>(), cols.data<T>(), out.data<T>());
      }
    }
    return Internal("unknown convolution product");
  });
}

const bool kConvKernelsRegistered = [] {
  for (const conv::KernelRole& role : conv::kKernelRoles) {
    OpRegistry::Global().RegisterKernel(role.op, DeviceType::kCuda, [role](KernelContext& ctx) {
      return ConvKernel(ctx, role.product, role.transpose);
    });
    OpRegistry::Global().RegisterKernelSupport(role.op, DeviceType::kCuda, HalfFloatKernelSupport());
  }
  return true;
}();

// db [C] = dy [N, C, spatial...] summed over all dims but 1.
Status BiasGradKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& dy = ctx.in(0);
  Tensor& db = ctx.out(0);
  const int64_t n = dy.shape()[0], c = dy.shape()[1], s = c * n == 0 ? 0 : dy.numel() / (n * c);
  return DispatchCudaFloatOrHalf(db.dtype(), "ConvBackwardBias", [&](auto zero) -> Status {
    using T = decltype(zero);
    using Acc = ConvAcc<T>;
    const int64_t chunks = ChannelSumChunks(n * s, c);
    Tensor partial;
    if (chunks > 1) {
      LOOM_ASSIGN_OR_RETURN(partial, Tensor::Empty(Shape({c * chunks}), DTypeOf<Acc>::value, ctx.device));
    }
    LOOM_CUDA_RETURN_IF_ERROR(LaunchChannelSum<T>(dy.data<T>(), n, c, s, chunks,
                                                  chunks > 1 ? partial.data<Acc>() : nullptr, db.data<T>(), stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("ConvBackwardBias", DeviceType::kCuda, BiasGradKernel);
LOOM_REGISTER_KERNEL_SUPPORT("ConvBackwardBias", DeviceType::kCuda, HalfFloatKernelSupport());

}  // namespace
}  // namespace loom::cuda
