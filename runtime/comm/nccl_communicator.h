// NCCL 2 between CUDA devices (built only under --config=cuda).
//
// - Every call is queued on the communicator's stream (the device's stream,
//   core/cuda/cuda_device.h DeviceStream, unless SetStream says otherwise) and
//   returns once queued: kernels queued after it on that stream see its
//   result; Synchronize() waits for it and reports NCCL's asynchronous errors.
// - Only local arguments are checked (device, dtype, shapes against size());
//   NCCL cannot tell that two ranks disagree, so mismatched calls across
//   ranks are undefined (they may hang) as in NCCL itself.
// - kMean is ncclAvg. Send/Recv are ncclSend/ncclRecv, which NCCL matches in
//   order per peer; a Send blocks its stream until the peer's Recv runs, so
//   rings must use SendRecv (one NCCL group).
// - Several ranks driven by one thread: wrap their calls in NcclGroupStart()
//   / NcclGroupEnd(), as NCCL requires; or use one thread per rank.
// - Abort() aborts this rank's NCCL communicator (ncclCommAbort) and marks the
//   group: ranks made by the same MakeNcclCommunicators call fail their next
//   call, and their Synchronize() aborts their own communicator instead of
//   waiting. Ranks in other processes learn of it only through the bootstrap
//   (the MPI issue): NCCL itself does not tell them.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace loom {

// "ncclInvalidUsage (invalid usage ...) in `expr` at file:line; NCCL: <ncclGetLastError>".
std::string NcclErrorMessage(ncclResult_t result, const char* expr, const char* file, int line);

// What the ranks of one group share in a process (aborts).
struct NcclGroupState;

class NcclCommunicator final : public Communicator {
 public:
  // One rank of a group whose ranks may live in other processes; every rank
  // calls it with the same id (made by NewNcclUniqueId on one rank and sent to
  // the others: NcclUniqueIdBytes / NcclUniqueIdFromBytes). Blocks until all
  // nranks ranks have joined.
  static StatusOr<std::unique_ptr<NcclCommunicator>> Create(const ncclUniqueId& id, int nranks, int rank,
                                                            Device device);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }

  Status AllReduce(Tensor& in_out, ReduceOp op) override;
  Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  Status AllGather(const Tensor& in, Tensor& out) override;
  Status Broadcast(Tensor& t, int root) override;
  Status Send(const Tensor& t, int peer) override;
  Status Recv(Tensor& t, int peer) override;
  Status SendRecv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) override;
  Status Synchronize() override;
  void Abort(const Status& reason) override;

  // The stream calls are queued on (another stream of device(), for tests).
  cudaStream_t stream() const { return stream_; }
  void SetStream(cudaStream_t stream) { stream_ = stream; }
  ncclComm_t nccl_comm() const { return comm_; }

 private:
  friend StatusOr<std::vector<std::unique_ptr<Communicator>>> MakeNcclCommunicators(
      const std::vector<Device>& devices);
  NcclCommunicator(ncclComm_t comm, int rank, int size, Device device, cudaStream_t stream,
                   std::shared_ptr<NcclGroupState> group);

  // Makes the device current; fails when the group was aborted.
  Status Begin(const std::string& op);
  void AbortLocal();

  ncclComm_t comm_;
  int rank_, size_;
  Device device_;
  cudaStream_t stream_;
  std::shared_ptr<NcclGroupState> group_;
};

// One communicator per device (all CUDA, all different: NCCL refuses two
// ranks on one GPU) in this process, through ncclCommInitAll; element i is
// rank i on devices[i].
StatusOr<std::vector<std::unique_ptr<Communicator>>> MakeNcclCommunicators(const std::vector<Device>& devices);

// The id of a new group, made on one rank (ncclGetUniqueId).
StatusOr<ncclUniqueId> NewNcclUniqueId();
// The id as bytes for a bootstrap to send (NCCL_UNIQUE_ID_BYTES of them).
std::string NcclUniqueIdBytes(const ncclUniqueId& id);
StatusOr<ncclUniqueId> NcclUniqueIdFromBytes(const std::string& bytes);

// ncclGroupStart / ncclGroupEnd, for several ranks driven by one thread.
Status NcclGroupStart();
Status NcclGroupEnd();

}  // namespace loom

// Returns an Internal status naming the NCCL error, the call and file:line.
#define LOOM_NCCL_RETURN_IF_ERROR(expr)                                                                  \
  do {                                                                                                   \
    ncclResult_t loom_nccl_result_ = (expr);                                                             \
    if (loom_nccl_result_ != ncclSuccess)                                                                \
      return ::loom::Internal(::loom::NcclErrorMessage(loom_nccl_result_, #expr, __FILE__, __LINE__));   \
  } while (0)
