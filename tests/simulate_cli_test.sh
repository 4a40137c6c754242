#!/usr/bin/env bash
# `loom simulate`: a prediction per strategy with its JSON and trace, and
# bad requests that exit non-zero naming what is wrong.
set -uo pipefail
loom="$1"
machines="$(dirname "$2")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/parallel_test_lib.sh"
write_cnn_config "$work/cnn.pbtxt"

for strategy in dp owt model; do
  out=$("$loom" simulate --config "$work/cnn.pbtxt" --machine "$machines/p100_4x4.pbtxt" --devices 4 \
    --strategy "$strategy" --json "$work/$strategy.json" --trace "$work/$strategy.trace" 2>&1) ||
    fail "simulate --strategy $strategy: $out"
  contains "simulate --strategy $strategy prints the iteration" "$out" "iteration:"
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["iteration_s"] > 0 and r["devices"] == 4 and r["fits"], r
assert all(0 <= b <= r["iteration_s"] * (1 + 1e-9) for b in r["device_busy_s"]) and max(r["device_busy_s"]) > 0, r
t = json.load(open(sys.argv[2]))["traceEvents"]
assert any(e["ph"] == "X" for e in t)
' "$work/$strategy.json" "$work/$strategy.trace" && echo "ok   $strategy: JSON and trace" || fail "$strategy: JSON or trace"
done

# This machine, probed, is one the simulator takes; the benchmark of
# predicted against measured steps runs on it (its numbers are not checked
# here: docs/benchmarks.md has them).
"$loom" machine probe --reps 1 --out "$work/local.pbtxt" >"$work/probe.log" 2>&1 || fail "machine probe: $(cat "$work/probe.log")"
out=$("$loom" simulate --config "$work/cnn.pbtxt" --machine "$work/local.pbtxt" --devices 1 2>&1) ||
  fail "simulate on the probed machine: $out"
contains "the probed machine simulates" "$out" "on cpu_local (cpu x 1)"
out=$("$loom" bench simulator --config "$work/cnn.pbtxt" --machine "$work/local.pbtxt" --devices 2 --reps 2 \
  --strategies dp,model 2>&1) || fail "bench simulator: $out"
contains "bench simulator prints predicted against measured" "$out" "median |error|"

out=$("$loom" bench simulator --speed --config "$work/cnn.pbtxt" --machine "$machines/p100_4x4.pbtxt" --devices 4 \
  --reps 2 2>&1) || fail "bench simulator --speed: $out"
contains "bench simulator --speed times full and delta simulation" "$out" "delta simulation"

# A profile measured here costs what it covers; simulate says how much.
"$loom" profile --config "$work/cnn.pbtxt" --devices 2 --steps 2 --out "$work/profile.txt" >"$work/profile.log" 2>&1 ||
  fail "profile: $(cat "$work/profile.log")"
grep -qP '^[0-9.e-]+\t[0-9]+\tConv2d ' "$work/profile.txt" && echo "ok   the profile has the convolutions" ||
  fail "no Conv2d line in $(cat "$work/profile.txt")"
out=$("$loom" simulate --config "$work/cnn.pbtxt" --machine "$work/local.pbtxt" --devices 2 --profile "$work/profile.txt" 2>&1) ||
  fail "simulate --profile: $out"
contains "simulate --profile counts the measured tasks" "$out" "tasks measured, 0 by the roofline calibrated on it"
# Another strategy's shapes (whole batches) the dp profile lacks: the calibrated roofline costs them.
out=$("$loom" simulate --config "$work/cnn.pbtxt" --machine "$work/local.pbtxt" --devices 2 --strategy model \
  --profile "$work/profile.txt" 2>&1) || fail "simulate --strategy model --profile: $out"
grep -qP '[1-9][0-9]* by the roofline calibrated on it' <<<"$out" &&
  echo "ok   the kernels a profile lacks take the calibrated roofline" || fail "no calibrated tasks in: $out"

expect "no machine" "loom simulate needs --machine FILE" -- simulate --config "$work/cnn.pbtxt"
expect "a missing machine file" "nowhere.pbtxt" -- simulate --config "$work/cnn.pbtxt" --machine "$work/nowhere.pbtxt"
printf 'name: "bad"\nnodes: 0\n' >"$work/bad.pbtxt"
expect "a bad machine file" "bad.pbtxt:2: a machine needs nodes >= 1" -- \
  simulate --config "$work/cnn.pbtxt" --machine "$work/bad.pbtxt"
expect "too many devices" "--devices 32: machine p100_4x4 has 16 devices" -- \
  simulate --config "$work/cnn.pbtxt" --machine "$machines/p100_4x4.pbtxt" --devices 32
printf 'devices: 3\ndefault_split { sample: 2 }\n' >"$work/three.pbtxt"
printf '1e-3\tmany\tConv2d x\n' >"$work/bad_profile.txt"
expect "a bad profile" "bad_profile.txt:1: SECONDS and SAMPLES must be numbers" -- \
  simulate --config "$work/cnn.pbtxt" --machine "$machines/p100_4x4.pbtxt" --profile "$work/bad_profile.txt"
expect "a strategy for other devices" "three.pbtxt: the strategy places parts on 3 devices, the run has 4" -- \
  simulate --config "$work/cnn.pbtxt" --machine "$machines/p100_4x4.pbtxt" --devices 4 --strategy "$work/three.pbtxt"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo PASS
