#!/usr/bin/env bash
# `mpirun -np 2 loom train` (the task runtime's devices shared out among
# the processes) trains as one device does (test loss after the same steps, f32, 1e-4),
# resumes to and from in-process runs under other strategies, writes the
# run folder once (rank 0), trains in bf16 as one process does, trains a
# GAN's two steps across the processes, probes the machine as a node per
# process for the simulator, and a refused run ends every rank with a message naming it and leaves no
# folder.
set -uo pipefail
loom="$1"
mpirun_sh="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/parallel_test_lib.sh"
np2() { bash "$mpirun_sh" 2 "$loom" "$@"; }

write_cnn_config "$work/cnn.pbtxt"

"$loom" train --config "$work/cnn.pbtxt" --out "$work/one" >"$work/one.log" 2>&1 || fail "one device: $(cat "$work/one.log")"
want=$(test_losses "$work/one")
for strategy in dp model owt; do
  np2 train --config "$work/cnn.pbtxt" --out "$work/$strategy" --strategy "$strategy" >"$work/$strategy.log" 2>&1 ||
    fail "mpirun --strategy $strategy: $(cat "$work/$strategy.log")"
  close "mpirun -np 2 --strategy $strategy matches one device" "$want" "$(test_losses "$work/$strategy")"
done
np2 train --config "$work/cnn.pbtxt" --out "$work/four" --devices cpu:4 --strategy owt >"$work/four.log" 2>&1 ||
  fail "mpirun --devices cpu:4: $(cat "$work/four.log")"
close "mpirun -np 2 --devices cpu:4 (two devices per process) matches one device" "$want" "$(test_losses "$work/four")"
# Mixed precision: bf16 activations and gradients cross the processes as
# bits, so two processes train as the in-process run does, bit for bit (the
# test loss to 1e-12: the processes share the test batches out and add
# their sums in another order).
# Three test batches of 4: rank 0 evaluates two, rank 1 one.
sed -e 's/^epochs:/precision: "bf16"\nepochs:/' -e 's/batch_size: 16 }/batch_size: 16 eval_batch_size: 4 }/' \
  "$work/cnn.pbtxt" >"$work/bf16.pbtxt"
grep -q 'precision: "bf16"' "$work/bf16.pbtxt" && grep -q 'eval_batch_size: 4' "$work/bf16.pbtxt" ||
  fail "the bf16 config: $(cat "$work/bf16.pbtxt")"
"$loom" train --config "$work/bf16.pbtxt" --out "$work/bf16_in" --devices cpu:2 >"$work/bf16_in.log" 2>&1 ||
  fail "bf16 in one process: $(cat "$work/bf16_in.log")"
np2 train --config "$work/bf16.pbtxt" --out "$work/bf16_np2" >"$work/bf16_np2.log" 2>&1 ||
  fail "bf16 under mpirun: $(cat "$work/bf16_np2.log")"
close "bf16 under mpirun -np 2 equals the in-process run" "$(test_losses "$work/bf16_in")" \
  "$(test_losses "$work/bf16_np2")" 1e-12

# Rank 0 alone writes: one record per epoch's evaluation, one progress log.
records=$(grep -c '"split":"test"' "$work/dp/metrics.jsonl")
[ "$records" -eq 2 ] && echo "ok   the run folder is written once" || fail "expected 2 test records, got $records"
contains "rank 0 prints the summary" "$(cat "$work/dp.log")" "run folder: $work/dp"

# --strategy auto: rank 0 searches (on this machine, probed), every rank
# trains with its strategy.
np2 train --config "$work/cnn.pbtxt" --out "$work/auto" --strategy auto >"$work/auto.log" 2>&1 ||
  fail "mpirun --strategy auto: $(cat "$work/auto.log")"
close "mpirun -np 2 --strategy auto matches one device" "$want" "$(test_losses "$work/auto")"
[ "$(grep -c "strategy auto: [0-9]* proposals" "$work/auto.log")" -eq 1 ] && [ -s "$work/auto/strategy.pbtxt" ] &&
  echo "ok   one search, its strategy in the run folder" || fail "auto: $(cat "$work/auto.log")"
contains "the search's machine has a node per process" "$(cat "$work/auto.log")" "on cpu_local_np2"
# Resumed: rank 0 keeps the saved strategy and sends it; no rank searches.
np2 train --resume "$work/auto" --epochs 3 >"$work/auto2.log" 2>&1 || fail "resume auto: $(cat "$work/auto2.log")"
grep -q "strategy auto: [0-9]* proposals" "$work/auto2.log" && fail "the resumed run searched again" ||
  echo "ok   mpirun resume keeps the saved strategy"

# Saved by 2 processes after epoch 1, resumed in one process on 3 devices;
# saved by one device, resumed by 2 processes.
np2 train --config "$work/cnn.pbtxt" --out "$work/moved" --epochs 1 >"$work/m1.log" 2>&1 || fail "mpirun epoch 1: $(cat "$work/m1.log")"
"$loom" train --resume "$work/moved" --epochs 2 --devices cpu:3 --strategy model >"$work/m2.log" 2>&1 ||
  fail "resumed in one process: $(cat "$work/m2.log")"
close "an mpirun run resumed on cpu:3 by layers matches one device" "$want" "$(test_losses "$work/moved")"
"$loom" train --config "$work/cnn.pbtxt" --out "$work/back" --epochs 1 >"$work/b1.log" 2>&1 || fail "epoch 1: $(cat "$work/b1.log")"
np2 train --resume "$work/back" --epochs 2 --strategy owt >"$work/b2.log" 2>&1 || fail "resumed by mpirun: $(cat "$work/b2.log")"
close "a one-device run resumed by mpirun -np 2 matches one device" "$want" "$(test_losses "$work/back")"

# A GAN (both of its steps split over the processes): one device's losses
# at every logged iteration, and rank 0 alone writes the records.
cat >"$work/gan.pbtxt" <<'CFG'
model { name: "dcgan" args { key: "nz" value: "8" } args { key: "ngf" value: "4" } args { key: "ndf" value: "4" } }
data { dataset: "synthetic" input_shape: [1, 16, 16] num_classes: 2 num_examples: 64 batch_size: 16 }
optimizer { type: "adam" lr: 0.0002 beta1: 0.5 weight_decay: 0 }
epochs: 2
log_every_steps: 2
CFG
gan_losses() {
  python3 -c '
import json, sys
for line in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(line)
    print("%.9g %.9g" % (r["loss"], r["loss_g"]))' "$1"
}
"$loom" train --config "$work/gan.pbtxt" --out "$work/gan_one" >"$work/gan_one.log" 2>&1 ||
  fail "GAN on one device: $(cat "$work/gan_one.log")"
for strategy in dp model; do
  np2 train --config "$work/gan.pbtxt" --out "$work/gan_$strategy" --strategy "$strategy" >"$work/gan_$strategy.log" 2>&1 ||
    fail "mpirun GAN --strategy $strategy: $(cat "$work/gan_$strategy.log")"
  close "mpirun -np 2 GAN --strategy $strategy matches one device" "$(gan_losses "$work/gan_one")" \
    "$(gan_losses "$work/gan_$strategy")"
done
[ "$(grep -c '"step":' "$work/gan_dp/metrics.jsonl")" -eq 4 ] && [ -s "$work/gan_dp/samples/epoch_2.pgm" ] &&
  echo "ok   the GAN's records and samples are written once" || fail "GAN records: $(cat "$work/gan_dp/metrics.jsonl")"

# SIGTERM to rank 1 alone: the ranks agree after the step, rank 0 saves the
# checkpoint and says so, both exit with 128 + 15, and the run resumes to
# the uninterrupted run's result, bit for bit.
sed 's/^epochs: 2$/epochs: 40/' "$work/cnn.pbtxt" >"$work/long.pbtxt"
np2 train --config "$work/long.pbtxt" --out "$work/long" >"$work/long.log" 2>&1 || fail "40 epochs: $(cat "$work/long.log")"
np2 train --config "$work/long.pbtxt" --out "$work/sig" >"$work/sig.log" 2>&1 &
mpirun_pid=$!
rank1=""
for _ in $(seq 1 1000); do
  if ls "$work/sig" 2>/dev/null | grep -q '^ckpt-'; then
    for pid in $(pgrep -f -- "--out $work/sig"); do
      grep -qz '^OMPI_COMM_WORLD_RANK=1$' "/proc/$pid/environ" 2>/dev/null && rank1=$pid
    done
    [ -n "$rank1" ] && break
  fi
  sleep 0.02
done
[ -n "$rank1" ] && kill -s TERM "$rank1" || fail "rank 1 was not found running"
wait "$mpirun_pid" && fail "mpirun exited 0 after SIGTERM"
stopped=$(sed -n 's/.*stopped by SIGTERM at step \([0-9]*\).*/\1/p' "$work/sig.log")
if [ -n "$stopped" ] && [ -e "$work/sig/ckpt-$stopped.loom" ]; then
  echo "ok   SIGTERM to one rank: every rank stopped after step $stopped, rank 0 saved it"
else
  fail "no agreed stop with a checkpoint: $(cat "$work/sig.log")"
fi
np2 train --resume "$work/sig" >"$work/sig2.log" 2>&1 || fail "resume after SIGTERM: $(cat "$work/sig2.log")"
[ "$(test_losses "$work/long")" = "$(test_losses "$work/sig")" ] &&
  echo "ok   a run stopped by SIGTERM to one rank resumes to the uninterrupted result" ||
  fail "resumed $(test_losses "$work/sig") vs uninterrupted $(test_losses "$work/long")"

# The simulator's view of the processes: a probe under mpirun describes a
# node per process with the link their messages take, and `loom bench
# simulator` under mpirun predicts on it (and refuses a one-process machine).
np2 machine probe --reps 1 --out "$work/np2.pbtxt" >"$work/probe.log" 2>&1 || fail "probe: $(cat "$work/probe.log")"
grep -q '^nodes: 2$' "$work/np2.pbtxt" && grep -q '^inter_node {' "$work/np2.pbtxt" &&
  echo "ok   a probe under mpirun has a node per process and their link" || fail "probe: $(cat "$work/np2.pbtxt")"
out=$(np2 bench simulator --config "$work/cnn.pbtxt" --machine "$work/np2.pbtxt" --reps 2 --strategies dp,model 2>&1) ||
  fail "bench simulator under mpirun: $out"
contains "bench simulator under mpirun predicts on it" "$out" "median |error|"
"$loom" machine probe --reps 1 --out "$work/one.pbtxt" >"$work/probe1.log" 2>&1 || fail "probe: $(cat "$work/probe1.log")"
if out=$(np2 bench simulator --config "$work/cnn.pbtxt" --machine "$work/one.pbtxt" --reps 2 2>&1); then
  fail "a one-process machine under mpirun: exit 0"
else
  contains "a one-process machine under mpirun is refused" "$out" "needs one node per process"
fi

if out=$(np2 train --config "$work/cnn.pbtxt" --out "$work/bad" --devices cpu:3 2>&1); then
  fail "devices cpu:3 under mpirun -np 2: exit 0"
else
  contains "a refused run names the rank and the cause" "$out" "rank 1 of 2 failed, ending every rank"
  contains "... and the devices" "$out" "devices cpu:3 under mpirun -np 2: each process runs as many devices"
fi
[ ! -e "$work/bad" ] && echo "ok   a refused run leaves no folder" || fail "a refused run wrote $work/bad"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo PASS
