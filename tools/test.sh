#!/usr/bin/env bash
# Runs every test: installs what is missing, builds everything (CPU), runs the
# whole test suite, compiles and links the CUDA build (--config=cuda; its
# tests run where a GPU is present and skip cleanly elsewhere), and ends with
# the line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh >/dev/null || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

log=$(mktemp)
failed_steps=0

echo "== bazel test //... (CPU)"
bazel test //... --test_output=errors 2>&1 | tee "$log" | grep -E "^//|FAILED|ERROR|Executed" || true
status=${PIPESTATUS[0]}

passed=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "$log" || true)
failed=$(grep -cE "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)" "$log" || true)
skipped=$(grep -cE "^//[^ ]+ +SKIPPED" "$log" || true)  # CUDA-only targets in the CPU build
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $status (build error?)"
  grep -E "ERROR" "$log" | head -20
  failed_steps=$((failed_steps + 1))
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== bazel build --config=cuda //... (compile and link; GPU tests run only where a GPU is present)"
  if bazel build --config=cuda //... >"$log" 2>&1; then
    passed=$((passed + 1))
  else
    grep -E "ERROR|error:" "$log" | head -20
    failed_steps=$((failed_steps + 1))
  fi
else
  echo "== no CUDA toolkit: --config=cuda build skipped"
fi
rm -f "$log"

failed=$((failed + failed_steps))
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
