#!/usr/bin/env bash
# `loom train --devices cpu:N --strategy ...` trains as one device does (the
# test loss after the same steps, f32: the all-reduces sum in another
# order), a run saved under one strategy resumes under another, and bad
# requests exit non-zero naming what is wrong.
set -uo pipefail
loom="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
source "$(dirname "${BASH_SOURCE[0]}")/parallel_test_lib.sh"

write_cnn_config "$work/cnn.pbtxt"
cat >"$work/fused.pbtxt" <<'CFG'
model { name: "mlp" args { key: "hidden" value: "16" } }
data { dataset: "synthetic" input_shape: [1, 4, 4] num_classes: 4 num_examples: 64 batch_size: 16 }
optimizer { type: "adam" lr: 0.01 }
replicas { seed: 1 } replicas { seed: 2 } replicas { seed: 3 } replicas { seed: 4 }
epochs: 2
CFG

"$loom" train --config "$work/cnn.pbtxt" --out "$work/one" >"$work/one.log" 2>&1 || fail "one device: $(cat "$work/one.log")"
want=$(test_losses "$work/one")
for strategy in dp model owt; do
  "$loom" train --config "$work/cnn.pbtxt" --out "$work/$strategy" --devices cpu:2 --strategy "$strategy" \
    >"$work/$strategy.log" 2>&1 || fail "--strategy $strategy: $(cat "$work/$strategy.log")"
  close "cnn --devices cpu:2 --strategy $strategy matches one device" "$want" "$(test_losses "$work/$strategy")"
done

# A byte-level language model (vocabulary 256) with its embedding table
# split along the vocabulary and the output layer along its features.
printf 'the quick brown fox jumps over the lazy dog; %.0s' $(seq 60) >"$work/text.txt"
cat >"$work/lm.pbtxt" <<CFG
model { name: "transformer_lm" args { key: "width" value: "16" } args { key: "layers" value: "1" }
        args { key: "heads" value: "2" } args { key: "feedforward" value: "16" } args { key: "dropout" value: "0" } }
data { dataset: "text" path: "$work/text.txt" text_level: "byte" sequence_length: 16 batch_size: 8 }
optimizer { type: "adam" lr: 0.01 }
epochs: 1
CFG
printf 'devices: 2\ndefault_split { sample: 2 }\nlayer { layer: "encoder" parameter: 2 parameter_split: "vocabulary" }\n' \
  >"$work/vocabulary.pbtxt"
"$loom" train --config "$work/lm.pbtxt" --out "$work/lm_one" >"$work/lm1.log" 2>&1 || fail "lm: $(cat "$work/lm1.log")"
"$loom" train --config "$work/lm.pbtxt" --out "$work/lm_vocabulary" --devices cpu:2 --strategy "$work/vocabulary.pbtxt" \
  >"$work/lm2.log" 2>&1 || fail "lm, vocabulary split: $(cat "$work/lm2.log")"
close "an embedding split along its vocabulary matches one device" "$(test_losses "$work/lm_one")" \
  "$(test_losses "$work/lm_vocabulary")"

# bf16: the batch's partial sums (a bias gradient) are added in f32 and
# rounded once, each part's sum already rounded to bf16 (hence 2e-3).
sed 's/^epochs:/precision: "bf16"\nepochs:/' "$work/cnn.pbtxt" >"$work/bf16.pbtxt"
"$loom" train --config "$work/bf16.pbtxt" --out "$work/bf16_one" >"$work/bf1.log" 2>&1 || fail "bf16: $(cat "$work/bf1.log")"
"$loom" train --config "$work/bf16.pbtxt" --out "$work/bf16_dp" --devices cpu:2 >"$work/bf2.log" 2>&1 ||
  fail "bf16 on cpu:2: $(cat "$work/bf2.log")"
close "bf16 data parallel on cpu:2 matches one device (2e-3)" "$(test_losses "$work/bf16_one")" \
  "$(test_losses "$work/bf16_dp")" 2e-3

# Saved under data parallelism after epoch 1, resumed on 3 devices by layers.
"$loom" train --config "$work/cnn.pbtxt" --out "$work/moved" --devices cpu:2 --epochs 1 >"$work/moved.log" 2>&1 ||
  fail "first half: $(cat "$work/moved.log")"
"$loom" train --resume "$work/moved" --epochs 2 --devices cpu:3 --strategy model >"$work/resumed.log" 2>&1 ||
  fail "resume under another strategy: $(cat "$work/resumed.log")"
close "a dp run resumed under model parallelism matches one device" "$want" "$(test_losses "$work/moved")"

"$loom" train --config "$work/fused.pbtxt" --out "$work/fused_one" >"$work/f1.log" 2>&1 || fail "fused: $(cat "$work/f1.log")"
"$loom" train --config "$work/fused.pbtxt" --out "$work/fused_replica" --devices cpu:2 --strategy replica \
  --trace "$work/trace.json" >"$work/f2.log" 2>&1 || fail "fused replica: $(cat "$work/f2.log")"
close "4 fused replicas split over 2 devices match one device" "$(test_losses "$work/fused_one")" \
  "$(test_losses "$work/fused_replica")"
python3 -c '
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
rows = {e["args"]["name"] for e in events if e["ph"] == "M"}
spans = [e for e in events if e["ph"] == "X"]
assert {"device 0", "device 1"} <= rows, rows
assert spans and all(e["dur"] >= 0 for e in spans)
' "$work/trace.json" && echo "ok   --trace writes every task per device" || fail "--trace"

expect "strategy without devices" "--strategy needs --devices cpu:N" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x1" --strategy dp
expect "zero devices" "--devices: expected cpu:N or cuda:LIST" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x2" --devices cpu:0
expect "trace without devices" "--trace FILE needs --devices cpu:N" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x3" --trace "$work/t.json"
printf 'devices: 3\ndefault_split { sample: 3 }\n' >"$work/three.pbtxt"
expect "a strategy for other devices" "three.pbtxt: the strategy places parts on 3 devices, the run has 2" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x4" --devices cpu:2 --strategy "$work/three.pbtxt"
expect "an unknown strategy" "'pipeline' is neither a standard strategy (dp, replica, model or owt) nor a strategy file" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x5" --devices cpu:2 --strategy pipeline
[ ! -e "$work/x4/ckpt-1.loom" ] && echo "ok   a refused run leaves no checkpoint" || fail "refused run wrote a checkpoint"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo PASS
