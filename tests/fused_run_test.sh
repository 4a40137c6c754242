#!/usr/bin/env bash
# One fused `loom train` run of 4 replicas end to end: a diverging replica is
# frozen and reported while the others go on, the early stop re-fuses the
# array smaller, and the run folder has one metrics stream and one
# TensorBoard curve per replica and a ranked summary.
set -euo pipefail
loom="$1"
config="$2"
data_order_config="$3"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "dataset-fashion-mnist is not installed (tools/setup.sh installs it): skipped"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; cat "$work/run.log"; exit 1; }

"$loom" train --config "$config" --out "$work/run" >"$work/run.log" 2>&1 || fail "the run failed"
grep -qE "replica huge [^:]*: diverged" "$work/run.log" || fail "replica huge was not reported as diverged"
grep -q "stopped by early stop (test_accuracy, epoch 1)" "$work/run.log" || fail "no replica was stopped early"
# Of base, slow, damped the early stop keeps ceil(0.5 * 3) = 2.
[ "$(grep -c 'stopped by early stop.*(train loss' "$work/run.log")" -eq 1 ] || fail "expected exactly one early-stopped replica"
for r in 0 1 3; do
  grep -q "\"replica\":$r," "$work/run/metrics.jsonl" || fail "metrics.jsonl has no line of replica $r"
  ls "$work/run/replica_$r"/events.out.tfevents.* >/dev/null 2>&1 || fail "no TensorBoard events for replica $r"
done
# Replica 2 diverged within the first steps, before the first report.
if grep -q '"replica":2,' "$work/run/metrics.jsonl"; then fail "the diverged replica was logged"; fi
grep -q "ranked by test_accuracy" "$work/run.log" || fail "no ranked summary"
[ "$(grep -cE '^ +[0-9]+  (base|slow|huge|damped)' "$work/run.log")" -eq 4 ] || fail "the summary does not list 4 replicas"
# The final checkpoint holds the 2 running replicas as an array and the 2
# retired ones aside.
final=$(ls "$work/run" | grep -E '^ckpt-[0-9]+\.loom$' | sort -t- -k2 -n | tail -1)
"$loom" checkpoint "$work/run/$final" >"$work/ckpt.txt"
grep -qE '^tensor +fc1/weight +f32 \[2, 64, 784\]' "$work/ckpt.txt" || { cat "$work/ckpt.txt" | head -20; fail "fc1/weight is not [2, 64, 784]"; }
grep -qE '^tensor +retired/2/fc1/weight +f32 \[64, 784\]' "$work/ckpt.txt" || fail "the diverged replica's tensors are not in the checkpoint"

# Per-replica data order: replica r1 (seed 9, lr 0.03) of the fused run must
# train as a single run with that seed and lr, which shuffles the same way.
# The fused and the single run differ only in GEMM summation order (f32).
"$loom" train --config "$data_order_config" --out "$work/order" >"$work/order.log" 2>&1 || fail "per-replica data order run failed"
sed -e '/^replicas/d' -e '/^fusion/d' -e 's/^seed: 5/seed: 9/' -e 's/  lr: 0.05/  lr: 0.03/' \
  "$data_order_config" >"$work/single.pbtxt"
"$loom" train --config "$work/single.pbtxt" --out "$work/single" >"$work/single.log" 2>&1 || fail "the single run failed"
fused_loss=$(grep '"replica":1,"epoch":2,.*"split":"test"' "$work/order/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
single_loss=$(grep '"epoch":2,.*"split":"test"' "$work/single/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
echo "replica r1 test loss: fused $fused_loss, single run $single_loss"
awk -v a="$fused_loss" -v b="$single_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-4 * b) }' ||
  fail "replica r1 of the fused run ($fused_loss) does not match the single run ($single_loss)"
# And the replicas' orders differ: r0 (seed 5) is another run.
[ "$(grep -c '"split":"test"' "$work/order/metrics.jsonl")" -eq 4 ] || fail "expected 2 test lines per replica"

# --dump-graphs: the graph after each pass of each compiled program.
"$loom" train --config "$config" --out "$work/dump" --max-steps 1 --dump-graphs "$work/graphs" >"$work/dump.log" 2>&1 ||
  { cat "$work/dump.log"; fail "the --dump-graphs run failed"; }
for f in train.01.fuse-replicas.txt train.02.training-step.txt eval.01.fuse-replicas.txt; do
  [ -s "$work/graphs/$f" ] || { ls "$work/graphs"; fail "--dump-graphs wrote no $f"; }
done
grep -q "SgdUpdate" "$work/graphs/train.02.training-step.txt" || fail "the training-step dump has no optimizer update"
if grep -q "SgdUpdate" "$work/graphs/train.01.fuse-replicas.txt"; then fail "the fusion dump already has updates"; fi
echo "PASS"
