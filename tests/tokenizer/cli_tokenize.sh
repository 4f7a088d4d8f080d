#!/usr/bin/env bash
# `promptcache tokenize` end to end: the ids it prints are load_tokenizer's (checked through
# bpe_js_crosscheck's encode mode), --json, --file, folders, and usage errors (exit 2) vs bad
# tokenizer files (exit 1, the path named).
#
#   cli_tokenize.sh PROMPTCACHE_CLI BPE_JS_CROSSCHECK
set -euo pipefail
cli=$1
helper=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$work/model"
"$helper" train "$work/model/tokenizer.json" >/dev/null
tok="$work/model/tokenizer.json"
text='Hello world, <|im_start|>user
caf'$'\xc3\xa9'' 123 '$'\xf0\x9f\x98\x80'

want=$("$helper" encode "$tok" "$text")
got=$("$cli" tokenize --tokenizer "$tok" --text "$text")
[ "$got" = "$want" ] || fail "--tokenizer --text printed '$got', want '$want'"
got=$("$cli" tokenize --model "$work/model" --text "$text")
[ "$got" = "$want" ] || fail "--model printed '$got', want '$want'"
printf '%s' "$text" >"$work/text.txt"
got=$("$cli" tokenize --model "$work/model" --file "$work/text.txt")
[ "$got" = "$want" ] || fail "--file printed '$got', want '$want'"

json=$("$cli" tokenize --tokenizer "$tok" --text "Hello<|im_end|>" --json)
grep -q '^{"ids":\[[0-9, ]*\],"tokens":\[.*"<|im_end|>"\]}$' <<<"$json" || fail "--json printed $json"
[ "$("$cli" tokenize --tokenizer "$tok" --text "")" = "" ] || fail "empty text"

# Invalid UTF-8 in a file reads as U+FFFD.
printf 'a\xffb' >"$work/bad.txt"
got=$("$cli" tokenize --tokenizer "$tok" --file "$work/bad.txt")
want=$("$helper" encode "$tok" "a"$'\xef\xbf\xbd'"b")
[ "$got" = "$want" ] || fail "invalid UTF-8: '$got', want '$want'"

expect_exit() {  # expect_exit CODE PATTERN ARGS...
  local code=$1 pattern=$2 rc=0 out
  shift 2
  out=$("$cli" tokenize "$@" 2>&1) || rc=$?
  [ "$rc" = "$code" ] || fail "tokenize $* exited $rc, want $code: $out"
  grep -qF -- "$pattern" <<<"$out" || fail "tokenize $* said '$out', want '$pattern'"
}
expect_exit 2 "exactly one of --model DIR or --tokenizer FILE" --text hi
expect_exit 2 "exactly one of --model DIR or --tokenizer FILE" --model "$work/model" --tokenizer "$tok" --text hi
expect_exit 2 "exactly one of --text TEXT or --file FILE" --model "$work/model"
expect_exit 2 "exactly one of --text TEXT or --file FILE" --model "$work/model" --text a --file "$work/text.txt"
expect_exit 2 "cannot read --file" --model "$work/model" --file "$work/missing.txt"
mkdir -p "$work/empty"
expect_exit 1 "$work/empty" --model "$work/empty" --text hi
echo '{"model": {"type": "Unigram"}}' >"$work/unigram.json"
expect_exit 1 "model.type" --tokenizer "$work/unigram.json" --text hi
echo "cli_tokenize: ok"
