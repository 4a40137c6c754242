#!/usr/bin/env bash
# Horizontal fusion of the zoo on one GPU against PyTorch (issue 12's H200
# table): per model, `loom bench fusion --device cuda` on
# bench/configs/gpu/MODEL.pbtxt (loom fused and serial, at each of
# --loom-precisions: f32 is true FP32, bf16 is `precision: bf16`), then
# bench/pytorch_zoo_fusion.py --device cuda on
# the same model, batch, data shapes and optimizer (PyTorch serial and
# torch.func vmap, each at f32, TF32 and bf16 autocast), and one markdown
# table of both in samples/s summed over the R replicas, with the issue's
# goals as pass/fail notes.
#
#   bench/gpu_zoo_fusion.sh LOOM_BIN OUT_DIR [--models a,b] [--replicas 1,2,4,8] [--reps 3] [--budget-s 240]
#                           [--precisions f32,tf32,bf16] [--loom-precisions f32,bf16] [--python python3]
#   bench/gpu_zoo_fusion.sh --table OUT_DIR     (re-writes OUT_DIR/gpu_zoo_fusion.md from its JSON; no GPU)
#
# MODEL: resnet18, mobilenet_v3_large, pointnet_cls, transformer_lm, bert_medium (default: all, in that order).
# --replicas: the R to measure, ascending; "plan" stands for the largest R
# that `loom plan --device h200` says fits (loom's own memory plan).
# --budget-s: wall-clock seconds for everything. Each model gets an equal
# share of what is left when it starts (what one leaves unused goes to the
# next), loom about 40% of it, PyTorch the rest; every command runs under
# `timeout`, and what the budget leaves out is listed in the table.
# loom runs once per R and precision (f32 then bf16 at each R), so an R that
# fails (out of memory, a missing kernel) keeps the smaller ones; larger R
# are then not tried at that precision. PyTorch runs
# every R in a fresh process and records an out-of-memory as OOM.
# Writes OUT_DIR/MODEL.loom.json (the rows of every R, merged; the data
# spec as loom wrote it), OUT_DIR/MODEL.torch.json, OUT_DIR/logs/*, and
# OUT_DIR/gpu_zoo_fusion.md.
set -euo pipefail
cd "$(dirname "$0")/.."
all_models="resnet18,mobilenet_v3_large,pointnet_cls,transformer_lm,bert_medium"
usage="usage: bench/gpu_zoo_fusion.sh LOOM_BIN OUT_DIR [--models $all_models] [--replicas 1,2,4,8] [--reps 3]
         [--budget-s 240] [--precisions f32,tf32,bf16] [--loom-precisions f32,bf16] [--python python3]
       bench/gpu_zoo_fusion.sh --table OUT_DIR"
python=python3

# The markdown table from OUT_DIR's JSON (plain python3: no torch needed).
write_table() {
  "$python" - "$1" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
nan = float("nan")
load = lambda p: json.load(open(p)) if os.path.exists(p) else None  # noqa: E731
meta = load(os.path.join(out, "run.json")) or {}
order = meta.get("models") or sorted(os.path.basename(p)[:-len(".loom.json")]
                                     for p in glob.glob(os.path.join(out, "*.loom.json")))
precisions = ("f32", "tf32", "bf16")
lines, notes, goals = [], [], []


def num(x):
    return "n/a" if x is None or x != x else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def note(text):
    """The footnote number of an error message, each message listed once."""
    if text not in notes:
        notes.append(text)
    return f"error [{notes.index(text) + 1}]"


def cell(row, variant):
    """A torch rate, or why there is none."""
    if row is None:
        return "n/a", None
    v = row.get(f"{variant}_samples_per_s")
    if v is not None:
        return num(v), v
    e = (row.get("errors") or {}).get(variant)
    if e is None:
        return "n/a", None
    if e == "OOM" or e.startswith("skipped"):
        return ("OOM" if e == "OOM" else "skipped"), None
    return note(f"torch {variant}: {e}"), None


def gib(b):
    return "n/a" if b is None else f"{b / 2**30:.2f}"


torch_version = None
for model in order:
    loom = load(os.path.join(out, f"{model}.loom.json"))
    torch = load(os.path.join(out, f"{model}.torch.json"))
    if loom is None and torch is None:
        continue
    torch_version = torch_version or (torch or {}).get("torch_version")
    trows = {}
    for r in (torch or {}).get("rows", []):
        trows.setdefault(r["replicas"], {})[r["precision"]] = r
    # loom's rows by (R, precision); JSON from before loom had bf16 is f32.
    all_lrows = {(r["replicas"], r.get("precision", "f32")): r for r in (loom or {}).get("rows", [])}
    all_lerr = {}
    for k, v in (loom or {}).get("errors", {}).items():
        r, _, p = str(k).partition(":")
        all_lerr[(int(r), p or "f32")] = v
    lrows = {r: row for (r, p), row in all_lrows.items() if p == "f32"}
    rs = sorted({r for r, _ in all_lrows} | set(trows) | {r for r, _ in all_lerr})

    def loom_cells(r, p):
        lr = all_lrows.get((r, p))
        if lr:
            f, s = lr["fused_samples_per_s"], lr["serial_samples_per_s"]
            return lr, f, num(f), num(s), f"{f / s:.2f}x"
        e = all_lerr.get((r, p), "not run")
        if e.startswith("skipped"):
            e = "skipped"
        elif e not in ("OOM", "not run"):
            e = note(f"loom {p}: {e}")
        return None, None, e, e, e

    for r in rs:
        t = trows.get(r, {})
        lr, f, lf, ls, sp = loom_cells(r, "f32")
        _, fb, lfb, lsb, spb = loom_cells(r, "bf16")
        ser = [cell(t.get(p), "serial") for p in precisions]
        vm = [cell(t.get(p), "vmap") for p in precisions]
        ts32, tv32, tvb = ser[0][1], vm[0][1], vm[2][1]
        vs_serial = f"{f / ts32:.2f}x" if f and ts32 else "n/a"
        vs_vmap = f"{f / tv32:.2f}x" if f and tv32 else "n/a"
        vs_vmap_bf16 = f"{fb / tvb:.2f}x" if fb and tvb else "n/a"
        t32 = t.get("f32") or {}
        mem = f"{gib(lr.get('fused_peak_bytes') if lr else None)} / {gib(t32.get('vmap_peak_bytes'))}"
        lines.append(f"| {model} | {r} | {lf} | {ls} | {sp} | {lfb} | {lsb} | {spb} | {' | '.join(c for c, _ in ser)} "
                     f"| {' | '.join(c for c, _ in vm)} | {vs_serial} | {vs_vmap} | {vs_vmap_bf16} | {mem} |")
    # The issue's goals, on what was measured.
    g = []
    measured = sorted(r for r in lrows)
    if measured:
        top = measured[-1]
        sp = lrows[top]["fused_samples_per_s"] / lrows[top]["serial_samples_per_s"]
        g.append(f"fused/serial {sp:.2f}x at R={top} (goal >= 2.42x): {'PASS' if sp >= 2.42 else 'FAIL'}")
    else:
        g.append("fused/serial: not measured")
    one = (trows.get(1) or {}).get("f32") or {}
    if 1 in lrows and one.get("serial_samples_per_s"):
        q = lrows[1]["serial_samples_per_s"] / one["serial_samples_per_s"]
        g.append(f"loom R=1 {q:.2f}x torch serial f32 (goal >= 0.9x): {'PASS' if q >= 0.9 else 'FAIL'}")
    else:
        g.append("loom R=1 vs torch serial f32: not measured")
    both = [r for r in measured if ((trows.get(r) or {}).get("f32") or {}).get("vmap_samples_per_s")]
    if both:
        r = both[-1]
        q = lrows[r]["fused_samples_per_s"] / trows[r]["f32"]["vmap_samples_per_s"]
        g.append(f"loom fused {q:.2f}x torch vmap f32 at R={r} (goal >= 1.5x): {'PASS' if q >= 1.5 else 'FAIL'}")
    else:
        g.append("loom fused vs torch vmap f32: not measured")
    extra = []
    if loom and loom.get("spec_source"):
        extra.append(f"data spec: {loom['spec_source']}")
    if torch and torch.get("model_source") and torch["model_source"] != "torchvision" and \
            model in ("resnet18", "mobilenet_v3_large"):
        extra.append(f"torch model: {torch['model_source']}")
    batch = (loom or torch or {}).get("batch")
    goals.append(f"- {model} (batch {batch}/replica): " + "; ".join(g) + (f" ({'; '.join(extra)})" if extra else ""))

print(f"GPU zoo fusion, {meta.get('date', '?')}, commit {meta.get('commit', '?')}, {meta.get('gpu', '?')}, "
      f"torch {torch_version or '?'}; samples/s over all R replicas, best of {meta.get('reps', '?')} steps after "
      f"warm-up; `{meta.get('command', 'bench/gpu_zoo_fusion.sh')}`\n")
print("loom f32 is true FP32 (no TF32); loom bf16 is `precision: bf16` (GEMMs and convolutions in bf16 with f32 "
      "accumulation, f32 master weights). loom's steps copy the batch host -> device and the outputs back, "
      "PyTorch's batch stays on the GPU. torch tf32: TF32 matmuls and convolutions; bf16: autocast around forward "
      "and loss, f32 master weights. Peak memory: loom's fused f32 step (its arena plus the state tensors) / "
      "PyTorch vmap f32 (torch.cuda.max_memory_allocated: parameters, optimizer state and the step), GiB.\n")
print("| model | R | loom fused f32 | loom serial f32 | fused/serial f32 | loom fused bf16 | loom serial bf16 "
      "| fused/serial bf16 | torch serial f32 | torch serial tf32 "
      "| torch serial bf16 | torch vmap f32 | torch vmap tf32 | torch vmap bf16 | loom fused f32 / torch serial f32 "
      "| loom fused f32 / vmap f32 | loom fused bf16 / vmap bf16 | peak GiB loom fused / vmap f32 |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
print("\n".join(lines))
print("\nGoals (issue 12):\n" + "\n".join(goals))
if notes:
    print("\nErrors:\n" + "\n".join(f"{i + 1}. {n}" for i, n in enumerate(notes)))
skipped = meta.get("skipped") or []
if skipped:
    print("\nSkipped (time budget or failures):\n" + "\n".join(f"- {s}" for s in skipped))
EOF
}

if [ "${1:-}" = "--table" ]; then
  [ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
  write_table "$2" > "$2/gpu_zoo_fusion.md"
  cat "$2/gpu_zoo_fusion.md"
  exit 0
fi
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
loom="$1" out="$2"
shift 2
models="$all_models" replicas="1,2,4,8" reps=3 budget=240 precisions="f32,tf32,bf16" loom_precisions="f32,bf16"
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --replicas) replicas="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --budget-s) budget="$2"; shift 2 ;;
    --precisions) precisions="$2"; shift 2 ;;
    --loom-precisions) loom_precisions="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a model_list <<< "$models"
IFS=, read -r -a loom_precision_list <<< "$loom_precisions"
for m in "${model_list[@]}"; do
  [ -f "bench/configs/gpu/$m.pbtxt" ] || { echo "no config bench/configs/gpu/$m.pbtxt" >&2; exit 2; }
done
[ -x "$loom" ] || { echo "LOOM_BIN $loom is not an executable" >&2; exit 2; }
mkdir -p "$out/logs"
start=$(date +%s)
deadline=$((start + budget))
skipped=()
now() { date +%s; }
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${gpu:-no nvidia-smi}, budget ${budget}s, models $models, R $replicas"

# Merges loom's per-R JSON into OUT/MODEL.loom.json: the first run's data
# spec, every run's row, each failed R's reason. Without any run, the
# config's data spec as written below (what loom would report), so that
# PyTorch still runs.
merge_loom() {  # model, then ("R:precision", status, JSON file) triples
  "$python" - "$out" "$@" <<'EOF'
import json, sys
out, model, args = sys.argv[1], sys.argv[2], sys.argv[3:]
fallback = {  # bench/configs/gpu/*.pbtxt
    "resnet18": dict(batch=128, input_shape=[3, 32, 32], input_dtype="f32", target_shape=[], num_classes=10,
                     vocabulary=0),
    "mobilenet_v3_large": dict(batch=1024, input_shape=[3, 32, 32], input_dtype="f32", target_shape=[],
                               num_classes=10, vocabulary=0),
    "pointnet_cls": dict(batch=32, input_shape=[3, 2500], input_dtype="f32", target_shape=[], num_classes=10,
                         vocabulary=0),
    "transformer_lm": dict(batch=32, input_shape=[32], input_dtype="i64", target_shape=[32], num_classes=256,
                           vocabulary=256),
    "bert_medium": dict(batch=32, input_shape=[32], input_dtype="i64", target_shape=[32], num_classes=257,
                        vocabulary=257),
}
merged, rows, errors = None, [], {}
for key, status, path in zip(args[::3], args[1::3], args[2::3]):
    precision = key.partition(":")[2]
    if status == "ok":
        j = json.load(open(path))
        merged = merged or j
        rows += [dict(row, precision=precision) for row in j["rows"]]
    else:
        errors[key] = status
if merged is None:
    merged = {"model": model, **fallback[model], "spec_source": "the script's copy of the config (loom gave no JSON)"}
merged["rows"], merged["errors"] = rows, errors
json.dump(merged, open(f"{out}/{model}.loom.json", "w"), indent=1)
EOF
}

n=${#model_list[@]}
for i in "${!model_list[@]}"; do
  m="${model_list[$i]}"
  config="bench/configs/gpu/$m.pbtxt"
  left=$((deadline - $(now)))
  if [ "$left" -lt 20 ]; then
    skipped+=("$m: not run (${left}s of the budget left)")
    continue
  fi
  share=$((left / (n - i)))
  model_deadline=$(($(now) + share))
  loom_deadline=$(($(now) + share * 2 / 5))
  rs="$replicas"
  if [[ ",$rs," == *,plan,* ]]; then
    plan_r=""
    if timeout 60 "$loom" plan --config "$config" --device h200 --json "$out/logs/$m.plan.json" \
         >"$out/logs/$m.plan.log" 2>&1; then
      plan_r=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["largest_fitting"])' \
                 "$out/logs/$m.plan.json" || true)
    fi
    if [ -n "$plan_r" ]; then
      rs="${rs//plan/$plan_r}"
    else
      rs="$(echo "$rs" | sed 's/,*plan//; s/^,//')"
      skipped+=("$m: R=plan (loom plan failed, see logs/$m.plan.log)")
    fi
  fi
  echo "== $m: ${share}s (loom until +$((loom_deadline - $(now)))s), R $rs"

  runs=()
  declare -A stop=()
  IFS=, read -r -a r_list <<< "$rs"
  for r in "${r_list[@]}"; do
    for p in "${loom_precision_list[@]}"; do
      if [ -n "${stop[$p]:-}" ]; then
        runs+=("$r:$p" "skipped: ${stop[$p]}" "")
        continue
      fi
      t=$((loom_deadline - $(now)))
      if [ "$t" -lt 5 ]; then
        runs+=("$r:$p" "skipped: time budget" "")
        skipped+=("$m: loom $p R=$r (time budget)")
        stop[$p]="time budget"
        continue
      fi
      log="$out/logs/$m.loom.r$r.$p.log"
      if timeout -k 5 "$t" "$loom" bench fusion --config "$config" --device cuda --precision "$p" --replicas "$r" \
           --reps "$reps" --json "$out/logs/$m.loom.r$r.$p.json" >"$log" 2>&1; then
        runs+=("$r:$p" ok "$out/logs/$m.loom.r$r.$p.json")
        grep -E "^ +$r " "$log" | sed "s/^/  loom $p: /" || true
      else
        rc=$?
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
          why="timed out after ${t}s"
          skipped+=("$m: loom $p R=$r (timed out after ${t}s)")
        elif grep -qiE "out of memory|cudaErrorMemoryAllocation|RESOURCE_EXHAUSTED" "$log"; then
          why="OOM"
        else
          why="$(grep -v '^ *$' "$log" | tail -1 | cut -c1-300)"
          why="exit $rc: ${why:-no output}"
        fi
        echo "  loom $p R=$r: $why"
        runs+=("$r:$p" "$why" "")
        stop[$p]="R=$r failed"
      fi
    done
  done
  unset stop
  merge_loom "$m" "${runs[@]}"

  t=$((model_deadline - $(now)))
  if [ "$t" -lt 10 ]; then
    skipped+=("$m: torch (${t}s of its share left)")
  else
    echo "  torch: ${t}s"
    rc=0
    timeout -k 5 $((t + 10)) "$python" bench/pytorch_zoo_fusion.py --model "$m" --loom-json "$out/$m.loom.json" \
      --device cuda --precision "$precisions" --replicas "$rs" --reps "$reps" --deadline-s "$t" \
      --json "$out/$m.torch.json" >"$out/logs/$m.torch.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
      skipped+=("$m: torch stopped (exit $rc; see logs/$m.torch.log; the rows it wrote are kept)")
    fi
    sed 's/^/  torch: /' "$out/logs/$m.torch.log"
    if grep -q "skipped: time budget" "$out/$m.torch.json" 2>/dev/null; then
      skipped+=("$m: some torch runs (time budget; see $m.torch.json)")
    fi
  fi
done

command="bench/gpu_zoo_fusion.sh LOOM_BIN OUT_DIR --models $models --replicas $replicas --reps $reps"
command+=" --budget-s $budget --precisions $precisions --loom-precisions $loom_precisions"
"$python" - "$out/run.json" "$start" "$reps" "$models" "${gpu:-unknown GPU}" \
  "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$command" "${skipped[@]+"${skipped[@]}"}" <<'EOF'
import json, sys, time
path, start, reps, models, gpu, commit, command, *skipped = sys.argv[1:]
json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(int(start))), "reps": int(reps),
           "models": models.split(","), "gpu": gpu, "commit": commit, "command": command,
           "seconds": int(time.time()) - int(start), "skipped": skipped}, open(path, "w"), indent=1)
EOF
write_table "$out" > "$out/gpu_zoo_fusion.md"
echo
cat "$out/gpu_zoo_fusion.md"
echo "$(( $(now) - start ))s of ${budget}s; wrote $out/gpu_zoo_fusion.md"
