#!/usr/bin/env bash
# `loom bench kernels`: a row and its roofs, --profile's split of a row by
# node, --json, and the errors (no row matches --only, --reps below 1).
set -uo pipefail
loom="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL $1"; failures=$((failures + 1)); }

run=(bench kernels --only "matmul 256" --reps 1 --threads 1)
out=$("$loom" "${run[@]}" --profile --json "$work/k.json" 2>&1) || fail "bench kernels --profile exited $?"
for want in "roof: Eigen sgemm" "bandwidth roof" "matmul 256x256x256" "  MatMul "; do
  grep -qF -- "$want" <<<"$out" || fail "expected '$want' in: $out"
done
# The node lines follow their row: the row first, then its one MatMul node.
[ "$(grep -n "matmul 256x256x256" <<<"$out" | cut -d: -f1)" -lt "$(grep -n "  MatMul " <<<"$out" | cut -d: -f1)" ] ||
  fail "the MatMul node line does not follow its row"
grep -qF '"name": "matmul 256x256x256"' "$work/k.json" || fail "--json lacks the row"
plain=$("$loom" "${run[@]}" 2>&1)
grep -qF "  MatMul " <<<"$plain" && fail "node lines without --profile"

out=$("$loom" bench kernels --only "no such kernel" 2>&1) && fail "--only matching nothing exited 0"
grep -qF "no kernel's name contains it" <<<"$out" || fail "unexpected error: $out"
out=$("$loom" bench kernels --reps 0 2>&1) && fail "--reps 0 exited 0"
grep -qF -- "--reps must be at least 1" <<<"$out" || fail "unexpected error: $out"
out=$("$loom" bench kernels --profile=yes 2>&1) && fail "--profile=yes exited 0"
grep -qF "takes no value" <<<"$out" || fail "unexpected error: $out"

echo "$failures failed"
[ "$failures" -eq 0 ]
