#!/usr/bin/env bash
# `loom inspect`: parameter counts of zoo models, the layer table, --export,
# and the errors (unknown model, unknown or malformed --set, bad --input).
set -uo pipefail
loom="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL $1"; failures=$((failures + 1)); }

# expect_out NAME EXPECTED-SUBSTRING -- loom args...: exit 0 and the text in stdout.
expect_out() {
  local name="$1" want="$2"
  shift 3
  local out rc
  out=$("$loom" "$@" 2>"$work/stderr")
  rc=$?
  if [ "$rc" -ne 0 ]; then fail "$name: exit $rc"; cat "$work/stderr"; return; fi
  if ! grep -qF -- "$want" <<<"$out"; then fail "$name: expected '$want' in:"; echo "$out"; return; fi
  echo "ok   $name: $(grep -F -- "$want" <<<"$out" | head -1)"
}

# expect_err NAME EXPECTED-SUBSTRING -- loom args...: non-zero exit and the text in the output.
expect_err() {
  local name="$1" want="$2"
  shift 3
  local out rc
  out=$("$loom" "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ]; then fail "$name: exit 0"; echo "$out"; return; fi
  if ! grep -qF -- "$want" <<<"$out"; then fail "$name: expected '$want' in:"; echo "$out"; return; fi
  echo "ok   $name: $(grep -F -- "$want" <<<"$out" | head -1)"
}

# The default MLP 784-256-128-10: 784*256+256 + 256*128+128 + 128*10+10.
out=$("$loom" inspect --model mlp --params)
if [ "$out" = "params: 235146" ]; then echo "ok   mlp --params: $out"; else fail "mlp --params: got '$out'"; fi
# hidden=16: 784*16+16 + 16*10+10; two hidden layers 64,32: 784*64+64 + 64*32+32 + 32*10+10.
expect_out "mlp hidden=16" "params: 12730" -- inspect --model mlp --set hidden=16 --params
expect_out "mlp hidden=64,32" "params: 52650" -- inspect --model mlp --set=hidden=64,32 --params
# 3x32x32 input, 100 classes: 3072*256+256 + 256*128+128 + 128*100+100.
expect_out "mlp cifar-100 shape" "params: 832484" -- inspect --model mlp --input 3,32,32 --classes 100 --params

# hidden=none: no hidden layer, 784*10+10; an empty list or item, or a width
# below 1, is an error naming the argument and the value.
expect_out "mlp hidden=none" "params: 7850" -- inspect --model mlp --set hidden=none --params
expect_err "mlp hidden=''" "argument hidden: '' is empty" -- inspect --model mlp --set hidden= --params
expect_err "mlp hidden=128,,64" "argument hidden: '128,,64' has an empty item" -- inspect --model mlp --set hidden=128,,64
expect_err "mlp hidden=128," "argument hidden: '128,' has an empty item" -- inspect --model mlp --set hidden=128,
expect_err "mlp hidden=128,0" "argument hidden: '128,0': items must be >= 1, got 0" -- inspect --model mlp --set hidden=128,0
expect_err "mlp hidden=-3" "argument hidden: '-3': items must be >= 1, got -3" -- inspect --model mlp --set hidden=-3

# Each zoo model's defaults are the data of its reference count
# (docs/model_zoo.md): 3x224x224 and 1000 classes for torchvision's
# classifiers, 3x299x299 for Inception-v3 (with the aux head), 1024 points
# and 40 classes (ModelNet40) or 50 parts (ShapeNet-part) for PointNet,
# 3x64x64 images for DCGAN (generator + discriminator), each text model's
# vocabulary (and rnntc's 2 classes).
for want in "alexnet 61100840" "vgg16 138357544" "inception_v3 27161264" "pointnet_cls 3471473" \
            "pointnet_seg 3533563" "dcgan $((3576704 + 2765568))" "resnet18 11689512" "resnet101 44549160" \
            "mobilenet_v2 3504872" "mobilenet_v3_small 2542856" "mobilenet_v3_large 5483032" \
            "transformer_lm 2769168" "bert_medium 41404730" "rnnlm 37283600" "rnntc 66357250" "nmt 272717824"; do
  read -r model count <<<"$want"
  expect_out "$model defaults" "params: $count" -- inspect --model "$model" --params
done
# Explicit flags still override the reference: AlexNet on 10 classes.
expect_out "alexnet --classes 10" "params: $((61100840 - 4097 * 990))" -- inspect --model alexnet --classes 10 --params
expect_out "alexnet table" "model alexnet: input [2, 3, 224, 224], 1000 classes" -- inspect --model alexnet
expect_out "dcgan table" "model dcgan: input [2, 3, 64, 64], a GAN" -- inspect --model dcgan
expect_out "rnntc table" "model rnntc: input [2, 64] token ids, 2 classes" -- inspect --model rnntc

# The table: the MLP's layers with their parameters, and the totals.
table=$("$loom" inspect --model mlp)
for want in "fc1 " "Linear" "[2, 256]" "200,960" "classifier" "params: 235146" "buffers: 0" "forward FLOPs: "; do
  grep -qF -- "$want" <<<"$table" || { fail "mlp table: no '$want' in:"; echo "$table"; }
done
echo "ok   mlp table"

# The CNN's table lists its conv and BatchNorm layers; the BatchNorm running
# statistics are buffers, not parameters. Default channels 32,64, hidden 128:
# conv 1*32*9 + bn 2*32 + conv 32*64*9 + bn 2*64 + fc 3136*128+128 + 128*10+10.
table=$("$loom" inspect --model cnn)
for want in "stage1/conv" "Conv2d" "stage1/bn" "BatchNorm" "stage2/conv" "[2, 64, 14, 14]" "params: 421738" \
            "buffers: 192"; do
  grep -qF -- "$want" <<<"$table" || { fail "cnn table: no '$want' in:"; echo "$table"; }
done
echo "ok   cnn table"
# Batch 4: four times the FLOPs of batch 1 per sample, the same per sample.
f1=$("$loom" inspect --model mlp --batch 1 | sed -n 's/^forward FLOPs: \([0-9]*\) .*/\1/p')
f4=$("$loom" inspect --model mlp --batch 4 | sed -n 's/^forward FLOPs: [0-9]* (.*per sample: \([0-9]*\),.*/\1/p')
if [ -n "$f1" ] && [ "$f1" -gt 400000 ] && [ "$f1" = "$f4" ]; then echo "ok   FLOPs per sample: $f1"
else fail "FLOPs per sample: batch 1 '$f1', batch 4 per sample '$f4'"; fi

# --export: text protobuf for .pbtxt (with the node names), binary otherwise.
expect_out "export pbtxt" "$work/cnn.pbtxt" -- inspect --model cnn --export "$work/cnn.pbtxt"
for want in 'name: "stage1/conv"' 'name: "stage1/conv/weight"' 'name: "classifier"' 'op: "BatchNorm"'; do
  grep -qF -- "$want" "$work/cnn.pbtxt" || fail "export pbtxt: no '$want' in $work/cnn.pbtxt"
done
expect_out "export binary" "binary protobuf" -- inspect --model mlp --export "$work/mlp.pb"
if [ -s "$work/mlp.pb" ] && ! grep -q 'nodes {' "$work/mlp.pb"; then echo "ok   binary file"; else fail "binary file"; fi
ls "$work" | grep -q '\.tmp' && fail "export left a temporary file: $(ls "$work")"

# Errors.
expect_err "unknown model" "unknown model 'resnet9000' (the zoo has: mlp" -- inspect --model resnet9000
expect_err "no model" "needs --model NAME (the zoo has: mlp" -- inspect
expect_err "unknown argument" "model mlp has no argument 'hiden'" -- inspect --model mlp --set hiden=64
expect_err "unknown cnn argument" "model cnn has no argument 'width'" -- inspect --model cnn --set width=3
expect_err "malformed --set" "--set 'hidden': expected key=value" -- inspect --model mlp --set hidden
expect_err "--set without value" "flag --set needs a value" -- inspect --model mlp --set
expect_err "bad --input" "--input '1,x,28'" -- inspect --model mlp --input 1,x,28
expect_err "empty --input dim" "--input '1,,28': empty item" -- inspect --model mlp --input 1,,28
expect_err "zero --input dim" "--input '0,28,28': items must be >= 1" -- inspect --model mlp --input 0,28,28
expect_err "bad --batch" "--batch must be >= 1" -- inspect --model mlp --batch 0
expect_err "unknown flag" "unknown flag --foo" -- inspect --model mlp --foo 1
expect_err "bad model value" "argument hidden: '0': items must be >= 1, got 0" -- inspect --model mlp --set hidden=0
# Numbers out of range are errors, not clamped.
expect_err "--batch beyond int64" "flag --batch: '99999999999999999999' is out of range (at most 9223372036854775807)" \
  -- inspect --model mlp --batch 99999999999999999999
expect_err "--input item beyond int64" "--input '1,99999999999999999999,28': '99999999999999999999' is out of range" \
  -- inspect --model mlp --input 1,99999999999999999999,28
expect_err "argument beyond int64" "argument width: '99999999999999999999' is out of range" \
  -- inspect --model resnet18 --set width=99999999999999999999
expect_err "argument inf" "argument width_mult: 'inf' is not a finite number" -- inspect --model mobilenet_v2 --set width_mult=inf
expect_err "--classes for a GAN" "--classes: model dcgan is a GAN" -- inspect --model dcgan --classes 10
# A long value is cut in the message.
long=$(printf 'x%.0s' $(seq 5000))
expect_err "long model name" "unknown model '$(printf 'x%.0s' $(seq 64))... (5000 bytes)' (the zoo has: mlp" -- inspect --model "$long"

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"
