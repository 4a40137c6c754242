#!/usr/bin/env bash
# loom against PyTorch on the CPU: the Fashion-MNIST MLP and CNN of
# models/configs/ (same layers, batch 128, SGD with momentum, same thread
# count), trained on the real data, steady-state training samples/s of each
# and the ratio, measured in one run: ROUNDS rounds, loom and PyTorch
# alternating (the order flipped every round), each rate the median over the
# rounds with its spread (min-max), the ratio the median of the rounds' own
# ratios with theirs, so a stolen stretch slows both sides of a ratio alike.
#
#   bench/train_vs_pytorch.sh [--threads T] [--steps N] [--rounds R] [--python PYTHON]
#
# PYTHON must have torch and numpy; by default bench/lib.sh's bench_python
# (a venv with the current PyTorch from PyPI under ~/.cache/loom-bench-venv,
# made when missing; Debian's python3-torch 1.13 also works: --python
# /usr/bin/python3). The output starts with the CPU and its vector width.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 steps=400 rounds=5 python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
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

# loom: the median of the training windows after the first (warm-up) one;
# a run folder per round (in one already used, loom train would resume).
loom_rate() {  # model round
  local out="$work/$1-$2"
  "$loom" train --config "models/configs/fashion_mnist_$1.pbtxt" --max-steps "$steps" --threads "$threads" \
    --out "$out" >"$out.log" 2>&1
  grep '"split":"train"' "$out/metrics.jsonl" | tail -n +2 | sed 's/.*"samples_per_s":\([0-9.e+-]*\).*/\1/' |
    sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}
torch_rate() {
  "$python" bench/pytorch_train.py --model "$1" --steps "$steps" --threads "$threads" | tee -a "$work/torch.jsonl" |
    sed 's/.*"samples_per_s": \([0-9.e+-]*\).*/\1/'
}

version=$("$python" -c "import torch; print(torch.__version__)")
for ((round = 1; round <= rounds; ++round)); do
  for model in mlp cnn; do
    if ((round % 2 == 1)); then
      l=$(loom_rate "$model" "$round")
      t=$(torch_rate "$model")
    else
      t=$(torch_rate "$model")
      l=$(loom_rate "$model" "$round")
    fi
    echo "$model $l $t" >>"$work/rates"
  done
  echo "round $round of $rounds done" >&2
done
printf "%-6s %-26s %-26s %s\n" model "loom samples/s" "torch $version samples/s" "loom / torch"
for model in mlp cnn; do
  awk -v m="$model" '
    function median(v, n,   i, j, t) {  # sorts v[1..n]
      for (i = 2; i <= n; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
      return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    $1 == m { ++n; l[n] = $2; t[n] = $3; r[n] = $2 / $3 }
    END {
      lm = median(l, n); tm = median(t, n); rm = median(r, n)
      printf "%-6s %-26s %-26s %s\n", m, sprintf("%.0f (%.0f-%.0f)", lm, l[1], l[n]),
        sprintf("%.0f (%.0f-%.0f)", tm, t[1], t[n]), sprintf("%.2fx (%.2f-%.2f)", rm, r[1], r[n])
    }' "$work/rates"
done
echo "($threads threads, $steps steps of batch 128 each, $rounds rounds alternating, $(date -u +%Y-%m-%d))"
