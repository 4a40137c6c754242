#!/usr/bin/env bash
# Kills a `loom train` run mid-epoch (SIGKILL, no chance to clean up), resumes
# it with --resume, and checks that its final parameters, optimizer state and
# position equal an uninterrupted run's bit for bit, and its metrics.jsonl
# the uninterrupted run's (time fields aside: no record lost or repeated).
set -euo pipefail
loom="$1"
config="$2"
source "$(dirname "${BASH_SOURCE[0]}")/run_test_lib.sh"
require_fashion_mnist
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$loom" train --config "$config" --out "$work/straight" >"$work/straight.log" 2>&1

"$loom" train --config "$config" --out "$work/killed" >"$work/killed.log" 2>&1 &
pid=$!
# Kill it once a checkpoint past step 100 exists: mid-way through epoch 2.
for _ in $(seq 1 600); do
  if ls "$work/killed" 2>/dev/null | grep -qE '^ckpt-(1[0-9][0-9]|[2-9][0-9][0-9])\.loom$'; then break; fi
  sleep 0.05
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
killed_at=$(latest_step "$work/killed")
echo "killed after checkpoint $killed_at"
final=$(latest_step "$work/straight")
if [ "$killed_at" -ge "$final" ]; then
  echo "FAIL: the run finished before it could be killed (checkpoint $killed_at of $final)"
  exit 1
fi

"$loom" train --resume "$work/killed" >"$work/resumed.log" 2>&1 || { cat "$work/resumed.log"; exit 1; }
grep -q "resuming" "$work/resumed.log" || { echo "FAIL: the run did not resume"; cat "$work/resumed.log"; exit 1; }

same_run "$work/killed" "$final" "$work/straight"
"$loom" checkpoint "$work/straight/ckpt-$final.loom" | grep -c "^tensor" | xargs echo "identical tensors:"
echo "PASS"
