#include "runtime/comm/nccl_bootstrap.h"

#include <cstring>
#include <string>

namespace loom {

StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicatorOver(Communicator& bootstrap, Device device) {
  const std::string context = comm::CommContext(bootstrap, "NcclCommunicatorOver");
  if (bootstrap.device() != Device::Cpu())
    return InvalidArgument(context, ": the bootstrap communicator must carry CPU tensors, it is on ",
                           bootstrap.device().ToString());
  // The id's bytes travel as i64 words (communicators carry no bytes),
  // then one word: whether rank 0 could make it.
  constexpr int64_t kWords = (NCCL_UNIQUE_ID_BYTES + 7) / 8;
  Tensor words = Tensor::Zeros({kWords + 1}, DType::kI64);
  Status made = Status::Ok();
  if (bootstrap.rank() == 0) {
    StatusOr<ncclUniqueId> id = NewNcclUniqueId();
    made = id.status();
    if (made.ok()) {
      const std::string bytes = NcclUniqueIdBytes(*id);
      std::memcpy(words.raw_data(), bytes.data(), bytes.size());
      words.data<int64_t>()[kWords] = 1;
    }
  }
  // Rank 0 broadcasts even when it failed, so that no rank waits for it.
  LOOM_RETURN_IF_ERROR(bootstrap.Broadcast(words, 0).WithContext(context));
  LOOM_RETURN_IF_ERROR(made.WithContext(context));
  if (words.data<int64_t>()[kWords] != 1) return FailedPrecondition(context, ": rank 0 could not make the NCCL unique id");
  const std::string bytes(static_cast<const char*>(words.raw_data()), NCCL_UNIQUE_ID_BYTES);
  LOOM_ASSIGN_OR_RETURN(ncclUniqueId id, NcclUniqueIdFromBytes(bytes));
  return NcclCommunicator::Create(id, bootstrap.size(), bootstrap.rank(), device);
}

}  // namespace loom
