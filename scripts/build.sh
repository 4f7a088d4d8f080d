#!/usr/bin/env bash
# Configures and builds promptcache into ${BUILD_DIR:-build} (Release, ccache when present): the
# library, the CLI, the tests, the benchmarks and the examples. Extra arguments go to CMake's
# configure step and come after these defaults, so e.g. -DPROMPTCACHE_BUILD_TESTS=OFF wins.
# BUILD_TARGETS="promptcache_cli" builds only those targets (scripts/demo.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
extra=()
if command -v ccache >/dev/null; then
  extra+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths under the checkout are hashed relative to it, so a clone elsewhere (CI) hits the cache.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
fi
# Stated each time: a build folder that scripts/demo.sh configured without the tests gets them
# back here.
everything=(-DPROMPTCACHE_BUILD_TESTS=ON -DPROMPTCACHE_BUILD_BENCHMARKS=ON
            -DPROMPTCACHE_BUILD_EXAMPLES=ON -DPROMPTCACHE_BUILD_SERVER=ON -DPROMPTCACHE_DEMO_ONLY=OFF)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "${extra[@]}" "${everything[@]}" \
  "$@" >/dev/null
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j"$(nproc)" "${targets[@]}"
