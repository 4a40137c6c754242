# Shared by bench/'s scripts (sourced): the Python that runs
# PyTorch, made when none is given, and the line naming the CPU that every
# table starts with (its vector width decides the kernels' speed).

# Prints a Python with PyTorch >= 2 (torch.func), numpy and the modules
# named (e.g. torchvision): the first of $LOOM_BENCH_PYTHON,
# /opt/torchbench/bin/python and the venv ~/.cache/loom-bench-venv that has
# them all; else it makes (or completes) that venv from the package
# registry. Progress goes to stderr.
bench_python() {
  local check="import torch, numpy; assert int(torch.__version__.split('.')[0]) >= 2"
  local module
  for module in "$@"; do check="$check; import $module"; done
  local venv="$HOME/.cache/loom-bench-venv" candidate
  for candidate in "${LOOM_BENCH_PYTHON:-}" /opt/torchbench/bin/python "$venv/bin/python"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c "$check" 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "bench: making $venv (torch numpy $*)" >&2
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >&2 || return 1
  "$venv/bin/pip" install -q torch numpy "$@" >&2 || return 1
  "$venv/bin/python" -c "$check" >&2 || return 1
  echo "$venv/bin/python"
}

# "cpu: AMD EPYC 7B13, 2 cores, vector: AVX2 FMA (no AVX-512)".
cpu_line() {
  local model cores flags vector="" f
  model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
  cores="$(nproc)"
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  for f in avx2 fma avx512f avx512bw avx512vl; do
    case "$flags" in *" $f "*) vector="$vector $(echo "$f" | tr a-z A-Z | sed 's/AVX512/AVX-512/')" ;; esac
  done
  case "$flags" in *" avx512f "*) ;; *) vector="$vector (no AVX-512)" ;; esac
  echo "cpu: $model, $cores cores, vector:${vector:- none of AVX2, FMA, AVX-512}"
}
