#!/usr/bin/env bash
# Horizontal fusion of zoo models against PyTorch on the CPU, one model per
# run: `loom bench fusion` on bench/configs/MODEL.pbtxt (loom fused and
# serial, % of the Eigen GEMM roof), then bench/pytorch_zoo_fusion.py on the
# same model, batch, data shapes, optimizer (SGD lr 0.01 momentum 0.9, as the
# configs) and threads (PyTorch serial and vmapped), in the same run, and
# one table of both in samples/s summed over the R replicas (markdown, for
# docs/benchmarks.md "Zoo models: fused vs serial").
#
#   bench/zoo_fusion_vs_pytorch.sh MODEL [--replicas 1,2,4] [--threads 1] [--reps 3] [--loom PATH] [--python PYTHON]
#
# MODEL: resnet18 | mobilenet_v3_large | pointnet_cls | transformer_lm | bert_medium.
# PYTHON default: bench/lib.sh's bench_python (PyTorch 2.x, torch.func; with
# torchvision for resnet18 and mobilenet_v3_large), made when missing; Debian's
# torch 1.13 + torchvision 0.14 also works (vmap through functorch):
# --python /usr/bin/python3. --loom: a loom binary (default: bazel build //tools:loom).
# Both sides report the fastest of --reps timed steps after one warm-up.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bench/zoo_fusion_vs_pytorch.sh resnet18|mobilenet_v3_large|pointnet_cls|transformer_lm|bert_medium [--replicas 1,2,4] [--threads 1] [--reps 3] [--loom PATH] [--python PYTHON]"
model="${1:?$usage}"
shift
[ -f "bench/configs/$model.pbtxt" ] || { echo "$usage" >&2; exit 2; }
replicas="1,2,4" threads=1 reps=3 loom="" python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
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
"$loom" bench fusion --config "bench/configs/$model.pbtxt" --replicas "$replicas" --threads "$threads" \
  --reps "$reps" --json "$work/loom.json"
"$python" bench/pytorch_zoo_fusion.py --model "$model" --loom-json "$work/loom.json" --replicas "$replicas" \
  --threads "$threads" --reps "$reps" --json "$work/torch.json"
echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$work/loom.json" "$work/torch.json" <<'EOF'
import json, sys
loom = json.load(open(sys.argv[1]))
torch = json.load(open(sys.argv[2]))
t = {r["replicas"]: r for r in torch["rows"]}
nan = float("nan")
print(f"\n{loom['model']}: batch {loom['batch']}/replica, {loom['threads']} thread(s), roof "
      f"{loom['roof_gflops']:.1f} GFLOP/s; {torch['params']:,} parameters per replica; "
      f"torch {torch['torch_version']} ({torch['fusion_api']}); samples/s over all replicas, best of "
      f"{loom['reps']} steps\n")
print("| R | loom fused | loom serial | fused/serial | GFLOP/s | % of roof | torch serial | torch vmap "
      "| loom fused / torch serial | loom fused / torch vmap |")
print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for l in loom["rows"]:
    r = t.get(l["replicas"], {})
    ts, tv = r.get("serial_samples_per_s") or nan, r.get("vmap_samples_per_s") or nan
    f = l["fused_samples_per_s"]
    fmt = lambda x, d=1: "n/a" if x != x else f"{x:.{d}f}"
    print(f"| {l['replicas']} | {f:.1f} | {l['serial_samples_per_s']:.1f} | {l['speedup']:.2f}x "
          f"| {l['fused_gflops']:.1f} | {100 * l['fraction_of_roof']:.0f}% | {fmt(ts)} | {fmt(tv)} "
          f"| {fmt(f / ts, 2)}x | {fmt(f / tv, 2)}x |")
    for k, e in (r.get("errors") or {}).items():
        print(f"  (torch {k}, R={l['replicas']}: {e})")
EOF
