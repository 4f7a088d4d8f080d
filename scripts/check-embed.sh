#!/usr/bin/env bash
# Installs the built library into a temporary prefix and builds examples/embed against it with
# find_package(promptcache), then runs it on a synthetic model. Usage: check-embed.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Installs what the build holds; it does not build. (It used to build the library and CLI first:
# run by CTest after a source edit, that relinked the CLI while other tests were running it.)
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log"
  echo "check-embed: cannot install from $build; build the project first (scripts/build.sh)" >&2
  exit 1
}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S examples/embed -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" -j"$(nproc)" >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; exit 1; }
"$tmp/prefix/bin/promptcache" make-model --shape tiny --out "$tmp/model" >/dev/null 2>&1
"$tmp/build/embed" "$tmp/model"
echo "embed example: built against the installed package and ran"
