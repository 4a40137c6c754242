#include "runtime/comm/nccl_communicator.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "core/cuda/cuda_device.h"
#include "core/logging.h"

namespace loom {

struct NcclGroupState {
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::string message;  // why, once aborted
};

namespace {

const char* NcclResultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t";
  }
}

Status NcclStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  if (result == ncclSuccess) return Status::Ok();
  return Internal(NcclErrorMessage(result, expr, file, line));
}

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kBF16:
    case DType::kF16: return ncclFloat16;  // moved as 16 bits, never reduced (comm::CheckReduce)
    case DType::kBool: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMean: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

size_t Count(const Tensor& t) { return static_cast<size_t>(t.numel()); }

}  // namespace

// An NCCL call of a member function: the error names this rank and the op.
#define LOOM_NCCL_IN(op, expr) \
  LOOM_RETURN_IF_ERROR(NcclStatus((expr), #expr, __FILE__, __LINE__).WithContext(comm::CommContext(*this, op)))

std::string NcclErrorMessage(ncclResult_t result, const char* expr, const char* file, int line) {
  std::string message = StrCat(NcclResultName(result), " (", ncclGetErrorString(result), ") in `", expr, "` at ", file,
                               ":", line);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') message += StrCat("; NCCL: ", last);
  return message;
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int rank, int size, Device device, cudaStream_t stream,
                                   std::shared_ptr<NcclGroupState> group)
    : comm_(comm), rank_(rank), size_(size), device_(device), stream_(stream), group_(std::move(group)) {}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  LOOM_CUDA_OK(cudaSetDevice(device_.index));
  // A group that was aborted may have kernels waiting for a dead peer: only
  // ncclCommAbort ends them. Otherwise destroy after the queued work.
  if (group_->aborted.load()) {
    AbortLocal();
    return;
  }
  ncclResult_t result = ncclCommDestroy(comm_);
  if (result != ncclSuccess)
    LOOM_LOG_WARN("{}", NcclErrorMessage(result, "ncclCommDestroy(comm_)", __FILE__, __LINE__));
  comm_ = nullptr;
}

StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(const ncclUniqueId& id, int nranks, int rank,
                                                                     Device device) {
  const std::string context = StrCat("rank ", rank, " of ", nranks, ": NcclCommunicator::Create");
  if (nranks < 1 || rank < 0 || rank >= nranks) return InvalidArgument(context, ": rank out of range");
  if (!device.is_cuda()) return InvalidArgument(context, ": ", device.ToString(), " is not a CUDA device");
  Status ready = cuda::SetDevice(device.index);
  if (!ready.ok()) return ready.WithContext(context);
  StatusOr<cudaStream_t> stream = cuda::DeviceStream(device.index);
  if (!stream.ok()) return stream.status().WithContext(context);
  ncclComm_t comm = nullptr;
  Status init = NcclStatus(ncclCommInitRank(&comm, nranks, id, rank), "ncclCommInitRank(&comm, nranks, id, rank)",
                           __FILE__, __LINE__);
  if (!init.ok()) return init.WithContext(context);
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, rank, nranks, device, *stream, std::make_shared<NcclGroupState>()));
}

StatusOr<std::vector<std::unique_ptr<Communicator>>> MakeNcclCommunicators(const std::vector<Device>& devices) {
  const std::string context = "MakeNcclCommunicators";
  if (devices.empty()) return InvalidArgument(context, ": no devices");
  for (size_t i = 0; i < devices.size(); ++i) {
    const Device& d = devices[i];
    if (!d.is_cuda()) return InvalidArgument(context, ": rank ", i, " is on ", d.ToString(), ", not a CUDA device");
    for (size_t j = 0; j < i; ++j)
      if (devices[j] == d)
        return InvalidArgument(context, ": ranks ", j, " and ", i, " are both on ", d.ToString(),
                               " (NCCL needs one GPU per rank)");
  }
  std::vector<int> indices;
  std::vector<cudaStream_t> streams;
  for (size_t i = 0; i < devices.size(); ++i) {
    const Device& d = devices[i];
    StatusOr<cudaStream_t> stream = cuda::DeviceStream(d.index);
    if (!stream.ok()) return stream.status().WithContext(StrCat(context, ": rank ", i));
    indices.push_back(d.index);
    streams.push_back(*stream);
  }
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  Status init = NcclStatus(ncclCommInitAll(raw.data(), n, indices.data()), "ncclCommInitAll(raw.data(), n, indices.data())",
                           __FILE__, __LINE__);
  if (!init.ok()) return init.WithContext(context);
  auto group = std::make_shared<NcclGroupState>();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(std::unique_ptr<Communicator>(new NcclCommunicator(raw[r], r, n, devices[r], streams[r], group)));
  return comms;
}

Status NcclCommunicator::Begin(const std::string& op) {
  if (group_->aborted.load()) {
    std::lock_guard<std::mutex> lock(group_->mu);
    return FailedPrecondition(comm::CommContext(*this, op), ": ", group_->message);
  }
  if (comm_ == nullptr) return FailedPrecondition(comm::CommContext(*this, op), ": the communicator was aborted");
  return cuda::SetDevice(device_.index).WithContext(comm::CommContext(*this, op));
}

void NcclCommunicator::AbortLocal() {
  if (comm_ == nullptr) return;
  ncclResult_t result = ncclCommAbort(comm_);
  if (result != ncclSuccess) LOOM_LOG_WARN("{}", NcclErrorMessage(result, "ncclCommAbort(comm_)", __FILE__, __LINE__));
  comm_ = nullptr;
}

void NcclCommunicator::Abort(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(group_->mu);
    if (!group_->aborted.load()) {
      group_->message = StrCat("rank ", rank_, " aborted the group (", reason.ToString(), ")");
      group_->aborted.store(true);
    }
  }
  LOOM_CUDA_OK(cudaSetDevice(device_.index));
  AbortLocal();
}

Status NcclCommunicator::AllReduce(Tensor& in_out, ReduceOp op) {
  const std::string name = "AllReduce";
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, name, "in_out", in_out));
  LOOM_RETURN_IF_ERROR(comm::CheckReduce(*this, name, in_out.dtype(), op));
  LOOM_RETURN_IF_ERROR(Begin(name));
  LOOM_NCCL_IN(name, ncclAllReduce(in_out.raw_data(), in_out.raw_data(), Count(in_out), NcclType(in_out.dtype()),
                                   NcclOp(op), comm_, stream_));
  return Status::Ok();
}

Status NcclCommunicator::ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) {
  const std::string name = "ReduceScatter";
  LOOM_RETURN_IF_ERROR(comm::CheckReduceScatter(*this, in, out, op));
  LOOM_RETURN_IF_ERROR(Begin(name));
  LOOM_NCCL_IN(name, ncclReduceScatter(in.raw_data(), out.raw_data(), Count(out), NcclType(in.dtype()), NcclOp(op),
                                       comm_, stream_));
  return Status::Ok();
}

Status NcclCommunicator::AllGather(const Tensor& in, Tensor& out) {
  const std::string name = "AllGather";
  LOOM_RETURN_IF_ERROR(comm::CheckAllGather(*this, in, out));
  LOOM_RETURN_IF_ERROR(Begin(name));
  LOOM_NCCL_IN(name, ncclAllGather(in.raw_data(), out.raw_data(), Count(in), NcclType(in.dtype()), comm_, stream_));
  return Status::Ok();
}

Status NcclCommunicator::Broadcast(Tensor& t, int root) {
  const std::string name = "Broadcast";
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, name, "t", t));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, name, "root", root, /*allow_self=*/true));
  LOOM_RETURN_IF_ERROR(Begin(name));
  LOOM_NCCL_IN(name, ncclBroadcast(t.raw_data(), t.raw_data(), Count(t), NcclType(t.dtype()), root, comm_, stream_));
  return Status::Ok();
}

Status NcclCommunicator::Send(const Tensor& t, int peer) {
  const std::string name = "Send";
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, name, "t", t));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, name, "peer", peer, /*allow_self=*/false));
  LOOM_RETURN_IF_ERROR(Begin(name));
  LOOM_NCCL_IN(name, ncclSend(t.raw_data(), Count(t), NcclType(t.dtype()), peer, comm_, stream_));
  return Status::Ok();
}

Status NcclCommunicator::Recv(Tensor& t, int peer) {
  const std::string name = "Recv";
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, name, "t", t));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, name, "peer", peer, /*allow_self=*/false));
  LOOM_RETURN_IF_ERROR(Begin(name));
  LOOM_NCCL_IN(name, ncclRecv(t.raw_data(), Count(t), NcclType(t.dtype()), peer, comm_, stream_));
  return Status::Ok();
}

Status NcclCommunicator::SendRecv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) {
  const std::string name = "SendRecv";
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, name, "send", send));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, name, "send_peer", send_peer, /*allow_self=*/false));
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, name, "recv", recv));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, name, "recv_peer", recv_peer, /*allow_self=*/false));
  LOOM_RETURN_IF_ERROR(Begin(name));
  // One NCCL group, so that neither half waits for the other; the group is
  // always closed, even when a call inside it failed.
  LOOM_NCCL_IN(name, ncclGroupStart());
  ncclResult_t sent = ncclSend(send.raw_data(), Count(send), NcclType(send.dtype()), send_peer, comm_, stream_);
  ncclResult_t received = ncclRecv(recv.raw_data(), Count(recv), NcclType(recv.dtype()), recv_peer, comm_, stream_);
  ncclResult_t ended = ncclGroupEnd();
  LOOM_NCCL_IN(name, sent);
  LOOM_NCCL_IN(name, received);
  LOOM_NCCL_IN(name, ended);
  return Status::Ok();
}

Status NcclCommunicator::Synchronize() {
  const std::string name = "Synchronize";
  LOOM_RETURN_IF_ERROR(Begin(name));
  // Polls instead of cudaStreamSynchronize: a kernel waiting for a peer that
  // failed never ends, so the wait must see NCCL's asynchronous errors and
  // the group's abort, and abort this rank's communicator to end it.
  // Every failure marks the group too (not only ncclCommAbort here): this
  // rank's peers in the process may wait in kernels for it, and only the
  // group's mark makes their Synchronize() abort instead of polling forever.
  const auto fail = [&](const std::string& what) {
    Status failed = Internal(comm::CommContext(*this, name), ": ", what);
    Abort(failed);
    return failed;
  };
  // NCCL's asynchronous error, checked also once the stream is idle (an
  // error it recorded for work that did complete).
  const auto async_error = [&]() -> std::optional<Status> {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &async);
    if (queried != ncclSuccess)
      return fail(NcclErrorMessage(queried, "ncclCommGetAsyncError(comm_, &async)", __FILE__, __LINE__));
    if (async != ncclSuccess && async != ncclInProgress)
      return fail(NcclErrorMessage(async, "an asynchronous NCCL operation", __FILE__, __LINE__));
    return std::nullopt;
  };
  for (;;) {
    cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) {
      if (std::optional<Status> failed = async_error()) return *failed;
      return Status::Ok();
    }
    if (state != cudaErrorNotReady) return fail(cuda::CudaErrorMessage(state, "cudaStreamQuery(stream_)", __FILE__, __LINE__));
    if (std::optional<Status> failed = async_error()) return *failed;
    if (group_->aborted.load()) {
      AbortLocal();
      return Begin(name);  // the group's abort message
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

StatusOr<ncclUniqueId> NewNcclUniqueId() {
  ncclUniqueId id;
  LOOM_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return id;
}

std::string NcclUniqueIdBytes(const ncclUniqueId& id) { return std::string(id.internal, NCCL_UNIQUE_ID_BYTES); }

StatusOr<ncclUniqueId> NcclUniqueIdFromBytes(const std::string& bytes) {
  if (bytes.size() != NCCL_UNIQUE_ID_BYTES)
    return InvalidArgument("an NCCL unique id has ", NCCL_UNIQUE_ID_BYTES, " bytes, got ", bytes.size());
  ncclUniqueId id;
  std::memcpy(id.internal, bytes.data(), NCCL_UNIQUE_ID_BYTES);
  return id;
}

Status NcclGroupStart() {
  LOOM_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  return Status::Ok();
}

Status NcclGroupEnd() {
  LOOM_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
  return Status::Ok();
}

}  // namespace loom
