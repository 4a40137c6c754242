#!/usr/bin/env bash
# The simulator's accuracy on this machine (issue 14): `loom bench simulator`
# for each model's dp, owt and model strategies on cpu:2 in one process, then
# the same under `mpirun -np 2` (one device per process) for the models in
# MPI_MODELS; every table in full, then the errors of all strategy-model
# pairs together: median, 90th percentile, largest, and the pairs where the
# measured spread (p10-p90) is wider than the error.
#
#   bench/simulator_accuracy.sh [REPS]      (default 20 measured steps each)
#
# Needs bazel-bin/tools/loom (bazel build //tools:loom) and, for the MPI
# runs, mpirun (tools/setup.sh installs Open MPI). Probe both machines
# first: `loom machine probe --out simulator/machines/cpu_local.pbtxt` and
# `tests/mpirun.sh 2 loom machine probe --out simulator/machines/cpu_local_np2.pbtxt`.
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-20}"
loom=bazel-bin/tools/loom
machine=simulator/machines/cpu_local.pbtxt
mpi_machine=simulator/machines/cpu_local_np2.pbtxt  # a node per process: `tests/mpirun.sh 2 loom machine probe`
models="fashion_mnist_cnn fashion_mnist_mlp fortunes_rnntc jargon_transformer_lm fashion_mnist_resnet18"
mpi_models="fashion_mnist_cnn fashion_mnist_mlp fortunes_rnntc"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

run() {  # label, then the command
  local label="$1"
  shift
  echo "== $label: $*"
  "$@" | tee "$work/out"
  # Each strategy row as: label, strategy, predicted, measured, spread %, error %.
  python3 - "$label" "$work/out" >>"$work/rows" <<'EOF'
import re, sys
label, path = sys.argv[1], sys.argv[2]
for line in open(path):
    m = re.match(r"(\S+)\s+([\d.]+)\s+([\d.]+)\s+\(\s*([\d.]+)-\s*([\d.]+)\)\s+([-+][\d.]+)%", line)
    if m and m.group(1) in ("dp", "owt", "model"):
        name, pred, meas, p10, p90, err = m.groups()
        spread = (float(p90) - float(p10)) / float(meas) * 100
        print(label, name, pred, meas, spread, err)
EOF
  sed -n "s/.*Kendall tau of the order \([-0-9.]*\).*/$label: \1/p" "$work/out" >>"$work/taus"
}

for m in $models; do
  run "$m cpu:2" "$loom" bench simulator --config "models/configs/$m.pbtxt" --reps "$reps" --machine "$machine"
done
if command -v mpirun >/dev/null; then
  for m in $mpi_models; do
    run "$m mpirun -np 2" tests/mpirun.sh 2 "$loom" bench simulator --config "models/configs/$m.pbtxt" \
      --reps "$reps" --machine "$mpi_machine"
  done
else
  echo "(no mpirun: the MPI runs are left out)"
fi

echo
echo "== all strategy-model pairs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
python3 - "$work/rows" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1])]
# label may hold spaces: the last five fields are name, predicted, measured, spread, error
pairs = [(" ".join(r[:-5]), r[-5], float(r[-4]), float(r[-3]), float(r[-2]), float(r[-1])) for r in rows]
errors = sorted(abs(p[5]) for p in pairs)
def q(x, f):
    return x[min(len(x) - 1, int(f * (len(x) - 1) + 0.5))]
print(f"{len(pairs)} pairs: median |error| {q(errors, 0.5):.1f}%, 90th percentile {q(errors, 0.9):.1f}%, "
      f"largest {errors[-1]:.1f}%")
noisy = [p for p in pairs if p[4] > abs(p[5])]
print(f"{len(noisy)} pairs whose measured spread (p10-p90) is wider than their error:")
for label, name, pred, meas, spread, err in noisy:
    print(f"  {label} {name}: error {err:+.1f}%, spread {spread:.1f}%")
EOF
echo "Kendall tau of the strategies' order, per run:"
sed 's/^/  /' "$work/taus"
