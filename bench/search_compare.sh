#!/usr/bin/env bash
# `loom search` speed of loom binaries side by side: ROUNDS rounds, each
# running every binary once on the same search (one chain, a fixed number
# of proposals), the order reversed every other round so that a busy
# stretch of the machine slows all of them alike. Prints each binary's
# proposals per second, round by round, and whether every binary found the
# same strategy (the files they wrote compare equal).
#
#   bench/search_compare.sh [ROUNDS] [--config C] [--machine M] [--devices D] [--proposals N] LOOM...
#   bench/search_compare.sh 4 /tmp/loom_before /tmp/loom_after
#
# Defaults: ResNet-101 (bench/configs/search/resnet101.pbtxt) on 16 devices
# of simulator/machines/p100_4x4.pbtxt, 400 proposals.
set -euo pipefail
usage="usage: bench/search_compare.sh [ROUNDS] [--config C] [--machine M] [--devices D] [--proposals N] LOOM..."
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds=4 config="$root/bench/configs/search/resnet101.pbtxt" machine="$root/simulator/machines/p100_4x4.pbtxt"
devices=16 proposals=400
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then rounds="$1"; shift; fi
binaries=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config="$(realpath "$2")"; shift 2 ;;
    --machine) machine="$(realpath "$2")"; shift 2 ;;
    --devices) devices="$2"; shift 2 ;;
    --proposals) proposals="$2"; shift 2 ;;
    --*) echo "unknown argument $1; $usage" >&2; exit 2 ;;
    *) binaries+=("$(realpath "$1")"); shift ;;
  esac
done
[ ${#binaries[@]} -ge 1 ] || { echo "$usage" >&2; exit 2; }
for b in "${binaries[@]}"; do
  [ -x "$b" ] || { echo "bench/search_compare.sh: $b is not an executable loom" >&2; exit 2; }
done
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
source "$root/bench/lib.sh"
cpu_line
echo "$(basename "$config") on $devices devices of $(basename "$machine"), $proposals proposals, one chain, $rounds rounds"
declare -A rates
for ((r = 1; r <= rounds; ++r)); do
  order=("${binaries[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#binaries[@]} - 1; i >= 0; --i)); do order+=("${binaries[$i]}"); done
  fi
  for b in "${order[@]}"; do
    i=0
    for ((j = 0; j < ${#binaries[@]}; ++j)); do [ "${binaries[$j]}" = "$b" ] && i=$j; done
    line="$("$b" search --config "$config" --machine "$machine" --devices "$devices" --proposals "$proposals" \
      --chains 1 --out "$out/strategy_$i.pbtxt" 2>&1 | grep -E '^[0-9]+ proposals in' || true)"
    [ -n "$line" ] || { echo "bench/search_compare.sh: $b printed no summary line" >&2; exit 1; }
    rates[$i]+=" $(sed -E 's/.*\(([0-9.]+)\/s\).*/\1/' <<<"$line")"
  done
done
for ((i = 0; i < ${#binaries[@]}; ++i)); do echo "${binaries[$i]}: proposals/s${rates[$i]}"; done
same=yes
for ((i = 1; i < ${#binaries[@]}; ++i)); do cmp -s "$out/strategy_0.pbtxt" "$out/strategy_$i.pbtxt" || same=no; done
echo "same strategy from every binary: $same"
