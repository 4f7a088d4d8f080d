#!/usr/bin/env bash
# Configures and builds promptcache into ${BUILD_DIR:-build} (Release, ccache when present).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
extra=()
command -v ccache >/dev/null && extra+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "${extra[@]}" "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
