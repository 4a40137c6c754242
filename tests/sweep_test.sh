#!/usr/bin/env bash
# `loom sweep` end to end on a small Hyperband sweep of the Fashion-MNIST MLP
# (9 trials, rungs at 1, 3 and 9 epochs, two batch sizes):
# - fused == separate: every trial's test loss at its last rung equals a
#   `loom train` run of the trial's own config alone (same seed), up to the
#   GEMM summation order of the fused array (1e-4 relative);
# - packing: one array per batch size; with the memory plan's R=2 total as
#   the sweep's memory, no array holds more than 2 trials;
# - resume: a sweep killed (SIGKILL, or SIGINT: exit 130 after a checkpoint)
#   mid-way and resumed ends with the same
#   trials, rung results, leaderboard, array checkpoints and metrics lines
#   as an uninterrupted one (no trial run twice, none lost);
# - a stopped trial's checkpoint exports with loom export; each trial has a
#   TensorBoard HParams session;
# - ASHA over arrays run one after another; diverging trials; a budget;
# - bad sweep files fail with FILE:LINE and write nothing.
set -euo pipefail
loom="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"  # absolute: the test changes folders
sweep="$2"
source "$(dirname "${BASH_SOURCE[0]}")/run_test_lib.sh"
require_fashion_mnist
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
show() { cat "$1"; }

"$loom" sweep --config "$sweep" --trials 9 --out "$work/straight" >"$work/straight.log" 2>&1 ||
  { show "$work/straight.log"; fail "the sweep failed"; }
grep -q "9 trials in 1 bracket, 2 arrays (packed by the memory plan)" "$work/straight.log" ||
  { show "$work/straight.log"; fail "expected 9 trials in 2 arrays (one per batch size)"; }
grep -q "^best: t" "$work/straight.log" || fail "no best trial reported"
[ "$(wc -l <"$work/straight/trials.jsonl")" -eq 9 ] || fail "trials.jsonl does not have 9 trials"
# Hyperband: 9 trials at epoch 1, 3 at epoch 3, 1 at epoch 9.
[ "$(grep -c '"status": "finished"' "$work/straight/trials.jsonl")" -eq 1 ] || fail "expected one finished trial"
[ "$(grep -c 'stopped at rung 0' "$work/straight/trials.jsonl")" -eq 6 ] || fail "expected 6 trials stopped at rung 0"
[ "$(grep -c 'stopped at rung 1' "$work/straight/trials.jsonl")" -eq 2 ] || fail "expected 2 trials stopped at rung 1"

# fused == separate, for every trial at its last rung.
checked=0
while read -r line; do
  id=$(sed 's/^{"trial": \([0-9]*\),.*/\1/' <<<"$line")
  epoch=$(sed 's/.*"rungs": {.*"\([0-9]*\)": [^,}]*}.*/\1/' <<<"$line")
  "$loom" train --config "$work/straight/trials/t$id/config.pbtxt" --out "$work/alone$id" >"$work/alone$id.log" 2>&1 ||
    { show "$work/alone$id.log"; fail "trial $id alone failed"; }
  swept=$(grep "\"epoch\":$epoch,.*\"split\":\"test\"" "$work/straight/trials/t$id/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
  alone=$(grep "\"epoch\":$epoch,.*\"split\":\"test\"" "$work/alone$id/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
  echo "trial $id epoch $epoch test loss: swept $swept, alone $alone"
  awk -v a="$swept" -v b="$alone" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-4 * b) }' ||
    fail "trial $id: the sweep's test loss at epoch $epoch ($swept) differs from the trial alone ($alone)"
  checked=$((checked + 1))
done <"$work/straight/trials.jsonl"
[ "$checked" -eq 9 ] || fail "compared $checked trials, expected 9"

# TensorBoard's HParams view: a session record beside each trial's scalars,
# naming every searched field.
sessions=0
for f in "$work"/straight/arrays/*/replica_*/events.out.tfevents.0000000000.hparams; do
  grep -qa "_hparams_/session_start_info" "$f" || fail "$f has no HParams session"
  for field in optimizer.lr optimizer.momentum data.batch_size; do grep -qa "$field" "$f" || fail "$f lacks $field"; done
  ls "$(dirname "$f")"/events.out.tfevents.* | grep -qv hparams || fail "no scalars beside $f"
  sessions=$((sessions + 1))
done
[ "$sessions" -eq 9 ] || fail "expected 9 HParams sessions, found $sessions"

# A trial stopped at rung 0 exports as a single model.
line=$(grep -m1 'stopped at rung 0' "$work/straight/trials.jsonl")
export_cmd=$(sed 's/.*"checkpoint": "loom export \([^"]*\)".*/\1/' <<<"$line")
# shellcheck disable=SC2086  # the recorded command's words
(cd "$work" && "$loom" export $export_cmd) >"$work/export.log" 2>&1 || { show "$work/export.log"; fail "loom export of a stopped trial failed"; }
grep -q "stopped by the sweep" "$work/export.log" || { show "$work/export.log"; fail "the export does not name the trial's stop"; }

# Starts a 9-trial sweep into $work/NAME (its log $work/NAME.log) and sends
# it SIGNAL once its second array has begun; leaves its pid in $pid.
start_and_signal() {
  "$loom" sweep --config "$sweep" --trials 9 --out "$work/$1" >"$work/$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    if [ -e "$work/$1/arrays/b0-a1/metrics.jsonl" ]; then break; fi
    sleep 0.05
  done
  kill -"$2" "$pid" 2>/dev/null || true
}

# Resume: kill the sweep once the second array has begun, resume it.
start_and_signal killed 9
wait "$pid" 2>/dev/null || true
if grep -q "^sweep done" "$work/killed.log"; then fail "the sweep finished before it could be killed"; fi
"$loom" sweep --resume "$work/killed" >"$work/resumed.log" 2>&1 || { show "$work/resumed.log"; fail "the resume failed"; }
grep -q "resumed" "$work/resumed.log" || fail "the sweep did not say it resumed"
# The records name their own folder; anything else differing is a failure.
diff <(sed "s|$work/straight/||g" "$work/straight/trials.jsonl") <(sed "s|$work/killed/||g" "$work/killed/trials.jsonl") ||
  fail "the resumed sweep's trials differ from the uninterrupted sweep's"
diff "$work/straight/leaderboard.txt" "$work/killed/leaderboard.txt" || fail "the leaderboards differ"
for a in b0-a0 b0-a1; do
  final=$(latest_step "$work/straight/arrays/$a")
  same_run "$work/killed/arrays/$a" "$final" "$work/straight/arrays/$a"
done
echo "resumed sweep: same trials, leaderboard, checkpoints and records"

# A sweep killed after an array's rung records, before its next checkpoint
# (the random kill above lands there now and then): made exactly, from the
# uninterrupted sweep's files as they stood after rung 0. Each array is cut
# back to its first epoch (b0-a0 to its checkpoint at step 16, b0-a1, 32
# steps an epoch, to no checkpoint at all), so the resume finds rung 0's
# results but must train b0-a1 to epoch 1 again before it drops the trial
# rung 0 stopped: that trial's kept state is its state at epoch 1 (it was
# its initial state before the fix, and the array's checkpoints differed).
cp -r "$work/straight" "$work/cut"
cut_back() {  # array folder, the last step kept
  for c in "$1"/ckpt-*.loom; do
    [ "$(basename "$c" .loom | sed 's/ckpt-//')" -le "$2" ] || rm "$c"
  done
  awk -v s="$2" '{ match($0, /"step":[0-9]+/); if (substr($0, RSTART + 7, RLENGTH - 7) + 0 <= s) print }' \
    "$1/metrics.jsonl" >"$1/metrics.cut" && mv "$1/metrics.cut" "$1/metrics.jsonl"
}
cut_back "$work/cut/arrays/b0-a0" 16
cut_back "$work/cut/arrays/b0-a1" 32
[ -z "$(latest_step "$work/cut/arrays/b0-a1")" ] || fail "b0-a1 should have no checkpoint left at step 32 or before"
"$loom" sweep --resume "$work/cut" >"$work/cut.log" 2>&1 || { show "$work/cut.log"; fail "the resume of the cut sweep failed"; }
for a in b0-a0 b0-a1; do
  same_run "$work/cut/arrays/$a" "$(latest_step "$work/straight/arrays/$a")" "$work/straight/arrays/$a"
done
echo "a sweep killed between a rung's records and the array's checkpoint resumes as the uninterrupted one"

# SIGINT: the sweep checkpoints the array in progress, exits 130, and its
# resume ends as the uninterrupted sweep.
start_and_signal interrupted INT
status=0
wait "$pid" || status=$?
if grep -q "^sweep done" "$work/interrupted.log"; then fail "the sweep finished before SIGINT"; fi
[ "$status" -eq 130 ] || { show "$work/interrupted.log"; fail "SIGINT: exit status $status, expected 130"; }
grep -q "stopped by SIGINT" "$work/interrupted.log" || { show "$work/interrupted.log"; fail "no SIGINT message"; }
"$loom" sweep --resume "$work/interrupted" >"$work/interrupted_resumed.log" 2>&1 || fail "the resume after SIGINT failed"
diff <(sed "s|$work/straight/||g" "$work/straight/trials.jsonl") <(sed "s|$work/interrupted/||g" "$work/interrupted/trials.jsonl") ||
  fail "the sweep resumed after SIGINT differs from the uninterrupted sweep"
echo "interrupted (SIGINT) and resumed sweep: same trials"

# Packing sized by the memory plan: with memory = the plan's total for 2
# replicas, arrays hold at most 2 trials.
"$loom" plan --config "$work/straight/trials/t0/config.pbtxt" --with-eval --max-replicas 4 --json "$work/plan.json" >/dev/null
two=$(sed 's/.*{"replicas": 2,[^}]*"total_bytes": \([0-9]*\),.*/\1/' "$work/plan.json")
sed "s|^train_config: \"|train_config: \"$(cd "$(dirname "$sweep")" && pwd)/|" "$sweep" >"$work/small.pbtxt"
echo "memory: \"$two\"" >>"$work/small.pbtxt"
"$loom" sweep --config "$work/small.pbtxt" --trials 9 --out "$work/small" >"$work/small.log" 2>&1 ||
  { show "$work/small.log"; fail "the memory-limited sweep failed"; }
grep -E "arrays of( [12])+$" "$work/small.log" || { show "$work/small.log"; fail "an array holds more than 2 trials"; }
echo "memory $two bytes: $(grep -o 'arrays of.*' "$work/small.log")"

# ASHA over arrays of at most 3 trials, run one after another: each trial
# stopped at a rung has results up to that rung only; a resume of the
# finished sweep reopens no array and changes no record.
sed -e 's/^algorithm: "hyperband"/algorithm: "asha"/' "$work/small.pbtxt" | grep -v '^memory' >"$work/asha.pbtxt"
echo 'max_array: 3' >>"$work/asha.pbtxt"
"$loom" sweep --config "$work/asha.pbtxt" --trials 8 --out "$work/asha" >"$work/asha.log" 2>&1 ||
  { show "$work/asha.log"; fail "the ASHA sweep failed"; }
grep -q "asha, 8 trials in 1 bracket, 3 arrays" "$work/asha.log" || { show "$work/asha.log"; fail "ASHA: expected 3 arrays"; }
grep -q "rungs at epochs 1, 3, 9; arrays of 3 3 2$" "$work/asha.log" || { show "$work/asha.log"; fail "ASHA: rungs or arrays"; }
[ "$(grep -c '"status": "finished"' "$work/asha/trials.jsonl")" -ge 1 ] || fail "ASHA: no trial finished"
[ "$(grep -c '"rungs": {"1": [^,}]*}, "status": "stopped at rung 0' "$work/asha/trials.jsonl")" -ge 1 ] ||
  fail "ASHA: no trial stopped at rung 0 with its rung-0 result alone"
if grep -E '"rungs": \{"1": [^,}]*, "3"[^}]*\}, "status": "stopped at rung 0' "$work/asha/trials.jsonl"; then
  fail "ASHA: a trial stopped at rung 0 has later results"
fi
cp "$work/asha/trials.jsonl" "$work/asha_trials.before"
"$loom" sweep --resume "$work/asha" >"$work/asha_resumed.log" 2>&1 || { show "$work/asha_resumed.log"; fail "ASHA resume failed"; }
if grep -q "^  array " "$work/asha_resumed.log"; then show "$work/asha_resumed.log"; fail "a finished sweep's resume trained again"; fi
diff "$work/asha_trials.before" "$work/asha/trials.jsonl" || fail "a finished sweep's resume changed its records"

# Diverging trials (learning rates up to 1e5; an array of 2 diverges
# whole) rank last and leave the bracket; the sweep goes on, and so does its
# resume.
sed 's/min: 0.005 max: 0.3/min: 0.05 max: 100000/' "$work/asha.pbtxt" | sed 's/^algorithm: "asha"/algorithm: "hyperband"/' |
  grep -v '^max_array' >"$work/diverge.pbtxt"
"$loom" sweep --config "$work/diverge.pbtxt" --trials 9 --out "$work/diverge" >"$work/diverge.log" 2>&1 ||
  { show "$work/diverge.log"; fail "a sweep with diverging trials failed"; }
grep -q "every replica diverged" "$work/diverge.log" || { show "$work/diverge.log"; fail "no array diverged whole"; }
[ "$(grep -c '"status": "diverged' "$work/diverge/trials.jsonl")" -ge 2 ] || fail "diverged trials not recorded"
grep -q '"status": "finished"' "$work/diverge/trials.jsonl" || fail "no trial finished beside the diverged"
"$loom" sweep --resume "$work/diverge" >"$work/diverge_resumed.log" 2>&1 || { show "$work/diverge_resumed.log"; fail "resume failed"; }

# A budget of 1 s: the arrays not begun by then never begin; their trials
# are recorded as not run.
"$loom" sweep --config "$work/asha.pbtxt" --trials 8 --budget 1s --out "$work/budget" >"$work/budget.log" 2>&1 ||
  { show "$work/budget.log"; fail "the budget sweep failed"; }
grep -q "the budget of 0:01 is spent: no new array starts" "$work/budget.log" || { show "$work/budget.log"; fail "no budget line"; }
[ "$(grep -c '"status": "not run (budget)"' "$work/budget/trials.jsonl")" -ge 2 ] || fail "the budget stopped no array"

# Bad space definitions: FILE:LINE errors, a non-zero exit, nothing written.
bad() {  # $1: the param block, $2: the expected message
  sed '/^param/d' "$work/small.pbtxt" >"$work/bad.pbtxt"
  echo "$1" >>"$work/bad.pbtxt"
  line=$(wc -l <"$work/bad.pbtxt")
  if "$loom" sweep --config "$work/bad.pbtxt" --out "$work/bad" >"$work/bad.log" 2>&1; then fail "accepted: $1"; fi
  grep -qF "bad.pbtxt:$line: field param[0]" "$work/bad.log" || { show "$work/bad.log"; fail "no FILE:LINE for: $1"; }
  grep -qF "$2" "$work/bad.log" || { show "$work/bad.log"; fail "expected '$2' for: $1"; }
  [ ! -e "$work/bad" ] || fail "a failed sweep wrote $work/bad"
}
bad 'param { field: "optimizer.lr" min: 0.1 max: 0.1 }' "empty range"
bad 'param { field: "optimizer.lr" distribution: "log_uniform" min: 0 max: 1 }' "log_uniform needs min > 0"
bad 'param { field: "optimizer.lrate" min: 0.1 max: 1 }' "is not a field of the train config"
bad 'param { field: "data.batch_size" strings: ["big"] }' "is a number"
bad 'param { field: "optimizer.type" values: [1, 2] }' "choose among strings"
bad 'param { field: "data.batch_size" values: [0, 32] }' "must be >= 1"
echo "PASS"
