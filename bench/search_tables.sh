#!/usr/bin/env bash
# The search tables of docs/search.md: `loom search` for FlexFlow's six
# models and a fused ResNet-18 sweep on four simulated machines; per pair
# the predicted step of data parallelism, OWT, the exact layer-wise
# solver's strategy and the searched one, the bytes each moves, the search's
# time. Prints a markdown table (and keeps each search's output in OUT).
#   bash bench/search_tables.sh [BUDGET=30s] [OUT=/tmp/loom_search_tables] [MODELS] [MACHINES]
set -euo pipefail
cd "$(dirname "$0")/.."
budget="${1:-30s}"
out="${2:-/tmp/loom_search_tables}"
models="${3:-alexnet inception_v3 resnet101 rnntc rnnlm nmt resnet18_sweep}"
machines="${4:-h200_8_nvswitch p100_4x4 dgx_h100_4x8 k80_16x4}"
loom=bazel-bin/tools/loom
[ -x "$loom" ] || bazel build //tools:loom >/dev/null
mkdir -p "$out"
echo "loom search --budget $budget, $(date -u +%Y-%m-%d), on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo
echo "| model | machine | devices | dp ms | owt ms | exact ms | searched ms | vs dp | vs owt | bytes dp / searched | proposals | search s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for model in $models; do
  for machine in $machines; do
    log="$out/${model}_$machine.log"
    start=$(date +%s.%N)
    "$loom" search --config "bench/configs/search/$model.pbtxt" --machine "simulator/machines/$machine.pbtxt" \
      --budget "$budget" --out "$out/${model}_$machine.pbtxt" >"$log" 2>&1 || { echo "| $model | $machine | failed: $(tail -1 "$log") |"; continue; }
    seconds=$(python3 -c "import time,sys; print('%.1f' % (time.time() - float(sys.argv[1])))" "$start")
    python3 - "$log" "$model" "$machine" "$seconds" <<'PY'
import re, sys
log, model, machine, seconds = sys.argv[1:]
rows, devices, proposals = {}, "", ""
for line in open(log):
    f = line.split()
    if len(f) >= 5 and f[0] in ("dp", "owt", "model", "replica", "exact", "searched") and re.match(r"^[0-9.e+-]+$", f[1]):
        rows[f[0]] = (float(f[1]), float(f[3]))
    m = re.search(r"\((\d+) devices\)", line)
    if m and not devices: devices = m.group(1)
    m = re.match(r"(\d+) proposals in", line)
    if m: proposals = m.group(1)
get = lambda k: "%.4g" % rows[k][0] if k in rows else "-"
s, dp = rows["searched"], rows["dp"]
owt = rows.get("owt", dp)
moved = "%.1fx" % (dp[1] / s[1]) if s[1] > 0 else ("-" if dp[1] == 0 else "all local")
print("| %s | %s | %s | %s | %s | %s | %s | %.2fx | %.2fx | %s | %s | %s |" % (
    model, machine, devices, get("dp"), get("owt"), get("exact"), get("searched"),
    dp[0] / s[0], owt[0] / s[0], moved, proposals, seconds))
PY
  done
done
