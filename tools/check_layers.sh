#!/usr/bin/env bash
# Checks the one-way layering of docs/design.md "Layers": the libraries of
# each layer (not its tests, not testonly helpers) depend only on the layers
# below it. Prints each offending path and fails if there is one.
set -uo pipefail
cd "$(dirname "$0")/.."

# layer: the packages it may use besides its own (space separated).
declare -A allowed=(
  [core]="core"
  [graph]="core graph ops"
  [ops]="core graph ops"
  [models]="core graph ops models"
  [runtime]="core graph ops runtime"
  [simulator]="core graph ops simulator"
  [search]="core graph ops search simulator"
  [train]="core graph ops runtime search simulator models train"
)

bad=0
for layer in "${!allowed[@]}"; do
  libs="attr(testonly, 0, kind(cc_library, //$layer/...))"
  for pkg in $(bazel query "deps($libs) except deps(//third_party/...)" --output package 2>/dev/null | grep -v '^@'); do
    top=${pkg%%/*}
    [ "$top" = third_party ] && continue
    if [[ " ${allowed[$layer]} " != *" $top "* ]]; then
      echo "layering: a library of $layer/ depends on $pkg/:"
      bazel query "somepath($libs, //$pkg:all)" 2>/dev/null | sed 's/^/  /'
      bad=1
    fi
  done
done
[ "$bad" -eq 0 ] && echo "layering: ok"
exit "$bad"
