#!/usr/bin/env bash
# `loom search` (docs/search.md): the found strategy against each starting
# point, a file that `loom simulate` predicts the same step for, the same
# file for the same seed; `loom train --strategy auto` searches, saves the
# strategy in the run folder, trains as one device does and resumes with
# the saved strategy; bad requests exit non-zero naming what is wrong.
set -uo pipefail
loom="$1"
machines="$(dirname "$2")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/parallel_test_lib.sh"
write_cnn_config "$work/cnn.pbtxt"
p100="$machines/p100_4x4.pbtxt"

out=$("$loom" search --config "$work/cnn.pbtxt" --machine "$p100" --devices 4 --proposals 300 --seed 3 \
  --out "$work/found.pbtxt" 2>&1) || fail "search: $out"
for row in "dp " "owt " "model " "exact " "searched "; do contains "search reports $row" "$out" "$row"; done
contains "search says how the exact solver did" "$out" "exact layer-wise solver: solved"
searched=$(awk '$1 == "searched" {print $2}' <<<"$out")
# Every starting point's predicted step is at least the searched one's.
awk '$1 ~ /^(dp|owt|model|exact)$/ && $2 ~ /^[0-9.e+-]+$/ && $2 + 0 < '"${searched:-0}"' {bad = 1} END {exit bad}' <<<"$out" &&
  echo "ok   searched is no slower than any start" || fail "a start beats the searched strategy: $out"
# Perfect scaling (one device's step over the 4) bounds every strategy.
python3 -c '
import re, sys
m = re.search(r"perfect scaling: ([0-9.e+-]+) ms \(dp-1 / 4 devices\); dp at ([0-9.]+)x of it, searched at ([0-9.]+)x", sys.argv[1])
dp1 = re.search(r"^dp-1 +([0-9.e+-]+)", sys.argv[1], re.M)
ok = m and dp1 and abs(float(m.group(1)) * 4 - float(dp1.group(1))) <= 1e-4 * float(dp1.group(1)) \
    and float(m.group(2)) >= 1 and float(m.group(3)) >= 1
sys.exit(0 if ok else 1)' "$out" && echo "ok   search reports perfect scaling, below every strategy" ||
  fail "perfect scaling: $out"
sim=$("$loom" simulate --config "$work/cnn.pbtxt" --machine "$p100" --strategy "$work/found.pbtxt" 2>&1) ||
  fail "simulate the found strategy: $sim"
python3 -c '
import re, sys
got = float(re.search(r"iteration: ([0-9.e+-]+) ms", sys.argv[1]).group(1))
want = float(sys.argv[2])
sys.exit(0 if abs(got - want) <= 1e-5 * want else 1)' "$sim" "$searched" &&
  echo "ok   loom simulate predicts the found strategy's step" || fail "simulate: $sim, search: $searched ms"
"$loom" search --config "$work/cnn.pbtxt" --machine "$p100" --devices 4 --proposals 300 --seed 3 \
  --out "$work/again.pbtxt" >/dev/null 2>&1 || fail "search again"
cmp -s "$work/found.pbtxt" "$work/again.pbtxt" && echo "ok   the same seed finds the same strategy" ||
  fail "the same seed found another strategy"

# Trained with a searched strategy: as one device trains (f32, 1e-4).
"$loom" train --config "$work/cnn.pbtxt" --out "$work/one" >"$work/one.log" 2>&1 || fail "one device: $(cat "$work/one.log")"
"$loom" train --config "$work/cnn.pbtxt" --out "$work/auto" --devices cpu:2 --strategy auto --epochs 1 \
  --machine "$machines/cpu_local.pbtxt" >"$work/auto.log" 2>&1 || fail "--strategy auto: $(cat "$work/auto.log")"
contains "--strategy auto reports its search" "$(cat "$work/auto.log")" "strategy auto:"
[ -s "$work/auto/strategy.pbtxt" ] && echo "ok   the run folder holds the strategy" || fail "no strategy.pbtxt"
cp "$work/auto/strategy.pbtxt" "$work/saved.pbtxt"
"$loom" train --resume "$work/auto" --epochs 2 >"$work/resumed.log" 2>&1 || fail "resume: $(cat "$work/resumed.log")"
grep -q "strategy auto:" "$work/resumed.log" && fail "the resumed run searched again" ||
  echo "ok   the resumed run keeps its strategy"
cmp -s "$work/saved.pbtxt" "$work/auto/strategy.pbtxt" && echo "ok   strategy.pbtxt unchanged by the resume" ||
  fail "strategy.pbtxt changed"
close "a searched strategy trains as one device does" "$(test_losses "$work/one")" "$(test_losses "$work/auto")"
# Without --machine it searches on this machine, probed.
out=$("$loom" train --config "$work/cnn.pbtxt" --out "$work/probed" --devices cpu:2 --strategy auto --max-steps 2 2>&1) ||
  fail "--strategy auto on the probed machine: $out"
contains "--strategy auto probes this machine" "$out" "on cpu_local"

expect "no --out" "loom search needs --out FILE" -- search --config "$work/cnn.pbtxt" --machine "$p100"
expect "a bad budget" "--budget 'soon': expected a positive time" -- \
  search --config "$work/cnn.pbtxt" --machine "$p100" --budget soon --out "$work/x.pbtxt"
expect "budget and proposals" "--budget and --proposals: give one" -- \
  search --config "$work/cnn.pbtxt" --machine "$p100" --budget 1s --proposals 5 --out "$work/x.pbtxt"
expect "too many devices" "--devices 32: machine p100_4x4 has 16 devices" -- \
  search --config "$work/cnn.pbtxt" --machine "$p100" --devices 32 --out "$work/x.pbtxt"
expect "--machine without auto" "--machine is the machine --strategy auto searches on" -- \
  train --config "$work/cnn.pbtxt" --out "$work/y" --devices cpu:2 --strategy dp --machine "$p100"
[ ! -e "$work/x.pbtxt" ] && [ ! -e "$work/y" ] && echo "ok   refused requests write nothing" || fail "a refused request wrote"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo PASS
