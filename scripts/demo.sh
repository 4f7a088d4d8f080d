#!/usr/bin/env bash
# Installs dependencies, builds, and runs the demo: a schema is compiled once, then one prompt is
# answered with and without the prompt cache, printing both TTFTs. Without --model it makes a
# synthetic model first. Extra arguments go to `promptcache demo` (e.g. --model DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh >/dev/null
exec "${BUILD_DIR:-build}/promptcache" demo "$@"
