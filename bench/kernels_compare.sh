#!/usr/bin/env bash
# `loom bench kernels` variants against each other on this machine, each a
# binary with an optional f32 kernel choice (LOOM@avx2 runs LOOM with
# LOOM_SGEMM=avx2): ROUNDS rounds, each running every variant once, the
# order reversed every other round, so a stolen stretch slows all of them
# alike. Prints the CPU line, then per kernel row and variant the median
# GFLOP/s with its spread (min-max) and the median share of the roof
# measured in the same process, and the median of the rounds' own ratios
# against the first variant with their spread.
#
#   bench/kernels_compare.sh [ROUNDS] [--threads T] [--reps N] [--only TEXT] VARIANT...
#   bench/kernels_compare.sh 21 bazel-bin/tools/loom@avx2 bazel-bin/tools/loom@avx512
set -euo pipefail
usage="usage: bench/kernels_compare.sh [ROUNDS] [--threads T] [--reps N] [--only TEXT] LOOM[@avx2|avx512|eigen]..."
rounds=7 threads=2 reps=9 only=()
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then rounds="$1"; shift; fi
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --only) only=(--only "$2"); shift 2 ;;  # the rows whose name contains TEXT
    --*) echo "unknown argument $1; $usage" >&2; exit 2 ;;
    *) variants+=("$1"); shift ;;
  esac
done
[ ${#variants[@]} -ge 1 ] || { echo "$usage" >&2; exit 2; }
for v in "${variants[@]}"; do
  [ -x "${v%@*}" ] || { echo "bench/kernels_compare.sh: ${v%@*} is not an executable loom" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
source bench/lib.sh
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cpu_line
echo "threads: $threads, rounds: $rounds, reps per case: $reps"
n=${#variants[@]}
for ((round = 0; round < rounds; ++round)); do
  for ((j = 0; j < n; ++j)); do
    i=$j
    if ((round % 2 == 1)); then i=$((n - 1 - j)); fi
    v="${variants[$i]}" sgemm=""
    [[ "$v" == *@* ]] && sgemm="${v##*@}"
    LOOM_SGEMM="$sgemm" "${v%@*}" bench kernels --reps "$reps" --threads "$threads" "${only[@]}" \
      --json "$work/$i-$round.json" >/dev/null
  done
done

python3 - "$work" "$rounds" "${variants[@]}" <<'PY'
import json, os, statistics, sys
work, rounds, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
labels = [os.path.basename(v) for v in variants]
runs = [[json.load(open(f"{work}/{i}-{r}.json")) for r in range(rounds)] for i in range(len(variants))]
for label, run in zip(labels, runs):
    print(f"{label}: {run[0]['kernels'].split(';')[0]}")
def spread(xs):
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"
print("| kernel | " + " | ".join(f"{l} GFLOP/s | of roof" for l in labels)
      + "".join(f" | {l} / {labels[0]}" for l in labels[1:]) + " |")
print("|---" * (3 * len(labels)) + "|")
for row, case in enumerate(runs[0][0]["results"]):
    cells = [case["name"]]
    for run in runs:
        cells.append(spread([r["results"][row]["gflops"] for r in run]))
        cells.append(f"{100 * statistics.median(r['results'][row]['fraction_of_roof'] for r in run):.0f}%")
    for run in runs[1:]:
        ratios = [run[r]["results"][row]["gflops"] / runs[0][r]["results"][row]["gflops"] for r in range(rounds)]
        cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    print("| " + " | ".join(cells) + " |")
print("roof (Eigen sgemm 1024^3 on 1 thread, times the threads): "
      + ", ".join(f"{l} {spread([r['roof_gflops'] for r in run])}" for l, run in zip(labels, runs)))
PY
