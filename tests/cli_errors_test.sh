#!/usr/bin/env bash
# Bad configs and bad data files: `loom train` exits non-zero with a message
# that names the file (and line and field), and leaves no run folder behind.
set -uo pipefail
loom="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

# expect NAME EXPECTED-SUBSTRING -- loom args...
expect() {
  local name="$1" want="$2"
  shift 3
  local out rc
  out=$("$loom" "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "FAIL $name: exit 0"; failures=$((failures + 1)); rm -rf "$work/out"; return
  fi
  if ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name: expected '$want' in:"; echo "$out"; failures=$((failures + 1)); return
  fi
  if [ -e "$work/out" ]; then
    echo "FAIL $name: left $work/out behind"; failures=$((failures + 1)); rm -rf "$work/out"; return
  fi
  echo "ok   $name: $(grep -F -- "$want" <<<"$out" | head -1)"
}

cfg() { printf '%s\n' "$2" >"$work/$1.pbtxt"; }

cfg unknown_field 'model { name: "mlp" }
data { dataset: "fashion_mnist" batchsize: 8 }'
expect "unknown field" "unknown_field.pbtxt:2:" -- train --config "$work/unknown_field.pbtxt" --out "$work/out"

cfg wrong_type 'model { name: "mlp" }
data {
  dataset: "fashion_mnist"
  batch_size: "eight"
}'
expect "wrong type" "wrong_type.pbtxt:4:" -- train --config "$work/wrong_type.pbtxt" --out "$work/out"

cfg range 'model { name: "mlp" }
data { dataset: "fashion_mnist" }
optimizer { type: "sgd" lr: -0.1 }'
expect "out of range" "range.pbtxt:3: field optimizer.lr: must be > 0, got -0.1" -- train --config "$work/range.pbtxt" --out "$work/out"

cfg model 'model { name: "resnet9000" }
data { dataset: "fashion_mnist" }'
expect "unknown model" "unknown model 'resnet9000' (the zoo has: mlp, cnn" -- train --config "$work/model.pbtxt" --out "$work/out"

cfg arg 'model { name: "mlp" args { key: "hiden" value: "64" } }
data { dataset: "fashion_mnist" }'
expect "unknown model argument" "model mlp has no argument 'hiden'" -- train --config "$work/arg.pbtxt" --out "$work/out"

cfg device 'model { name: "mlp" }
data { dataset: "fashion_mnist" }
device: "tpu"'
expect "unknown device" "device.pbtxt:3: field device: unknown device 'tpu' (expected cpu[:N] or cuda[:N])" -- train --config "$work/device.pbtxt" --out "$work/out"
# No GPU in the CPU build (or on the machine): named before any step runs.
cfg plain 'model { name: "mlp" }
data { dataset: "fashion_mnist" }'
expect "absent device" "cuda:0" -- train --config "$work/plain.pbtxt" --device cuda --max-steps 1 --out "$work/out"
expect "bad --device" "--device: unknown device 'gpu0'" -- train --config "$work/plain.pbtxt" --device gpu0 --out "$work/out"

mkdir -p "$work/data"
cfg missing_data "model { name: \"mlp\" }
data { dataset: \"mnist\" path: \"$work/data\" }"
expect "missing data file" "$work/data/train-images-idx3-ubyte" -- train --config "$work/missing_data.pbtxt" --out "$work/out"

# A truncated image file and a label file with the wrong magic number.
printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c\x01\x02' >"$work/data/train-images-idx3-ubyte"
printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00' >"$work/data/train-labels-idx1-ubyte"
expect "truncated data file" "train-images-idx3-ubyte" -- train --config "$work/missing_data.pbtxt" --out "$work/out"

expect "missing config" "nope.pbtxt: cannot open the config file" -- train --config "$work/nope.pbtxt" --out "$work/out"
expect "directory as config" "$work/data: is a directory, not a config file" -- train --config "$work/data" --out "$work/out"

# Values out of range: in the file (named with its line) and on the command
# line (named by the flag). The data folder is empty, so a value that got
# through would fail on the data instead, before any thread or run folder.
cfg nodata "model { name: \"mlp\" }
data { dataset: \"mnist\" path: \"$work/nodata\" }"
cfg threads "model { name: \"mlp\" }
data { dataset: \"mnist\" path: \"$work/nodata\" }
threads: 100000"
expect "threads: 100000" "threads.pbtxt:3: field threads: must be <= 1024 (this machine has" -- train --config "$work/threads.pbtxt" --out "$work/out"
expect "--threads 100000" "--threads: must be <= 1024 (this machine has" -- train --config "$work/nodata.pbtxt" --threads 100000 --out "$work/out"
cfg padding "model { name: \"mlp\" }
data {
  dataset: \"mnist\"
  path: \"$work/nodata\"
  augment { random_crop_padding: 100000 }
}"
expect "random_crop_padding: 100000" "padding.pbtxt:5: field data.augment.random_crop_padding: must be in [0, 64] (pixels on each side), got 100000" -- train --config "$work/padding.pbtxt" --out "$work/out"
expect "--seed -1" "flag --seed: must be >= 0, got -1" -- train --config "$work/nodata.pbtxt" --seed -1 --out "$work/out"
expect "--max-steps beyond int64" "flag --max-steps: '99999999999999999999' is out of range (at most 9223372036854775807)" -- train --config "$work/nodata.pbtxt" --max-steps 99999999999999999999 --out "$work/out"
# An empty hidden list is an error, not an MLP without hidden layers (that is hidden: "none").
cfg no_hidden 'model { name: "mlp" args { key: "hidden" value: "" } }
data { dataset: "fashion_mnist" train_limit: 256 test_limit: 100 batch_size: 64 }'
expect "hidden: \"\"" "argument hidden: '' is empty" -- train --config "$work/no_hidden.pbtxt" --out "$work/out"
# Long values are cut in messages: the first 64 bytes and the length.
printf 'model { name: "%s" }\ndata { dataset: "fashion_mnist" }\n' "$(head -c 1000000 /dev/zero | tr '\0' m)" >"$work/long.pbtxt"
expect "long model name" "unknown model '$(head -c 64 /dev/zero | tr '\0' m)... (1000000 bytes)' (the zoo has: mlp" -- train --config "$work/long.pbtxt" --out "$work/out"
expect "resume of nothing" "holds no run to resume" -- train --resume "$work/out"
rm -rf "$work/out"
expect "unknown flag" "unknown flag --epoch" -- train --config "$work/model.pbtxt" --epoch 3

# A corrupt checkpoint is moved aside on resume with a warning naming the
# file, and the run resumes from the one before (docs/reliability.md).
if [ -d /usr/share/datasets/fashion-mnist ]; then
  cfg tiny 'model { name: "mlp" args { key: "hidden" value: "16" } }
data { dataset: "fashion_mnist" train_limit: 256 test_limit: 100 batch_size: 64 }
epochs: 1'
  "$loom" train --config "$work/tiny.pbtxt" --out "$work/run" >/dev/null 2>&1 || { echo "FAIL: tiny run"; failures=$((failures + 1)); }
  ckpt=$(ls "$work/run"/ckpt-*.loom | head -1)
  printf 'X' | dd of="$ckpt" bs=1 seek=100 conv=notrunc 2>/dev/null
  out=$("$loom" train --resume "$work/run" 2>&1); rc=$?
  if [ "$rc" -eq 0 ] && grep -qF "checkpoint '$ckpt' is corrupt" <<<"$out" && [ -e "$ckpt.corrupt" ]; then
    echo "ok   corrupt checkpoint: $(grep -F "$ckpt" <<<"$out" | head -1)"
  else echo "FAIL corrupt checkpoint: rc=$rc: $out"; failures=$((failures + 1)); fi
fi

[ "$failures" -eq 0 ] && echo PASS
# Models and data that do not fit each other.
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 40) >"$work/text.txt"
cfg task 'model { name: "rnntc" }
data { dataset: "text" path: "'"$work"'/text.txt" sequence_length: 16 batch_size: 8 }'
expect "per-example model on per-token data" "model rnntc predicts one class per example (targets [] per example), the data's targets are [16]" -- train --config "$work/task.pbtxt" --out "$work/out"
cfg kind 'model { name: "transformer_lm" }
data { dataset: "fashion_mnist" }'
expect "token model on images" "model transformer_lm reads token ids, the data gives f32 features [1, 28, 28]" -- train --config "$work/kind.pbtxt" --out "$work/out"
cfg gan_size 'model { name: "dcgan" }
data { dataset: "fashion_mnist" }'
expect "GAN image size" "dcgan: image_size must be 4 * 2^k with k >= 1 (8, 16, 32, 64, ...), got 28" -- train --config "$work/gan_size.pbtxt" --out "$work/out"

exit "$failures"
