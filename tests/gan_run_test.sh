#!/usr/bin/env bash
# `loom train` of a GAN (dcgan) end to end, single and fused: the metrics
# carry both networks' losses and D's outputs, the sample grids are written,
# bf16 and fp16 (a loss scaler per network) train as f32,
# fused replica "base" trains exactly as the single run with its settings,
# both steps split over 2 CPU devices (data, model, replica parallel and a
# searched strategy) train as on one, --trace shows both steps, and bad GAN
# input fails before anything is written.
set -euo pipefail
loom="$1"
config="$2"
fused_config="$3"
machine="$4"  # a machine file for --strategy auto's search
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "dataset-fashion-mnist is not installed (tools/setup.sh installs it): skipped"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; cat "$work"/*.log; exit 1; }

"$loom" train --config "$config" --out "$work/single" >"$work/single.log" 2>&1 || fail "the single run failed"
"$loom" train --config "$fused_config" --out "$work/fused" >"$work/fused.log" 2>&1 || fail "the fused run failed"
for f in loss_g d_real d_fake; do
  grep -q "\"$f\":" "$work/single/metrics.jsonl" || fail "metrics.jsonl lacks $f"
done
# 8 x 8 samples of 16x16 images: a 128x128 binary PGM.
[ "$(head -c 15 "$work/single/samples/epoch_1.pgm" | tr '\n' ' ')" = "P5 128 128 255 " ] || fail "bad sample grid header"
[ "$(stat -c %s "$work/single/samples/epoch_1.pgm")" -eq $((15 + 128 * 128)) ] || fail "bad sample grid size"
for r in 0 1; do
  [ -s "$work/fused/samples/epoch_1_r$r.pgm" ] || fail "no samples of replica $r"
  grep -q "\"replica\":$r,\"epoch\":1,\"step\":8," "$work/fused/metrics.jsonl" || fail "no step-8 line of replica $r"
done
ls "$work/single"/ckpt-8.loom >/dev/null || fail "no checkpoint"
# Replica 0 has the single run's seed, learning rates, data and noise: its
# losses must be the single run's (f32; only the summation order inside the
# fused convolutions may differ).
single=$(grep '"step":8,' "$work/single/metrics.jsonl" | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2)
fused=$(grep '"replica":0,"epoch":1,"step":8,' "$work/fused/metrics.jsonl" | grep -o '"loss":[0-9.e+-]*' | cut -d: -f2)
awk -v a="$single" -v b="$fused" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * a) }' ||
  fail "fused replica 0 loss $fused differs from the single run's $single"
grep -qE '^fast lr=0.001 +8 ' "$work/fused.log" || fail "the summary does not list replica fast"

# loss_d and loss_g of every replica at iteration 8, one per line.
losses() {
  python3 -c '
import json, sys
for line in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(line)
    if r.get("step") == 8: print("%.9g %.9g" % (r["loss"], r["loss_g"]))' "$1"
}
# close A B [TOL]: equal to TOL (1e-4) relative, number by number (f32:
# the split steps sum in another order).
close() {
  python3 -c '
import sys
a, b, tol = sys.argv[1].split(), sys.argv[2].split(), float(sys.argv[3])
sys.exit(0 if len(a) == len(b) > 0 and all(abs(float(x) - float(y)) <= tol * max(1.0, abs(float(x))) for x, y in zip(a, b)) else 1)' "$1" "$2" "${3:-1e-4}"
}
# Both steps on 2 CPU devices: each step's graph under the strategy (auto:
# one search per step, on the machine file), dp with the last iteration's
# trace.
for strategy in dp model auto; do
  extra=()
  [ "$strategy" = dp ] && extra=(--trace "$work/trace.json")
  [ "$strategy" = auto ] && extra=(--machine "$machine")
  "$loom" train --config "$config" --out "$work/$strategy" --devices cpu:2 --strategy "$strategy" "${extra[@]}" \
    >"$work/$strategy.log" 2>&1 || fail "--devices cpu:2 --strategy $strategy failed"
  close "$(losses "$work/single")" "$(losses "$work/$strategy")" ||
    fail "--strategy $strategy: losses $(losses "$work/$strategy") differ from one device's $(losses "$work/single")"
  [ -s "$work/$strategy/samples/epoch_1.pgm" ] || fail "--strategy $strategy wrote no samples"
done
"$loom" train --config "$fused_config" --out "$work/fused_split" --devices cpu:2 --strategy replica \
  >"$work/fused_split.log" 2>&1 || fail "the fused run split over 2 devices failed"
for step in d_step g_step; do
  [ "$(grep -c "strategy auto ($step): [0-9]* proposals" "$work/auto.log")" -eq 1 ] ||
    fail "no search of $step: $(cat "$work/auto.log")"
  grep -q "^devices: 2$" "$work/auto/strategy_$step.pbtxt" || fail "no strategy_$step.pbtxt in the run folder"
done
# The trace: the discriminator's step, then the generator's after it, each
# with spans on both devices.
python3 -c '
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
assert names == {0: "discriminator step", 1: "generator step"}, names
spans = {p: [e for e in events if e["ph"] == "X" and e["pid"] == p] for p in (0, 1)}
assert all(len(s) > 20 for s in spans.values()), {p: len(s) for p, s in spans.items()}
d_end = max(e["ts"] + e["dur"] for e in spans[0])
assert min(e["ts"] for e in spans[1]) >= d_end - 1e-3, "the steps overlap"
assert {e["tid"] for e in spans[0]} >= {0, 1}, "not both devices"
' "$work/trace.json" || fail "bad trace: $(head -c 600 "$work/trace.json")"
close "$(losses "$work/fused")" "$(losses "$work/fused_split")" ||
  fail "fused replicas over 2 devices: $(losses "$work/fused_split") differ from one device's $(losses "$work/fused")"

# Mixed precision: bf16, and fp16 with a loss scaler per network, train as
# f32 does (8 iterations: within 1e-3 of its losses; measured 2e-5 and 7e-6).
for p in bf16 fp16; do
  (cat "$config"; echo "precision: \"$p\"") >"$work/$p.pbtxt"
  "$loom" train --config "$work/$p.pbtxt" --out "$work/$p" >"$work/$p.log" 2>&1 || fail "the $p run failed"
  close "$(losses "$work/single")" "$(losses "$work/$p")" 1e-3 ||
    fail "$p losses $(losses "$work/$p") are not f32's $(losses "$work/single")"
done
grep -q '"step":8,.*"loss_scale_d":65536,"loss_scale_g":65536,"skipped_steps_d":0,"skipped_steps_g":0' \
  "$work/fp16/metrics.jsonl" || fail "no fp16 loss scales in $(tail -1 "$work/fp16/metrics.jsonl")"
# A scale of 2^40 overflows both networks' fp16 gradients at every one of
# the 8 iterations: each skips its update and halves its own scale (2^36
# after four), and the run goes on.
(cat "$work/fp16.pbtxt"; echo "loss_scale { init_scale: 1099511627776 }") >"$work/overflow.pbtxt"
"$loom" train --config "$work/overflow.pbtxt" --out "$work/overflow" >"$work/overflow.log" 2>&1 ||
  fail "the overflowing fp16 run failed"
grep -q '"step":4,.*"loss_scale_d":68719476736,"loss_scale_g":68719476736,"skipped_steps_d":4,"skipped_steps_g":4' \
  "$work/overflow/metrics.jsonl" || fail "overflowed steps not skipped: $(head -1 "$work/overflow/metrics.jsonl")"

# SIGTERM stops a GAN run after its iteration with its records closed and
# exit status 143 (GAN runs do not resume yet: no part-epoch checkpoint).
"$loom" train --config "$config" --out "$work/stopped" --epochs 1000 >"$work/stopped.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -s "$work/stopped/metrics.jsonl" ] && break
  sleep 0.02
done
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
[ "$status" -eq 143 ] || fail "exit status $status after SIGTERM, expected 143"
grep -q "stopped by SIGTERM at iteration" "$work/stopped.log" || fail "no stop line"
tail -c 1 "$work/stopped/metrics.jsonl" | od -c | grep -q '\\n' || fail "metrics.jsonl ends mid-line"

# A GAN needs images of size 4 * 2^k; nothing is written when they are not.
sed 's/crop_size: 16/crop_size: 20/' "$config" >"$work/bad.pbtxt"
if "$loom" train --config "$work/bad.pbtxt" --out "$work/bad" >"$work/bad.log" 2>&1; then fail "a 20x20 GAN trained"; fi
grep -q "image_size must be 4 \* 2^k" "$work/bad.log" || fail "unclear error: $(cat "$work/bad.log")"
[ ! -e "$work/bad" ] || fail "a failed start left $work/bad"
echo "gan_run_test: OK"
