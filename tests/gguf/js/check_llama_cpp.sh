#!/usr/bin/env bash
# llama.cpp (node-llama-cpp@3.21.1's prebuilt CPU binary, npm) loads stories260K converted by
# `promptcache convert` to f32, q8_0 and q4_k GGUF files (q4_k: its 64-wide rows as Q5_0, the
# fallback llama.cpp's quantizer writes for Q4_K rows of no whole 256-block, its 172-wide rows as
# F16); its tokenization of a text and its 20 greedy tokens must equal promptcache's on the same
# file. Then the K-quants: stories260K's rows (64,
# 172) hold no whole 256-block, so bench-small (random weights of N(0, 0.02), rows of 768 and
# 2048) is made and converted to q4_k_m (Q4_K + Q6_K); on the same file the tokenization must
# be equal and the first 8 of 20 greedy tokens too (measured 2026-12-07 on this text: the first
# 10 equal, 11 on "Once upon a time"; then the two part where this random model's next-token
# logits are nearly tied).
#
# Then the next-token distributions at every position of BOS + that text, on the same files
# (llama_cpp_logits.mjs against gguf_logits, promptcache's log-softmax rows): per position the KL
# divergence of promptcache's distribution from llama.cpp's over the whole vocabulary, and the
# largest log-probability difference over both engines' 10 most likely tokens, each within the
# bounds below (measured figures beside them), and the same most likely token unless the two
# engines both see a near tie. Bounds (KL, log-probability difference) and what was measured on
# 2026-12-07: f32 1e-4, 0.1 (2.2e-6, 0.013); q8_0 5e-3, 1.0 (1.0e-3, 0.27); q4_k 5e-3, 1.0
# (8.7e-4, 0.27); bench-small q4_k_m 1e-3, 0.2 (1.4e-4, 0.042; the same most likely token at 41
# of 42 positions, the other a near tie). The largest log-probability differences are those of
# the less likely of the 10 tokens; the KL divergence weighs them by their probability.
#
#   check_llama_cpp.sh PROMPTCACHE_CLI NPM_PREFIX STORIES260K_DIR GGUF_LOGITS
#
# Exits 77 (CTest: skipped) when node/npm are missing or the package cannot be installed.
set -euo pipefail
cli=$1
prefix=$2
stories=$3
logits_bin=$4
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
# logits FILE IDS MAX_LOGP MAX_KL: the distributions of both engines at every position of IDS.
logits() {
  local file=$1 ids=$2 max_logp=$3 max_kl=$4 name
  name=$(basename "$file" .gguf)
  "$logits_bin" "$file" "$ids" "$work/$name.f32" >/dev/null
  if node "$here/llama_cpp_logits.mjs" "$prefix" "$file" "$ids" "$work/$name.f32" 10 "$max_logp" \
      "$max_kl" >"$work/$name.json"; then
    :
  else
    echo "$name: next-token distributions differ beyond the bounds"
    status=1
  fi
  node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));
    console.log(`${r.file}: ${r.positions} positions, worst KL ${r.worst_kl} (bound ${r.max_kl}), ` +
      `worst top-${r.top} log-prob difference ${r.worst_max_logp_diff} (bound ${r.max_logp}), ` +
      `same most likely token at ${r.same_top1}`);
    for (const p of r.per_position) if (!p.ok) console.log("  position", JSON.stringify(p));' \
    "$work/$name.json"
}
for type in f32 q8_0 q4_k; do
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
  bos=$(node -e 'console.log(JSON.parse(process.argv[1]).bos)' "$theirs")
  case $type in
    f32) logits "$out" "$bos,$ours_ids" 0.1 1e-4 ;;
    q8_0 | q4_k) logits "$out" "$bos,$ours_ids" 1.0 5e-3 ;;
  esac
done

"$cli" make-model --shape bench-small --out "$work/bench-small" --seed 1 >/dev/null
out="$work/bench-small-q4_k_m.gguf"
"$cli" convert --model "$work/bench-small" --out "$out" --type q4_k_m >/dev/null
ours_ids=$("$cli" tokenize --model "$out" --text "$text" --json |
  node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).ids.join(",")))')
ours_greedy=$("$cli" generate --model "$out" --text "$text" -n 20 --json |
  node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).token_ids.join(",")))')
theirs=$(node "$here/llama_cpp_check.mjs" "$prefix" "$out" "$text")
theirs_ids=$(node -e 'console.log(JSON.parse(process.argv[1]).ids.join(","))' "$theirs")
theirs_greedy=$(node -e 'console.log(JSON.parse(process.argv[1]).greedy.join(","))' "$theirs")
echo "q4_k_m: promptcache ids    $ours_ids"
echo "q4_k_m: llama.cpp ids      $theirs_ids"
echo "q4_k_m: promptcache greedy $ours_greedy"
echo "q4_k_m: llama.cpp greedy   $theirs_greedy"
if [ "$ours_ids" != "$theirs_ids" ]; then echo "q4_k_m: tokenization differs"; status=1; fi
same=0
IFS=, read -ra a <<<"$ours_greedy"
IFS=, read -ra b <<<"$theirs_greedy"
while [ "$same" -lt "${#a[@]}" ] && [ "$same" -lt "${#b[@]}" ] && [ "${a[$same]}" = "${b[$same]}" ]; do
  same=$((same + 1))
done
echo "q4_k_m: the first $same greedy tokens agree"
if [ "$same" -lt 8 ]; then echo "q4_k_m: fewer than 8 greedy tokens agree"; status=1; fi
bos=$(node -e 'console.log(JSON.parse(process.argv[1]).bos)' "$theirs")
logits "$out" "$bos,$ours_ids" 0.2 1e-3
exit $status
