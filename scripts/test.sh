#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite with CTest; then builds the library
# and the fast suite with AddressSanitizer + UBSan in build-asan and runs that once
# (scripts/sanitize.sh asan; docs/reliability.md, "Sanitizers").
#
#   PROMPTCACHE_SKIP_ASAN=1 scripts/test.sh    skip the sanitizer pass (quick local runs)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j2
if [[ ${PROMPTCACHE_SKIP_ASAN:-0} == 1 ]]; then
  echo "PROMPTCACHE_SKIP_ASAN=1: the ASan + UBSan pass (scripts/sanitize.sh asan) is skipped"
else
  BUILD_DIR=build-asan scripts/sanitize.sh asan
fi
