#!/usr/bin/env bash
# `loom bench kernels --profile` of several loom binaries, node by node:
# ROUNDS rounds, each running every binary once (the order reversed every
# other round), then per row and per node of that row the median ms per run
# and its spread (min-max) for each binary. What bench/kernels_compare.sh
# does for whole rows, for the kernels inside them.
#
#   bench/kernel_nodes_compare.sh [ROUNDS] [--only TEXT] [--threads T] [--reps N] LOOM...
#   bench/kernel_nodes_compare.sh 7 --only depthwise /tmp/loom_old bazel-bin/tools/loom
set -euo pipefail
usage="usage: bench/kernel_nodes_compare.sh [ROUNDS] [--only TEXT] [--threads T] [--reps N] LOOM..."
rounds=7 only="" threads=2 reps=20
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then rounds="$1"; shift; fi
binaries=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --*) echo "$usage" >&2; exit 2 ;;
    *) binaries+=("$1"); shift ;;
  esac
done
[ ${#binaries[@]} -ge 1 ] || { echo "$usage" >&2; exit 2; }
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
source "$(dirname "$0")/lib.sh"
cpu_line
for r in $(seq "$rounds"); do
  order=("${binaries[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    order=()
    for ((i = ${#binaries[@]} - 1; i >= 0; i--)); do order+=("${binaries[$i]}"); done
  fi
  for b in "${order[@]}"; do
    "$b" bench kernels --only "$only" --threads "$threads" --reps "$reps" --profile |
      sed -n '/^kernel /,$p' | tail -n +2 | sed "s|^|$b\t|" >>"$out"
  done
done
python3 - "$out" "${binaries[@]}" <<'PY'
import collections, statistics, sys
# Lines: BINARY<TAB>row line (name, then ms...) or "  OP NODE ms ...".
times = collections.defaultdict(list)
order = []
row = {}
for line in open(sys.argv[1]):
    binary, rest = line.rstrip("\n").split("\t", 1)
    name, ms = rest[:42].rstrip(), float(rest[42:].split()[0])
    if not rest.startswith("  "):
        row[binary] = name
        key = name
    else:
        key = row[binary] + " / " + name.strip()
    if key not in order:
        order.append(key)
    times[(key, binary)].append(ms)
binaries = sys.argv[2:]
print("| row / node (ms per run: median, min-max) | " + " | ".join(binaries) + " |")
print("|---" * (len(binaries) + 1) + "|")
for key in order:
    cells = []
    for b in binaries:
        t = times.get((key, b))
        cells.append("%.3f (%.3f-%.3f)" % (statistics.median(t), min(t), max(t)) if t else "")
    print("| " + key + " | " + " | ".join(cells) + " |")
PY
