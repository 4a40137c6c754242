#!/usr/bin/env bash
# The configs that tools/gpu_check.sh trains on the GPU (tools/gpu_configs)
# stay valid: each parses, builds its fused model and trains one step on the
# CPU, so a device session never spends its minutes on a stale config.
set -uo pipefail
loom="$1"
configs="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
for cfg in "$configs"/*.pbtxt; do
  name="$(basename "$cfg" .pbtxt)"
  sed "s|@DATA@|/usr/share/doc/jargon-text|g" "$cfg" >"$work/$name.pbtxt"
  if "$loom" train --config "$work/$name.pbtxt" --device cpu --max-steps 1 --out "$work/run_$name" >"$work/$name.log" 2>&1; then
    echo "ok   $name"
  else
    echo "FAIL $name:"; tail -5 "$work/$name.log"; failures=$((failures + 1))
  fi
done
[ "$failures" -eq 0 ]
