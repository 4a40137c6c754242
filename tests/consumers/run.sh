#!/usr/bin/env bash
# loom as outside projects use it (docs/embedding.md): installs loom to a
# temporary prefix (bazel run //:install), then builds and runs
#   cmake       tests/consumers/cmake (find_package(loom)): the service
#               against libloom.so and against libloom.a
#   pkg-config  the same service, compiled with `pkg-config --cflags --libs loom`
#   bazel       tests/consumers/bazel (its own workspace, @loom = the prefix)
# Each run trains an MLP on Fashion-MNIST for 300 steps with loom::Trainer,
# serves it with loom::Predictor from 8 threads and checks the predictions
# and the accuracy (tests/consumers/service/main.cc).
#
#   bash tests/consumers/run.sh [FASHION_MNIST_DIR]
#
# Offline. The two Bazel runs use output bases of their own under
# $LOOM_CONSUMERS_CACHE (default ~/.cache/loom-consumers), kept between runs
# so that a rerun is incremental, and shut down at the end; the main build's
# output base is not touched. Prints "N passed, N failed"; exits 1 on any
# failure.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
data="${1:-/usr/share/datasets/fashion-mnist}"
cache="${LOOM_CONSUMERS_CACHE:-$HOME/.cache/loom-consumers}"
work="$(mktemp -d)"
prefix="$work/prefix"
passed=0 failed=0
started=$SECONDS

cleanup() {
  bazel --output_base="$cache/install" shutdown >/dev/null 2>&1
  bazel --output_base="$cache/bazel" shutdown >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# step NAME COMMAND...: runs it with its output in $work/NAME.log, says ok or
# FAIL (with the log's end).
step() {
  local name="$1" t0=$SECONDS
  shift
  if "$@" >"$work/$name.log" 2>&1; then
    echo "ok   $name ($((SECONDS - t0)) s)"
    passed=$((passed + 1))
    return 0
  fi
  echo "FAIL $name ($((SECONDS - t0)) s):"
  tail -n 25 "$work/$name.log" | sed 's/^/     /'
  failed=$((failed + 1))
  return 1
}

finish() {
  echo "$passed passed, $failed failed ($((SECONDS - started)) s)"
  [ "$failed" -eq 0 ]
  exit
}

for tool in bazel cmake pkg-config c++; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (bash tools/setup.sh)"; failed=1; finish; }
done
[ -f "$data/t10k-images-idx3-ubyte.gz" ] || { echo "FAIL: no Fashion-MNIST in $data (bash tools/setup.sh)"; failed=1; finish; }

# --symlink_prefix=/: no bazel-* links in the source tree pointing at this
# output base (the main build would read them as packages).
install_loom() { cd "$repo" && bazel --output_base="$cache/install" run --symlink_prefix=/ //:install -- "$prefix"; }
step install install_loom || finish

# service NAME BINARY: a run in a work folder of its own (exit 0: every check held).
service() { mkdir -p "$work/run-$1" && "$2" "$data" "$work/run-$1"; }

# ---- CMake
cmake_build() {
  cmake -S "$repo/tests/consumers/cmake" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$work/cmake" -j "$(nproc)"
}
if step cmake-build cmake_build; then
  step cmake-shared service cmake-shared "$work/cmake/service"
  step cmake-static service cmake-static "$work/cmake/service_static"
fi

# ---- pkg-config
pkg_config_build() {
  export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
  # shellcheck disable=SC2046  # the flags are words
  c++ -std=c++17 -O2 -Wall -Wextra $(pkg-config --cflags loom) "$repo/tests/consumers/service/main.cc" \
    -o "$work/service-pc" $(pkg-config --libs loom) -lz -pthread -Wl,-rpath,"$prefix/lib"
}
step pkg-config-build pkg_config_build && step pkg-config service pkg-config "$work/service-pc"

# ---- Bazel (its own workspace; the prefix is @loom)
bazel_service() {
  cd "$repo/tests/consumers/bazel" && mkdir -p "$work/run-bazel" &&
    bazel --output_base="$cache/bazel" run --repo_env=LOOM_PREFIX="$prefix" //:service -- "$data" "$work/run-bazel"
}
step bazel bazel_service

finish
