#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite with CTest; then builds the library
# and the fast suite with AddressSanitizer + UBSan in build-asan and runs that once
# (scripts/sanitize.sh asan; docs/reliability.md, "Sanitizers"). The CI log shows that pass
# between lines "======== sanitizer pass (asan): ...".
#
#   PROMPTCACHE_ASAN=0 scripts/test.sh    skip the ASan + UBSan pass (the normal suite only)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j2
if [[ ${PROMPTCACHE_ASAN:-1} == 1 ]]; then
  BUILD_DIR=build-asan scripts/sanitize.sh asan
else
  echo "the ASan + UBSan pass is skipped (PROMPTCACHE_ASAN=0; alone: scripts/sanitize.sh asan)"
fi
