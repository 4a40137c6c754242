// Open MPI between processes (`mpirun -np K loom train ...`): rank and size
// are MPI_COMM_WORLD's, tensors live on the CPU.
//
// - Every call returns when it is complete, like the local communicator's.
// - It talks on a duplicate of MPI_COMM_WORLD (its messages never meet
//   anyone else's) whose errors come back as a Status instead of ending the
//   process.
// - AllReduce and ReduceScatter are MPI_Allreduce and
//   MPI_Reduce_scatter_block: the same bits on every rank and every run for
//   a given process count and size, but in an order of additions of Open
//   MPI's choosing, not rank order. (The task runtime adds partial sums in
//   its own order, over Send and Recv, so its bits are one process's.)
// - Recv looks at the message before taking it (MPI_Mprobe) and fails,
//   naming both, when its size is not the tensor's: a shape of the same
//   size is not told apart.
// - Abort() prints the reason, naming this rank, and ends every process of
//   the job (MPI_Abort): a rank cannot be left waiting for a failed one.
// - Calls come from one thread at a time (MPI_THREAD_SERIALIZED).
#pragma once

#include <memory>

#include "runtime/comm/communicator.h"

namespace loom {

// Whether this process was started by mpirun (Open MPI's environment).
bool LaunchedByMpirun();

class MpiCommunicator final : public Communicator {
 public:
  // MPI_COMM_WORLD, initializing MPI first if nobody has.
  static StatusOr<std::unique_ptr<MpiCommunicator>> World();
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::Cpu(); }

  Status AllReduce(Tensor& in_out, ReduceOp op) override;
  Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  Status AllGather(const Tensor& in, Tensor& out) override;
  Status Broadcast(Tensor& t, int root) override;
  Status Send(const Tensor& t, int peer) override;
  Status Recv(Tensor& t, int peer) override;
  Status SendRecv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) override;
  Status Synchronize() override { return Status::Ok(); }
  [[noreturn]] void Abort(const Status& reason) override;

 private:
  struct Handle;  // the MPI communicator (keeps mpi.h out of this header)
  MpiCommunicator(std::unique_ptr<Handle> handle, int rank, int size);
  // Takes a message from `peer` into t, after checking its size.
  Status ReceiveChecked(const std::string& op, Tensor& t, int peer);

  std::unique_ptr<Handle> handle_;
  int rank_ = 0, size_ = 1;
};

// Ends MPI if World() started it; call once, after every MpiCommunicator is
// gone (at the end of main).
void FinalizeMpi();

}  // namespace loom
