#!/usr/bin/env bash
# The CLI's part of the bad-input catalogue (docs/reliability.md): bad arguments and files each
# give one clear line naming what is wrong — exit 2 for a usage error, 1 for bad input — never a
# stack trace; and a schema with stray '<' / '&' loads with "warning: FILE:LINE: ..." on stderr.
# Usage: cli_bad_inputs.sh PROMPTCACHE_BINARY
set -uo pipefail
pc=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$pc" make-model --shape tiny --seed 0 --out "$work/tiny" >/dev/null 2>"$work/make.err" ||
  fail "make-model: $(cat "$work/make.err")"
cat >"$work/s.xml" <<'XML'
<schema name="s">
  <module name="a">Compare: if (a < b && c) return x<y;</module>
  <union><module name="x">X.</module><module name="y">Y.</module></union>
</schema>
XML
printf '<prompt schema="s"><a/><user>Hi</user></prompt>\n' >"$work/p.xml"
printf '<prompt schema="s">\n  <x/>\n  <y/>\n</prompt>\n' >"$work/conflict.xml"
{ echo '<schema name="s"><module name="huge">'; for _ in $(seq 700); do echo "the cat sat on the mat."; done; echo '</module></schema>'; } >"$work/big.xml"

cases=0
# expect CODE "TEXT" -- ARGS...: the command exits CODE and its stderr holds TEXT, no trace.
expect() {
  local code=$1 text=$2
  shift 3
  cases=$((cases + 1))
  "$pc" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  [ "$rc" -eq "$code" ] || { cat "$work/err"; fail "$*: exit $rc, want $code"; }
  grep -qF -- "$text" "$work/err" || { cat "$work/err"; fail "$*: no '$text' on stderr"; }
  if grep -qiE "terminate called|Exception raised from|stack trace|Segmentation" "$work/err"; then
    fail "$*: a crash or trace on stderr"
  fi
  [ "$(wc -l <"$work/err")" -le 6 ] || { cat "$work/err"; fail "$*: more than a few lines on stderr"; }
}

run=(run --model "$work/tiny" --schema "$work/s.xml" --prompt "$work/p.xml")
# Numbers and flags (usage errors: exit 2, the flag named).
expect 2 "--max-new-tokens: expects a whole number >= 0, got 'abc'" -- "${run[@]}" -n abc
expect 2 "--max-new-tokens: expects a whole number >= 0, got '-5'" -- "${run[@]}" -n -5
expect 2 "--temperature: expects a number >= 0, got '-1'" -- "${run[@]}" --temperature -1
expect 2 "--top-k: expects a whole number >= 0, got '1e3'" -- "${run[@]}" --top-k 1e3
expect 2 "--top-p: expects a number from 0 to 1, got 'nan'" -- "${run[@]}" --top-p nan
expect 2 "--seed: expects a whole number from 0 to 18446744073709551615" -- "${run[@]}" --seed 99999999999999999999
expect 2 "--threads: expects a whole number >= 0, got 'many'" -- "${run[@]}" --threads many
expect 2 "frobnicate" -- "${run[@]}" --frobnicate
expect 2 "--redis-ttl: expects whole seconds from 1 to" -- "${run[@]}" --redis redis://127.0.0.1:1 --cache-secret s --redis-ttl 1h
expect 2 "--redis-ttl: expects whole seconds from 1 to" -- "${run[@]}" --redis redis://127.0.0.1:1 --cache-secret s --redis-ttl 0
expect 2 "--redis-ttl: give --redis URL as well" -- "${run[@]}" --redis-ttl 60
expect 2 "nothere.xml" -- run --model "$work/tiny" --schema "$work/nothere.xml" --prompt "$work/p.xml"
expect 2 "nothere.xml" -- run --model "$work/tiny" --schema "$work/s.xml" --prompt "$work/nothere.xml"
expect 2 "no model given" -- run --schema "$work/s.xml" --prompt "$work/p.xml"
# Values the library refuses (exit 1, the value named).
expect 1 "unknown device 'tpu'" -- "${run[@]}" --device tpu
expect 1 "unknown dtype 'f8'" -- "${run[@]}" --dtype f8
expect 1 "'bogus'" -- "${run[@]}" --encoding bogus
expect 1 "'nope'" -- "${run[@]}" --template nope
expect 1 "$work/nowhere" -- run --model "$work/nowhere" --schema "$work/s.xml" --prompt "$work/p.xml"
expect 1 "config.json" -- layout "$work/s.xml" --model "$work"
# Bad input files through the CLI: file and line named.
expect 1 "conflict.xml:3:3: union conflict error" -- run --model "$work/tiny" --schema "$work/s.xml" --prompt "$work/conflict.xml"
expect 1 "big.xml:1:" -- run --model "$work/tiny" --schema "$work/big.xml" --prompt "$work/p.xml"
grep -qF "context overflow error" "$work/err" || fail "big schema: not a context overflow"
expect 2 "--shape: huge not in {tiny," -- make-model --shape huge --out "$work/huge"
# A 100 MB module: `layout` shows over-long schemas, but refuses this one at once, untokenized.
{ printf '<schema name="s"><module name="book">'; head -c 100000000 /dev/zero | tr '\0' 'a'; printf '</module></schema>'; } >"$work/100mb.xml"
start=$(date +%s)
expect 1 "100mb.xml:1:38: context overflow error: a text of 100000000 bytes in module 'book'" -- layout "$work/100mb.xml" --model "$work/tiny"
[ $(($(date +%s) - start)) -lt 60 ] || fail "layout of a 100 MB module took a minute or more"
rm -f "$work/100mb.xml"

# Lenient input: the schema loads, each repaired line is a warning naming file and line.
"$pc" layout "$work/s.xml" --model "$work/tiny" >"$work/out" 2>"$work/err" || fail "layout of the lenient schema: $(cat "$work/err")"
grep -qF "warning: $work/s.xml:2: read as text, not markup: '<' at column 35 (starts no tag)" "$work/err" ||
  { cat "$work/err"; fail "layout: no warning for line 2"; }
grep -qF "warning:" "$work/out" && grep -qF "read as text" "$work/out" && fail "layout: the warning went to stdout"
"$pc" run --model "$work/tiny" --schema "$work/s.xml" --prompt "$work/p.xml" -n 2 --json >"$work/out" 2>"$work/err" ||
  fail "run with the lenient schema: $(cat "$work/err")"
grep -qF "warning: $work/s.xml:2:" "$work/err" || { cat "$work/err"; fail "run: no warning"; }
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert len(j["token_ids"]) == 2 and j["cached_tokens"] > 0' "$work/out" ||
  fail "run with the lenient schema: bad output"
echo "ok: $cases CLI cases and the lenient-schema warnings"
