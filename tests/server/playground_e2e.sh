#!/usr/bin/env bash
# End-to-end test of the playground page: `promptcache serve` on a tiny synthetic model, driven
# by headless Chromium through playwright-core (executablePath set: no browser download).
#
#   playground_e2e.sh PROMPTCACHE_BINARY NPM_PREFIX SCREENSHOT
#
# Exits 77 (CTest: skipped) with a message when node, npm or chromium is missing, or
# playwright-core cannot be installed under NPM_PREFIX (no registry).
set -uo pipefail
pc=$1 prefix=$2 screenshot=$3
here=$(cd "$(dirname "$0")" && pwd)
version=1.65.2

command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "SKIPPED: node and npm are needed for the playground test (Debian: nodejs npm)"; exit 77; }
chrome=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chrome" ] || { echo "SKIPPED: chromium is needed for the playground test (Debian: chromium)"; exit 77; }
if [ ! -f "$prefix/node_modules/playwright-core/package.json" ]; then
  mkdir -p "$prefix"
  echo "installing playwright-core@$version into $prefix"
  if ! timeout 600 npm install --no-audit --no-fund --prefer-offline --fetch-retries 1 \
      --prefix "$prefix" "playwright-core@$version" >"$prefix/npm-install.log" 2>&1; then
    tail -5 "$prefix/npm-install.log"
    echo "SKIPPED: npm install playwright-core failed (is the npm registry reachable?)"
    exit 77
  fi
fi

work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
"$pc" make-model --shape tiny --seed 0 --out "$work/tiny" >/dev/null 2>"$work/make.err" ||
  { echo "FAIL: make-model: $(cat "$work/make.err")"; exit 1; }
# Starts `serve` with the given extra flags on a free port; sets $server and $port.
start_server() {
  "$pc" serve --model "$work/tiny" --port 0 "$@" 2>"$work/serve.log" &
  server=$!
  port=""
  for _ in $(seq 600); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$work/serve.log")
    [ -n "$port" ] && return 0
    kill -0 "$server" 2>/dev/null || { echo "FAIL: the server exited:"; cat "$work/serve.log"; exit 1; }
    sleep 0.1
  done
  echo "FAIL: the server did not start:"; cat "$work/serve.log"; exit 1
}
stop_server() { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=""; }

# Without a key: the page works as it is.
start_server
NODE_PATH="$prefix/node_modules" node "$here/playground_e2e.js" "http://127.0.0.1:$port/" \
  "$chrome" "$screenshot" || exit 1
stop_server
# With a key (from a file): the page asks for it, keeps it in the tab and sends it in a header.
key="e2e-$RANDOM$RANDOM-key"
printf '%s\n' "$key" >"$work/key"
start_server --api-key-file "$work/key"
NODE_PATH="$prefix/node_modules" node "$here/playground_e2e.js" "http://127.0.0.1:$port/" \
  "$chrome" "${screenshot%.png}-key.png" "$key"
