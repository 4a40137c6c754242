// A group of ranks inside one process, one thread per rank, on CPU devices:
// the in-process communicator of the task runtime (`--devices cpu:N`) and the
// reference that the other implementations are tested against.
//
// - Every call returns when it is complete (Synchronize() has nothing to do).
// - A collective waits until every rank has called it. Each rank then
//   computes its share (a slice of the reduction, its own output) while the
//   others do theirs, and no rank returns before every rank is done reading
//   the others' tensors.
// - Reductions run in rank order 0..n-1 per element, so every rank gets the
//   same bits, equal to a one-device loop `acc = x0; acc += x1; ...` (kMean
//   divides that sum by n).
// - Send is buffered: it copies the tensor into the mailbox of (source,
//   destination) and returns. Recv takes the oldest message of that mailbox
//   (waiting for it) and fails if its shape or dtype differs.
// - A collective whose ranks disagree (kind, reduce op, root, shapes, dtypes)
//   or whose arguments are invalid on some rank fails on every rank, and
//   aborts the group: every later call of every rank fails, naming the cause.
//   So does a Recv that does not match its Send (the sender learns at its
//   next call), Abort() from any rank, and a rank whose communicator is
//   destroyed while others wait for it. Nothing waits forever for a rank
//   that has failed, aborted or left.
// - A communicator is used by one thread at a time (its rank's thread).
#pragma once

#include <memory>
#include <vector>

#include "runtime/comm/communicator.h"

namespace loom {

// n >= 1 communicators of one group on cpu:0; element i is rank i.
std::vector<std::unique_ptr<Communicator>> MakeLocalCommunicators(int n);

}  // namespace loom
