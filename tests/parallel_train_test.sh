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
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
contains() { grep -qF -- "$3" <<<"$2" && echo "ok   $1" || { fail "$1: expected '$3' in:"; echo "$2"; }; }

cat >"$work/cnn.pbtxt" <<'CFG'
model { name: "cnn" args { key: "channels" value: "4,8" } args { key: "hidden" value: "16" } }
data { dataset: "synthetic" input_shape: [1, 8, 8] num_classes: 4 num_examples: 64 batch_size: 16 }
optimizer { type: "sgd" lr: 0.05 momentum: 0.9 }
epochs: 2
CFG
cat >"$work/fused.pbtxt" <<'CFG'
model { name: "mlp" args { key: "hidden" value: "16" } }
data { dataset: "synthetic" input_shape: [1, 4, 4] num_classes: 4 num_examples: 64 batch_size: 16 }
optimizer { type: "adam" lr: 0.01 }
replicas { seed: 1 } replicas { seed: 2 } replicas { seed: 3 } replicas { seed: 4 }
epochs: 2
CFG

# The last test loss of each replica in a run folder, one per line.
test_losses() {
  python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(line)
    if r.get("split") == "test": last[r.get("replica", 0)] = r["loss"]
print("\n".join("%.9g" % last[k] for k in sorted(last)))' "$1"
}
# close NAME A B: equal to 1e-4 relative, line by line.
close() {
  python3 -c '
import sys
a, b = sys.argv[2].split(), sys.argv[3].split()
ok = len(a) == len(b) and len(a) > 0 and all(abs(float(x) - float(y)) <= 1e-4 * max(1.0, abs(float(x))) for x, y in zip(a, b))
print(("ok   " if ok else "FAIL ") + sys.argv[1] + ("" if ok else ": %s vs %s" % (a, b)))
sys.exit(0 if ok else 1)' "$1" "$2" "$3" || failures=$((failures + 1))
}

"$loom" train --config "$work/cnn.pbtxt" --out "$work/one" >"$work/one.log" 2>&1 || fail "one device: $(cat "$work/one.log")"
want=$(test_losses "$work/one")
for strategy in dp model owt; do
  "$loom" train --config "$work/cnn.pbtxt" --out "$work/$strategy" --devices cpu:2 --strategy "$strategy" \
    >"$work/$strategy.log" 2>&1 || fail "--strategy $strategy: $(cat "$work/$strategy.log")"
  close "cnn --devices cpu:2 --strategy $strategy matches one device" "$want" "$(test_losses "$work/$strategy")"
done

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

expect() {
  local name="$1" want="$2"
  shift 3
  local out
  if out=$("$loom" "$@" 2>&1); then fail "$name: exit 0"; return; fi
  contains "$name" "$out" "$want"
}
expect "strategy without devices" "--strategy needs --devices cpu:N" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x1" --strategy dp
expect "zero devices" "--devices: expected cpu:N with N in [1, 64]" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x2" --devices cpu:0
expect "trace without devices" "--trace FILE needs --devices cpu:N" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x3" --trace "$work/t.json"
printf 'devices: 3\ndefault_split { sample: 3 }\n' >"$work/three.pbtxt"
expect "a strategy for other devices" "three.pbtxt: the strategy places parts on 3 devices, the run has devices: cpu:2" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x4" --devices cpu:2 --strategy "$work/three.pbtxt"
expect "an unknown strategy" "'pipeline' is neither a standard strategy (dp, replica, model or owt) nor a strategy file" -- \
  train --config "$work/cnn.pbtxt" --out "$work/x5" --devices cpu:2 --strategy pipeline
[ ! -e "$work/x4/ckpt-1.loom" ] && echo "ok   a refused run leaves no checkpoint" || fail "refused run wrote a checkpoint"

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo PASS
