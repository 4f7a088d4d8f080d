#!/usr/bin/env bash
# Installs dependencies (the tests' too), builds, and runs the whole test suite with CTest and the
# Python suite with pytest (tests/python); then the checks CI adds
# (docs/reliability.md, "Sanitizers"; docs/fuzzing.md, "In CI"), each in its own build folder:
#   1. ASan + UBSan: the library and the fast suite, the server's tests among them, in build-asan
#      (scripts/sanitize.sh asan)
#   2. TSan: the server's tests and the concurrency stress test, in build-tsan
#      (scripts/sanitize.sh tsan)
#   3. fuzzing: the LibTorch-free libFuzzer targets, 30 s each, in build-fuzz (scripts/fuzz.sh ci)
# The CI log shows each pass between lines "======== sanitizer pass (asan): ...",
# "======== sanitizer pass (tsan): ..." and "======== fuzz pass (ci): ...". Every pass runs even
# when one before it failed; the script fails when any did.
#
#   PROMPTCACHE_ASAN=0 scripts/test.sh    skip the ASan + UBSan pass
#   PROMPTCACHE_TSAN=0 scripts/test.sh    skip the TSan pass
#   PROMPTCACHE_FUZZ=0 scripts/test.sh    skip the fuzz pass
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --tests
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j2
# The Python suite (tests/python, docs/python.md) against the module in the build tree, with
# Debian's python3 (the one python3-torch is for, whatever python3 comes first on the PATH).
python=/usr/bin/python3
[ -x "$python" ] || python=python3
PYTHONPATH="${BUILD_DIR:-build}/python" PROMPTCACHE_CLI="${BUILD_DIR:-build}/promptcache" \
  "$python" -m pytest -q tests/python
failed=()
if [[ ${PROMPTCACHE_ASAN:-1} == 1 ]]; then
  BUILD_DIR=build-asan scripts/sanitize.sh asan || failed+=(asan)
else
  echo "the ASan + UBSan pass is skipped (PROMPTCACHE_ASAN=0; alone: scripts/sanitize.sh asan)"
fi
if [[ ${PROMPTCACHE_TSAN:-1} == 1 ]]; then
  BUILD_DIR=build-tsan scripts/sanitize.sh tsan || failed+=(tsan)
else
  echo "the TSan pass is skipped (PROMPTCACHE_TSAN=0; alone: scripts/sanitize.sh tsan)"
fi
if [[ ${PROMPTCACHE_FUZZ:-1} == 1 ]]; then
  BUILD_DIR=build-fuzz scripts/fuzz.sh ci || failed+=(fuzz)
else
  echo "the fuzz pass is skipped (PROMPTCACHE_FUZZ=0; alone: scripts/fuzz.sh ci)"
fi
if ((${#failed[@]})); then
  echo "scripts/test.sh: FAILED passes: ${failed[*]} (their logs are above)" >&2
  exit 1
fi
