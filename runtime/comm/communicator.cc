#include "runtime/comm/communicator.h"

#include <vector>

namespace loom {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMean: return "mean";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

namespace comm {

std::string CommContext(const Communicator& comm, const std::string& op) {
  return StrCat("rank ", comm.rank(), " of ", comm.size(), ": ", op);
}

std::string Describe(const Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return StrCat(t.shape().ToString(), " ", DTypeName(t.dtype()));
}

Status CheckTensor(const Communicator& comm, const std::string& op, const char* which, const Tensor& t) {
  auto fail = [&](const std::string& why) { return InvalidArgument(CommContext(comm, op), ": ", which, " ", why); };
  if (!t.defined()) return fail("is an undefined tensor");
  if (t.device() != comm.device())
    return fail(StrCat(Describe(t), " is on ", t.device().ToString(), ", the communicator's device is ",
                       comm.device().ToString()));
  return Status::Ok();
}

Status CheckReduce(const Communicator& comm, const std::string& op, DType dtype, ReduceOp reduce) {
  if (dtype != DType::kF32 && dtype != DType::kF64 && !IsInteger(dtype))
    return InvalidArgument(CommContext(comm, op), ": reductions take f32, f64, i32 and i64, got ", DTypeName(dtype),
                           " (bf16, f16 and bool tensors move, they do not reduce)");
  if (reduce == ReduceOp::kMean && IsInteger(dtype))
    return InvalidArgument(CommContext(comm, op), ": mean of ", DTypeName(dtype), " tensors is not supported (use sum)");
  return Status::Ok();
}

namespace {

Shape WithDim0(const Shape& shape, int64_t dim0) {
  std::vector<int64_t> dims = shape.dims();
  dims[0] = dim0;
  return Shape(dims);
}

}  // namespace

Status CheckReduceScatter(const Communicator& comm, const Tensor& in, const Tensor& out, ReduceOp reduce) {
  const std::string op = "ReduceScatter";
  LOOM_RETURN_IF_ERROR(CheckTensor(comm, op, "in", in));
  LOOM_RETURN_IF_ERROR(CheckTensor(comm, op, "out", out));
  LOOM_RETURN_IF_ERROR(CheckReduce(comm, op, in.dtype(), reduce));
  const int n = comm.size();
  if (in.shape().rank() == 0 || in.shape()[0] % n != 0)
    return InvalidArgument(CommContext(comm, op), ": dim 0 of in ", Describe(in), " does not split into ", n,
                           " equal parts");
  Shape expected = WithDim0(in.shape(), in.shape()[0] / n);
  if (out.shape() != expected || out.dtype() != in.dtype())
    return InvalidArgument(CommContext(comm, op), ": out is ", Describe(out), ", expected ", expected.ToString(), " ",
                           DTypeName(in.dtype()), " (part of in ", Describe(in), " over ", n, " ranks)");
  return Status::Ok();
}

Status CheckAllGather(const Communicator& comm, const Tensor& in, const Tensor& out) {
  const std::string op = "AllGather";
  LOOM_RETURN_IF_ERROR(CheckTensor(comm, op, "in", in));
  LOOM_RETURN_IF_ERROR(CheckTensor(comm, op, "out", out));
  if (in.shape().rank() == 0)
    return InvalidArgument(CommContext(comm, op), ": in is a scalar; AllGather concatenates along dim 0");
  Shape expected = WithDim0(in.shape(), in.shape()[0] * comm.size());
  if (out.shape() != expected || out.dtype() != in.dtype())
    return InvalidArgument(CommContext(comm, op), ": out is ", Describe(out), ", expected ", expected.ToString(), " ",
                           DTypeName(in.dtype()), " (", comm.size(), " ranks x ", Describe(in), ")");
  return Status::Ok();
}

Status CheckPeer(const Communicator& comm, const std::string& op, const char* which, int peer, bool allow_self) {
  if (peer < 0 || peer >= comm.size())
    return InvalidArgument(CommContext(comm, op), ": ", which, " ", peer, " is not a rank of a group of ", comm.size());
  if (!allow_self && peer == comm.rank())
    return InvalidArgument(CommContext(comm, op), ": ", which, " ", peer, " is this rank");
  return Status::Ok();
}

}  // namespace comm
}  // namespace loom
