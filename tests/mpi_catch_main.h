// The main() of the Catch2 tests that run as MPI processes
// (tests/mpirun.sh NP BINARY): it joins the job, runs the cases on every
// rank and leaves MPI; a failing rank makes the job fail.
#pragma once

#include "runtime/comm/mpi_communicator.h"

namespace loom::testing {

// The job's world communicator (valid while the cases run).
MpiCommunicator& World();

}  // namespace loom::testing
