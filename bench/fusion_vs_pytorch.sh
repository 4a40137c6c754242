#!/usr/bin/env bash
# Horizontal fusion against PyTorch on the CPU, one model at a time: for each
# replica count R, loom fused and serial (`loom bench fusion`) and PyTorch
# serial and torch.func-vmap fused (bench/pytorch_fusion.py), all in training
# samples/s summed over the R replicas, and the ratios.
#
#   bench/fusion_vs_pytorch.sh mlp|cnn [--replicas 1,2,4,8,16,32] [--threads T]
#                              [--rounds K] [--python PYTHON]
#
# The two frameworks alternate for K rounds (default 5; the order flips
# every round), so a neighbour that slows the machine for a while slows both
# alike. Each rate is the median over the rounds with its spread (min-max);
# each ratio is the median of the rounds' own ratios, with their spread.
# Within a round loom interleaves its fused and serial steps (--reps rounds
# of its own) and PyTorch reports the median of its repeats.
#
# PYTHON must have torch >= 2.0 (torch.func); default bench/lib.sh's
# bench_python (/opt/torchbench/bin/python, else a venv it makes). The output
# starts with the CPU and its vector width. The tables land in
# docs/benchmarks.md by hand, with the command line.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bench/fusion_vs_pytorch.sh mlp|cnn [--replicas LIST] [--threads T] [--rounds K] [--python PYTHON]"
model="${1:?$usage}"
shift
replicas="1,2,4,8,16,32" threads=2 rounds=5 python=""
[ "$model" = cnn ] && replicas="1,2,4,8"
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) echo "unknown argument $1; $usage" >&2; exit 2 ;;
  esac
done
source bench/lib.sh
[ -n "$python" ] || python="$(bench_python)"
cpu_line
steps=10 reps=7
[ "$model" = cnn ] && steps=4 reps=3

bazel build //tools:loom >/dev/null 2>&1
loom="$(bazel info bazel-bin 2>/dev/null)/tools/loom"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

run_loom() {
  "$loom" bench fusion --config "models/configs/fashion_mnist_$model.pbtxt" --replicas "$replicas" \
    --threads "$threads" --reps "$reps" --json "$work/loom.$1.json" >"$work/loom.$1.log"
}
run_torch() {
  "$python" bench/pytorch_fusion.py --model "$model" --replicas "$replicas" --threads "$threads" \
    --steps "$steps" --repeats "$reps" --json "$work/torch.$1.json" >"$work/torch.$1.log"
}
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then run_loom "$round"; run_torch "$round"; else run_torch "$round"; run_loom "$round"; fi
  echo "round $round of $rounds done" >&2
done
head -n 1 "$work/loom.1.log"

"$python" - "$work" "$rounds" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
loom = [{r["replicas"]: r for r in json.load(open(f"{work}/loom.{k}.json"))["rows"]} for k in range(1, rounds + 1)]
torch_runs = [json.load(open(f"{work}/torch.{k}.json")) for k in range(1, rounds + 1)]
torch = [{r["replicas"]: r for r in t["rows"]} for t in torch_runs]

def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"

print(f"\ntorch {torch_runs[0].get('torch_version', '?')}; {rounds} rounds, loom and PyTorch alternating; "
      "samples/s over all replicas: median over rounds (min-max); ratios: median of the rounds' ratios (min-max)")
print(f"{'R':>3} {'loom fused':>22} {'loom serial':>22} {'torch serial':>22} {'torch vmap':>22}"
      f" {'fused/serial':>19} {'vs torch serial':>19} {'vs torch vmap':>19}")
for r in sorted(loom[0]):
    lf = [l[r]["fused_samples_per_s"] for l in loom]
    ls = [l[r]["serial_samples_per_s"] for l in loom]
    own = [l[r]["speedup"] for l in loom]
    ts = [t[r]["serial_samples_per_s"] if r in t else None for t in torch]
    tv = [t[r]["vmap_samples_per_s"] if r in t else None for t in torch]
    vs_ts = [f / s for f, s in zip(lf, ts) if s]
    vs_tv = [f / v for f, v in zip(lf, tv) if v]
    print(f"{r:>3} {spread(lf, '{:.0f}'):>22} {spread(ls, '{:.0f}'):>22} {spread(ts, '{:.0f}'):>22}"
          f" {spread(tv, '{:.0f}'):>22} {spread(own, '{:.2f}'):>19} {spread(vs_ts, '{:.2f}'):>19}"
          f" {spread(vs_tv, '{:.2f}'):>19}")
EOF
