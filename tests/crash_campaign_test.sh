#!/usr/bin/env bash
# Kills a `loom train` run with SIGKILL at random moments, again and again
# (resuming it each time), until it finishes; then its final parameters and
# metrics.jsonl (time fields aside) must equal an uninterrupted run's. Kills
# that land inside a checkpoint write leave a temporary behind, which the
# next resume removes; the test counts them.
set -euo pipefail
loom="$1"
config="$2"
kills="${3:-30}"
source "$(dirname "${BASH_SOURCE[0]}")/run_test_lib.sh"
require_fashion_mnist
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

start=$(date +%s.%N)
"$loom" train --config "$config" --out "$work/straight" >/dev/null 2>&1
run_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
final=$(latest_step "$work/straight")

# Kill i waits for the run to pass step final * (i + 1) / (kills + 2), so the
# kills spread over the whole run however fast this machine trains and
# writes checkpoints (waiting only for the next checkpoint, a run on a fast
# disk got far enough ahead between kills to finish after 24 of 30). The
# random moment after it is at most 4 steps' time of the uninterrupted run.
max_delay_ms=$(awk -v s="$run_s" -v n="$final" 'BEGIN { d = 4000 * s / n; print int(d < 20 ? (d < 1 ? 1 : d) : 20) }')
RANDOM=42  # the same campaign every time
done_kills=0 in_writes=0 in_startup=0
while [ "$done_kills" -lt "$kills" ]; do
  target=$((final * (done_kills + 1) / (kills + 2)))
  if [ -f "$work/crashed/config.pbtxt" ]; then
    "$loom" train --resume "$work/crashed" >>"$work/log" 2>&1 &
  else
    "$loom" train --config "$config" --out "$work/crashed" >>"$work/log" 2>&1 &
  fi
  pid=$!
  if [ $((done_kills % 6)) -eq 5 ]; then
    # Now and then during start-up (data loading, model building, restore).
    sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.3f", (r % 300) / 1000 }')"
    in_startup=$((in_startup + 1))
  else
    # Otherwise once the run has passed its target, at a random moment after a checkpoint.
    for _ in $(seq 1 2000); do
      now=$(latest_step "$work/crashed" 2>/dev/null || true)
      [ -n "$now" ] && [ "$now" -ge "$target" ] && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.005
    done
    sleep "$(awk -v r="$RANDOM" -v m="$max_delay_ms" 'BEGIN { printf "%.3f", (r % m) / 1000 }')"
  fi
  if ! kill -9 "$pid" 2>/dev/null; then
    wait "$pid" 2>/dev/null || { tail -5 "$work/log"; fail "a run failed on its own"; }
    break  # it finished first
  fi
  wait "$pid" 2>/dev/null || true
  done_kills=$((done_kills + 1))
  if [ -d "$work/crashed" ] && ls "$work/crashed" | grep -q '\.tmp-'; then in_writes=$((in_writes + 1)); fi
done
# Whatever the last kill left, finish the run.
if [ "$(latest_step "$work/crashed" 2>/dev/null || true)" != "$final" ]; then
  "$loom" train --resume "$work/crashed" >>"$work/log" 2>&1 || { tail -5 "$work/log"; fail "the last resume failed"; }
fi
[ "$done_kills" -ge "$kills" ] || fail "only $done_kills kills landed before the run finished"
same_run "$work/crashed" "$final" "$work/straight"
if ls "$work/crashed" | grep -q '\.tmp-'; then fail "a temporary was left behind"; fi
echo "PASS: $done_kills kill -9 ($in_writes inside a checkpoint write, $in_startup during start-up), final parameters and metrics equal the uninterrupted run's"
