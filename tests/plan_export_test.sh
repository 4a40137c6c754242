#!/usr/bin/env bash
# `loom plan` and `loom export` (docs/fusion_tools.md).
#  plan:   on the shipped MLP config with --memory 64MiB the largest R that
#          fits has a total <= 64 MiB and R + 1 a total above; the powers of
#          two are all there; unknown devices and bad sizes are errors.
#  export: a tiny fused run of 3 replicas (replica 0 diverges and leaves the
#          array, 1 and 2 keep running as rows 0 and 1), every replica
#          exported: single-model shapes, the replica's own config and seed,
#          no replica_* values, replicas differ; the retired replica's
#          tensors are byte-identical to retired/0/* (checksums) and, with
#          python3, each running replica's to its row of the array; errors
#          for an out-of-range replica (listing them) and a non-fused
#          checkpoint; the export loads with loom train --init-from.
set -uo pipefail
loom="$1"
mlp_config="$2"
cnn_config="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect NAME EXPECTED-SUBSTRING -- loom args...: exits non-zero, says that.
expect_error() {
  local name="$1" want="$2"
  shift 3
  local out rc
  out=$("$loom" "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ]; then fail "$name: exit 0"; return; fi
  if ! grep -qF -- "$want" <<<"$out"; then fail "$name: expected '$want' in:"; echo "$out"; return; fi
  ok "$name: $(grep -F -- "$want" <<<"$out" | head -1)"
}

# ---- loom plan ----
out=$("$loom" plan --config "$mlp_config" --memory 64MiB --json "$work/plan.json" 2>&1) || fail "plan exited $?: $out"
echo "$out"
largest=$(sed -n 's/^largest R that fits in 64 MiB (cpu): \([0-9][0-9]*\)$/\1/p' <<<"$out")
if [ -z "$largest" ]; then
  fail "plan: no line 'largest R that fits in 64 MiB (cpu): N'"
else
  # total_bytes of row R from the JSON ("" if there is none).
  total_of() { grep -o "{\"replicas\": $1, [^}]*}" "$work/plan.json" | sed -n 's/.*"total_bytes": \([0-9]*\).*/\1/p'; }
  limit=$((64 * 1024 * 1024))
  t_n=$(total_of "$largest")
  t_next=$(total_of $((largest + 1)))
  if [ "$largest" -lt 1 ] || [ -z "$t_n" ] || [ -z "$t_next" ]; then
    fail "plan: largest R $largest, rows R=$largest ($t_n) and R+1 ($t_next) missing from the JSON"
  elif [ "$t_n" -le "$limit" ] && [ "$t_next" -gt "$limit" ]; then
    ok "plan: largest R $largest: $t_n bytes <= $limit < $t_next bytes (R=$((largest + 1)))"
  else
    fail "plan: R=$largest totals $t_n, R=$((largest + 1)) totals $t_next, limit $limit"
  fi
  grep -q "\"largest_fitting\": $largest," "$work/plan.json" || fail "plan: the JSON's largest_fitting is not $largest"
  for r in 1 2 4 8 16; do
    [ "$r" -gt "$largest" ] && break
    grep -qE "^ +$r +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +yes$" <<<"$out" || fail "plan: no fitting table row for R=$r"
  done
fi
tail -1 <<<"$out" | grep -q "CUDA library workspaces such as cuBLAS's" || fail "plan: the last line does not say what is not counted"

# --with-eval adds loom train's evaluation executor: fewer replicas fit.
out=$("$loom" plan --config "$mlp_config" --memory 64MiB --with-eval 2>&1) || fail "plan --with-eval exited $?: $out"
with_eval=$(sed -n 's/^largest R that fits in 64 MiB (cpu): \([0-9][0-9]*\)$/\1/p' <<<"$out")
if [ -n "$with_eval" ] && [ -n "$largest" ] && [ "$with_eval" -ge 1 ] && [ "$with_eval" -lt "$largest" ] &&
  grep -q "eval MiB" <<<"$out"; then
  ok "plan --with-eval: largest R $with_eval < $largest"
else
  fail "plan --with-eval: $out"
fi

# A named device's memory, the --max-replicas limit.
out=$("$loom" plan --config "$cnn_config" --device t4 2>&1) || fail "plan --device t4 exited $?: $out"
grep -qE "^largest R that fits in 16 GB \(t4\): [1-9][0-9]*$" <<<"$out" && ok "plan --device t4: $(grep '^largest' <<<"$out")" ||
  fail "plan --device t4: $out"
out=$("$loom" plan --config "$mlp_config" --memory 1TiB --max-replicas 6 2>&1) || fail "plan --max-replicas exited $?"
grep -qF "largest R that fits in 1024 GiB (cpu): 6 (the --max-replicas limit; more may fit)" <<<"$out" &&
  ok "plan --max-replicas 6: $(grep '^largest' <<<"$out")" || fail "plan --max-replicas 6: $out"
out=$("$loom" plan --config "$mlp_config" --memory 1.5MiB 2>&1) || fail "plan --memory 1.5MiB exited $?"
grep -qF "largest R that fits in 1.50 MiB (cpu): 0" <<<"$out" && ok "plan: nothing fits in 1.5 MiB" ||
  fail "plan --memory 1.5MiB: $out"

expect_error "unknown device" "unknown device 'tpu9' (known: h200, h100, a100, a100-80gb, a100-40gb, v100, v100-32gb, t4, rtx4090, cpu)" \
  -- plan --config "$mlp_config" --device tpu9
expect_error "bad memory unit" "--memory '12parsecs': unknown unit 'parsecs'" -- plan --config "$mlp_config" --memory 12parsecs
expect_error "bad memory number" "--memory 'lots': not a size" -- plan --config "$mlp_config" --memory lots
expect_error "negative memory" "--memory '-5GB': must be more than 0 bytes" -- plan --config "$mlp_config" --memory -5GB
expect_error "plan without config" "loom plan needs --config FILE" -- plan --memory 1GB

# ---- loom export ----
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "dataset-fashion-mnist is not installed (tools/setup.sh installs it): export part skipped"
else
  cat >"$work/fused.pbtxt" <<'EOF'
model { name: "mlp" args { key: "hidden" value: "16" } }
data { dataset: "fashion_mnist" batch_size: 32 train_limit: 512 test_limit: 256 }
optimizer { type: "sgd" lr: 0.05 momentum: 0.9 }
epochs: 1
threads: 2
seed: 7
replicas { name: "huge" optimizer { lr: 1e30 } }
replicas { name: "base" }
replicas { name: "slow" optimizer { lr: 0.005 } }
EOF
  if ! "$loom" train --config "$work/fused.pbtxt" --out "$work/run" >"$work/run.log" 2>&1; then
    fail "the fused run failed"; cat "$work/run.log"
  fi
  ckpt=$(ls "$work/run"/ckpt-*.loom | tail -1)
  "$loom" checkpoint "$ckpt" >"$work/fused.txt" || fail "loom checkpoint $ckpt"
  grep -q "^tensor fc1/weight f32 \[2, 16, 784\] " "$work/fused.txt" && ok "fused checkpoint: an array of 2 running replicas" ||
    fail "fused checkpoint: expected fc1/weight [2, 16, 784]: $(cat "$work/fused.txt")"
  for r in 0 1 2; do
    if ! out=$("$loom" export --checkpoint "$ckpt" --replica "$r" --out "$work/r$r.loom" 2>&1); then
      fail "export --replica $r: $out"; continue
    fi
    echo "$out"
    "$loom" checkpoint "$work/r$r.loom" >"$work/r$r.txt" || { fail "loom checkpoint r$r.loom"; continue; }
    # Single-model shapes, the fused run's tensor names and position.
    if grep -q "^tensor fc1/weight f32 \[16, 784\] " "$work/r$r.txt" &&
      grep -q "^tensor fc1/weight/momentum_buffer f32 \[16, 784\] " "$work/r$r.txt" &&
      grep -q "^tensor classifier/weight f32 \[10, 16\] " "$work/r$r.txt" &&
      [ "$(grep -c '^tensor ' "$work/r$r.txt")" -eq "$(grep '^tensor ' "$work/fused.txt" | grep -vc '^tensor retired/')" ] &&
      ! grep -q "retired/" "$work/r$r.txt" &&
      [ "$(grep -v '^tensor' "$work/r$r.txt")" = "$(grep -v '^tensor' "$work/fused.txt")" ]; then
      ok "export replica $r: single-model shapes, $(grep -c '^tensor ' "$work/r$r.txt") tensors, same position"
    else
      fail "export replica $r: $(cat "$work/r$r.txt")"
    fi
  done
  # The diverged replica's tensors are retired/0/* byte for byte.
  if [ "$(sed -n 's|^tensor retired/0/||p' "$work/fused.txt")" = "$(sed -n 's|^tensor ||p' "$work/r0.txt")" ]; then
    ok "export replica 0 (diverged): its retired/0/* tensors, checksums equal"
  else
    fail "export replica 0 differs from retired/0/*"
  fi
  # The replicas differ from each other, tensor by tensor.
  for pair in "0 1" "0 2" "1 2"; do
    set -- $pair
    same=$(comm -12 <(grep '^tensor' "$work/r$1.txt" | sort) <(grep '^tensor' "$work/r$2.txt" | sort) | wc -l)
    [ "$same" -eq 0 ] && ok "replicas $1 and $2 differ in every tensor" || fail "replicas $1 and $2 share $same tensors"
  done

  if command -v python3 >/dev/null; then
    # Row i of every array tensor is the i-th running replica's tensor,
    # byte for byte; the replica's own config and seed; no replica_* values.
    if python3 - "$ckpt" "$work" <<'EOF'
import struct, sys

def varint(b, i):
    v = s = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7f) << s; s += 7
        if c < 0x80: return v, i

def fields(b):  # protobuf wire format: (field, wire type, value)
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0: v, i = varint(b, i)
        elif w == 1: v = b[i:i + 8]; i += 8
        elif w == 5: v = b[i:i + 4]; i += 4
        elif w == 2: n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise ValueError("wire type %d" % w)
        yield f, w, v

def load(path):  # train/checkpoint/checkpoint.cc: prelude, header, data
    data = open(path, "rb").read()
    assert data[:8] == b"LOOMCKPT", path
    header_bytes = struct.unpack_from("<Q", data, 16)[0]
    start = (32 + header_bytes + 63) // 64 * 64
    c = {"tensors": {}, "strings": {}, "seeds": {}, "config": ""}
    for f, w, v in fields(data[32:32 + header_bytes]):
        if f == 8:
            t = {"shape": [], "offset": 0, "nbytes": 0}
            for g, gw, gv in fields(v):
                if g == 1: t["name"] = gv.decode()
                elif g == 3 and gw == 2:
                    j = 0
                    while j < len(gv): d, j = varint(gv, j); t["shape"].append(d)
                elif g == 3: t["shape"].append(gv)
                elif g == 4: t["offset"] = gv
                elif g == 5: t["nbytes"] = gv
            t["bytes"] = data[start + t["offset"]:start + t["offset"] + t["nbytes"]]
            c["tensors"][t["name"]] = t
        elif f in (2, 5):
            kv = {g: gv for g, gw, gv in fields(v)}
            key = kv.get(1, b"").decode()
            if f == 2: c["seeds"][key] = kv.get(2, 0)
            else: c["strings"][key] = kv.get(2, b"").decode()
        elif f == 6: c["config"] = v.decode()
    return c

fused = load(sys.argv[1])
errors = []
for r, row in ((1, 0), (2, 1)):
    e = load("%s/r%d.loom" % (sys.argv[2], r))
    for name, t in e["tensors"].items():
        a = fused["tensors"][name]
        n = t["nbytes"]
        if a["shape"][1:] != t["shape"] or a["bytes"][row * n:(row + 1) * n] != t["bytes"]:
            errors.append("replica %d: %s is not row %d of the array" % (r, name, row))
    if any(k.startswith("replica_") for k in e["strings"]): errors.append("replica %d: replica_* values" % r)
    if "replicas" in e["config"] or "lr: %s" % ("0.05" if r == 1 else "0.005") not in e["config"]:
        errors.append("replica %d: not its own config:\n%s" % (r, e["config"]))
    if e["seeds"].get("seed") != 7 + r or "seed: %d" % (7 + r) not in e["config"]:
        errors.append("replica %d: seed %s, expected %d" % (r, e["seeds"], 7 + r))
print("\n".join(errors) if errors else "rows 0 and 1 of the array are replicas 1 and 2, byte for byte")
sys.exit(1 if errors else 0)
EOF
    then ok "export values (python3)"; else fail "export values (python3)"; fi
  else
    echo "python3 not found: the byte-level row check is skipped"
  fi

  # The export is an ordinary single-model checkpoint: loom train loads it.
  if "$loom" train --config "$work/fused.pbtxt" --init-from "$work/r1.loom" --out "$work/run2" --max-steps 1 \
    >"$work/run2.log" 2>&1; then
    ok "loom train --init-from an exported replica"
  else
    fail "loom train --init-from r1.loom: $(tail -3 "$work/run2.log")"
  fi
  # ... but not into another model: the error names the tensor and both shapes.
  sed 's/value: "16"/value: "24"/' "$work/fused.pbtxt" >"$work/wider.pbtxt"
  expect_error "init-from another model" "r1.loom: tensor 'fc1/weight' is [16, 784] f32, the model's Parameter is [24, 784] f32" \
    -- train --config "$work/wider.pbtxt" --init-from "$work/r1.loom" --out "$work/run3"
  [ ! -e "$work/run3" ] && ok "a refused --init-from writes no run folder" || fail "run3 was created"

  expect_error "replica out of range" "--replica 3: $ckpt holds replicas 0 to 2:" \
    -- export --checkpoint "$ckpt" --replica 3 --out "$work/x.loom"
  out=$("$loom" export --checkpoint "$ckpt" --replica 3 --out "$work/x.loom" 2>&1)
  grep -qF "  0  huge lr=1e+30: diverged" <<<"$out" && grep -qF "  2  slow lr=0.005: running" <<<"$out" &&
    ok "out of range lists the replicas with labels and statuses" || fail "replica list: $out"
  expect_error "negative replica" "--replica -1: " -- export --checkpoint "$ckpt" --replica -1 --out "$work/x.loom"
  expect_error "not fused" "$work/r1.loom is not a fused run's checkpoint" \
    -- export --checkpoint "$work/r1.loom" --replica 0 --out "$work/x.loom"
  [ -e "$work/x.loom" ] && fail "a failed export left $work/x.loom"
  # An existing file that is not a checkpoint is never overwritten; an earlier export may be.
  printf 'notes I want to keep\n' >"$work/notes.txt"
  expect_error "export over a non-checkpoint" "$work/notes.txt exists and is not a loom checkpoint: not overwriting it" \
    -- export --checkpoint "$ckpt" --replica 1 --out "$work/notes.txt"
  grep -qx "notes I want to keep" "$work/notes.txt" && ok "the non-checkpoint file is untouched" || fail "notes.txt changed"
  expect_error "export over its own input" "is the --checkpoint being exported" \
    -- export --checkpoint "$ckpt" --replica 1 --out "$ckpt"
  "$loom" export --checkpoint "$ckpt" --replica 1 --out "$work/r1.loom" >/dev/null 2>&1 &&
    ok "export over an earlier export" || fail "export over an earlier export was refused"
fi
expect_error "missing checkpoint" "cannot open checkpoint '$work/nope.loom'" \
  -- export --checkpoint "$work/nope.loom" --replica 0 --out "$work/x.loom"
printf 'not a checkpoint at all, just some bytes to fill the prelude' >"$work/junk.loom"
expect_error "not a checkpoint" "$work/junk.loom" -- export --checkpoint "$work/junk.loom" --replica 0 --out "$work/x.loom"
expect_error "export without --replica" "loom export needs --replica R" -- export --checkpoint "$work/junk.loom" --out "$work/x.loom"

[ "$failures" -eq 0 ] && echo PASS
exit "$failures"
