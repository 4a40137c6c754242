# Shared by the tests that compare `loom train` runs on several devices or
# processes with one device (parallel_train_test, mpi_train_test) and the
# simulator's commands (simulate_cli_test); sourced
# after `loom` and `failures` are set (close and fail count into it).

failures=${failures:-0}
fail() { echo "FAIL $1"; failures=$((failures + 1)); }
contains() { grep -qF -- "$3" <<<"$2" && echo "ok   $1" || { fail "$1: expected '$3' in:"; echo "$2"; }; }
# expect NAME WANT -- ARGS...: `$loom ARGS` exits non-zero saying WANT.
expect() {
  local name="$1" want="$2"
  shift 3
  local out
  if out=$("$loom" "$@" 2>&1); then fail "$name: exit 0"; return; fi
  contains "$name" "$out" "$want"
}

# The last test loss of each replica in run folder $1, one per line.
test_losses() {
  python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(line)
    if r.get("split") == "test": last[r.get("replica", 0)] = r["loss"]
print("\n".join("%.9g" % last[k] for k in sorted(last)))' "$1"
}

# close NAME A B [TOLERANCE]: equal to 1e-4 relative (or TOLERANCE), line
# by line (f32 runs whose sums are added in another order).
close() {
  python3 -c '
import sys
a, b, tol = sys.argv[2].split(), sys.argv[3].split(), float(sys.argv[4])
ok = len(a) == len(b) and len(a) > 0 and all(abs(float(x) - float(y)) <= tol * max(1.0, abs(float(x))) for x, y in zip(a, b))
print(("ok   " if ok else "FAIL ") + sys.argv[1] + ("" if ok else ": %s vs %s" % (a, b)))
sys.exit(0 if ok else 1)' "$1" "$2" "$3" "${4:-1e-4}" || failures=$((failures + 1))
}

# A CNN config on synthetic data, 2 epochs, written to file $1.
write_cnn_config() {
  cat >"$1" <<'CFG'
model { name: "cnn" args { key: "channels" value: "4,8" } args { key: "hidden" value: "16" } }
data { dataset: "synthetic" input_shape: [1, 8, 8] num_classes: 4 num_examples: 64 batch_size: 16 }
optimizer { type: "sgd" lr: 0.05 momentum: 0.9 }
epochs: 2
CFG
}
