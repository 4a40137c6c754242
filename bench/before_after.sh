#!/usr/bin/env bash
# Compares two loom binaries side by side (e.g. before and after a refactor),
# interleaved so that both see the same machine state: ROUNDS rounds, each
# running both binaries on
#   train    `loom train` of the Fashion-MNIST MLP for 300 steps (wall s)
#   fusion   `loom bench fusion` of the MLP at R = 1 and 8 (fused samples/s)
# and prints each measurement's median and spread (min-max) per binary.
#
#   bench/before_after.sh OLD_LOOM NEW_LOOM [ROUNDS]
set -euo pipefail
old="$1"
new="$2"
rounds="${3:-5}"
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

measure() {  # binary label round
  local loom="$1" label="$2" round="$3" start end
  start=$(date +%s.%N)
  "$loom" train --config models/configs/fashion_mnist_mlp.pbtxt --max-steps 300 --threads 2 \
    --out "$work/$label-$round" >/dev/null
  end=$(date +%s.%N)
  awk -v l="$label" -v s="$start" -v e="$end" 'BEGIN { printf "%s train_s %.3f\n", l, e - s }' >>"$work/results"
  "$loom" bench fusion --config models/configs/fashion_mnist_mlp.pbtxt --replicas 1,8 --reps 20 --threads 2 |
    awk -v l="$label" '$1 == 1 || $1 == 8 { print l, "fused_r" $1 "_smp_s", $2 }' >>"$work/results"
}

for round in $(seq 1 "$rounds"); do
  measure "$old" before "$round"
  measure "$new" after "$round"
done

grep -m1 "model name" /proc/cpuinfo
echo "rounds: $rounds (interleaved)"
printf "%-18s %-34s %-34s %s\n" measure "before: median (min-max)" "after: median (min-max)" "after/before"
for m in train_s fused_r1_smp_s fused_r8_smp_s; do
  stats() {
    awk -v l="$1" -v m="$m" '$1 == l && $2 == m { print $3 }' "$work/results" | sort -g |
      awk '{ v[NR] = $1 } END { printf "%.5g %.5g %.5g", v[int((NR + 1) / 2)], v[1], v[NR] }'
  }
  read -r bm blo bhi <<<"$(stats before)"
  read -r am alo ahi <<<"$(stats after)"
  printf "%-18s %-34s %-34s %s\n" "$m" "$bm ($blo-$bhi)" "$am ($alo-$ahi)" "$(awk -v a="$am" -v b="$bm" 'BEGIN { printf "%.3f", a / b }')"
done
