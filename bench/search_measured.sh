#!/usr/bin/env bash
# The search on this machine (docs/search.md "Measured"): for each config,
# `loom search` on this machine probed (2 devices), then every candidate
# (the starting points and the searched strategy) measured by `loom bench
# parallel` in one process (cpu:2); and the same under `mpirun -np 2`, the
# search on the machine probed under mpirun (a node per process); predicted
# against measured, and whether the simulator orders them as measured:
# Kendall tau over every pair, and over the pairs the measurement itself
# orders (p10-p90 spreads apart; pairs closer than the steps' noise have no
# measured order to match).
#   bash bench/search_measured.sh [REPS=20] [CONFIGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-20}"
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(models/configs/fashion_mnist_mlp.pbtxt models/configs/fashion_mnist_cnn.pbtxt
  bench/configs/resnet18.pbtxt)
loom=bazel-bin/tools/loom
[ -x "$loom" ] || bazel build //tools:loom >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$loom" machine probe --out "$work/local.pbtxt" >/dev/null
bash tests/mpirun.sh 2 "$loom" machine probe --out "$work/np2.pbtxt" >/dev/null
echo "loom search on this machine probed, 2 devices, 2000 proposals; measured medians of $reps steps; $(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
for config in "${configs[@]}"; do
  name=$(basename "$config" .pbtxt)
  for run in cpu mpi; do  # the search on the machine its candidates are measured on
    machine="$work/local.pbtxt"
    [ "$run" = mpi ] && machine="$work/np2.pbtxt"
    dir="$work/$name.$run"
    "$loom" search --config "$config" --machine "$machine" --devices 2 --proposals 2000 \
      --candidates "$dir" --out "$dir.pbtxt" >"$work/$name.$run.search.log" 2>&1 ||
      { cat "$work/$name.$run.search.log"; exit 1; }
  done
  "$loom" bench parallel --config "$config" --devices 2 --reps "$reps" \
    --strategies "$(ls "$work/$name.cpu"/*.pbtxt | paste -sd,)" >"$work/$name.cpu.log" 2>&1
  bash tests/mpirun.sh 2 "$loom" bench parallel --config "$config" --reps "$reps" \
    --strategies "$(ls "$work/$name.mpi"/*.pbtxt | paste -sd,)" >"$work/$name.mpi.log" 2>&1
  python3 - "$name" "$work/$name.cpu.search.log" "$work/$name.cpu.log" "$work/$name.mpi.search.log" \
    "$work/$name.mpi.log" <<'PY'
import re, sys
name, cpu_search, cpu, mpi_search, mpi = sys.argv[1:]
def predictions(path):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and re.match(r"^[0-9.e+-]+$", f[1]) and (
                f[0] in ("dp", "owt", "model", "replica", "exact", "searched") or re.match(r"^dp-[0-9]+$", f[0])):
            out[f[0]] = float(f[1])
    return out
def measured(path):  # name -> (median, p10, p90)
    out = {}
    for line in open(path):
        m = re.match(r"^(\S+) on (?:cpu:2|2 procs)\s+([0-9.]+)\s+([0-9.]+) -\s+([0-9.]+)", line)
        if m: out[m.group(1)] = tuple(float(m.group(k)) for k in (2, 3, 4))
    return out
def tau(a, b, apart=lambda i, j: True):
    c = d = n = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            if not apart(i, j): continue
            s = (a[i] - a[j]) * (b[i][0] - b[j][0])
            c += s > 0
            d += s < 0
            n += 1
    return ((c - d) / n if n else 1.0), n
for label, search, path in (("cpu:2", cpu_search, cpu), ("mpirun -np 2", mpi_search, mpi)):
    predicted = predictions(search)
    got = measured(path)
    names = [k for k in predicted if k in got]
    p = [predicted[k] for k in names]
    m = [got[k] for k in names]
    print("\n%s, %s:" % (name, label))
    print("| strategy | predicted ms | measured ms (p10-p90) |")
    print("|---|---|---|")
    for k in names: print("| %s | %.3f | %.3f (%.3f-%.3f) |" % (k, predicted[k], *got[k]))
    apart = lambda i, j: m[i][2] < m[j][1] or m[j][2] < m[i][1]
    all_tau, all_n = tau(p, m)
    apart_tau, apart_n = tau(p, m, apart)
    print("searched / dp measured: %.3f; Kendall tau of predicted vs measured order: %.2f (%d pairs), "
          "over the pairs measured apart: %.2f (%d pairs)" % (got["searched"][0] / got["dp"][0], all_tau, all_n,
                                                              apart_tau, apart_n))
PY
done
