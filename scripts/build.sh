#!/usr/bin/env bash
# Configures and builds promptcache into ${BUILD_DIR:-build} (Release, ccache when present).
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
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "${extra[@]}" "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
