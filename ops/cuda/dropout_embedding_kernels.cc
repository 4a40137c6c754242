// CUDA kernels of ops/dropout_embedding_ops.cc, with the CPU kernels'
// semantics: Dropout draws the CPU's mask bit for bit (the same counter-based
// keys and comparison), Embedding gathers rows, EmbeddingBackward sums rows
// deterministically (a stable sort of the indices, then one ordered sum per
// dw element: the CPU's summation order).
//
// Out-of-range indices: the CPU fails the step with InvalidArgument naming
// the first bad index. The kernels never read out of bounds; they lower a
// device flag to the first bad position, and the wrapper reads it back (8
// bytes, which synchronizes the stream) to return the CPU's error. That sync
// per call is the price of reporting the error as a Status of this step.
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/dropout_embedding_kernels.h"
#include "ops/dropout_embedding_util.h"

namespace loom::cuda {
namespace {

// ---------------------------------------------------------------- Dropout

using dropout_embedding::DispatchIndex;
using dropout_embedding::DropoutActive;
using dropout_embedding::DropoutKeys;
using dropout_embedding::IndexOutOfRange;
using dropout_embedding::MakeDropoutKeys;

Status DropoutKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  const double p = ctx.attrs->Float("p");
  const bool active = DropoutActive(*ctx.attrs);
  const int64_t n = x.numel();
  if (active && !ctx.rng) return Internal("Dropout: the executor gave no random stream");
  // The keys exactly as the CPU kernel makes them (ops/dropout_embedding_util.h).
  const DropoutKeys draw = active ? MakeDropoutKeys(ctx) : DropoutKeys{};
  const std::vector<uint64_t>& keys = draw.keys;
  DropoutIndex index;
  index.replicas = draw.replicas;
  index.inner = draw.inner;
  // A part's first draw index in the whole tensor, as the CPU kernel adds it.
  index.offset = static_cast<uint64_t>(ctx.attrs->Has("offset") ? ctx.attrs->Int("offset") : 0);
  index.run = ctx.attrs->Int("run", 0);
  index.run_stride = ctx.attrs->Int("run_stride", 0);
  if (index.run > 0 && index.replicas > 1) return Internal("Dropout: a fused part in runs");
  return DispatchCudaFloat(x.dtype(), "Dropout", [&](auto zero) -> Status {
    using T = decltype(zero);
    T* y = ctx.out(0).data<T>();
    T* mask = ctx.out(1).data<T>();
    if (!active) {
      if (n > 0 && y != x.data<T>())
        LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y, x.data<T>(), x.nbytes(), cudaMemcpyDeviceToDevice, stream));
      LOOM_CUDA_RETURN_IF_ERROR(LaunchFill(mask, n, T(1), stream));
      return Status::Ok();
    }
    if (n == 0) return Status::Ok();
    // u < p with u = k * 2^-53 is k < p * 2^53 (exact: a power-of-two
    // scaling), i.e. k < ceil(p * 2^53) for the integer k.
    index.threshold = static_cast<uint64_t>(std::ceil(std::ldexp(p, 53)));
    Tensor device_keys;
    if (keys.size() <= static_cast<size_t>(DropoutIndex::kInlineKeys)) {
      std::copy(keys.begin(), keys.end(), index.inline_keys);
    } else {
      LOOM_ASSIGN_OR_RETURN(device_keys,
                            Tensor::Empty(Shape({static_cast<int64_t>(keys.size())}), DType::kI64, ctx.device));
      // From pageable memory: staged before the call returns, so `keys` may go.
      LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_keys.raw_data(), keys.data(), keys.size() * sizeof(uint64_t),
                                                cudaMemcpyHostToDevice, stream));
      index.keys = static_cast<const uint64_t*>(device_keys.raw_data());
    }
    const T scale = p < 1 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchDropout(x.data<T>(), y, mask, n, scale, index, stream));
    return Status::Ok();
  });
}
LOOM_REGISTER_KERNEL("Dropout", DeviceType::kCuda, DropoutKernel);

// -------------------------------------------------------------- Embedding

// A device u64 preset to ~0, which the kernels lower to the first bad position.
StatusOr<Tensor> NewBadFlag(const KernelContext& ctx, cudaStream_t stream) {
  LOOM_ASSIGN_OR_RETURN(Tensor flag, Tensor::Empty(Shape({1}), DType::kI64, ctx.device));
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag.raw_data(), 0xff, sizeof(uint64_t), stream));
  return flag;
}

// Waits for the flag; the CPU kernel's InvalidArgument if it was lowered.
template <typename I>
Status CheckBadFlag(const char* op, const Tensor& flag, const Tensor& indices, int64_t num_embeddings,
                    cudaStream_t stream) {
  unsigned long long first_bad = 0;
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&first_bad, flag.raw_data(), sizeof(first_bad), cudaMemcpyDeviceToHost,
                                            stream));
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (first_bad == ~0ull) return Status::Ok();
  const int64_t at = static_cast<int64_t>(first_bad);
  I value = 0;
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&value, indices.data<I>() + at, sizeof(I), cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return IndexOutOfRange(op, static_cast<int64_t>(value), at, indices.shape(), num_embeddings);
}

// A part of a vocabulary split (attrs vocab_offset, vocab_size) runs on
// CPU devices only so far: refused by name rather than read wrong.
Status ExpectWholeVocabulary(const char* op, const KernelContext& ctx, int64_t rows) {
  const int64_t offset = ctx.attrs->Int("vocab_offset"), size = ctx.attrs->Int("vocab_size");
  if (offset == 0 && (size == -1 || size == rows)) return Status::Ok();
  return Unimplemented(op, ": a part of a vocabulary split (vocab_offset ", offset, ", vocab_size ", size,
                       ") has no CUDA kernel yet; it runs on CPU devices");
}

Status EmbeddingKernel(KernelContext& ctx) {
  LOOM_RETURN_IF_ERROR(ExpectWholeVocabulary("Embedding", ctx, ctx.in(1).shape()[0]));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& indices = ctx.in(0);
  const Tensor& weight = ctx.in(1);
  const int64_t num = weight.shape()[0];
  const int64_t row_bytes = weight.shape()[1] * static_cast<int64_t>(DTypeSize(weight.dtype()));
  const int64_t n = indices.numel();
  if (n == 0) return Status::Ok();
  LOOM_ASSIGN_OR_RETURN(Tensor flag, NewBadFlag(ctx, stream));
  auto* first_bad = static_cast<unsigned long long*>(flag.raw_data());
  return DispatchIndex(indices.dtype(), [&](auto zero) -> Status {
    using I = decltype(zero);
    LOOM_CUDA_RETURN_IF_ERROR(LaunchEmbedding(indices.data<I>(), weight.raw_data(), ctx.out(0).raw_data(), n, num,
                                              row_bytes, first_bad, stream));
    return CheckBadFlag<I>("Embedding", flag, indices, num, stream);
  });
}
LOOM_REGISTER_KERNEL("Embedding", DeviceType::kCuda, EmbeddingKernel);

Status EmbeddingBackwardKernel(KernelContext& ctx) {
  LOOM_RETURN_IF_ERROR(ExpectWholeVocabulary("EmbeddingBackward", ctx, ctx.out(0).shape()[0]));
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& dy = ctx.in(0);
  const Tensor& indices = ctx.in(1);
  Tensor& dw = ctx.out(0);
  const int64_t num = dw.shape()[0], dim = dw.shape()[1];
  const int64_t padding_idx = ctx.attrs->Int("padding_idx");
  const int64_t n = indices.numel();
  LOOM_ASSIGN_OR_RETURN(Tensor flag, NewBadFlag(ctx, stream));
  auto* first_bad = static_cast<unsigned long long*>(flag.raw_data());
  const size_t workspace_bytes = n > 0 && dim > 0 ? EmbeddingBackwardWorkspaceBytes(n, num) : 0;
  Tensor workspace;
  if (workspace_bytes > 0) {
    const int64_t words = static_cast<int64_t>((workspace_bytes + 7) / 8);
    LOOM_ASSIGN_OR_RETURN(workspace, Tensor::Empty(Shape({words}), DType::kI64, ctx.device));
  }
  void* workspace_data = workspace_bytes > 0 ? workspace.raw_data() : nullptr;
  return DispatchCudaFloat(dw.dtype(), "EmbeddingBackward", [&](auto zero) -> Status {
    using T = decltype(zero);
    return DispatchIndex(indices.dtype(), [&](auto izero) -> Status {
      using I = decltype(izero);
      LOOM_CUDA_RETURN_IF_ERROR(LaunchEmbeddingBackward(dy.data<T>(), indices.data<I>(), dw.data<T>(), n, num, dim,
                                                        padding_idx, workspace_data, workspace_bytes, first_bad,
                                                        stream));
      if (n == 0) return Status::Ok();
      return CheckBadFlag<I>("EmbeddingBackward", flag, indices, num, stream);
    });
  });
}
LOOM_REGISTER_KERNEL("EmbeddingBackward", DeviceType::kCuda, EmbeddingBackwardKernel);

}  // namespace
}  // namespace loom::cuda
