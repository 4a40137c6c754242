# Shared by the tests that stop and continue `loom train` runs (resume_test,
# run_recovery_test, crash_campaign_test); sourced after `loom` is set.

# The runs train on Fashion-MNIST; without it there is nothing to test.
require_fashion_mnist() {
  if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    echo "dataset-fashion-mnist is not installed (tools/setup.sh installs it): skipped"
    exit 0
  fi
}

fail() { echo "FAIL: $*"; exit 1; }

# Run folder $1's metrics.jsonl without the fields that measure time.
records() { sed -E 's/"(samples_per_s|time_s)":[^,}]*,?//g' "$1/metrics.jsonl"; }

# The highest checkpoint step in run folder $1; empty when there is none.
latest_step() { ls "$1" | grep -E '^ckpt-[0-9]+\.loom$' | sed 's/ckpt-\(.*\)\.loom/\1/' | sort -n | tail -1; }

# Fails unless run folder $1 ends at step $2 with the parameters, optimizer
# state and position of uninterrupted run $3, and with its records (time
# fields aside: no record lost, none twice).
same_run() {
  local got want
  got=$("$loom" checkpoint "$1/ckpt-$2.loom") || fail "$1 has no checkpoint at step $2"
  want=$("$loom" checkpoint "$3/ckpt-$2.loom")
  [ "$got" = "$want" ] || fail "$1: the checkpoint at step $2 differs from the uninterrupted run's"
  diff <(records "$3") <(records "$1") || fail "$1: metrics.jsonl differs from the uninterrupted run's"
}
