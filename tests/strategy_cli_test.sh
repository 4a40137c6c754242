#!/usr/bin/env bash
# `loom strategy` writes the standard strategies of a config's model and
# `loom inspect --config C --strategy S` shows every layer's split; bad
# requests and bad strategy files exit non-zero naming what is wrong.
set -uo pipefail
loom="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

cat >"$work/cnn.pbtxt" <<'CFG'
model { name: "cnn" args { key: "channels" value: "4,8" } args { key: "hidden" value: "16" } }
data { dataset: "synthetic" input_shape: [1, 8, 8] num_classes: 4 num_examples: 64 batch_size: 16 }
CFG
cat >"$work/fused.pbtxt" <<'CFG'
model { name: "cnn" args { key: "channels" value: "4,8" } args { key: "hidden" value: "16" } }
data { dataset: "synthetic" input_shape: [1, 8, 8] num_classes: 4 num_examples: 64 batch_size: 16 }
replicas { } replicas { } replicas { } replicas { }
CFG

# contains NAME TEXT SUBSTRING
contains() { grep -qF -- "$3" <<<"$2" && echo "ok   $1" || { fail "$1: expected '$3' in:"; echo "$2"; }; }

for kind in dp owt model; do
  "$loom" strategy --config "$work/cnn.pbtxt" --devices 2 --kind "$kind" --out "$work/$kind.pbtxt" >/dev/null ||
    fail "loom strategy --kind $kind"
  out=$("$loom" inspect --config "$work/cnn.pbtxt" --strategy "$work/$kind.pbtxt" 2>&1) || fail "inspect $kind: $out"
  case "$kind" in
    dp) contains "dp splits the convolutions by sample" "$out" "Conv2d        [16, 4, 8, 8]  sample 2 on devices 0,1" ;;
    owt) contains "owt splits fc by parameter" "$out" "parameter 2 on devices 0,1" ;;
    model) contains "model places the classifier on device 1" "$out" "whole on device 1" ;;
  esac
done
"$loom" strategy --config "$work/fused.pbtxt" --devices 2 --kind replica --out "$work/replica.pbtxt" >/dev/null ||
  fail "loom strategy --kind replica"
out=$("$loom" inspect --config "$work/fused.pbtxt" --strategy "$work/replica.pbtxt" 2>&1) || fail "inspect replica: $out"
contains "replica splits the fused array" "$out" "replica 2 on devices 0,1"

# expect NAME SUBSTRING -- loom args...
expect() {
  local name="$1" want="$2"
  shift 3
  local out
  if out=$("$loom" "$@" 2>&1); then fail "$name: exit 0"; return; fi
  contains "$name" "$out" "$want"
}
expect "unknown kind" "unknown strategy kind 'pipeline' (expected dp, replica, model or owt)" -- \
  strategy --config "$work/cnn.pbtxt" --devices 2 --kind pipeline
expect "no devices" "loom strategy needs --devices N (N >= 1)" -- strategy --config "$work/cnn.pbtxt" --kind dp
expect "replica of an unfused model" "replica parallelism needs a fused model" -- \
  strategy --config "$work/cnn.pbtxt" --devices 2 --kind replica
printf 'devices: 2\nlayer { layer: "fc" parameter: 2 }\nlayer {\n  layer: "fc9"\n}\n' >"$work/typo.pbtxt"
expect "a pattern that matches nothing" "typo.pbtxt:4: layer pattern 'fc9' matches no layer of the model" -- \
  inspect --config "$work/cnn.pbtxt" --strategy "$work/typo.pbtxt"
printf 'devices: 3\nlayer { layer: "stage1/conv" attribute: 3 }\n' >"$work/uneven.pbtxt"
expect "an uneven split" "uneven.pbtxt:2: layer 'stage1/conv' (Conv2d): attribute 3: its extent 8" -- \
  inspect --config "$work/cnn.pbtxt" --strategy "$work/uneven.pbtxt"
expect "--strategy without --config" "loom inspect --strategy FILE needs --config FILE" -- \
  inspect --strategy "$work/dp.pbtxt"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
