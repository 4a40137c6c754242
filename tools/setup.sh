#!/usr/bin/env bash
# Installs everything loom's build, tests and default training run need on a
# fresh Debian 12 machine. Idempotent; run as root (or with sudo available).
set -euo pipefail

packages=(
  bazel-bootstrap        # Bazel 4.2.3, used fully offline (see WORKSPACE)
  build-essential
  cmake                  # the CMake consumer of the installed library (tests/consumers/run.sh)
  pkg-config             # the pkg-config consumer of the installed library
  libeigen3-dev          # CPU kernels
  libspdlog-dev          # logging (pulls libfmt-dev)
  libprotobuf-dev protobuf-compiler   # IR / config serialization
  catch2                 # tests (v2 API)
  clang libclang-rt-14-dev  # libFuzzer for the fuzz targets (tests/fuzz/run.sh)
  openmpi-bin libopenmpi-dev  # processes: mpirun -np K loom train (runtime/comm/mpi_communicator.h)
  openssh-client         # mpirun will not start without a remote-shell agent, even on one machine
  zlib1g-dev             # gzip IDX files
  xz-utils               # tools/gpu_check.sh compresses the binaries it packs
  dataset-fashion-mnist  # the real training data
  jargon-text            # English text (the Jargon File) for the language-model configs
  fortunes               # English text by topic, for the text-classification config
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# CUDA is optional: --config=cuda needs nvcc under /usr/local/cuda.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found at /usr/local/cuda (--config=cuda available)"
else
  echo "setup: no CUDA toolkit at /usr/local/cuda (--config=cuda unavailable; CPU build is unaffected)"
fi
echo "setup: done"
