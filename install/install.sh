#!/usr/bin/env bash
# `bazel run //:install -- PREFIX`: lays down loom's headers, libloom.so,
# libloom.a, loom.pc and the CMake package under PREFIX (install/BUILD says
# what goes where). A relative PREFIX is taken from where bazel was run.
# Re-running replaces PREFIX/include/loom whole, so headers that left the
# API do not linger.
set -euo pipefail

version=0.1.0

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: bazel run //:install -- PREFIX" >&2
  exit 2
fi
prefix=$1
case "$prefix" in
  /*) ;;
  *) prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix" ;;
esac

# bazel run starts us in the runfiles tree of the main repository.
root=$PWD
[ -f "$root/install/headers.txt" ] || root="$0.runfiles/loom"
if [ ! -f "$root/install/headers.txt" ]; then
  echo "install: no runfiles next to $0; run it as bazel run //:install -- PREFIX" >&2
  exit 1
fi

# ---- headers: train/loom.h and every loom header it includes, transitively
declare -A known=() seen=()
while IFS= read -r h; do known[$h]=1; done <"$root/install/headers.txt"
queue=(train/loom.h)
seen[train/loom.h]=1
closure=()
while [ ${#queue[@]} -gt 0 ]; do
  h=${queue[0]}
  queue=("${queue[@]:1}")
  closure+=("$h")
  # "quoted" includes are loom's own; <angled> ones are loom's only when they name one of its headers.
  while IFS= read -r line; do
    inc=${line:1}
    if [ -z "${known[$inc]:-}" ]; then
      [ "${line:0:1}" = "<" ] && continue
      echo "install: $h includes \"$inc\", which is not a header of //:loom (add its library to the deps of //train:loom)" >&2
      exit 1
    fi
    if [ -z "${seen[$inc]:-}" ]; then
      seen[$inc]=1
      queue+=("$inc")
    fi
  done < <(sed -n -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/"\1/p' \
                  -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/<\1/p' "$root/$h")
done

rm -rf "$prefix/include/loom"
for h in "${closure[@]}"; do
  dest="$prefix/include/loom/$h"
  [ "$h" = train/loom.h ] && dest="$prefix/include/loom/loom.h"
  install -D -m 644 "$root/$h" "$dest"
done

# ---- libraries
install -D -m 755 "$root/install/libloom.so" "$prefix/lib/libloom.so"
install -D -m 644 "$root/install/libloom.a" "$prefix/lib/libloom.a"

# ---- pkg-config and CMake, from the system libraries libloom links. The
# public headers include protobuf's (train_config.pb.h), so protobuf is a
# public requirement; the rest only the static archive needs.
requires="" requires_private="" libs_private="" find_deps="" shared_deps="" static_deps=""
add_dep() {  # pkg-config name, CMake find_dependency argument, CMake target, public?
  if [ "$4" = public ]; then
    requires+=" $1"
    shared_deps+=";$3"
  else
    requires_private+=" $1"
  fi
  static_deps+=";$3"
  find_deps+="find_dependency($2)"$'\n'
}
while IFS= read -r flag; do
  case "$flag" in
    -lprotobuf) add_dep protobuf Protobuf protobuf::libprotobuf public ;;
    -lspdlog) add_dep spdlog spdlog spdlog::spdlog private ;;
    -lfmt) add_dep fmt fmt fmt::fmt private ;;
    -lz) add_dep zlib ZLIB ZLIB::ZLIB private ;;
    -lpthread | -pthread)
      libs_private+=" -lpthread"
      shared_deps+=";Threads::Threads"
      static_deps+=";Threads::Threads"
      find_deps+="find_dependency(Threads)"$'\n'
      ;;
    "") ;;
    # Others (--config=cuda: -L/usr/local/cuda/lib64, -lcudart, ...): libloom.so
    # records them itself; programs linking libloom.a need them verbatim.
    -l* | -L* | -Wl,*)
      libs_private+=" $flag"
      static_deps+=";$flag"
      ;;
    *)
      echo "install: libloom links with '$flag', which install/install.sh does not know how to pass on" >&2
      exit 1
      ;;
  esac
done <"$root/install/libraries_link_flags.txt"

subst() {  # template output
  local text
  text=$(<"$1")
  text=${text//@VERSION@/$version}
  text=${text//@PREFIX@/$prefix}
  text=${text//@REQUIRES@/${requires# }}
  text=${text//@REQUIRES_PRIVATE@/${requires_private# }}
  text=${text//@LIBS_PRIVATE@/${libs_private# }}
  text=${text//@FIND_DEPENDENCIES@/${find_deps%$'\n'}}
  text=${text//@SHARED_DEPS@/${shared_deps#;}}
  text=${text//@STATIC_DEPS@/${static_deps#;}}
  install -d "$(dirname "$2")"
  printf '%s\n' "$text" >"$2"
  chmod 644 "$2"
}
subst "$root/install/loom.pc.in" "$prefix/lib/pkgconfig/loom.pc"
subst "$root/install/loomConfig.cmake.in" "$prefix/lib/cmake/loom/loomConfig.cmake"
subst "$root/install/loomConfigVersion.cmake.in" "$prefix/lib/cmake/loom/loomConfigVersion.cmake"

echo "installed loom $version to $prefix: ${#closure[@]} headers, lib/libloom.so, lib/libloom.a, pkg-config loom, CMake loom::loom"
