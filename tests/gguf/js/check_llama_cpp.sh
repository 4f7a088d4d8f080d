#!/usr/bin/env bash
# llama.cpp (node-llama-cpp@3.21.1's prebuilt CPU binary, npm) loads stories260K converted by
# `promptcache convert` to f32 and q8_0 GGUF files; its tokenization of a text and its 20 greedy
# tokens must equal promptcache's on the same file.
#
#   check_llama_cpp.sh PROMPTCACHE_CLI NPM_PREFIX STORIES260K_DIR
#
# Exits 77 (CTest: skipped) when node/npm are missing or the package cannot be installed.
set -euo pipefail
cli=$1
prefix=$2
stories=$3
here=$(cd "$(dirname "$0")" && pwd)
package=node-llama-cpp@3.21.1

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIPPED: node and npm are needed for the llama.cpp cross-check (Debian: nodejs npm)"
  exit 77
fi
if [ ! -f "$prefix/node_modules/node-llama-cpp/package.json" ]; then
  mkdir -p "$prefix"
  # The prebuilt binaries come as optional dependencies; no build from source.
  if ! NODE_LLAMA_CPP_SKIP_DOWNLOAD=true timeout 900 npm install --no-audit --no-fund \
      --prefer-offline --fetch-retries 1 --prefix "$prefix" "$package" \
      >"$prefix/npm-install.log" 2>&1; then
    tail -5 "$prefix/npm-install.log"
    echo "SKIPPED: npm install failed (is the npm registry reachable?)"
    exit 77
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
text="Once upon a time, there was a little girl named Lily. She loved to play outside"
status=0
for type in f32 q8_0; do
  out="$work/stories260K-$type.gguf"
  "$cli" convert --model "$stories" --out "$out" --type "$type" >/dev/null
  ours_ids=$("$cli" tokenize --model "$out" --text "$text" --json |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).ids.join(",")))')
  ours_greedy=$("$cli" generate --model "$out" --text "$text" -n 20 --json |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).token_ids.join(",")))')
  theirs=$(node "$here/llama_cpp_check.mjs" "$prefix" "$out" "$text")
  theirs_ids=$(node -e 'console.log(JSON.parse(process.argv[1]).ids.join(","))' "$theirs")
  theirs_greedy=$(node -e 'console.log(JSON.parse(process.argv[1]).greedy.join(","))' "$theirs")
  echo "$type: promptcache ids   $ours_ids"
  echo "$type: llama.cpp ids     $theirs_ids"
  echo "$type: promptcache greedy $ours_greedy"
  echo "$type: llama.cpp greedy   $theirs_greedy"
  if [ "$ours_ids" != "$theirs_ids" ]; then echo "$type: tokenization differs"; status=1; fi
  # promptcache stops at EOS; compare the tokens it produced.
  n=$(tr ',' '\n' <<<"$ours_greedy" | wc -l)
  if [ "$(tr ',' '\n' <<<"$theirs_greedy" | head -n "$n" | paste -sd,)" != "$ours_greedy" ]; then
    echo "$type: greedy tokens differ"
    status=1
  fi
done
exit $status
