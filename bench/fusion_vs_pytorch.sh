#!/usr/bin/env bash
# Horizontal fusion against PyTorch on the CPU, one model at a time in one
# run: for each replica count R, loom fused and serial (`loom bench fusion`)
# and PyTorch serial and torch.func-vmap fused (bench/pytorch_fusion.py), all
# in training samples/s summed over the R replicas, and the ratios.
#
#   bench/fusion_vs_pytorch.sh mlp|cnn [--replicas 1,2,4,8,16,32] [--threads T] [--python PYTHON]
#
# PYTHON must have torch >= 2.0 (torch.func); default bench/lib.sh's
# bench_python (/opt/torchbench/bin/python, else a venv it makes). The output
# starts with the CPU and its vector width. The tables land in
# docs/benchmarks.md by hand, with the command line.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: bench/fusion_vs_pytorch.sh mlp|cnn [--replicas LIST] [--threads T] [--python PYTHON]}"
shift
replicas="1,2,4,8,16,32" threads=2 python=""
[ "$model" = cnn ] && replicas="1,2,4,8"
while [ $# -gt 0 ]; do
  case "$1" in
    --replicas) replicas="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
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

"$loom" bench fusion --config "models/configs/fashion_mnist_$model.pbtxt" --replicas "$replicas" \
  --threads "$threads" --reps "$reps" --json "$work/loom.json"
"$python" bench/pytorch_fusion.py --model "$model" --replicas "$replicas" --threads "$threads" \
  --steps "$steps" --repeats "$reps" --json "$work/torch.json" >"$work/torch.log"

"$python" - "$work/loom.json" "$work/torch.json" <<'EOF'
import json, sys
loom = {r["replicas"]: r for r in json.load(open(sys.argv[1]))["rows"]}
torch = json.load(open(sys.argv[2]))
rows = {r["replicas"]: r for r in torch["rows"]}
print(f"\ntorch {torch.get('torch_version', '?')}; samples/s over all replicas")
print(f"{'R':>4} {'loom fused':>11} {'loom serial':>12} {'torch serial':>13} {'torch vmap':>11}"
      f" {'fused/serial':>13} {'vs torch serial':>16} {'vs torch vmap':>14} {'of roof':>8}")
for r in sorted(loom):
    l, t = loom[r], rows.get(r)
    ts = t["serial_samples_per_s"] if t else float("nan")
    tv = t["vmap_samples_per_s"] if t else float("nan")
    f = l["fused_samples_per_s"]
    print(f"{r:>4} {f:>11.0f} {l['serial_samples_per_s']:>12.0f} {ts:>13.0f} {tv:>11.0f}"
          f" {f / l['serial_samples_per_s']:>12.2f}x {f / ts:>15.2f}x {f / tv:>13.2f}x"
          f" {100 * l['fraction_of_roof']:>7.1f}%")
EOF
