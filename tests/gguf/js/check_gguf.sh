#!/usr/bin/env bash
# The GGUF cross-check against an independent reader: `promptcache convert` writes tiny models of
# each family and stories260K in f32, f16, bf16 and q8_0, and @huggingface/gguf (npm, MIT) parses
# every file and must agree with the folder's config.json and convert's report on the metadata
# and every tensor's name, shape and type.
#
#   check_gguf.sh PROMPTCACHE_CLI NPM_PREFIX STORIES260K_DIR
#
# The package is installed once under NPM_PREFIX (the build tree, never the source tree). Exits
# 77 (CTest: skipped) when node/npm are missing or the package cannot be installed.
set -euo pipefail
cli=$1
prefix=$2
stories=$3
here=$(cd "$(dirname "$0")" && pwd)
package=@huggingface/gguf@0.4.6

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIPPED: node and npm are needed for the GGUF cross-check (Debian: nodejs npm)"
  exit 77
fi
if [ ! -f "$prefix/node_modules/@huggingface/gguf/package.json" ]; then
  mkdir -p "$prefix"
  if ! timeout 600 npm install --no-audit --no-fund --prefer-offline --fetch-retries 1 \
      --prefix "$prefix" "$package" >"$prefix/npm-install.log" 2>&1; then
    tail -5 "$prefix/npm-install.log"
    echo "SKIPPED: npm install failed (is the npm registry reachable?)"
    exit 77
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
folders=("$stories")
for shape in tiny qwen2-tiny qwen3-tiny mistral-tiny; do
  "$cli" make-model --shape "$shape" --out "$work/$shape" >/dev/null
  folders+=("$work/$shape")
done
for folder in "${folders[@]}"; do
  for type in f32 f16 bf16 q8_0; do
    out="$work/$(basename "$folder")-$type.gguf"
    "$cli" convert --model "$folder" --out "$out" --type "$type" --json >"$out.json"
    node "$here/check_gguf.mjs" "$prefix" "$out" "$folder/config.json" "$out.json" || status=1
  done
done
exit $status
