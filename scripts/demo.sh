#!/usr/bin/env bash
# Installs what building and running need (not what the tests add), builds the `promptcache` CLI
# alone (no tests, benchmarks, examples or server), and runs `promptcache demo`: a story on the real
# stories260K model (models/stories260K) answered with and without the prompt cache, then TTFT
# on a synthetic bench-small model in bf16 (docs/demo.md). Extra arguments go to
# `promptcache demo` (e.g. --model DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
build=${BUILD_DIR:-build}
mkdir -p "$build"
# apt's hundreds of lines go to a log (printed when it fails); the packages it installs are named.
deps_log=$build/demo-deps.log
echo "demo.sh: checking the packages building needs (a fresh machine installs about 180: a" \
  "minute or two; apt's messages go to $deps_log) ..."
if ! scripts/install-deps.sh 2>&1 | tee "$deps_log" \
  | { grep --line-buffered '^install-deps:' || true; } | sed -u 's/^/  /'; then
  cat "$deps_log" >&2
  echo "demo.sh: installing the dependencies failed (apt's messages are above and in $deps_log)" >&2
  exit 1
fi
deps_done=$(date +%s)
echo "demo.sh: dependencies took $((deps_done - start)) s; building the promptcache CLI (first" \
  "time: a few minutes; progress below) ..."
# Only the build's progress lines are shown; the compiler's messages go to a log, printed when
# the build fails.
log=$build/demo-build.log
# No server either: the demo does not serve (scripts/build.sh builds it, and `serve` says so).
# PROMPTCACHE_DEMO_ONLY: the library units and the one CLI command the demo runs, about half the
# compile time of the whole CLI (docs/demo.md); scripts/build.sh later builds the rest here.
# A new folder is built with Ninja when it is there (scripts/install-deps.sh installs it): it
# compiles the CLI's units beside the library's, where make waits for the whole library first.
# A folder made before keeps its generator, and scripts/build.sh reuses whichever it finds.
generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
if ! BUILD_TARGETS=promptcache_cli scripts/build.sh "${generator[@]}" -DPROMPTCACHE_DEMO_ONLY=ON \
  2>"$log" | { grep --line-buffered -E '^\[ *[0-9]+%\]|^\[[0-9]+/[0-9]+\]' || true; } \
  | sed -u 's/^/  /'; then
  cat "$log" >&2
  echo "demo.sh: the build failed (its messages are above and in $log)" >&2
  exit 1
fi
echo "demo.sh: the build took $(($(date +%s) - deps_done)) s; dependencies and build $(($(date +%s) - start)) s"
echo
exec "$build/promptcache" demo "$@"
