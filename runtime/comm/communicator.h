// Collective communication between the ranks of a group: the interface that
// the task runtime moves gradients, activations and halos through, whatever
// carries them (threads of one process, NCCL between GPUs, MPI between
// processes). docs/communicator.md describes the semantics.
//
// Every rank of a group calls the same collectives in the same order, each
// with tensors on its communicator's device. The work of one communicator is
// ordered: a call starts after the previous call of that communicator.
// When a call returns depends on the implementation:
//   - CPU ones (LocalCommunicator) return when the call is complete: the
//     output can be read and the input reused.
//   - NCCL ones are queued on the device's stream and return when queued;
//     kernels that are queued later on that stream see the result.
//     Synchronize() waits for the queued work.
#pragma once

#include <string>

#include "core/device.h"
#include "core/status.h"
#include "core/tensor.h"

namespace loom {

enum class ReduceOp { kSum, kMean, kMax };

const char* ReduceOpName(ReduceOp op);  // "sum", "mean", "max"

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;

  // in_out becomes the reduction over ranks of every rank's in_out (same
  // shape and dtype on every rank). kMean is the sum divided by size(); it is
  // refused for integer tensors.
  virtual Status AllReduce(Tensor& in_out, ReduceOp op) = 0;
  // in is [size() * m, ...]; out ([m, ...]) on rank r becomes the reduction
  // over ranks of part r of in (dim 0 split into size() equal parts).
  virtual Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  // in is [m, ...]; out ([size() * m, ...]) becomes the ranks' ins
  // concatenated along dim 0 in rank order.
  virtual Status AllGather(const Tensor& in, Tensor& out) = 0;
  // t on every rank becomes root's t.
  virtual Status Broadcast(Tensor& t, int root) = 0;
  // Point to point, matched in order per (source, destination) pair: the
  // k-th Send from a to b is received by b's k-th Recv from a, which must
  // have the same shape and dtype. peer != rank().
  virtual Status Send(const Tensor& t, int peer) = 0;
  virtual Status Recv(Tensor& t, int peer) = 0;
  // Sends to one peer and receives from another (possibly the same) without
  // deadlocking when every rank does it at once (rings, halo exchange).
  virtual Status SendRecv(const Tensor& send, int send_peer, Tensor& recv, int recv_peer) = 0;

  // Waits for the work this communicator queued (nothing for CPU ones) and
  // reports an error that happened asynchronously.
  virtual Status Synchronize() = 0;
  // Tells the group that this rank failed: calls of the other ranks that
  // wait for this one return an error naming this rank and `reason` instead
  // of waiting forever, and every later call of the group fails.
  virtual void Abort(const Status& reason) = 0;
};

// Argument checks shared by the implementations. Each returns an error whose
// message starts with "rank R of N: OP: " (CommContext).
namespace comm {

std::string CommContext(const Communicator& comm, const std::string& op);
// "[4, 3] f32".
std::string Describe(const Tensor& t);
// A defined tensor on comm.device() (any dtype moves). `which` names the
// argument in the message.
Status CheckTensor(const Communicator& comm, const std::string& op, const char* which, const Tensor& t);
// Reductions take f32, f64, i32 and i64 (16-bit floats and bool only move:
// sum them in f32); kMean of an integer tensor is refused.
Status CheckReduce(const Communicator& comm, const std::string& op, DType dtype, ReduceOp reduce);
Status CheckReduceScatter(const Communicator& comm, const Tensor& in, const Tensor& out, ReduceOp reduce);
Status CheckAllGather(const Communicator& comm, const Tensor& in, const Tensor& out);
// A rank other than comm.rank() (root may be comm.rank(): allow_self).
Status CheckPeer(const Communicator& comm, const std::string& op, const char* which, int peer, bool allow_self);

}  // namespace comm
}  // namespace loom
