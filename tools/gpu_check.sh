#!/usr/bin/env bash
# The GPU check of the CUDA backend, in two halves (see docs/cuda.md):
#
#   tools/gpu_check.sh prepare   here (Bazel, no GPU): builds the CUDA test
#                                binaries and packs them, with the shared
#                                libraries they need, into .gpu/ (git-ignored).
#   tools/gpu_check.sh run       on the GPU machine (no Bazel, no Eigen/spdlog/
#                                Catch2, has CUDA 13): runs them against the GPU
#                                and writes logs and summary.txt to $OUT.
#
# .gpu/ layout:
#   bin/     the test binaries (portable x86-64-v2, loom's libraries linked in)
#   lib/     the other shared libraries they load (spdlog, fmt)
#   compat/  libstdc++ and libgcc_s, used only if the machine's are too old
#   glibc/   this machine's glibc and loader, used only if the machine's glibc
#            is too old to load the binaries
#   cuda/    libcudart, used only if the machine has no libcudart.so.13
#            (cuBLAS, cuDNN and NCCL are not packed: each is hundreds of MiB;
#            the machine's own, or PyTorch's nvidia-* wheels, are used)
#   tools/   the loom binary (training runs and benchmarks on the GPU)
#   data/    the Jargon File, for the text models of tools/gpu_configs
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$ROOT/.gpu"
# Every op family's harness cases run in //ops:all_ops_test (one binary keeps
# the pack small: each binary carries every kernel's device code).
TESTS=(//ops/cuda:cuda_kernels_test //ops:all_ops_test //tests:optimizer_test //runtime/comm:nccl_communicator_test
  //tests:parallel_cuda_test //runtime:fold_activations_test)
TOOLS=(//tools:loom)
read -r -a EXTRA_TESTS <<<"${LOOM_GPU_EXTRA_TESTS:-}"  # more cc_test labels, space-separated
TESTS+=("${EXTRA_TESTS[@]}")
MAX_PACK_MIB=60
BUILD_FLAGS=(--config=cuda --config=portable --dynamic_mode=off)

usage() {
  sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
}

say() { echo "gpu_check: $*"; }
die() { echo "gpu_check: error: $*" >&2; exit 1; }

# ---------------------------------------------------------------- prepare --

# Where a resolved library goes in the pack; "skip" for the driver and cuBLAS.
classify() {
  case "$(basename "$1")" in
    libcuda.so* | libnvidia*) echo skip ;;  # the driver: always the machine's own
    libcublas.so* | libcublasLt.so* | libcudnn*.so* | libnccl.so*) echo skip ;;  # too big; the machine has them
    libcudart.so*) echo cuda ;;
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | ld-linux*) echo glibc ;;
    libstdc++.so.* | libgcc_s.so.*) echo compat ;;
    *) echo lib ;;
  esac
}

prepare() {
  command -v bazel >/dev/null || die "prepare needs Bazel (run it on the build machine)"
  cd "$ROOT"
  say "building ${TESTS[*]} with ${BUILD_FLAGS[*]}"
  bazel build "${BUILD_FLAGS[@]}" "${TESTS[@]}" "${TOOLS[@]}"

  rm -rf "$PACK"
  mkdir -p "$PACK"/{bin,lib,compat,glibc,cuda,tools,data}
  cp /usr/share/doc/jargon-text/jargon.txt.gz "$PACK/data/" || die "no Jargon File (tools/setup.sh installs jargon-text)"
  local label bin
  for label in "${TESTS[@]}" "${TOOLS[@]}"; do
    bin="bazel-bin/$(echo "${label#//}" | tr ':' '/')"
    [ -x "$bin" ] || die "no binary at $bin for $label"
    # Another build in this workspace may have replaced bazel-bin since ours:
    # a mostly-static binary does not load Bazel's per-target libraries.
    local deps
    deps="$(ldd "$bin")"
    if grep -q '_solib' <<<"$deps"; then
      die "$bin links Bazel's _solib libraries (a concurrent build replaced it?); run prepare again"
    fi
    local dest_dir="$PACK/bin"
    [[ " ${TOOLS[*]} " == *" $label "* ]] && dest_dir="$PACK/tools"
    cp "$bin" "$dest_dir/"
    chmod u+w "$dest_dir/$(basename "$bin")"
  done

  # The shared libraries every binary resolves here, sorted into the pack.
  local line path dest
  for bin in "$PACK"/bin/* "$PACK"/tools/*; do
    while read -r line; do
      path="$(echo "$line" | sed -n 's/.*=> \(\/[^ ]*\) (0x.*/\1/p; s/^\(\/[^ ]*\) (0x.*/\1/p')"
      [ -n "$path" ] || continue
      dest="$(classify "$path")"
      [ "$dest" = skip ] && continue
      cp -L "$path" "$PACK/$dest/$(basename "$path")"
    done < <(ldd "$bin")
    if ldd "$bin" >"$PACK/ldd.tmp" && grep -q 'not found' "$PACK/ldd.tmp"; then
      grep 'not found' "$PACK/ldd.tmp" >&2
      die "$bin has unresolved libraries here"
    fi
    rm -f "$PACK/ldd.tmp"
  done

  # The binaries must resolve their non-system libraries from the pack.
  for bin in "$PACK"/bin/* "$PACK"/tools/*; do
    local resolved
    resolved="$(LD_LIBRARY_PATH="$PACK/lib" ldd "$bin")"
    for lib in "$PACK"/lib/*; do
      # Only the libraries this binary loads (not every binary loads every one).
      grep -qF "$(basename "$lib") =>" <<<"$resolved" || continue
      grep -qF "=> $lib " <<<"$resolved" || die "$(basename "$bin") does not resolve $(basename "$lib") from .gpu/lib"
    done
  done
  local packed=""
  for lib in "$PACK"/lib/*; do packed+="$(basename "$lib") "; done
  say "ldd: the binaries resolve ${packed}from .gpu/lib"

  # The pack's own loader and glibc must be able to start every binary
  # (the fallback for a GPU machine with an older glibc).
  local cuda_here="/usr/local/cuda/lib64:/usr/local/cuda-13.0/lib"
  for bin in "$PACK"/bin/* "$PACK"/tools/*; do
    "$PACK/glibc/ld-linux-x86-64.so.2" --library-path "$PACK/glibc:$PACK/compat:$PACK/lib:$cuda_here" "$bin" \
      --help >/dev/null || die "$(basename "$bin") does not start through the packed loader"
  done

  # Smoke run here: no GPU, so the CUDA checks skip; everything else runs.
  for bin in "$PACK"/bin/*; do
    env -u LOOM_REQUIRE_CUDA LD_LIBRARY_PATH="$cuda_here:$PACK/lib" "$bin" >/dev/null 2>&1 || die "$(basename "$bin") fails here (run it for details)"
  done
  say "smoke run without GPU: all binaries pass (CUDA checks skipped)"

  # Each binary carries the device code of every kernel (three targets each):
  # xz takes a binary to a fifth, which keeps the pack inside the carry limit.
  # `run` unpacks them (xz, or Python's lzma where xz is missing).
  for bin in "$PACK"/bin/* "$PACK"/tools/*; do
    xz -T2 -6 "$bin" || die "xz failed on $bin"
  done

  {
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(getconf GNU_LIBC_VERSION)"
    echo "flags: ${BUILD_FLAGS[*]}"
    echo "tests: ${TESTS[*]}"
    echo "tools: ${TOOLS[*]}"
    (cd "$PACK" && find . -type f ! -name MANIFEST | sort | xargs sha256sum)
  } >"$PACK/MANIFEST"

  local mib
  mib=$(( $(du -sb "$PACK" | cut -f1) / 1048576 ))
  du -sh "$PACK"/* | sed 's/^/  /'
  [ "$mib" -le "$MAX_PACK_MIB" ] || die ".gpu is ${mib} MiB, over the ${MAX_PACK_MIB} MiB carry budget"
  say "packed .gpu (${mib} MiB). On the GPU machine: tools/gpu_check.sh run   (carry: .gpu)"
}

# -------------------------------------------------------------------- run --

# Directories holding the CUDA 13 runtime libraries on this machine.
find_cuda_dirs() {
  local dirs=() d f
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
           /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/local/cuda-13.0/lib; do
    for f in libcublas.so.13 libcudart.so.13 libcudnn.so.9 libnccl.so.2; do
      if [ -e "$d/$f" ]; then dirs+=("$d"); break; fi
    done
  done
  # Each library the toolkit directories lack: ldconfig's cache, then pip's
  # nvidia-* wheels (PyTorch's).
  local lib site
  site="$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)"
  for lib in libcublas.so.13 libcudnn.so.9 libnccl.so.2; do
    local have=0
    for d in "${dirs[@]}"; do [ -e "$d/$lib" ] && have=1; done
    [ "$have" -eq 1 ] && continue
    f="$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF}' | head -1 || true)"
    if [ -n "$f" ]; then dirs+=("$(dirname "$f")"); continue; fi
    for d in $site; do
      while read -r f; do dirs+=("$(dirname "$f")"); done < <(find "$d/nvidia" -name "$lib" 2>/dev/null | head -1 || true)
    done
  done
  [ ${#dirs[@]} -gt 0 ] || return 0
  # One entry per real directory (/usr/local/cuda is usually a link).
  for d in "${dirs[@]}"; do readlink -f "$d"; done | awk 'NF && !seen[$0]++' | paste -sd:
}

run() {
  local skip_sanitizer=0
  for arg in "$@"; do
    case "$arg" in
      --no-sanitizer) skip_sanitizer=1 ;;
      *) die "unknown option $arg" ;;
    esac
  done
  cd "$ROOT"
  OUT="${OUT:-$PACK/out}"
  mkdir -p "$OUT"
  [ -f "$PACK/MANIFEST" ] || die "no .gpu/MANIFEST: run 'tools/gpu_check.sh prepare' on the build machine and carry .gpu"
  [ "$(uname -m)" = x86_64 ] || die "the pack is x86_64; this machine is $(uname -m)"
  # The binaries travel xz-compressed (prepare); a read-only pack is first
  # copied to a scratch folder.
  if [ ! -w "$PACK/bin" ]; then
    local scratch
    scratch="$(mktemp -d)"
    cp -r "$PACK/." "$scratch/"
    PACK="$scratch"
  fi
  local packed_bin
  for packed_bin in "$PACK"/bin/*.xz "$PACK"/tools/*.xz; do
    [ -e "$packed_bin" ] || continue
    if command -v xz >/dev/null; then
      xz -dc "$packed_bin" >"${packed_bin%.xz}"
    else
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$packed_bin" "${packed_bin%.xz}"
    fi
    chmod +x "${packed_bin%.xz}"
    rm -f "$packed_bin"
  done

  local env_log="$OUT/env.txt"
  {
    echo "== pack"; cat "$PACK/MANIFEST"
    echo "== machine"; uname -a; nproc; getconf GNU_LIBC_VERSION
    echo "== nvidia-smi"; nvidia-smi 2>&1 || echo "(nvidia-smi failed)"
    echo "== CUDA toolkit"; head -20 /usr/local/cuda/version.json 2>/dev/null || echo "(no /usr/local/cuda/version.json)"
  } >"$env_log" 2>&1

  local cuda_dirs
  cuda_dirs="$(find_cuda_dirs)"
  echo "== CUDA library dirs: ${cuda_dirs:-none found}" >>"$env_log"
  local driver_dir
  driver_dir="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF}' | head -1 | xargs -r dirname || true)"
  echo "== driver (libcuda.so.1) dir: ${driver_dir:-from the default search path}" >>"$env_log"

  # Loading tiers, tried in order until the binaries start:
  #  native: the machine's libc and libstdc++, the pack's spdlog/fmt;
  #  compat: + the pack's libstdc++/libgcc_s (the machine's are older);
  #  glibc:  the pack's loader and glibc (the machine's glibc is older).
  # The machine's CUDA libraries always come first; the pack's libcudart last.
  local native="${cuda_dirs:+$cuda_dirs:}$PACK/lib:$PACK/cuda"
  local compat="${cuda_dirs:+$cuda_dirs:}$PACK/lib:$PACK/compat:$PACK/cuda"
  local glibc="$PACK/glibc:$PACK/compat:$PACK/lib:${cuda_dirs:+$cuda_dirs:}${driver_dir:+$driver_dir:}$PACK/cuda"
  local tier="${LOOM_GPU_TIER:-}" probe="$PACK/bin/cuda_kernels_test"
  [ -x "$probe" ] || die "no $probe in the pack"
  if [ -n "$tier" ]; then
    case "$tier" in native | compat | glibc) ;; *) die "LOOM_GPU_TIER must be native, compat or glibc" ;; esac
  elif LD_LIBRARY_PATH="$native" "$probe" --help >/dev/null 2>>"$env_log"; then
    tier=native
  elif LD_LIBRARY_PATH="$compat" "$probe" --help >/dev/null 2>>"$env_log"; then
    tier=compat
  elif "$PACK/glibc/ld-linux-x86-64.so.2" --library-path "$glibc" "$probe" --help >/dev/null 2>>"$env_log"; then
    tier=glibc
  else
    die "the binaries do not start on this machine in any loading tier (see $env_log)"
  fi
  echo "== loading tier: $tier" >>"$env_log"
  say "loading tier: $tier; CUDA libraries from ${cuda_dirs:-the default search path}"

  # Runs a pack binary with the chosen tier, at most $limit s (default 300;
  # a hung kernel must not eat the device budget): launch BIN ARGS...
  launch() {
    local bin="$1"
    shift
    case "$tier" in
      native) LD_LIBRARY_PATH="$native" timeout "${limit:-300}" "$bin" "$@" ;;
      compat) LD_LIBRARY_PATH="$compat" timeout "${limit:-300}" "$bin" "$@" ;;
      glibc) timeout "${limit:-300}" "$PACK/glibc/ld-linux-x86-64.so.2" --library-path "$glibc" "$bin" "$@" ;;
    esac
  }
  # The whole run stays inside the session's device time: phases that would
  # start past the budget are skipped (and say so).
  local budget="${LOOM_GPU_BUDGET_S:-420}" started="$SECONDS"
  time_left() { echo $((budget - (SECONDS - started))); }
  {
    echo "== libraries the CUDA test loads (tier $tier)"
    case "$tier" in
      glibc) "$PACK/glibc/ld-linux-x86-64.so.2" --library-path "$glibc" --list "$probe" ;;
      *) LD_LIBRARY_PATH="$([ "$tier" = native ] && echo "$native" || echo "$compat")" ldd "$probe" ;;
    esac
  } >>"$env_log" 2>&1 || true

  export LOOM_REQUIRE_CUDA=1  # a test that finds no GPU here fails instead of skipping
  local passed=0 failed=0 summary="$OUT/summary.txt" name rc
  : >"$summary"
  for bin in "$PACK"/bin/*; do
    name="$(basename "$bin")"
    set +e
    launch "$bin" --durations yes >"$OUT/$name.log" 2>&1 </dev/null
    rc=$?
    set -e
    local totals
    totals="$(grep -E '^(All tests passed|test cases:)' "$OUT/$name.log" | tail -1 || true)"
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1))
      echo "PASS $name: $totals" | tee -a "$summary"
    else
      failed=$((failed + 1))
      echo "FAIL $name (exit $rc): ${totals:-no Catch2 summary} (see $name.log)" | tee -a "$summary"
    fi
  done

  # Throughput of the kernels (informational; never fails the check).
  set +e
  launch "$PACK/bin/cuda_kernels_test" "[bench]" >"$OUT/bench.log" 2>&1 </dev/null
  set -e
  grep -E 'TFLOP/s|GB/s' "$OUT/bench.log" | sed 's/^/bench: /' | tee -a "$summary" || true

  # Out-of-bounds and race checks of the kernels, where the toolkit has them.
  # API errors are not reported: the test provokes cudaMalloc failures on
  # purpose (out-of-memory handling); memcheck still flags every bad access.
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
  if [ "$skip_sanitizer" -eq 0 ] && [ -n "$sanitizer" ] && [ -x "$PACK/bin/cuda_kernels_test" ]; then
    local target=("$PACK/bin/cuda_kernels_test")
    if [ "$tier" = glibc ]; then
      target=("$PACK/glibc/ld-linux-x86-64.so.2" --library-path "$glibc" "$PACK/bin/cuda_kernels_test")
    fi
    set +e
    LD_LIBRARY_PATH="$([ "$tier" = compat ] && echo "$compat" || echo "$native")" \
      timeout 150 "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 86 "${target[@]}" \
        >"$OUT/memcheck.log" 2>&1 </dev/null
    rc=$?
    set -e
    case "$rc" in
      0) passed=$((passed + 1)); echo "PASS memcheck cuda_kernels_test" | tee -a "$summary" ;;
      124) echo "SKIP memcheck cuda_kernels_test: over 150 s (inconclusive)" | tee -a "$summary" ;;
      *) failed=$((failed + 1)); echo "FAIL memcheck cuda_kernels_test (exit $rc, see memcheck.log)" | tee -a "$summary" ;;
    esac
  elif [ -z "$sanitizer" ]; then
    echo "SKIP memcheck: no compute-sanitizer on this machine" | tee -a "$summary"
  else
    echo "SKIP memcheck: --no-sanitizer" | tee -a "$summary"
  fi

  # One short fused training run per model family on cuda:0, then the CNN's
  # run resumed on the CPU: checkpoints are device independent.
  local cfg runs="$OUT/runs" configs="$OUT/configs"
  mkdir -p "$runs" "$configs"
  for cfg in tools/gpu_configs/*.pbtxt; do
    name="$(basename "$cfg" .pbtxt)"
    if [ "$(time_left)" -lt 60 ]; then
      echo "SKIP train $name: device budget spent" | tee -a "$summary"
      continue
    fi
    sed "s|@DATA@|$PACK/data|g" "$cfg" >"$configs/$name.pbtxt"
    set +e
    limit=90 launch "$PACK/tools/loom" train -v --config "$configs/$name.pbtxt" --device cuda --max-steps 20 \
      --out "$runs/$name" >"$OUT/train_$name.log" 2>&1 </dev/null
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1))
      echo "PASS train $name on cuda: $(grep -iE 'loss' "$OUT/train_$name.log" | tail -1 | cut -c1-150)" | tee -a "$summary"
    else
      failed=$((failed + 1))
      echo "FAIL train $name on cuda (exit $rc): $(grep -iE 'error|fail' "$OUT/train_$name.log" | head -1 | cut -c1-200)" |
        tee -a "$summary"
    fi
  done
  # The cuDNN algorithms and math types the runs chose (-v logs each new
  # choice): FMA for f32 (no TF32), deterministic ones only.
  grep -h "cuDNN" "$OUT"/train_*.log 2>/dev/null | sed 's/^.*cuDNN/cuDNN/' | sort -u | head -12 |
    sed 's/^/chosen: /' | tee -a "$summary" || true
  # The task runtime on two streams of the GPU (data parallelism), the same
  # 20 steps as the CNN's run on one device above.
  if [ -f "$configs/cnn.pbtxt" ] && [ "$(time_left)" -ge 60 ]; then
    set +e
    limit=90 launch "$PACK/tools/loom" train --config "$configs/cnn.pbtxt" --devices cuda:0x2 --strategy dp \
      --max-steps 20 --out "$runs/cnn_dp_streams" >"$OUT/train_cnn_dp_streams.log" 2>&1 </dev/null
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1))
      echo "PASS train cnn on cuda:0x2 dp: $(grep -iE 'loss' "$OUT/train_cnn_dp_streams.log" | tail -1 | cut -c1-150)" |
        tee -a "$summary"
    else
      failed=$((failed + 1))
      echo "FAIL train cnn on cuda:0x2 dp (exit $rc): $(grep -iE 'error|fail' "$OUT/train_cnn_dp_streams.log" | head -1 | cut -c1-200)" |
        tee -a "$summary"
    fi
  fi
  # Its speed (informational): one device against dp and OWT on two streams.
  if [ -f "$configs/cnn.pbtxt" ] && [ "$(time_left)" -ge 90 ]; then
    set +e
    limit=60 launch "$PACK/tools/loom" bench parallel --config "$configs/cnn.pbtxt" --devices cuda:0x2 \
      --strategies dp,owt --reps 10 >"$OUT/bench_parallel_streams.log" 2>&1 </dev/null
    set -e
    grep -E '^(1 device|dp|owt)' "$OUT/bench_parallel_streams.log" | sed 's/^/bench parallel: /' | tee -a "$summary" || true
  fi
  if [ -d "$runs/cnn" ] && [ "$(time_left)" -ge 30 ]; then
    set +e
    limit=90 launch "$PACK/tools/loom" train --resume "$runs/cnn" --device cpu --max-steps 25 \
      >"$OUT/resume_cnn_on_cpu.log" 2>&1 </dev/null
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1)); echo "PASS resume cnn (trained on cuda) on the cpu" | tee -a "$summary"
    else
      failed=$((failed + 1)); echo "FAIL resume cnn on the cpu (exit $rc, see resume_cnn_on_cpu.log)" | tee -a "$summary"
    fi
  fi

  # The zoo benchmark (informational; bench/gpu_zoo_fusion.sh writes its table).
  if [ -f bench/gpu_zoo_fusion.sh ] && [ "$(time_left)" -ge 60 ]; then
    local wrapper="$OUT/loom"
    case "$tier" in
      glibc) printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' "$PACK/glibc/ld-linux-x86-64.so.2" "$glibc" \
               "$PACK/tools/loom" >"$wrapper" ;;
      *) printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$([ "$tier" = native ] && echo "$native" || echo "$compat")" \
           "$PACK/tools/loom" >"$wrapper" ;;
    esac
    chmod +x "$wrapper"
    set +e
    bash bench/gpu_zoo_fusion.sh "$wrapper" "$OUT/bench" --budget-s "$(( $(time_left) - 20 ))" >"$OUT/gpu_zoo_fusion.log" 2>&1
    set -e
    [ -f "$OUT/bench/gpu_zoo_fusion.md" ] && sed 's/^/bench: /' "$OUT/bench/gpu_zoo_fusion.md" | tee -a "$summary"
  else
    echo "SKIP zoo benchmark: $([ -f bench/gpu_zoo_fusion.sh ] && echo 'device budget spent' || echo 'no bench/gpu_zoo_fusion.sh')" |
      tee -a "$summary"
  fi

  echo "$passed passed, $failed failed" | tee -a "$summary"
  [ "$failed" -eq 0 ]
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
