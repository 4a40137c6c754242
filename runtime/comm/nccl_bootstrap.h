// NCCL between processes, bootstrapped through a CPU communicator (the MPI
// one under mpirun): rank 0 makes the group's unique id, the CPU
// communicator broadcasts its bytes, and every rank joins on its own GPU.
// Built only under --config=cuda.
#pragma once

#include <memory>

#include "runtime/comm/nccl_communicator.h"

namespace loom {

// Rank bootstrap.rank() of bootstrap.size() on `device` (a CUDA device;
// one rank per GPU). Every rank of `bootstrap` calls it, with a device of
// its own; it returns once all have joined.
StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicatorOver(Communicator& bootstrap, Device device);

}  // namespace loom
