#!/usr/bin/env bash
# Kills a `loom train` run mid-epoch (SIGKILL, no chance to clean up), resumes
# it with --resume, and checks that its final parameters, optimizer state and
# position equal an uninterrupted run's bit for bit.
set -euo pipefail
loom="$1"
config="$2"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "dataset-fashion-mnist is not installed (tools/setup.sh installs it): skipped"
  exit 0
fi
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
killed_at=$(ls "$work/killed" | grep -E '^ckpt-[0-9]+\.loom$' | sed 's/ckpt-\(.*\)\.loom/\1/' | sort -n | tail -1)
echo "killed after checkpoint $killed_at"
final=$(ls "$work/straight" | grep -E '^ckpt-[0-9]+\.loom$' | sed 's/ckpt-\(.*\)\.loom/\1/' | sort -n | tail -1)
if [ "$killed_at" -ge "$final" ]; then
  echo "FAIL: the run finished before it could be killed (checkpoint $killed_at of $final)"
  exit 1
fi

"$loom" train --resume "$work/killed" >"$work/resumed.log" 2>&1 || { cat "$work/resumed.log"; exit 1; }
grep -q "resuming" "$work/resumed.log" || { echo "FAIL: the run did not resume"; cat "$work/resumed.log"; exit 1; }

"$loom" checkpoint "$work/straight/ckpt-$final.loom" >"$work/straight.txt"
"$loom" checkpoint "$work/killed/ckpt-$final.loom" >"$work/resumed.txt"
if ! diff "$work/straight.txt" "$work/resumed.txt"; then
  echo "FAIL: the resumed run's final checkpoint differs from the uninterrupted run's"
  exit 1
fi
grep -c "^tensor" "$work/straight.txt" | xargs echo "identical tensors:"
# Metrics continue where they stopped: records logged after the checkpoint
# are dropped and logged again, so the file equals the uninterrupted run's
# (time fields aside) with no (replica, split, step) twice.
records() { sed -E 's/"(samples_per_s|time_s)":[^,}]*,?//g' "$1/metrics.jsonl"; }
if ! diff <(records "$work/straight") <(records "$work/killed"); then
  echo "FAIL: the resumed run's metrics.jsonl differs from the uninterrupted run's"
  exit 1
fi
echo "PASS"
