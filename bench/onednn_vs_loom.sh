#!/usr/bin/env bash
# oneDNN against loom's own kernels, row by row, on the shapes of `loom bench
# kernels` (GEMM, dense 3x3, depthwise and 1x1 convolutions): builds
# bench/onednn_kernels.cc against Debian's libdnnl-dev (installed when
# missing), then runs it and `loom bench kernels` ROUNDS times in
# alternation with the same thread count, and prints each row's best time
# on both sides and loom's time over oneDNN's. oneDNN picks its own blocked
# layouts; its convolutions are timed alone (its layouts kept between
# layers: its best case) and with the reorders from and to loom's NCHW
# (what a drop-in kernel inside loom would pay).
#
#   bench/onednn_vs_loom.sh [--threads 2] [--rounds 3] [--loom PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 rounds=3 loom=""
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --loom) loom="$2"; shift 2 ;;
    *) echo "unknown argument $1; usage: bench/onednn_vs_loom.sh [--threads T] [--rounds K] [--loom PATH]" >&2; exit 2 ;;
  esac
done
source bench/lib.sh
if [ ! -f /usr/include/oneapi/dnnl/dnnl.hpp ]; then
  echo "installing libdnnl-dev (oneDNN 2.6)" >&2
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q libdnnl-dev >/dev/null; else sudo apt-get install -y -q libdnnl-dev >/dev/null; fi
fi
if [ -z "$loom" ]; then
  bazel build //tools:loom >/dev/null 2>&1
  loom="$(bazel info bazel-bin 2>/dev/null)/tools/loom"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
g++ -O2 -std=c++17 bench/onednn_kernels.cc -ldnnl -o "$work/onednn_kernels"

cpu_line
for round in $(seq 1 "$rounds"); do
  OMP_NUM_THREADS="$threads" "$work/onednn_kernels" 9 >"$work/onednn.$round"
  "$loom" bench kernels --threads "$threads" --reps 9 >"$work/loom.$round"
  echo "round $round of $rounds done" >&2
done
head -n 1 "$work/onednn.1"
head -n 3 "$work/loom.1"
echo
echo "best over $rounds rounds of the best of 9 runs, ms; $threads threads"
printf "%-38s %9s %9s %11s %9s %11s\n" kernel loom oneDNN "+reorders" "/ oneDNN" "/ +reorders"
# loom's rows: name, ms, GFLOP/s, % of roof, GB/s, % of bandwidth roof;
# oneDNN's: name (with " +reorders" for the second timing), ms, GFLOP/s.
awk '
  FNR == 1 { side = (FILENAME ~ /onednn\./) ? "d" : "l" }
  /^(matmul|conv2d|depthwise|pointwise) / {
    last = side == "l" ? NF - 5 : NF - 2
    name = $1; for (i = 2; i <= last; ++i) name = name " " $i
    t = $(last + 1) + 0
    key = side
    if (name ~ / \+reorders$/) { sub(/ \+reorders$/, "", name); key = "r" }
    if (!((name, key) in best) || t < best[name, key]) best[name, key] = t
    if (side == "l" && !(name in seen)) { seen[name] = 1; order[++n] = name }
  }
  END {
    for (i = 1; i <= n; ++i) {
      k = order[i]
      if (!((k, "d") in best)) continue
      r = ((k, "r") in best) ? sprintf("%9.3f", best[k, "r"]) : sprintf("%9s", "-")
      rr = ((k, "r") in best) ? sprintf("%10.2fx", best[k, "l"] / best[k, "r"]) : sprintf("%11s", "-")
      printf "%-38s %9.3f %9.3f %s %8.2fx %s\n", k, best[k, "l"], best[k, "d"], r, best[k, "l"] / best[k, "d"], rr
    }
  }' "$work"/loom.* "$work"/onednn.*
