#!/usr/bin/env bash
# Runs a command as NP MPI processes on this machine, for the tests:
#   tests/mpirun.sh NP COMMAND [ARGS...]
# Open MPI refuses root unless told; --oversubscribe lets NP exceed the
# cores; shared memory (vader) without single-copy (CMA needs ptrace, which
# containers often forbid). Leak checks are off in the ranks: Open MPI keeps
# allocations until exit by design.
set -euo pipefail
np="$1"
shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_orte_base_help_aggregate=0
# mpirun refuses to start without a remote-shell agent on PATH, even for a
# job on this machine alone, which never calls it.
if ! command -v ssh >/dev/null && ! command -v rsh >/dev/null; then export OMPI_MCA_plm_rsh_agent=false; fi
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
exec mpirun -np "$np" "$@"  # local ranks inherit this environment
