#!/usr/bin/env bash
# A stopped run can always be continued: extended (--max-steps), moved or
# named by another path, resumed after dying before its first checkpoint or
# with a damaged newest checkpoint, and stopped cleanly by SIGTERM/SIGINT.
# Each continued run must end with the parameters of an uninterrupted one
# and with metrics.jsonl equal to its own (time fields aside), no record twice.
set -euo pipefail
loom="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"  # absolute: one step runs elsewhere
config="$2"
source "$(dirname "${BASH_SOURCE[0]}")/run_test_lib.sh"
require_fashion_mnist
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$loom" train --config "$config" --out "$work/straight60" --max-steps 60 >/dev/null 2>&1
"$loom" train --config "$config" --out "$work/straight120" --max-steps 120 >/dev/null 2>&1

echo "== extending a run stopped by --max-steps, and naming the field a resume may not change"
"$loom" train --config "$config" --out "$work/ext" --max-steps 60 >/dev/null 2>&1
if "$loom" train --resume "$work/ext" --seed 7 >"$work/refused.log" 2>&1; then fail "a resume with another seed was accepted"; fi
grep -q "seed: unset -> 7" "$work/refused.log" || { cat "$work/refused.log"; fail "the refusal does not name the seed"; }
"$loom" train --resume "$work/ext" --max-steps 120 >"$work/ext.log" 2>&1 || { cat "$work/ext.log"; fail "extending the run failed"; }
grep -q "max_steps: 120" "$work/ext/config.pbtxt" || fail "config.pbtxt does not record the new length"
"$loom" checkpoint "$work/ext/ckpt-120.loom" >/dev/null || fail "the extended run has no checkpoint at step 120"

echo "== a moved run folder, resumed through a relative path with a trailing slash and a symlink"
"$loom" train --config "$config" --out "$work/orig" --max-steps 60 >/dev/null 2>&1
mv "$work/orig" "$work/moved"
ln -s "$work/moved" "$work/link"
(cd "$work" && "$loom" train --resume link/ --max-steps 120 >"$work/moved.log" 2>&1) || { cat "$work/moved.log"; fail "resuming the moved run failed"; }
"$loom" checkpoint "$work/moved/ckpt-120.loom" >/dev/null || fail "the moved run has no checkpoint at step 120"

echo "== a run that died before its first checkpoint"
"$loom" train --config "$config" --out "$work/early" --max-steps 60 >/dev/null 2>&1
rm "$work/early"/ckpt-*.loom
touch "$work/early/ckpt-10.loom.tmp-999-1"  # a save cut short
"$loom" train --resume "$work/early" >"$work/early.log" 2>&1 || { cat "$work/early.log"; fail "resuming a run without checkpoints failed"; }
grep -q "holds no checkpoint yet: starting the run from step 0" "$work/early.log" || fail "no note about starting again"
[ ! -e "$work/early/ckpt-10.loom.tmp-999-1" ] || fail "the orphan temporary was not removed"
same_run "$work/early" 60 "$work/straight60"

echo "== a damaged newest checkpoint: back to the one before it"
"$loom" train --config "$config" --out "$work/damaged" --max-steps 60 >/dev/null 2>&1
printf 'garbage' | dd of="$work/damaged/ckpt-60.loom" bs=1 seek=200 conv=notrunc status=none
"$loom" train --resume "$work/damaged" >"$work/damaged.log" 2>&1 || { cat "$work/damaged.log"; fail "resume with a damaged checkpoint failed"; }
grep -q "warning: .*ckpt-60.loom.*moved to .*ckpt-60.loom.corrupt" "$work/damaged.log" || { cat "$work/damaged.log"; fail "no warning"; }
grep -q "resuming .* (step 50" "$work/damaged.log" || fail "did not fall back to step 50"
same_run "$work/damaged" 60 "$work/straight60"

# Long runs: a 120-step run took 0.34 s on a Zen 4 and ended before the
# signal (polled every 20 ms past step 20) reached it.
"$loom" train --config "$config" --out "$work/straight1200" --epochs 12 --max-steps 1200 >/dev/null 2>&1
for sig in TERM INT; do
  echo "== SIG$sig: the run finishes its step, saves, exits with 128+signal, and resumes exactly"
  "$loom" train --config "$config" --out "$work/sig$sig" --epochs 12 --max-steps 1200 >"$work/sig$sig.log" 2>&1 &
  pid=$!
  # Signal it once it is past step 20 (checkpoints are pruned: compare steps, not names).
  for _ in $(seq 1 600); do
    at=$(latest_step "$work/sig$sig" 2>/dev/null || true)
    [ -n "$at" ] && [ "$at" -ge 20 ] && break
    sleep 0.02
  done
  kill -s "$sig" "$pid" || fail "the run ended before the signal"
  status=0
  wait "$pid" || status=$?
  want=$([ "$sig" = TERM ] && echo 143 || echo 130)
  [ "$status" -eq "$want" ] || { cat "$work/sig$sig.log"; fail "exit status $status after SIG$sig, expected $want"; }
  grep -q "stopped by SIG$sig at step" "$work/sig$sig.log" || fail "no stop line"
  stopped=$(sed -n "s/.*stopped by SIG$sig at step \([0-9]*\).*/\1/p" "$work/sig$sig.log")
  [ "$stopped" -lt 1200 ] || fail "the run ended before the signal"
  "$loom" checkpoint "$work/sig$sig/ckpt-$stopped.loom" >/dev/null || fail "no checkpoint at the stop step $stopped"
  "$loom" train --resume "$work/sig$sig" >/dev/null 2>&1 || fail "resume after SIG$sig failed"
  same_run "$work/sig$sig" 1200 "$work/straight1200"
  echo "stopped at step $stopped, resumed"
done

# A second signal ending the run at once: train/stop_signals_test.cc.
echo "PASS"
