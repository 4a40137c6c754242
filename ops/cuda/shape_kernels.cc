// CUDA kernels of ops/shape_ops.cc, with the CPU kernels' semantics. They
// move elements of any dtype (by element size): Transpose / Permute merge
// dims like the CPU kernel, then a tiled transpose or a gather; Flatten is a
// copy (none when aliased); Concat, Split, Slice and SliceBackward are
// strided copies of [outer, count, inner] slabs.
#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_kernel_util.h"
#include "ops/cuda/shape_kernels.h"
#include "ops/shape_geometry.h"

namespace loom::cuda {
namespace {

using shape_ops::AxisSplit;
using shape_ops::MergePermutedDims;
using shape_ops::PermutedDims;
using shape_ops::ResolvePerm;
using shape_ops::ResolveSlice;
using shape_ops::SliceRange;
using shape_ops::SplitAt;

char* Bytes(void* p, int64_t elements, int64_t elem_size) { return static_cast<char*>(p) + elements * elem_size; }
const char* Bytes(const void* p, int64_t elements, int64_t elem_size) {
  return static_cast<const char*>(p) + elements * elem_size;
}

// dst[o, dst_start + i * dst_step, :] = src[o, src_start + i * src_step, :]
// for o < outer, i < count, with `inner`-element slabs and src_len / dst_len
// slabs per outer index on each side.
Status CopySlabs(const void* src, int64_t src_len, int64_t src_start, int64_t src_step, void* dst, int64_t dst_len,
                 int64_t dst_start, int64_t dst_step, int64_t outer, int64_t count, int64_t inner, int64_t elem_size,
                 cudaStream_t stream) {
  if (outer == 0 || count == 0 || inner == 0) return Status::Ok();
  StridedCopy c;
  c.dims[0] = outer;
  c.dims[1] = count;
  c.dims[2] = inner;
  c.src_strides[0] = src_len * inner;
  c.src_strides[1] = src_step * inner;
  c.dst_strides[0] = dst_len * inner;
  c.dst_strides[1] = dst_step * inner;
  LOOM_CUDA_RETURN_IF_ERROR(LaunchStridedCopy(Bytes(src, src_start * inner, elem_size),
                                              Bytes(dst, dst_start * inner, elem_size), elem_size, c, stream));
  return Status::Ok();
}

int64_t ElemSize(const Tensor& t) { return static_cast<int64_t>(DTypeSize(t.dtype())); }

// ---------------------------------------------------------------- Transpose

Status TransposeKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  if (x.numel() == 0) return Status::Ok();
  // The permutation was validated by InferTypes.
  const std::vector<int> perm = ResolvePerm("Transpose", *ctx.attrs, x.shape()).value();
  // As the CPU kernel: unit dims dropped, output dims adjacent in x merged.
  const PermutedDims merged = MergePermutedDims(x.shape(), perm);
  const std::vector<int64_t>& dims = merged.dims;
  const std::vector<int64_t>& strides = merged.strides;
  if (dims.size() <= 1) return CopyKernel(ctx);  // the element order is unchanged
  if (dims.size() > static_cast<size_t>(kMaxPermuteRank))
    return Unimplemented("CUDA Transpose: ", dims.size(), " dims after merging, at most ", kMaxPermuteRank);
  PermuteIndex index;
  index.rank = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), index.dims);
  std::copy(strides.begin(), strides.end(), index.x_strides);
  LOOM_CUDA_RETURN_IF_ERROR(LaunchPermute(x.raw_data(), ctx.out(0).raw_data(), ElemSize(x), index, stream));
  return Status::Ok();
}
LOOM_REGISTER_KERNEL("Transpose", DeviceType::kCuda, TransposeKernel);
LOOM_REGISTER_KERNEL("Permute", DeviceType::kCuda, TransposeKernel);
LOOM_REGISTER_KERNEL("Flatten", DeviceType::kCuda, CopyKernel);

// ------------------------------------------------------------ Concat, Split

LOOM_REGISTER_KERNEL("Concat", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  Tensor& y = ctx.out(0);
  const int axis = NormalizeAxis(ctx.attrs->Int("axis"), y.shape().rank()).value();
  const AxisSplit ys = SplitAt(y.shape(), axis);
  int64_t offset = 0;
  for (const Tensor* x : ctx.inputs) {
    const int64_t len = x->shape()[axis];
    LOOM_RETURN_IF_ERROR(CopySlabs(x->raw_data(), len, 0, 1, y.raw_data(), ys.len, offset, 1, ys.outer, len, ys.inner,
                                   ElemSize(y), stream));
    offset += len;
  }
  return Status::Ok();
});

LOOM_REGISTER_KERNEL("Split", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  const int axis = NormalizeAxis(ctx.attrs->Int("axis"), x.shape().rank()).value();
  const AxisSplit xs = SplitAt(x.shape(), axis);
  int64_t offset = 0;
  for (Tensor* y : ctx.outputs) {
    const int64_t len = y->shape()[axis];
    LOOM_RETURN_IF_ERROR(CopySlabs(x.raw_data(), xs.len, offset, 1, y->raw_data(), len, 0, 1, xs.outer, len, xs.inner,
                                   ElemSize(x), stream));
    offset += len;
  }
  return Status::Ok();
});

// -------------------------------------------------------- Slice (+backward)

LOOM_REGISTER_KERNEL("Slice", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  const SliceRange r = ResolveSlice("Slice", *ctx.attrs, x.shape()).value();  // validated by InferTypes
  const AxisSplit xs = SplitAt(x.shape(), r.axis);
  return CopySlabs(x.raw_data(), xs.len, r.start, r.step, ctx.out(0).raw_data(), r.count, 0, 1, xs.outer, r.count,
                   xs.inner, ElemSize(x), stream);
});

LOOM_REGISTER_KERNEL("SliceBackward", DeviceType::kCuda, [](KernelContext& ctx) -> Status {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  Tensor& dx = ctx.out(0);
  const SliceRange r = ResolveSlice("SliceBackward", *ctx.attrs, dx.shape()).value();
  const AxisSplit xs = SplitAt(dx.shape(), r.axis);
  // All-zero bytes are zero in every dtype.
  if (dx.nbytes() > 0) LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), stream));
  return CopySlabs(ctx.in(0).raw_data(), r.count, 0, 1, dx.raw_data(), xs.len, r.start, r.step, xs.outer, r.count,
                   xs.inner, ElemSize(dx), stream);
});

// Shape ops move elements of any size: every dtype, as on the CPU.
LOOM_REGISTER_KERNEL_SUPPORT("Transpose", DeviceType::kCuda, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Permute", DeviceType::kCuda, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Flatten", DeviceType::kCuda, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Concat", DeviceType::kCuda, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Split", DeviceType::kCuda, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("Slice", DeviceType::kCuda, AnyDTypeSupport());
LOOM_REGISTER_KERNEL_SUPPORT("SliceBackward", DeviceType::kCuda, AnyDTypeSupport());

}  // namespace
}  // namespace loom::cuda
