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
    echo "FAIL $name: exit 0"; failures=$((failures + 1)); return
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

mkdir -p "$work/data"
cfg missing_data "model { name: \"mlp\" }
data { dataset: \"mnist\" path: \"$work/data\" }"
expect "missing data file" "$work/data/train-images-idx3-ubyte" -- train --config "$work/missing_data.pbtxt" --out "$work/out"

# A truncated image file and a label file with the wrong magic number.
printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c\x01\x02' >"$work/data/train-images-idx3-ubyte"
printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00' >"$work/data/train-labels-idx1-ubyte"
expect "truncated data file" "train-images-idx3-ubyte" -- train --config "$work/missing_data.pbtxt" --out "$work/out"

expect "missing config" "nope.pbtxt: cannot open the config file" -- train --config "$work/nope.pbtxt" --out "$work/out"
expect "resume of nothing" "holds no run to resume" -- train --resume "$work/out"
rm -rf "$work/out"
expect "unknown flag" "unknown flag --epoch" -- train --config "$work/model.pbtxt" --epoch 3

# A corrupt checkpoint is refused on resume, naming the file.
if [ -d /usr/share/datasets/fashion-mnist ]; then
  cfg tiny 'model { name: "mlp" args { key: "hidden" value: "16" } }
data { dataset: "fashion_mnist" train_limit: 256 test_limit: 100 batch_size: 64 }
epochs: 1'
  "$loom" train --config "$work/tiny.pbtxt" --out "$work/run" >/dev/null 2>&1 || { echo "FAIL: tiny run"; failures=$((failures + 1)); }
  ckpt=$(ls "$work/run"/ckpt-*.loom | head -1)
  printf 'X' | dd of="$ckpt" bs=1 seek=100 conv=notrunc 2>/dev/null
  out=$("$loom" train --resume "$work/run" 2>&1); rc=$?
  if [ "$rc" -ne 0 ] && grep -qF "$ckpt" <<<"$out"; then echo "ok   corrupt checkpoint: $(head -1 <<<"$out")"
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
