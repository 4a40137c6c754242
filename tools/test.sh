#!/usr/bin/env bash
# Runs every test: installs what is missing, builds everything (CPU) and runs
# the whole suite, compiles and links the CUDA build (--config=cuda; its
# tests run where a GPU is present and skip cleanly elsewhere), runs the
# libraries' C++ tests again under ASan + UBSan (--config=asan; see the
# step for what it leaves out), and fuzzes each reader of outside input for
# a while (tests/fuzz/run.sh). Ends with the line
# "N passed, N failed, N skipped": the CPU suite's tests, plus one each for
# the CUDA build, the layering check, the outside consumers, the sanitizer
# suite and the fuzz run.
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh >/dev/null || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

log=$(mktemp)
passed=0 failed=0 skipped=0

# One whole step (a build, a second suite, the fuzzers): passes or fails.
# Each step's wall time is printed, so a CI log shows where the time goes.
step() {
  local name="$1" t0=$SECONDS
  shift
  echo "== $name"
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
  else
    grep -E "^//.*(FAILED|TIMEOUT)|ERROR|error:|FAILED|fuzz" "$log" | head -20
    failed=$((failed + 1))
  fi
  echo "   ($((SECONDS - t0)) s)"
}

echo "== bazel test //... (CPU)"
t0=$SECONDS
bazel test //... --test_output=errors 2>&1 | tee "$log" | grep -E "^//|FAILED|ERROR|Executed" || true
status=${PIPESTATUS[0]}
passed=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "$log" || true)
failed=$(grep -cE "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)" "$log" || true)
skipped=$(grep -cE "^//[^ ]+ +SKIPPED" "$log" || true)  # CUDA-only targets in the CPU build
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $status (build error?)"
  grep -E "ERROR" "$log" | head -20
  failed=1
fi
echo "   ($((SECONDS - t0)) s)"

if [ -x /usr/local/cuda/bin/nvcc ]; then
  # Compiles every CUDA kernel and links them into loom; the CUDA tests then
  # run their checks that need no GPU (registrations, coverage of the
  # catalogue, the index and GEMM mappings) and skip the rest. (Relinking
  # every test binary with CUDA proved nothing more and took minutes;
  # tools/gpu_check.sh builds what it runs on a GPU.)
  # --config=cuda_compile_check: sm_90 code only (no GPU runs it here).
  cuda_targets="//core/cuda/... //ops/cuda/... //runtime/comm/... //tools:loom"
  cuda_config=--config=cuda_compile_check
  step "bazel build $cuda_config $cuda_targets + bazel test $cuda_config //ops/cuda:all //runtime/comm:all //tests:parallel_cuda_test (GPU checks run only where a GPU is present)" \
    bash -c "bazel build $cuda_config $cuda_targets && bazel test $cuda_config //ops/cuda:all //runtime/comm:all //tests:parallel_cuda_test"
else
  echo "== no CUDA toolkit: --config=cuda build skipped"
fi

step "tools/check_layers.sh (libraries depend only on the layers below theirs)" bash tools/check_layers.sh

step "tests/consumers/run.sh (loom installed, then built and run by CMake, pkg-config and Bazel projects)" \
  bash tests/consumers/run.sh

# The sanitizers where memory is handled by hand: the tensors, the IR and
# its passes, every kernel, the executors and task runtime, the readers of
# data, configs and checkpoints, and the op tests of //tests. Left out
# (every package's tests took 50 of CI's 90 minutes under them): the shell
# tests (end-to-end runs of the loom binary), the zoo-wide tests tagged
# heavy, and the models, simulator, search and training loops, which hold
# no buffers of their own and run on the libraries checked here.
asan_targets="//core/... //graph/... //ops/... //runtime/... //train/data/... //train/config/... //train/checkpoint/..."
asan_targets+=" //tests:fusion_ops_test //tests:optimizer_test //tests:parallel_async_test"
step "bazel test --config=asan $asan_targets (AddressSanitizer + UndefinedBehaviorSanitizer; C++ tests, those tagged heavy left out)" \
  bazel test --config=asan $asan_targets --test_lang_filters=-sh --test_tag_filters=-heavy --build_tests_only \
  --test_output=errors

step "tests/fuzz/run.sh 20 (libFuzzer, 20 s per target from the committed corpus)" bash tests/fuzz/run.sh 20
grep -E "inputs in" "$log" || true

rm -f "$log"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
