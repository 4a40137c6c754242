#include "runtime/comm/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace loom {

struct MpiCommunicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
};

namespace {

bool started_mpi = false;  // World() initialized MPI, so FinalizeMpi ends it

// "MPI_Send: MPI_ERR_RANK: invalid rank" from an MPI return code.
Status MpiStatus(int code, const std::string& context, const char* call) {
  if (code == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return Internal(context, ": ", call, " failed: ", std::string(text, static_cast<size_t>(length)));
}

MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;  // moved as bits, never reduced (comm::CheckReduce)
    case DType::kBool: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiOp(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

// MPI counts are ints.
Status CheckCount(const std::string& context, const Tensor& t) {
  if (t.numel() > INT_MAX)
    return Unimplemented(context, ": ", comm::Describe(t), " has more than ", INT_MAX, " elements (one MPI message)");
  return Status::Ok();
}

// kMean: the sum divided by the number of ranks (float tensors only).
void DivideBy(Tensor& t, int n) {
  if (t.dtype() == DType::kF32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= static_cast<float>(n);
  } else if (t.dtype() == DType::kF64) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= static_cast<double>(n);
  }
}

constexpr int kTag = 0;  // point to point: MPI matches in order per (source, tag)

}  // namespace

bool LaunchedByMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::World() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    LOOM_RETURN_IF_ERROR(
        MpiStatus(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI", "MPI_Init_thread"));
    started_mpi = true;
    if (provided < MPI_THREAD_SERIALIZED)
      return FailedPrecondition("MPI: the library gives thread level ", provided,
                                ", calls from more than one thread (MPI_THREAD_SERIALIZED) are needed");
  }
  auto handle = std::make_unique<Handle>();
  LOOM_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(MPI_COMM_WORLD, &handle->comm), "MPI", "MPI_Comm_dup"));
  MPI_Comm_set_errhandler(handle->comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(handle->comm, &rank);
  MPI_Comm_size(handle->comm, &size);
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(handle), rank, size));
}

MpiCommunicator::MpiCommunicator(std::unique_ptr<Handle> handle, int rank, int size)
    : handle_(std::move(handle)), rank_(rank), size_(size) {}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && handle_->comm != MPI_COMM_NULL) MPI_Comm_free(&handle_->comm);
}

Status MpiCommunicator::AllReduce(Tensor& in_out, ReduceOp op) {
  const std::string context = comm::CommContext(*this, "AllReduce");
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, "AllReduce", "in_out", in_out));
  LOOM_RETURN_IF_ERROR(comm::CheckReduce(*this, "AllReduce", in_out.dtype(), op));
  LOOM_RETURN_IF_ERROR(CheckCount(context, in_out));
  LOOM_RETURN_IF_ERROR(MpiStatus(MPI_Allreduce(MPI_IN_PLACE, in_out.raw_data(), static_cast<int>(in_out.numel()),
                                               MpiType(in_out.dtype()), MpiOp(op), handle_->comm),
                                 context, "MPI_Allreduce"));
  if (op == ReduceOp::kMean) DivideBy(in_out, size_);
  return Status::Ok();
}

Status MpiCommunicator::ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) {
  const std::string context = comm::CommContext(*this, "ReduceScatter");
  LOOM_RETURN_IF_ERROR(comm::CheckReduceScatter(*this, in, out, op));
  LOOM_RETURN_IF_ERROR(CheckCount(context, in));
  LOOM_RETURN_IF_ERROR(MpiStatus(MPI_Reduce_scatter_block(in.raw_data(), out.raw_data(), static_cast<int>(out.numel()),
                                                          MpiType(in.dtype()), MpiOp(op), handle_->comm),
                                 context, "MPI_Reduce_scatter_block"));
  if (op == ReduceOp::kMean) DivideBy(out, size_);
  return Status::Ok();
}

Status MpiCommunicator::AllGather(const Tensor& in, Tensor& out) {
  const std::string context = comm::CommContext(*this, "AllGather");
  LOOM_RETURN_IF_ERROR(comm::CheckAllGather(*this, in, out));
  LOOM_RETURN_IF_ERROR(CheckCount(context, out));
  const MPI_Datatype type = MpiType(in.dtype());
  return MpiStatus(MPI_Allgather(in.raw_data(), static_cast<int>(in.numel()), type, out.raw_data(),
                                 static_cast<int>(in.numel()), type, handle_->comm),
                   context, "MPI_Allgather");
}

Status MpiCommunicator::Broadcast(Tensor& t, int root) {
  const std::string context = comm::CommContext(*this, "Broadcast");
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, "Broadcast", "t", t));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, "Broadcast", "root", root, /*allow_self=*/true));
  LOOM_RETURN_IF_ERROR(CheckCount(context, t));
  return MpiStatus(MPI_Bcast(t.raw_data(), static_cast<int>(t.numel()), MpiType(t.dtype()), root, handle_->comm),
                   context, "MPI_Bcast");
}

Status MpiCommunicator::Send(const Tensor& t, int peer) {
  const std::string context = comm::CommContext(*this, "Send");
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, "Send", "t", t));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, "Send", "peer", peer, /*allow_self=*/false));
  LOOM_RETURN_IF_ERROR(CheckCount(context, t));
  return MpiStatus(MPI_Send(t.raw_data(), static_cast<int>(t.numel()), MpiType(t.dtype()), peer, kTag, handle_->comm),
                   context, "MPI_Send");
}

Status MpiCommunicator::ReceiveChecked(const std::string& op, Tensor& t, int peer) {
  const std::string context = comm::CommContext(*this, op);
  const MPI_Datatype type = MpiType(t.dtype());
  MPI_Message message;
  MPI_Status status;
  LOOM_RETURN_IF_ERROR(MpiStatus(MPI_Mprobe(peer, kTag, handle_->comm, &message, &status), context, "MPI_Mprobe"));
  int count = 0;
  MPI_Get_count(&status, type, &count);
  if (count == MPI_UNDEFINED || count != t.numel()) {
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::vector<char> drain(static_cast<size_t>(bytes));  // take it anyway: the pair's order stays intact
    MPI_Mrecv(drain.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE);
    return InvalidArgument(context, ": the message from rank ", peer, " holds ", bytes, " bytes, recv is ",
                           comm::Describe(t), " (", t.numel() * static_cast<int64_t>(DTypeSize(t.dtype())),
                           " bytes)");
  }
  return MpiStatus(MPI_Mrecv(t.raw_data(), count, type, &message, MPI_STATUS_IGNORE), context, "MPI_Mrecv");
}

Status MpiCommunicator::Recv(Tensor& t, int peer) {
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, "Recv", "t", t));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, "Recv", "peer", peer, /*allow_self=*/false));
  LOOM_RETURN_IF_ERROR(CheckCount(comm::CommContext(*this, "Recv"), t));
  return ReceiveChecked("Recv", t, peer);
}

Status MpiCommunicator::SendRecv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) {
  const std::string context = comm::CommContext(*this, "SendRecv");
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, "SendRecv", "send", send));
  LOOM_RETURN_IF_ERROR(comm::CheckTensor(*this, "SendRecv", "recv", recv));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, "SendRecv", "send_peer", send_peer, /*allow_self=*/false));
  LOOM_RETURN_IF_ERROR(comm::CheckPeer(*this, "SendRecv", "recv_peer", recv_peer, /*allow_self=*/false));
  LOOM_RETURN_IF_ERROR(CheckCount(context, send));
  LOOM_RETURN_IF_ERROR(CheckCount(context, recv));
  // The send is posted first and waited for last: every rank doing this at
  // once cannot deadlock.
  MPI_Request request;
  LOOM_RETURN_IF_ERROR(MpiStatus(MPI_Isend(send.raw_data(), static_cast<int>(send.numel()), MpiType(send.dtype()),
                                           send_peer, kTag, handle_->comm, &request),
                                 context, "MPI_Isend"));
  const Status received = ReceiveChecked("SendRecv", recv, recv_peer);
  const Status sent = MpiStatus(MPI_Wait(&request, MPI_STATUS_IGNORE), context, "MPI_Wait");
  LOOM_RETURN_IF_ERROR(received);
  return sent;
}

void MpiCommunicator::Abort(const Status& reason) {
  std::fprintf(stderr, "loom: rank %d of %d failed, ending every rank: %s\n", rank_, size_, reason.ToString().c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return
}

void FinalizeMpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (started_mpi && !finalized) MPI_Finalize();
}

}  // namespace loom
