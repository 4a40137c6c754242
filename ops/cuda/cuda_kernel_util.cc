#include "ops/cuda/cuda_kernel_util.h"

#include <algorithm>
#include <map>
#include <memory>

#include "ops/cpu_util.h"

namespace loom::cuda {

StatusOr<cudaStream_t> KernelStream(const KernelContext& ctx) {
  const std::string where = ctx.node ? "node '" + ctx.node->name + "' (" + ctx.node->op + ")" : std::string("CUDA kernel");
  if (!ctx.device.is_cuda()) return Internal(where, ": CUDA kernel called for ", ctx.device.ToString());
  auto check = [&](const Tensor* t, const char* kind, size_t i) -> Status {
    if (t && t->defined() && t->device() != ctx.device)
      return Internal(where, ": ", kind, " ", i, " is on ", t->device().ToString(), ", the kernel runs on ",
                      ctx.device.ToString());
    return Status::Ok();
  };
  for (size_t i = 0; i < ctx.inputs.size(); ++i) LOOM_RETURN_IF_ERROR(check(ctx.inputs[i], "input", i));
  for (size_t i = 0; i < ctx.outputs.size(); ++i) LOOM_RETURN_IF_ERROR(check(ctx.outputs[i], "output", i));
  LOOM_RETURN_IF_ERROR(SetDevice(ctx.device.index));
  if (ctx.stream) return static_cast<cudaStream_t>(ctx.stream);
  return CurrentStream(ctx.device.index);
}

Status CopyKernel(KernelContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(cudaStream_t stream, KernelStream(ctx));
  const Tensor& x = ctx.in(0);
  Tensor& y = ctx.out(0);
  if (x.nbytes() == 0 || y.raw_data() == x.raw_data()) return Status::Ok();
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y.raw_data(), x.raw_data(), x.nbytes(), cudaMemcpyDeviceToDevice, stream));
  return Status::Ok();
}

std::string CublasErrorMessage(cublasStatus_t status, const char* expr, const char* file, int line) {
  return StrCat(cublasGetStatusName(status), " (", cublasGetStatusString(status), ") in `", expr, "` at ", file, ":",
                line);
}

std::string CudnnErrorMessage(cudnnStatus_t status, const char* expr, const char* file, int line) {
  return StrCat(cudnnGetErrorString(status), " in `", expr, "` at ", file, ":", line);
}

namespace {

template <typename Handle>
struct HandleEntry {
  std::mutex mu;
  Handle handle = nullptr;  // created on first use; kept for the process
};

// The entry of (`device`, `stream`) in a per-library table (never freed:
// handles outlive static destruction order). A handle per stream: streams
// that run at once (the task runtime's devices on one GPU) neither wait for
// each other's lock nor share cuBLAS's workspace, which belongs to a handle.
template <typename Handle>
HandleEntry<Handle>* FindEntry(int device, cudaStream_t stream) {
  static std::mutex* table_mu = new std::mutex;
  static auto* table = new std::map<std::pair<int, cudaStream_t>, std::unique_ptr<HandleEntry<Handle>>>;
  std::lock_guard<std::mutex> lock(*table_mu);
  std::unique_ptr<HandleEntry<Handle>>& slot = (*table)[{device, stream}];
  if (!slot) slot = std::make_unique<HandleEntry<Handle>>();
  return slot.get();
}

}  // namespace

StatusOr<CublasLease> AcquireCublas(int device, cudaStream_t stream) {
  HandleEntry<cublasHandle_t>* entry = FindEntry<cublasHandle_t>(device, stream);
  std::unique_lock<std::mutex> lock(entry->mu);
  if (!entry->handle) {
    LOOM_RETURN_IF_ERROR(SetDevice(device));
    cublasHandle_t handle = nullptr;
    LOOM_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle));
    // Split-K reductions in the accumulator's type, never in a bf16 / fp16
    // output's: f32 accumulation rounded once, as the CPU's half GEMMs.
    LOOM_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
        handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    entry->handle = handle;
  }
  LOOM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(entry->handle, stream));
  return CublasLease(std::move(lock), entry->handle);
}

StatusOr<CudnnLease> AcquireCudnn(int device, cudaStream_t stream) {
  HandleEntry<cudnnHandle_t>* entry = FindEntry<cudnnHandle_t>(device, stream);
  std::unique_lock<std::mutex> lock(entry->mu);
  if (!entry->handle) {
    LOOM_RETURN_IF_ERROR(SetDevice(device));
    cudnnHandle_t handle = nullptr;
    LOOM_CUDNN_RETURN_IF_ERROR(cudnnCreate(&handle));
    entry->handle = handle;
  }
  LOOM_CUDNN_RETURN_IF_ERROR(cudnnSetStream(entry->handle, stream));
  return CudnnLease(std::move(lock), entry->handle);
}

namespace {

// One dim of an index: its extent and a stride per operand.
struct IndexDim {
  int64_t extent;
  int64_t stride[2];
};

// Merges each dim into the next-inner one where every operand walks the
// pair as one contiguous run (or broadcasts both); returns outermost first.
std::vector<IndexDim> Coalesce(const std::vector<IndexDim>& dims, int operands) {
  std::vector<IndexDim> inner_first;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    bool merge = !inner_first.empty();
    for (int k = 0; merge && k < operands; ++k)
      merge = it->stride[k] == inner_first.back().stride[k] * inner_first.back().extent;
    if (merge) {
      inner_first.back().extent *= it->extent;
    } else {
      inner_first.push_back(*it);
    }
  }
  return {inner_first.rbegin(), inner_first.rend()};
}

}  // namespace

StatusOr<BroadcastIndex> MakeBroadcastIndex(const Shape& out, const std::vector<Shape>& operands) {
  const int k = static_cast<int>(operands.size());
  if (k < 1 || k > 2) return Internal("MakeBroadcastIndex takes 1 or 2 operands, got ", k);
  std::vector<std::vector<int64_t>> strides;
  for (const Shape& s : operands) {
    if (s.rank() > out.rank()) return InvalidArgument("operand ", s.ToString(), " has a higher rank than ", out.ToString());
    strides.push_back(BroadcastStrides(s, out));
  }
  std::vector<IndexDim> dims;
  for (int d = 0; d < out.rank(); ++d) {
    if (out[d] == 1) continue;
    IndexDim dim{out[d], {0, 0}};
    for (int i = 0; i < k; ++i) dim.stride[i] = strides[i][d];
    dims.push_back(dim);
  }
  dims = Coalesce(dims, k);
  if (dims.empty()) dims.push_back({1, {0, 0}});  // a single element
  if (dims.size() > static_cast<size_t>(kMaxKernelRank))
    return Unimplemented("CUDA broadcast to ", out.ToString(), " needs ", dims.size(), " index dims; the kernels take ",
                         kMaxKernelRank);
  BroadcastIndex index;
  index.rank = static_cast<int>(dims.size());
  for (int d = 0; d < index.rank; ++d) {
    index.dims[d] = dims[d].extent;
    index.strides[0][d] = dims[d].stride[0];
    index.strides[1][d] = dims[d].stride[1];
  }
  return index;
}

StatusOr<ReduceIndex> MakeReduceIndex(const Shape& in, const Shape& target) {
  const int offset = in.rank() - target.rank();
  if (offset < 0) return InvalidArgument("SumToShape: ", target.ToString(), " has a higher rank than ", in.ToString());
  const std::vector<int64_t> strides = in.Strides();
  std::vector<IndexDim> kept, reduced;
  for (int d = 0; d < in.rank(); ++d) {
    const int64_t extent = in[d];
    const int64_t want = d >= offset ? target[d - offset] : 1;
    if (extent == 1) continue;
    if (want == extent) {
      kept.push_back({extent, {strides[d], 0}});
    } else if (want == 1) {
      reduced.push_back({extent, {strides[d], 0}});
    } else {
      return InvalidArgument("SumToShape: ", target.ToString(), " does not broadcast to ", in.ToString());
    }
  }
  kept = Coalesce(kept, 1);
  reduced = Coalesce(reduced, 1);
  if (kept.size() > static_cast<size_t>(kMaxKernelRank) || reduced.size() > static_cast<size_t>(kMaxKernelRank))
    return Unimplemented("CUDA SumToShape from ", in.ToString(), " to ", target.ToString(), " needs more than ",
                         kMaxKernelRank, " index dims");
  ReduceIndex index;
  index.kept_rank = static_cast<int>(kept.size());
  for (int d = 0; d < index.kept_rank; ++d) {
    index.kept_dims[d] = kept[d].extent;
    index.kept_strides[d] = kept[d].stride[0];
  }
  index.reduced_rank = static_cast<int>(reduced.size());
  for (int d = 0; d < index.reduced_rank; ++d) {
    index.reduced_dims[d] = reduced[d].extent;
    index.reduced_strides[d] = reduced[d].stride[0];
  }
  return index;
}

}  // namespace loom::cuda
