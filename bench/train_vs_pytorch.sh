#!/usr/bin/env bash
# loom against PyTorch on the CPU: the Fashion-MNIST MLP and CNN of
# models/configs/ (same layers, batch 128, SGD with momentum, same thread
# count), trained on the real data, steady-state training samples/s of each
# and the ratio, measured in one run.
#
#   bench/train_vs_pytorch.sh [--threads T] [--steps N] [--python PYTHON]
#
# PYTHON must have torch and numpy; by default bench/lib.sh's bench_python
# (a venv with the current PyTorch from PyPI under ~/.cache/loom-bench-venv,
# made when missing; Debian's python3-torch 1.13 also works: --python
# /usr/bin/python3). The output starts with the CPU and its vector width.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 steps=400 python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
source bench/lib.sh
[ -n "$python" ] || python="$(bench_python)"
cpu_line

bazel build //tools:loom >/dev/null 2>&1
loom="$(bazel info bazel-bin 2>/dev/null)/tools/loom"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# loom: the median of the training windows after the first (warm-up) one.
loom_rate() {
  "$loom" train --config "models/configs/fashion_mnist_$1.pbtxt" --max-steps "$steps" --threads "$threads" \
    --out "$work/$1" >"$work/$1.log" 2>&1
  grep '"split":"train"' "$work/$1/metrics.jsonl" | tail -n +2 | sed 's/.*"samples_per_s":\([0-9.e+-]*\).*/\1/' |
    sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}
torch_rate() {
  "$python" bench/pytorch_train.py --model "$1" --steps "$steps" --threads "$threads" | tee -a "$work/torch.jsonl" |
    sed 's/.*"samples_per_s": \([0-9.e+-]*\).*/\1/'
}

version=$("$python" -c "import torch; print(torch.__version__)")
printf "%-6s %14s %18s %8s\n" model "loom samples/s" "torch $version" ratio
for model in mlp cnn; do
  l=$(loom_rate "$model")
  t=$(torch_rate "$model")
  printf "%-6s %14.0f %18.0f %7.2fx\n" "$model" "$l" "$t" "$(awk -v a="$l" -v b="$t" 'BEGIN {print a / b}')"
done
echo "($threads threads, $steps steps of batch 128 each, $(date -u +%Y-%m-%d))"
