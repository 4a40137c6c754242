#!/usr/bin/env bash
# The search tables of docs/search.md: `loom search` for FlexFlow's six
# models and a fused ResNet-18 sweep on four simulated machines; per pair
# the predicted step of data parallelism, OWT, replica parallelism (a
# fused model), the exact layer-wise solver's strategy and the searched
# one, the most any strategy can gain over data parallelism (dp / perfect
# scaling of one device), the bytes each moves, the search's proposals
# and time. Each search's output stays in OUT; the markdown table is made
# from those logs (`--table OUT` remakes it alone).
#   bash bench/search_tables.sh [BUDGET=30s] [OUT=/tmp/loom_search_tables] [MODELS] [MACHINES]
#   bash bench/search_tables.sh --table OUT
set -euo pipefail
cd "$(dirname "$0")/.."
table() {
  python3 - "$1" <<'PY'
import glob, os, re, sys
out = sys.argv[1]
print("| model | machine | devices | dp ms | owt ms | replica ms | exact ms | searched ms | vs dp | vs owt | most vs dp | bytes dp / searched | proposals | search s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for log in sorted(glob.glob(os.path.join(out, "*.log")), key=os.path.getmtime):
    model, machine = re.match(r"(.+?)_((?:h200|p100|dgx|k80).*)\.log$", os.path.basename(log)).groups()
    rows, devices, proposals, seconds, perfect = {}, "", "", "", 0.0
    for line in open(log):
        f = line.split()
        if len(f) >= 5 and f[0] in ("dp", "owt", "model", "replica", "exact", "searched") and re.match(r"^[0-9.e+-]+$", f[1]):
            rows[f[0]] = (float(f[1]), float(f[3]), "does not fit" not in line)
        m = re.search(r"\((\d+) devices\)", line)
        if m and not devices: devices = m.group(1)
        m = re.match(r"(\d+) proposals in ([0-9.]+) s", line)
        if m: proposals, seconds = m.groups()
        m = re.match(r"perfect scaling: ([0-9.e+-]+) ms", line)
        if m: perfect = float(m.group(1))
    if "searched" not in rows:
        lines = open(log).read().strip().splitlines()
        print("| %s | %s | failed: %s |" % (model, machine, lines[-1] if lines else "no output"))
        continue
    cell = lambda k: ("%.4g" % rows[k][0] + ("" if rows[k][2] else " (no fit)")) if k in rows else "-"
    s, dp = rows["searched"], rows["dp"]
    owt = rows.get("owt", dp)
    moved = "%.1fx" % (dp[1] / s[1]) if s[1] > 0 else ("-" if dp[1] == 0 else "all local")
    most = "%.2fx" % (dp[0] / perfect) if perfect > 0 else "-"
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %.2fx | %.2fx | %s | %s | %s | %s |" % (
        model, machine, devices, cell("dp"), cell("owt"), cell("replica"), cell("exact"), cell("searched"),
        dp[0] / s[0], owt[0] / s[0], most, moved, proposals, seconds))
PY
}
if [ "${1:-}" = "--table" ]; then
  table "$2"
  exit 0
fi
budget="${1:-30s}"
out="${2:-/tmp/loom_search_tables}"
models="${3:-alexnet inception_v3 resnet101 rnntc rnnlm nmt resnet18_sweep}"
machines="${4:-h200_8_nvswitch p100_4x4 dgx_h100_4x8 k80_16x4}"
loom=${LOOM:-bazel-bin/tools/loom}  # LOOM: another binary (a copy, to rebuild meanwhile)
[ -x "$loom" ] || bazel build //tools:loom >/dev/null
mkdir -p "$out"
rm -f "$out"/*.log
for model in $models; do
  for machine in $machines; do
    "$loom" search --config "bench/configs/search/$model.pbtxt" --machine "simulator/machines/$machine.pbtxt" \
      --budget "$budget" --out "$out/${model}_$machine.pbtxt" >"$out/${model}_$machine.log" 2>&1 || true
  done
done
echo "loom search --budget $budget, $(date -u +%Y-%m-%d), on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo
table "$out"
