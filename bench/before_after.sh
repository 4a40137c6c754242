#!/usr/bin/env bash
# Compares two loom binaries side by side (e.g. before and after a change),
# interleaved so that both see the same machine state: ROUNDS rounds, each
# running both binaries (their order flipping every round) on
#   train    `loom train` of the Fashion-MNIST MLP for 300 steps (wall s)
#   fusion   `loom bench fusion` at each R of --replicas (fused samples/s)
# and prints each measurement's median and spread (min-max) per binary, and
# the median of the rounds' own after/before ratios with their spread.
# With --count, each binary's steps are also counted in instructions under
# callgrind (valgrind): everything executed inside Executor::Run for
# `loom bench fusion --reps 1 --threads 1` (a warm-up and a measured round,
# each one fused step and R single steps), a count that a busy machine does
# not change, per --replicas value.
#
#   bench/before_after.sh OLD_LOOM NEW_LOOM [ROUNDS] [--config FILE] [--replicas 1,8] [--threads 2] [--count]
#
# Without --config: the MLP's training run and its fusion at R = 1 and 8.
# With --config FILE (e.g. bench/configs/mobilenet_v3_large.pbtxt): that
# config's fusion only, at --replicas (default 1).
set -euo pipefail
usage="usage: bench/before_after.sh OLD_LOOM NEW_LOOM [ROUNDS] [--config FILE] [--replicas LIST] [--threads T] [--count]"
old="${1:?$usage}"
new="${2:?$usage}"
shift 2
rounds=5
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then rounds="$1"; shift; fi
config="" replicas="" threads=2 count=0
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --replicas) replicas="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --count) count=1; shift ;;
    *) echo "unknown argument $1; $usage" >&2; exit 2 ;;
  esac
done
if [ -z "$config" ]; then
  config=models/configs/fashion_mnist_mlp.pbtxt train=1 reps=20
  replicas="${replicas:-1,8}"
else
  train=0 reps=3
  replicas="${replicas:-1}"
fi
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

measure() {  # binary label round
  local loom="$1" label="$2" round="$3" start end
  if [ "$train" = 1 ]; then
    start=$(date +%s.%N)
    "$loom" train --config "$config" --max-steps 300 --threads "$threads" --out "$work/$label-$round" >/dev/null
    end=$(date +%s.%N)
    awk -v l="$label" -v r="$round" -v s="$start" -v e="$end" \
      'BEGIN { printf "%s %s train_s %.3f\n", l, r, e - s }' >>"$work/results"
  fi
  "$loom" bench fusion --config "$config" --replicas "$replicas" --reps "$reps" --threads "$threads" |
    awk -v l="$label" -v r="$round" -v want=",$replicas," \
      'index(want, "," $1 ",") && $2 + 0 > 0 { print l, r, "fused_r" $1 "_smp_s", $2 }' >>"$work/results"
}

for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    measure "$old" before "$round"
    measure "$new" after "$round"
  else
    measure "$new" after "$round"
    measure "$old" before "$round"
  fi
done

grep -m1 "model name" /proc/cpuinfo
echo "$config, $threads threads, $rounds rounds (interleaved, order flipped every round)"
printf "%-18s %-26s %-26s %s\n" measure "before: median (min-max)" "after: median (min-max)" "after/before: median (min-max)"
median_range() { sort -g | awk '{ v[NR] = $1 } END { printf "%.4g %.4g %.4g", v[int((NR + 1) / 2)], v[1], v[NR] }'; }
for m in $(awk '{ print $3 }' "$work/results" | sort -u); do
  read -r bm blo bhi <<<"$(awk -v m="$m" '$1 == "before" && $3 == m { print $4 }' "$work/results" | median_range)"
  read -r am alo ahi <<<"$(awk -v m="$m" '$1 == "after" && $3 == m { print $4 }' "$work/results" | median_range)"
  read -r rm rlo rhi <<<"$(awk -v m="$m" '$3 == m { v[$1 " " $2] = $4; r[$2] = 1 }
      END { for (i in r) if (("before " i) in v) print v["after " i] / v["before " i] }' "$work/results" | median_range)"
  printf "%-18s %-26s %-26s %s\n" "$m" "$bm ($blo-$bhi)" "$am ($alo-$ahi)" "$rm ($rlo-$rhi)"
done

if [ "$count" = 1 ]; then
  command -v valgrind >/dev/null || { echo "--count needs valgrind (apt-get install valgrind)" >&2; exit 1; }
  instructions() {  # binary R: instructions inside Executor::Run
    valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" --toggle-collect='loom::Executor::Run(*' \
      "$1" bench fusion --config "$config" --replicas "$2" --reps 1 --threads 1 --no-roof >/dev/null 2>"$work/valgrind.log" || {
      cat "$work/valgrind.log" >&2
      # Valgrind 3.19 (Debian 12) decodes no AVX-512 (EVEX, first byte 0x62).
      if grep -q "unhandled instruction bytes: 0x62" "$work/valgrind.log"; then
        echo "--count: valgrind cannot run AVX-512 code; count binaries built without it" \
          "(bazel build --config=portable //tools:loom) with LOOM_SGEMM=avx2" >&2
      fi
      exit 1
    }
    awk '/^(summary|totals):/ { print $2; exit }' "$work/callgrind.out"
  }
  echo "instructions inside Executor::Run (callgrind, 1 thread, bench fusion --reps 1: 2 rounds of 1 fused + R single steps)"
  printf "%-18s %-18s %-18s %s\n" replicas before after after/before
  for r in ${replicas//,/ }; do
    before=$(instructions "$old" "$r")
    after=$(instructions "$new" "$r")
    awk -v r="$r" -v b="$before" -v a="$after" 'BEGIN { printf "%-18s %-18.0f %-18.0f %.4f\n", r, b, a, a / b }'
  done
fi
