#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer, ASan and UBSan (its own
# Bazel output base, so the GCC build's outputs stay), and fuzzes each for
# SECONDS (default 60) starting from its committed corpus. New inputs go to
# a scratch folder; crashes are written to tests/fuzz/crashes/ and fail the
# run (copy one into tests/fuzz/corpus/<target>/ with the fix, so the
# normal suite replays it). Prints each target's executed input count.
#   bash tests/fuzz/run.sh [SECONDS] [TARGET ...]
# LOOM_FUZZ_RUNS=N runs N inputs per target instead of a time budget.
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(train_config_fuzz data_files_fuzz checkpoint_fuzz graph_fuzz)

bazel_fuzz() { bazel --output_base="${HOME:-/root}/.cache/loom-fuzz-bazel" "$@"; }
# --symlink_prefix=/: no bazel-* links in the source tree pointing at this
# output base (the main build would read them as packages).
if ! bazel_fuzz build --config=fuzz --symlink_prefix=/ --repo_env=CC="$PWD/tests/fuzz/clang.sh" \
    $(printf '//tests/fuzz:%s ' "${targets[@]}") 2>&1 | tail -3; then
  echo "fuzz build failed"; exit 1
fi
bin="$(bazel_fuzz info --config=fuzz --repo_env=CC="$PWD/tests/fuzz/clang.sh" bazel-bin 2>/dev/null)/tests/fuzz"
mkdir -p tests/fuzz/crashes
failed=0
for t in "${targets[@]}"; do
  scratch="$(mktemp -d)"
  log="$(mktemp)"
  # -rss_limit_mb: a reader that allocates what a header promises must refuse first.
  budget=(-max_total_time="$seconds")
  [ -n "${LOOM_FUZZ_RUNS:-}" ] && budget=(-runs="$LOOM_FUZZ_RUNS")
  start=$SECONDS
  "$bin/$t" "$scratch" "tests/fuzz/corpus/$t" "${budget[@]}" -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="tests/fuzz/crashes/$t-" -print_final_stats=1 >"$log" 2>&1
  status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  if [ "$status" -eq 0 ]; then
    echo "$t: ${runs:-?} inputs in $((SECONDS - start)) s, clean"
  else
    echo "$t: FAILED after ${runs:-?} inputs (exit $status):"
    grep -E "ERROR|SUMMARY|invariant|Test unit written" "$log" | head -8
    failed=$((failed + 1))
  fi
  rm -rf "$scratch" "$log"
done
[ "$failed" -eq 0 ]
