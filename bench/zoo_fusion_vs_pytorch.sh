#!/usr/bin/env bash
# Horizontal fusion of zoo models against PyTorch on the CPU, one model per
# run: `loom bench fusion` on bench/configs/MODEL.pbtxt (loom fused and
# serial, % of the Eigen GEMM roof), then bench/pytorch_zoo_fusion.py on the
# same model, batch, data shapes, optimizer (SGD lr 0.01 momentum 0.9, as the
# configs) and threads (PyTorch serial and vmapped), in the same run, and
# one table of both in samples/s summed over the R replicas (markdown, for
# docs/benchmarks.md "Zoo models: fused vs serial").
#
#   bench/zoo_fusion_vs_pytorch.sh MODEL [--replicas 1,2,4] [--threads 1] [--reps 3] [--rounds 3]
#                                  [--loom PATH] [--python PYTHON]
#
# MODEL: resnet18 | mobilenet_v3_large | pointnet_cls | transformer_lm | bert_medium.
# PYTHON default: bench/lib.sh's bench_python (PyTorch 2.x, torch.func; with
# torchvision for resnet18 and mobilenet_v3_large), made when missing; Debian's
# torch 1.13 + torchvision 0.14 also works (vmap through functorch):
# --python /usr/bin/python3. --loom: a loom binary (default: bazel build //tools:loom).
# The two frameworks alternate for --rounds rounds (the order flips every
# round), so a neighbour that slows the machine for a while slows both
# alike; within a round loom interleaves its fused and serial steps for
# --reps rounds of its own (medians) and PyTorch reports the fastest of
# --reps steps after one warm-up. The table gives each rate's median over
# the rounds with its spread (min-max), each ratio the median of the
# rounds' own ratios with theirs.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bench/zoo_fusion_vs_pytorch.sh resnet18|mobilenet_v3_large|pointnet_cls|transformer_lm|bert_medium [--replicas 1,2,4] [--threads 1] [--reps 3] [--rounds 3] [--loom PATH] [--python PYTHON]"
model="${1:?$usage}"
shift
[ -f "bench/configs/$model.pbtxt" ] || { echo "$usage" >&2; exit 2; }
replicas="1,2,4" threads=1 reps=3 rounds=3 loom="" python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --loom) loom="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source bench/lib.sh
if [ -z "$python" ]; then
  case "$model" in
    resnet18 | mobilenet_v3_large) python="$(bench_python torchvision)" ;;
    *) python="$(bench_python)" ;;
  esac
fi
if [ -z "$loom" ]; then
  bazel build //tools:loom >/dev/null 2>&1
  loom="$(bazel info bazel-bin 2>/dev/null)/tools/loom"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), load average $(cut -d' ' -f1-3 /proc/loadavg)"
cpu_line
run_loom() {
  "$loom" bench fusion --config "bench/configs/$model.pbtxt" --replicas "$replicas" --threads "$threads" \
    --reps "$reps" --json "$work/loom.$1.json" >"$work/loom.$1.log"
}
run_torch() {  # PyTorch takes the model's batch and shapes from loom's first report
  "$python" bench/pytorch_zoo_fusion.py --model "$model" --loom-json "$work/loom.1.json" --replicas "$replicas" \
    --threads "$threads" --reps "$reps" --json "$work/torch.$1.json" >"$work/torch.$1.log"
}
for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then run_loom "$round"; run_torch "$round"; else run_torch "$round"; run_loom "$round"; fi
  echo "round $round of $rounds done" >&2
done
cat "$work/loom.1.log" "$work/torch.1.log"
echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$work" "$rounds" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
loom_runs = [json.load(open(f"{work}/loom.{k}.json")) for k in range(1, rounds + 1)]
torch_runs = [json.load(open(f"{work}/torch.{k}.json")) for k in range(1, rounds + 1)]
loom = [{r["replicas"]: r for r in run["rows"]} for run in loom_runs]
torch = [{r["replicas"]: r for r in run["rows"]} for run in torch_runs]
first, tfirst = loom_runs[0], torch_runs[0]

def spread(values, fmt):
    values = [v for v in values if v is not None and v == v]
    if not values:
        return "n/a"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"

print(f"\n{first['model']}: batch {first['batch']}/replica, {first['threads']} thread(s), roof "
      f"{first['roof_gflops']:.1f} GFLOP/s (round 1); {tfirst['params']:,} parameters per replica; "
      f"torch {tfirst['torch_version']} ({tfirst['fusion_api']}); {rounds} rounds, loom and PyTorch alternating; "
      "samples/s over all replicas: median over rounds (min-max); ratios: median of the rounds' ratios (min-max)\n")
print("| R | loom fused | loom serial | fused/serial | % of roof | torch serial | torch vmap "
      "| loom fused / torch serial | loom fused / torch vmap |")
print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for r in sorted(loom[0]):
    lf = [l[r]["fused_samples_per_s"] for l in loom]
    ls = [l[r]["serial_samples_per_s"] for l in loom]
    own = [l[r]["speedup"] for l in loom]
    roof = [100 * l[r]["fraction_of_roof"] for l in loom]
    ts = [t.get(r, {}).get("serial_samples_per_s") for t in torch]
    tv = [t.get(r, {}).get("vmap_samples_per_s") for t in torch]
    vs_ts = [f / s for f, s in zip(lf, ts) if s]
    vs_tv = [f / v for f, v in zip(lf, tv) if v]
    print(f"| {r} | {spread(lf, '{:.1f}')} | {spread(ls, '{:.1f}')} | {spread(own, '{:.2f}x')} "
          f"| {spread(roof, '{:.0f}%')} | {spread(ts, '{:.1f}')} | {spread(tv, '{:.1f}')} "
          f"| {spread(vs_ts, '{:.2f}x')} | {spread(vs_tv, '{:.2f}x')} |")
    for t in torch:
        for k, e in (t.get(r, {}).get("errors") or {}).items():
            print(f"  (torch {k}, R={r}: {e})")
EOF
