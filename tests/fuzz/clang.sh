#!/usr/bin/env bash
# The C/C++ compiler of the fuzz build (tests/fuzz/run.sh): clang, which has
# libFuzzer, given the project's flags less the GCC-only ones (.bazelrc's
# -mmove-max/-mstore-max work around a GCC bug clang does not have).
args=()
for a in "$@"; do
  case "$a" in
    -mmove-max=* | -mstore-max=*) ;;
    *) args+=("$a") ;;
  esac
done
exec clang "${args[@]}"
