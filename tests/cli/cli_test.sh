#!/usr/bin/env bash
# One CLI test case: cli_test.sh CASE PROMPTCACHE_BINARY SOURCE_DIR
# Exit 0 = pass, 77 = skipped (with a message), anything else = fail.
set -uo pipefail
case_name=$1 pc=$2 src=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }
expect_in() { grep -qF -- "$1" "$2" || { echo "--- $2:"; cat "$2"; fail "expected '$1' in $2"; }; }
tiny() { "$pc" make-model --shape tiny --seed 0 --out "$work/tiny" >/dev/null 2>"$work/make.err" || fail "make-model: $(cat "$work/make.err")"; }
# The trained stories260K model ships with the repository: a missing file fails the case.
stories="$src/models/stories260K"
need_stories() {
  for f in config.json model.safetensors tokenizer.model; do
    [ -f "$stories/$f" ] || fail "$stories/$f is missing; stories260K ships with the repository (git checkout -- models/stories260K)"
  done
}

case "$case_name" in
  layout_golden)
    tiny
    "$pc" layout "$src/schemas/trip.xml" --model "$work/tiny" >"$work/out.txt" 2>&1 || fail "layout exit $?"
    diff -u "$src/tests/cli/golden/trip.layout.txt" "$work/out.txt" || fail "layout differs from the golden file"
    ;;
  layout_warnings)
    tiny
    "$pc" layout "$src/tests/cli/fixtures/warnings.xml" --model "$work/tiny" >"$work/out.txt" 2>&1 || fail "layout exit $?"
    diff -u "$src/tests/cli/golden/warnings.layout.txt" "$work/out.txt" || fail "layout differs from the golden file"
    # A module longer than the tiny model's 2048 positions.
    { echo '<schema name="big"><module name="huge">'; for i in $(seq 700); do echo "the cat sat on the mat."; done; echo '</module></schema>'; } >"$work/big.xml"
    "$pc" layout "$work/big.xml" --model "$work/tiny" >"$work/big.txt" 2>&1 || fail "layout big exit $?"
    expect_in "warning: the schema reserves" "$work/big.txt"
    expect_in "warning: module 'huge'" "$work/big.txt"
    expect_in "is larger than the context (2048)" "$work/big.txt"
    ;;
  schemas)
    # Every example schema lays out without error, and every example prompt runs.
    tiny
    for schema in "$src"/schemas/*.xml; do
      case "$schema" in *.prompt.xml) continue ;; esac
      "$pc" layout "$schema" --model "$work/tiny" >"$work/l.txt" 2>&1 || fail "layout $schema: $(cat "$work/l.txt")"
      prompt=${schema%.xml}.prompt.xml
      [ -f "$prompt" ] || fail "no example prompt for $schema"
      "$pc" run --model "$work/tiny" --schema "$schema" --prompt "$prompt" -n 2 --json >"$work/r.json" 2>"$work/r.err" || fail "run $prompt: $(cat "$work/r.err")"
      python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["cached_tokens"] > 0 and len(j["token_ids"]) == 2' "$work/r.json" || fail "bad result for $prompt"
    done
    ;;
  families)
    # A tiny model of each family is used exactly as a Llama 2 one: layout, cached run equal to the
    # uncached one, qa; the family's chat format and tokenizer come from the folder.
    for shape in qwen2-tiny qwen3-tiny llama3-tiny mistral-tiny; do
      d="$work/$shape"
      "$pc" make-model --shape "$shape" --seed 1 --out "$d" >/dev/null 2>"$work/make.err" || fail "make-model $shape: $(cat "$work/make.err")"
      "$pc" layout "$src/schemas/trip.xml" --model "$d" --ids >"$work/layout.txt" 2>&1 || fail "layout $shape: $(cat "$work/layout.txt")"
      case $shape in
        qwen*) expect_in "<|im_start|>" "$work/layout.txt"; grep -q "<bos>" "$work/layout.txt" && fail "$shape: Qwen has no BOS" ;;
        llama3*) expect_in "<|start_header_id|>" "$work/layout.txt"; expect_in "<bos>" "$work/layout.txt" ;;
        mistral*) expect_in "[INST]" "$work/layout.txt" ;;
      esac
      for mode in "" "--no-cache"; do
        "$pc" run --model "$d" --schema "$src/schemas/fewshot.xml" --prompt "$src/schemas/fewshot.prompt.xml" \
          -n 10 --json $mode >"$work/out$mode.json" 2>"$work/err" || fail "run $shape $mode: $(cat "$work/err")"
      done
      python3 - "$work/out.json" "$work/out--no-cache.json" <<'PY' || fail "$shape: cached and uncached differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["cached_tokens"] > 0 and b["cached_tokens"] == 0
assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"], (a["token_ids"], b["token_ids"])
PY
      "$pc" qa --model "$d" --docs "$src/schemas/docs" --question "When does it open?" -n 4 >"$work/qa.txt" 2>&1 || fail "qa $shape: $(cat "$work/qa.txt")"
    done
    # An architecture the runtime does not have is refused with the supported list.
    cp -r "$work/qwen3-tiny" "$work/other"
    sed -i 's/Qwen3ForCausalLM/GemmaForCausalLM/' "$work/other/config.json"
    "$pc" run --model "$work/other" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" >"$work/o.txt" 2>&1
    [ $? -eq 1 ] || fail "unsupported architecture: expected exit 1"
    expect_in "unsupported architecture 'GemmaForCausalLM'" "$work/o.txt"
    expect_in "Qwen3ForCausalLM" "$work/o.txt"
    ;;
  run_cache_equals_nocache)
    tiny
    for mode in "" "--no-cache"; do
      "$pc" run --model "$work/tiny" --schema "$src/schemas/fewshot.xml" --prompt "$src/schemas/fewshot.prompt.xml" \
        -n 12 --json $mode >"$work/out$mode.json" 2>"$work/err" || fail "run $mode: $(cat "$work/err")"
    done
    python3 - "$work/out.json" "$work/out--no-cache.json" <<'PY' || fail "cached and uncached differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["cached"] and not b["cached"], (a["cached"], b["cached"])
assert a["cached_tokens"] > 0 and b["cached_tokens"] == 0
assert len(a["token_ids"]) == 12, a["token_ids"]
assert a["token_ids"] == b["token_ids"], (a["token_ids"], b["token_ids"])
assert a["text"] == b["text"]
PY
    ;;
  run_batch)
    # Several --prompt files run as one batch: each answer equals the one of its prompt alone.
    tiny
    prompts=("$src/schemas/trip.prompt.xml" "$src/schemas/trip-sunny.prompt.xml")
    for i in 0 1; do
      "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "${prompts[$i]}" -n 8 --json \
        >"$work/alone$i.json" 2>"$work/err" || fail "run alone: $(cat "$work/err")"
    done
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "${prompts[@]}" -n 8 --json \
      >"$work/batch.json" 2>"$work/err" || fail "run batch: $(cat "$work/err")"
    python3 - "$work/batch.json" "$work/alone0.json" "$work/alone1.json" "${prompts[@]}" <<'PY' || fail "batch differs from single runs"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
alone = [json.load(open(p)) for p in sys.argv[2:4]]
assert len(rows) == 2, rows
for row, one, name in zip(rows, alone, sys.argv[4:6]):
    assert row["prompt"] == name, (row["prompt"], name)
    assert row["token_ids"] == one["token_ids"], (row["token_ids"], one["token_ids"])
    assert row["text"] == one["text"] and row["cached_tokens"] == one["cached_tokens"] > 0
assert rows[0]["cached_tokens"] != rows[1]["cached_tokens"]  # different module selections
PY
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "${prompts[@]}" -n 4 --stats \
      >"$work/batch.txt" 2>"$work/stats" || fail "run batch text: $(cat "$work/stats")"
    expect_in "--- $src/schemas/trip-sunny.prompt.xml" "$work/batch.txt"
    [ "$(grep -c 'TTFT' "$work/stats")" = 2 ] || fail "expected one stats line per prompt: $(cat "$work/stats")"
    ;;
  run_stories260k)
    need_stories
    cat >"$work/s.xml" <<'XML'
<schema name="tale"><module name="a">Once upon a time, there was a little girl named Lily.</module>
<module name="b">She loved to play outside in the park.</module></schema>
XML
    echo '<prompt schema="tale"><a/><b/> One day, she</prompt>' >"$work/p.xml"
    "$pc" run --model "$stories" --template plain --schema "$work/s.xml" --prompt "$work/p.xml" -n 30 >"$work/c.txt" 2>"$work/err" || fail "run: $(cat "$work/err")"
    "$pc" run --model "$stories" --template plain --schema "$work/s.xml" --prompt "$work/p.xml" -n 30 --no-cache --stats >"$work/n.txt" 2>"$work/err2" || fail "run --no-cache"
    diff "$work/c.txt" "$work/n.txt" || fail "cached and uncached text differ"
    [ "$(wc -c <"$work/c.txt")" -gt 20 ] || fail "answer too short"
    expect_in "no cache: TTFT" "$work/err2"
    echo "stories260K answer: $(cat "$work/c.txt")"
    ;;
  cache_file)
    tiny
    args=(--model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" -n 4 --stats --cache "$work/trip.states")
    "$pc" run "${args[@]}" >"$work/1.txt" 2>"$work/1.err" || fail "first run: $(cat "$work/1.err")"
    expect_in "compiled, saved to" "$work/1.err"
    "$pc" run "${args[@]}" >"$work/2.txt" 2>"$work/2.err" || fail "second run: $(cat "$work/2.err")"
    expect_in "loaded from" "$work/2.err"
    diff "$work/1.txt" "$work/2.txt" || fail "answers differ"
    head -c 100 "$work/trip.states" >"$work/bad.states"
    "$pc" run "${args[@]:0:10}" --cache "$work/bad.states" >"$work/3.txt" 2>"$work/3.err" && fail "corrupt cache accepted"
    expect_in "bad.states" "$work/3.err"
    ;;
  compile_cache_dir)
    # compile into a cache folder; run and qa find the file there; cache ls/verify/rm.
    tiny
    d="$work/states"
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --cache-dir "$d" >"$work/c1.txt" 2>"$work/c1.err" || fail "compile: $(cat "$work/c1.err")"
    expect_in "trip: compiled" "$work/c1.txt"
    expect_in "compiling trip:" "$work/c1.err"
    ls "$d"/trip-*.states >/dev/null 2>&1 || fail "no trip-*.states in the cache folder"
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --cache-dir "$d" >"$work/c2.txt" 2>&1 || fail "second compile"
    expect_in "trip: up to date" "$work/c2.txt"
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --cache-dir "$d" --force --json >"$work/c3.json" 2>&1 || fail "forced compile"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert not j["up_to_date"] and j["tokens_stored"] > 0, j' "$work/c3.json" || fail "bad compile --json"
    # Another KV dtype gets a file of its own beside the first.
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --cache-dir "$d" --kv-dtype bf16 >/dev/null 2>&1 || fail "bf16 compile"
    [ "$(ls "$d"/trip-*.states | wc -l)" = 2 ] || fail "expected two files: $(ls "$d")"
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" -n 4 --stats --cache-dir "$d" >"$work/r.txt" 2>"$work/r.err" || fail "run: $(cat "$work/r.err")"
    expect_in "loaded from $d/trip-" "$work/r.err"
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" -n 4 >"$work/plain.txt" 2>/dev/null || fail "run without the folder"
    diff "$work/r.txt" "$work/plain.txt" || fail "the loaded states answer differently"
    "$pc" cache ls --cache-dir "$d" >"$work/ls.txt" 2>&1 || fail "cache ls"
    expect_in "trip" "$work/ls.txt"
    expect_in "bf16" "$work/ls.txt"
    "$pc" cache ls --cache-dir "$d" --json >"$work/ls.json" 2>&1 || fail "cache ls --json"
    python3 -c '
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
assert len(rows)==2 and all(r["schema"]=="trip" and r["current_format"] and r["tokens"]>0 for r in rows), rows
assert sorted(r["kv_dtype"] for r in rows)==["bf16","f32"], rows' "$work/ls.json" || fail "bad cache ls --json"
    "$pc" cache verify --cache-dir "$d" >"$work/v.txt" 2>&1 || fail "verify of intact files: $(cat "$work/v.txt")"
    expect_in "2 intact, 0 corrupt" "$work/v.txt"
    # One byte changed near the end (inside the last span's tensor): verify names file and tensor.
    f=$(ls "$d"/trip-*.states | head -1)
    python3 -c '
import sys
p=sys.argv[1]; b=bytearray(open(p,"rb").read()); b[-10]^=0x55; open(p,"wb").write(b)' "$f"
    "$pc" cache verify --cache-dir "$d" >"$work/v2.txt" 2>&1 && fail "verify passed a corrupt file"
    expect_in "CORRUPT" "$work/v2.txt"
    expect_in "$f" "$work/v2.txt"
    expect_in "tensor 'span." "$work/v2.txt"
    "$pc" cache rm --cache-dir "$d" >"$work/rm0.txt" 2>&1 && fail "rm without a selector"
    expect_in "--schema NAME, --stale or --all" "$work/rm0.txt"
    "$pc" cache rm --cache-dir "$d" --schema trip --dry-run >"$work/rm1.txt" 2>&1 || fail "rm --dry-run"
    [ "$(ls "$d"/*.states | wc -l)" = 2 ] || fail "--dry-run removed files"
    "$pc" cache rm --cache-dir "$d" --schema trip >"$work/rm2.txt" 2>&1 || fail "rm"
    [ -z "$(ls "$d")" ] || fail "files left: $(ls "$d")"
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" >"$work/c4.txt" 2>&1 && fail "compile without a destination"
    expect_in "--out FILE, --cache-dir DIR or --redis URL" "$work/c4.txt"
    ;;
  qa)
    tiny
    echo "The meeting is on Monday at ten in the small room." >"$work/a.txt"
    echo "The train to the city leaves every hour." >"$work/b.md"
    "$pc" qa --model "$work/tiny" --docs "$work/a.txt" "$work/b.md" --question "When is the meeting?" -n 8 >"$work/out.txt" 2>"$work/err" || fail "qa: $(cat "$work/err")"
    expect_in "2 documents" "$work/err"
    expect_in "TTFT" "$work/err"
    [ -s "$work/out.txt" ] || fail "no answer printed"
    # Two questions are one batch; each answer is the one it gets alone.
    "$pc" qa --model "$work/tiny" --docs "$work/a.txt" "$work/b.md" --question "Where does the train go?" -n 8 >"$work/out2.txt" 2>"$work/err" || fail "qa 2: $(cat "$work/err")"
    "$pc" qa --model "$work/tiny" --docs "$work/a.txt" "$work/b.md" -q "When is the meeting?" -q "Where does the train go?" -n 8 >"$work/both.txt" 2>"$work/err" || fail "qa batch: $(cat "$work/err")"
    python3 - "$work/both.txt" "$work/out.txt" "$work/out2.txt" <<'PY' || fail "batch answers differ from single answers"
import sys
both = open(sys.argv[1]).read().split("\n")
first, second = (open(p).read().strip() for p in sys.argv[2:4])
assert both[0] == "Q: When is the meeting?", both
i = both.index("Q: Where does the train go?")
assert "\n".join(both[1:i]).strip() == first, (both[1:i], first)
assert "\n".join(both[i + 1:]).strip() == second, (both[i + 1:], second)
PY
    [ "$(grep -c 'TTFT' "$work/err")" = 2 ] || fail "expected a stats line per question: $(cat "$work/err")"
    # --cache keeps the compiled documents: the second run loads them.
    for i in 1 2; do
      "$pc" qa --model "$work/tiny" --docs "$work/a.txt" "$work/b.md" --question "When is the meeting?" -n 8 --cache "$work/qa.states" >"$work/c$i.txt" 2>"$work/c$i.err" || fail "qa --cache $i: $(cat "$work/c$i.err")"
    done
    expect_in "saved to $work/qa.states" "$work/c1.err"
    expect_in "loaded from $work/qa.states" "$work/c2.err"
    cmp -s "$work/c1.txt" "$work/c2.txt" || fail "the answer changed when the states were loaded"
    need_stories
    mkdir "$work/folder" && cp "$work/a.txt" "$work/b.md" "$work/folder/"
    "$pc" qa --model "$stories" --template plain --docs "$work/folder" --question "Who went to the park?" -n 20 >"$work/s.txt" 2>"$work/s.err" || fail "qa stories260K: $(cat "$work/s.err")"
    expect_in "2 documents" "$work/s.err"
    expect_in "TTFT" "$work/s.err"
    echo "stories260K qa answer: $(cat "$work/s.txt")"
    ;;
  qa_interactive)
    tiny
    mkdir "$work/docs"
    echo "Lily has a red ball." >"$work/docs/lily.txt"
    echo "Tom has a blue kite." >"$work/docs/tom.txt"
    printf ':docs\n:use tom.txt\n:docs\nWhat does Tom have?\nAnd what colour?\n:use nobody.txt\n:quit\n' |
      "$pc" qa --model "$work/tiny" --docs "$work/docs" -n 4 >"$work/out.txt" 2>"$work/err" || fail "qa loop: $(cat "$work/err")"
    expect_in "* lily.txt" "$work/out.txt"
    expect_in "  lily.txt" "$work/out.txt"
    expect_in "using 1 document" "$work/err"
    expect_in "TTFT" "$work/err"
    # The second question over the same document keeps its states in the buffer.
    expect_in "kept from the last question" "$work/err"
    # The first question reads its document's states in place where the fused CPU attention
    # runs (f32, AVX2 or AVX-512, kernels on).
    if grep -qw avx2 /proc/cpuinfo 2>/dev/null &&
      [ "${PROMPTCACHE_CPU_KERNELS:-on}" != off ] && [ "${PROMPTCACHE_CPU_KERNELS:-on}" != 0 ]; then
      expect_in "read in place" "$work/err"
    fi
    expect_in "no document 'nobody.txt'" "$work/err"
    ;;
  qa_names)
    # Module names come from file names: sanitized to XML names and made unique; text with XML
    # characters is read through src= untouched.
    tiny
    mkdir "$work/d"
    echo "Notes with <tags> & ampersands." >"$work/d/my notes (v2).txt"
    echo "Other notes." >"$work/d/my notes (v2).md"
    echo "First." >"$work/d/1st.md"
    echo "Ampersand file." >"$work/d/a&b.txt"
    echo "ignored" >"$work/d/skip.json"
    printf ':docs\n:use 1st.md my_notes__v2_\nWhat is first?\n:docs\n:bogus\n:quit\n' |
      "$pc" qa --model "$work/tiny" --docs "$work/d" -n 3 >"$work/out.txt" 2>"$work/err" || fail "qa names: $(cat "$work/err")"
    expect_in "4 documents" "$work/err"
    expect_in "* my notes (v2).md (:use my_notes__v2_)" "$work/out.txt"
    expect_in "* my notes (v2).txt (:use my_notes__v2__2)" "$work/out.txt"
    expect_in "  my notes (v2).txt (:use my_notes__v2__2)" "$work/out.txt"
    expect_in "  a&b.txt" "$work/out.txt"
    expect_in "using 2 document(s)" "$work/err"
    expect_in "unknown command :bogus" "$work/err"
    grep -q "skip.json" "$work/out.txt" && fail "a .json file was taken as a document"
    "$pc" qa --model "$work/tiny" --docs "$work/nowhere" --question hi >"$work/o" 2>"$work/e" && fail "missing docs accepted"
    expect_in "nowhere" "$work/e"
    mkdir "$work/emptydir"
    "$pc" qa --model "$work/tiny" --docs "$work/emptydir" --question hi >"$work/o" 2>"$work/e" && fail "empty docs folder accepted"
    expect_in "no .txt or .md documents" "$work/e"
    ;;
  errors)
    "$pc" run --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" >"$work/o" 2>"$work/e"; rc=$?
    [ $rc -eq 2 ] || fail "no --model: exit $rc, want 2"
    expect_in "make-model" "$work/e"
    tiny
    printf '<prompt schema="trip">\n  <city/>\n  <nowhere/>\n  Hi\n</prompt>\n' >"$work/bad.xml"
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$work/bad.xml" >"$work/o" 2>"$work/e"; rc=$?
    [ $rc -eq 1 ] || fail "unknown module: exit $rc, want 1"
    expect_in "bad.xml:3" "$work/e"
    expect_in "nowhere" "$work/e"
    "$pc" layout "$work/missing.xml" --model "$work/tiny" >"$work/o" 2>"$work/e" && fail "missing schema accepted"
    expect_in "missing.xml" "$work/e"
    "$pc" generate --model "$work/nothere" --text hi >"$work/o" 2>"$work/e" && fail "missing model accepted"
    expect_in "nothere" "$work/e"
    "$pc" run --model "$work/tiny" --bogus 2>"$work/e" >/dev/null; rc=$?
    [ $rc -eq 2 ] || fail "unknown flag: exit $rc, want 2"
    "$pc" run --model "$work/tiny" --schema "$work/nothere.xml" --prompt "$src/schemas/trip.prompt.xml" 2>"$work/e" >/dev/null; rc=$?
    [ $rc -eq 2 ] || fail "missing --schema file: exit $rc, want 2"
    expect_in "nothere.xml" "$work/e"
    "$pc" 2>"$work/e" >/dev/null; rc=$?
    [ $rc -eq 2 ] || fail "no subcommand: exit $rc, want 2"
    printf '<schema name="x"><module name="a">hi</modul></schema>' >"$work/broken.xml"
    "$pc" layout "$work/broken.xml" --model "$work/tiny" >"$work/o" 2>"$work/e"; rc=$?
    [ $rc -eq 1 ] || fail "malformed schema: exit $rc, want 1"
    expect_in "broken.xml:1:" "$work/e"
    "$pc" layout "$src/schemas/trip.xml" --model "$work" >"$work/o" 2>"$work/e"; rc=$?
    [ $rc -eq 1 ] || fail "folder without a model: exit $rc, want 1"
    expect_in "config.json" "$work/e"
    # Numbers: the message names the flag, what it wants and what it got; exit 2.
    for bad in "-n abc|--max-new-tokens: expects a whole number >= 0, got 'abc'" \
               "-n 99999999999|--max-new-tokens: expects a whole number from 0 to 2147483647" \
               "--top-p 2|--top-p: expects a number from 0 to 1, got '2'" \
               "--repetition-penalty 0|--repetition-penalty: expects a number > 0, got '0'" \
               "--threads 1.5|--threads: expects a whole number >= 0, got '1.5'"; do
      read -r -a args <<<"${bad%%|*}"
      "$pc" generate --model "$work/tiny" --text hi "${args[@]}" >"$work/o" 2>"$work/e"; rc=$?
      [ $rc -eq 2 ] || fail "${bad%%|*}: exit $rc, want 2"
      expect_in "${bad#*|}" "$work/e"
    done
    "$pc" demo --shape huge 2>"$work/e" >/dev/null && fail "bad shape accepted"
    grep -qi "terminate\|stack\|Exception raised from" "$work/e" && fail "stack trace printed"
    for sub in demo layout run qa generate make-model; do
      "$pc" "$sub" --help >"$work/h" 2>&1 || fail "$sub --help failed"
      expect_in "Example" "$work/h"
    done
    ;;
  src_outside)
    # A schema file reads src files inside its folder; one leading out is refused (naming the
    # flag) unless --allow-src-outside is given.
    tiny
    mkdir -p "$work/s" "$work/elsewhere"
    echo "The secret text lives elsewhere." >"$work/elsewhere/doc.txt"
    ln -s "$work/elsewhere/doc.txt" "$work/s/link.txt"
    for src in "../elsewhere/doc.txt" "$work/elsewhere/doc.txt" "link.txt"; do
      printf '<schema name="o"><module name="d" src="%s"/></schema>\n' "$src" >"$work/s/o.xml"
      "$pc" layout "$work/s/o.xml" --model "$work/tiny" >"$work/o" 2>"$work/e"; rc=$?
      [ $rc -eq 1 ] || fail "src=$src: exit $rc, want 1"
      expect_in "o.xml:1:" "$work/e"
      expect_in "--allow-src-outside" "$work/e"
      grep -q "secret text" "$work/o" "$work/e" && fail "src=$src: the file was read"
      "$pc" layout "$work/s/o.xml" --model "$work/tiny" --allow-src-outside >"$work/o" 2>"$work/e" ||
        fail "src=$src with --allow-src-outside: $(cat "$work/e")"
      expect_in "secret text" "$work/o"
    done
    ;;
  demo)
    # The default demo, kept small: the story on stories260K (the real part), then the speed part
    # on a tiny synthetic model with a short schema.
    need_stories
    "$pc" demo --shape tiny --speed-tokens 200 --repeats 1 >"$work/out.txt" 2>"$work/err" || fail "demo: $(cat "$work/err")"
    cat "$work/out.txt"
    [ "$(grep -c 'identical: yes' "$work/out.txt")" = 2 ] || fail "expected both parts' answers identical"
    expect_in "TTFT with the cache" "$work/out.txt"
    expect_in "part 2 took" "$work/out.txt"
    python3 - "$work/out.txt" <<'PY' || fail "the story's answers are not the same readable words"
import re, sys
lines = open(sys.argv[1]).read().split("\n")
# The story's two answers: the first lines "with the cache: ..." and "without the cache: ...".
answer = lambda label: next(l for l in lines if l.strip().startswith(label)).split(":", 1)[1].strip()
cached, plain = answer("with the cache:"), answer("without the cache:")
assert cached == plain, (cached, plain)
words = re.findall(r"[A-Za-z]+", cached)
assert len(words) >= 8, cached
common = {"the", "a", "she", "her", "he", "was", "to", "and", "lily", "dog", "mom", "said", "play"}
assert sum(w.lower() in common for w in words) >= 3, cached
assert sum(c.isalpha() or c in " ,.!?'\"" for c in cached) >= 0.95 * len(cached), cached
print("story:", cached)
PY
    # --model takes any folder: both parts run on it.
    tiny
    "$pc" demo --model "$work/tiny" -n 6 --speed-tokens 100 --repeats 1 >"$work/t.txt" 2>"$work/t.err" || fail "demo --model: $(cat "$work/t.err")"
    [ "$(grep -c 'identical: yes' "$work/t.txt")" = 2 ] || fail "demo --model: answers differ: $(cat "$work/t.txt")"
    # A missing model is a clear error: a --model folder that is not there, and the default model
    # when the binary is run outside a checkout.
    "$pc" demo --model "$work/nowhere" --speed-tokens 0 >/dev/null 2>"$work/m.err" && fail "demo with a missing --model succeeded"
    expect_in "$work/nowhere" "$work/m.err"
    mkdir -p "$work/elsewhere/bin" && cp "$pc" "$work/elsewhere/bin/promptcache"
    (cd "$work/elsewhere" && ./bin/promptcache demo --speed-tokens 0) >/dev/null 2>"$work/d.err"
    [ $? = 2 ] || fail "demo without stories260K: expected exit status 2: $(cat "$work/d.err")"
    expect_in "the stories260K model was not found" "$work/d.err"
    expect_in "give --model DIR" "$work/d.err"
    ;;
  generate)
    tiny
    "$pc" generate --model "$work/tiny" --text "Once upon a time" -n 5 --json >"$work/out.json" 2>"$work/err" || fail "generate: $(cat "$work/err")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert len(j["token_ids"])==5 and j["ttft_ms"]>0' "$work/out.json" || fail "bad json"
    ;;
  info_defaults)
    # A bf16 folder loads with bf16 weights and states and f32 compute, with no flags; info and
    # generate --json say so (and why); --weights f32 overrides, and its states follow it.
    "$pc" make-model --shape tiny --seed 0 --dtype bf16 --out "$work/bf16" >/dev/null 2>"$work/make.err" || fail "make-model: $(cat "$work/make.err")"
    "$pc" info --model "$work/bf16" --json >"$work/i.json" 2>"$work/i.err" || fail "info: $(cat "$work/i.err")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
assert (j["checkpoint_dtype"], j["weights_dtype"], j["dtype"], j["kv_dtype"]) == ("bf16", "bf16", "f32", "bf16"), j
assert "as the checkpoint stores" in j["dtype_reasons"]["weights"], j
assert j["weight_bytes"] <= 1.1 * j["checkpoint_bytes"], j
assert j["tokenizer"] == "sentencepiece" and j["chat_template"] == "llama-2" and j["layers"] == 2, j' "$work/i.json" || fail "bad info: $(cat "$work/i.json")"
    "$pc" info --model "$work/bf16" --weights f32 --json >"$work/f.json" 2>"$work/f.err" || fail "info --weights f32: $(cat "$work/f.err")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
assert (j["weights_dtype"], j["kv_dtype"]) == ("f32", "f32") and j["dtype_reasons"]["weights"] == "given (--weights)", j' "$work/f.json" || fail "bad info --weights f32: $(cat "$work/f.json")"
    "$pc" info --model "$work/bf16" >"$work/i.txt" 2>&1 || fail "info text: $(cat "$work/i.txt")"
    expect_in "weights        bf16: as the checkpoint stores them (bf16)" "$work/i.txt"
    expect_in "KV / states    bf16" "$work/i.txt"
    "$pc" generate --model "$work/bf16" --text "Once upon a time" -n 3 --json >"$work/g.json" 2>"$work/g.err" || fail "generate: $(cat "$work/g.err")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
assert (j["weights_dtype"], j["kv_dtype"], j["checkpoint_dtype"]) == ("bf16", "bf16", "bf16") and len(j["token_ids"]) == 3, j' "$work/g.json" || fail "bad generate json: $(cat "$work/g.json")"
    ;;
  blas_core)
    # info names OpenBLAS's kernels; a core named in OPENBLAS_CORETYPE is the user's and stays,
    # and without it no generic (SSE-only or AVX1) core is left on a processor with AVX2 + FMA.
    "$pc" make-model --shape tiny --seed 0 --out "$work/t" >/dev/null 2>"$work/make.err" || fail "make-model: $(cat "$work/make.err")"
    OPENBLAS_CORETYPE=Nehalem "$pc" info --model "$work/t" --json >"$work/n.json" 2>"$work/n.err" || fail "info: $(cat "$work/n.err")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
if j["blas_core_detected"]:
    assert j["blas_core"] == "Nehalem" and j["blas_core_note"] == "as OPENBLAS_CORETYPE says", j' "$work/n.json" || fail "OPENBLAS_CORETYPE not kept: $(cat "$work/n.json")"
    env -u OPENBLAS_CORETYPE "$pc" info --model "$work/t" --json >"$work/a.json" 2>"$work/a.err" || fail "info: $(cat "$work/a.err")"
    avx2=0
    if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then avx2=1; fi
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
generic = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge", "Barcelona", "Bulldozer"}
if j["blas_core_detected"] and sys.argv[2] == "1":
    assert j["blas_core"] not in generic, j' "$work/a.json" "$avx2" || fail "generic BLAS kernels left: $(cat "$work/a.json")"
    "$pc" info --model "$work/t" >"$work/i.txt" 2>&1 || fail "info text: $(cat "$work/i.txt")"
    expect_in "BLAS kernels" "$work/i.txt"
    ;;
  fidelity)
    # r = 1 gives the no-cache answer; r out of [0, 1] is a usage error; run reports the recompute.
    tiny
    "$pc" fidelity --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      --recompute 1 --tokens 8 --json >"$work/f.json" 2>"$work/f.err" || fail "fidelity: $(cat "$work/f.err")"
    python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
p,s=rows[0],rows[-1]
# city and rainy (its own pass, same context) are the exact leading run; the rest is recomputed.
assert p["first_token_kl"] < 1e-6 and p["exact"] and 0 < p["exact_tokens"] < p["cached_tokens"], p
assert p["recomputed_tokens"] == p["cached_tokens"] - p["exact_tokens"], p
assert s["summary"] and s["prompts"] == 1 and s["first_token_agreement"] == 1.0, s' "$work/f.json" || fail "bad fidelity result: $(cat "$work/f.json")"
    "$pc" fidelity --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      --recompute 0 --tokens 4 >"$work/f.txt" 2>&1 || fail "fidelity text: $(cat "$work/f.txt")"
    expect_in "first-token agreement" "$work/f.txt"
    "$pc" fidelity --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      --recompute 1.5 >"$work/bad.txt" 2>&1; rc=$?
    [ "$rc" = 2 ] || fail "--recompute 1.5 exit $rc, expected 2"
    expect_in "--recompute" "$work/bad.txt"
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      --recompute 0.2 --recompute-criterion boundary -n 2 --json >"$work/r.json" 2>"$work/r.err" || fail "run --recompute: $(cat "$work/r.err")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["recomputed_tokens"] > 0 and len(j["token_ids"]) == 2, j' "$work/r.json" || fail "bad run --recompute result"
    # A schema's recompute attribute is the default; --recompute 0 overrides it.
    sed 's/<schema name="\([^"]*\)"/<schema name="\1" recompute="1"/' "$src/schemas/trip.xml" >"$work/trip-r.xml"
    grep -q 'recompute="1"' "$work/trip-r.xml" || fail "could not add the recompute attribute"
    "$pc" run --model "$work/tiny" --schema "$work/trip-r.xml" --prompt "$src/schemas/trip.prompt.xml" \
      -n 1 --json >"$work/d.json" 2>"$work/d.err" || fail "run with a schema default: $(cat "$work/d.err")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["recomputed_tokens"] == j["cached_tokens"] - j["exact_tokens"] > 0, j' "$work/d.json" || fail "the schema default did not apply: $(cat "$work/d.json")"
    "$pc" run --model "$work/tiny" --schema "$work/trip-r.xml" --prompt "$src/schemas/trip.prompt.xml" \
      --recompute 0 -n 1 --json >"$work/z.json" 2>"$work/z.err" || fail "run --recompute 0: $(cat "$work/z.err")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["recomputed_tokens"] == 0, j' "$work/z.json" || fail "--recompute 0 did not override: $(cat "$work/z.json")"
    # A module's own budget applies with no share given; the prompt overrides and adds budgets.
    # guide follows a gap (rainy is shorter than the union); city and rainy are the exact
    # leading run, so budgets there recompute nothing.
    sed 's/<module name="guide"/<module name="guide" recompute="5"/' "$src/schemas/trip.xml" >"$work/trip-m.xml"
    grep -q 'recompute="5"' "$work/trip-m.xml" || fail "could not add the module's recompute attribute"
    sed -e 's|<guide name="Anna"/>|<guide name="Anna" recompute="2"/>|' -e 's|<rainy/>|<rainy recompute="3"/>|' \
      "$src/schemas/trip.prompt.xml" >"$work/trip-m.prompt.xml"
    grep -q 'recompute="2"' "$work/trip-m.prompt.xml" || fail "could not add the prompt's override"
    for p in "$src/schemas/trip.prompt.xml:5" "$work/trip-m.prompt.xml:2"; do
      "$pc" run --model "$work/tiny" --schema "$work/trip-m.xml" --prompt "${p%:*}" -n 1 --json \
        >"$work/m.json" 2>"$work/m.err" || fail "run with a module budget: $(cat "$work/m.err")"
      python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["recomputed_tokens"] == int(sys.argv[2]), j' \
        "$work/m.json" "${p##*:}" || fail "module budget: expected ${p##*:} recomputed: $(cat "$work/m.json")"
    done
    sed 's|<city/>|<city recompute="1.5"/>|' "$src/schemas/trip.prompt.xml" >"$work/bad.prompt.xml"
    "$pc" run --model "$work/tiny" --schema "$work/trip-m.xml" --prompt "$work/bad.prompt.xml" -n 1 \
      >"$work/bad.out" 2>&1 && fail "a bad recompute override was accepted"
    expect_in 'bad.prompt.xml:2' "$work/bad.out"
    expect_in 'recompute="1.5" on <city>' "$work/bad.out"
    ;;
  tiers_budget)
    # A tiny host budget: the same answer as without one; the stats say spans were evicted and
    # re-read from the cache folder, none compiled again.
    tiny
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      -n 4 --json --cache-dir "$work/cache" >"$work/plain.json" 2>"$work/e" || fail "run: $(cat "$work/e")"
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      -n 4 --json --stats --cache-dir "$work/cache" --max-host-bytes 1K >"$work/budget.json" 2>"$work/e" || fail "run budget: $(cat "$work/e")"
    python3 - "$work/plain.json" "$work/budget.json" <<'PY' || fail "budgeted run differs or stats are wrong"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["token_ids"] == b["token_ids"], (a["token_ids"], b["token_ids"])
t = b["tiers"]
assert t["host"]["max_bytes"] == 1024 and t["evictions"] > 0 and t["file_loads"] > 0, t
assert t["recompiles"] == 0, t
PY
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      --max-host-bytes 12Q >/dev/null 2>"$work/e" && fail "a bad size was accepted"
    expect_in "--max-host-bytes: expects a byte count" "$work/e"
    ;;
  redis_two_process)
    # Process 1 compiles into Redis; process 2 (fresh) answers without any compile pass.
    redis=$(command -v redis-server || true)
    [ -n "$redis" ] || { echo "SKIPPED: redis-server is not installed (Debian: redis-server)"; exit 77; }
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$redis" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >"$work/redis.log" 2>&1 &
    rpid=$!
    disown "$rpid"  # killed at the end: no job notice
    trap 'kill -9 $rpid 2>/dev/null; rm -rf "$work"' EXIT
    for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1',$port))" 2>/dev/null && break; sleep 0.1; done
    tiny
    url="redis://127.0.0.1:$port"
    # --redis needs the secret its values are sealed with: refused without one, naming the flags.
    unset PROMPTCACHE_CACHE_SECRET
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --redis "$url" >/dev/null 2>"$work/e" && fail "--redis without a secret was accepted"
    expect_in "--cache-secret-file FILE, --cache-secret S or \$PROMPTCACHE_CACHE_SECRET" "$work/e"
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --redis "$url" --cache-secret a --cache-secret-file "$work/e" >/dev/null 2>"$work/e2" && fail "both secret flags were accepted"
    expect_in "give one of them" "$work/e2"
    printf 'the-secret \t\nsecond line\n' >"$work/secret"  # the first line, trailing blanks trimmed
    export PROMPTCACHE_CACHE_SECRET=the-secret
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --redis "$url" --json >"$work/c.json" 2>"$work/e" || fail "compile --redis: $(cat "$work/e")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["source"] == "compiled" and j["tiers"]["remote_puts"] > 0, j' "$work/c.json" || fail "compile did not write to Redis: $(cat "$work/c.json")"
    unset PROMPTCACHE_CACHE_SECRET  # the same secret, from the file
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      -n 4 --redis "$url" --cache-secret-file "$work/secret" --stats --json >"$work/r.json" 2>"$work/r.err" || fail "run --redis: $(cat "$work/r.err")"
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      -n 4 --json >"$work/local.json" 2>"$work/e" || fail "run: $(cat "$work/e")"
    python3 - "$work/r.json" "$work/local.json" "$url" <<'PY' || fail "process 2 compiled, or answered otherwise: $(cat "$work/r.json")"
import json, sys
r, local = (json.load(open(f)) for f in sys.argv[1:3])
assert r["schema_source"] == "loaded from " + sys.argv[3], r["schema_source"]
t = r["tiers"]
assert t["compiled_spans"] == 0 and t["recompiles"] == 0 and t["remote_loads"] > 0, t
assert t["remote_rejected"] == 0 and t["file_rejected"] == 0, t
assert r["token_ids"] == local["token_ids"]
PY
    grep -q "compiling" "$work/r.err" && fail "process 2 showed a compile progress bar"
    export PROMPTCACHE_CACHE_SECRET=the-secret
    # --force compiles past Redis and writes every span again.
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --redis "$url" --json >"$work/c2.json" 2>"$work/e" || fail "compile again: $(cat "$work/e")"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["up_to_date"] and j["tiers"]["compiled_spans"] == 0, j' "$work/c2.json" || fail "a second compile did not load from Redis: $(cat "$work/c2.json")"
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --redis "$url" --force --json >"$work/c3.json" 2>"$work/e" || fail "compile --force: $(cat "$work/e")"
    python3 - "$work/c.json" "$work/c3.json" <<'PY' || fail "compile --force --redis did not compile and write again: $(cat "$work/c3.json")"
import json, sys
first, forced = (json.load(open(f)) for f in sys.argv[1:3])
assert forced["source"] == "compiled" and not forced["up_to_date"], forced
t = forced["tiers"]
assert t["compiled_spans"] > 0 and t["remote_loads"] == 0, t
assert t["remote_puts"] == first["tiers"]["remote_puts"], (t, first["tiers"])
PY
    # Another secret: the values are refused (one line on stderr even without --stats, counted),
    # the schema is compiled, the answer is the same.
    "$pc" run --model "$work/tiny" --schema "$src/schemas/trip.xml" --prompt "$src/schemas/trip.prompt.xml" \
      -n 4 --redis "$url" --cache-secret other --json >"$work/w.json" 2>"$work/w.err" || fail "run with another secret: $(cat "$work/w.err")"
    expect_in "failed its check: its MAC does not match" "$work/w.err"
    python3 - "$work/w.json" "$work/local.json" <<'PY' || fail "another secret's run used the values or answered otherwise: $(cat "$work/w.json")"
import json, sys
w, local = (json.load(open(f)) for f in sys.argv[1:3])
assert w["token_ids"] == local["token_ids"]
PY
    # --redis-ttl: every value a compile writes carries the TTL (checked with redis-cli).
    "$pc" compile "$src/schemas/trip.xml" --model "$work/tiny" --redis "$url" --redis-ttl 100 --force >/dev/null 2>"$work/e" || fail "compile --redis-ttl: $(cat "$work/e")"
    if cli=$(command -v redis-cli); then
      n=0
      for k in $("$cli" -p "$port" --scan --pattern 'promptcache:span:*'); do
        ttl=$("$cli" -p "$port" TTL "$k")
        [ "$ttl" -gt 0 ] && [ "$ttl" -le 100 ] || fail "key $k has TTL $ttl after compile --redis-ttl 100"
        n=$((n + 1))
      done
      [ "$n" -gt 0 ] || fail "no span keys in Redis"
    else
      echo "WARN: redis-cli missing: the TTL of the keys was not checked"
    fi
    ;;
  eval_stories260k)
    # examples/eval on the real model: every row answered once, scores that are log-probabilities,
    # a prediction per scored row, an accuracy; the same numbers without the cache.
    need_stories
    ex="$src/examples/eval"
    "$pc" eval --model "$stories" --template plain --schema "$ex/stories.xml" --data "$ex/stories.jsonl" \
      --out "$work/r.jsonl" --json --check 3 >"$work/sum.json" 2>"$work/err" || fail "eval: $(cat "$work/err")"
    "$pc" eval --model "$stories" --template plain --schema "$ex/stories.xml" --data "$ex/stories.jsonl" \
      --out "$work/n.jsonl" --no-cache --batch 3 >/dev/null 2>"$work/err2" || fail "eval --no-cache: $(cat "$work/err2")"
    expect_in "eval: accuracy" "$work/err"
    expect_in "3 rows again without the cache" "$work/err"
    python3 - "$work/r.jsonl" "$work/n.jsonl" "$work/sum.json" "$ex/stories.jsonl" <<'PY' || fail "bad eval output"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
plain = {r["id"]: r for r in map(json.loads, open(sys.argv[2]))}
summary = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
data = [json.loads(l) for l in open(sys.argv[4])]
assert [r["id"] for r in rows] == [d["id"] for d in data], [r["id"] for r in rows]
answered = 0
for r, d in zip(rows, data):
    assert r["prompt_tokens"] > r["cached_tokens"] > 0, r
    assert plain[r["id"]]["cached_tokens"] == 0
    if "choices" in d:
        assert len(r["choices"]) == len(d["choices"])
        for c, p in zip(r["choices"], plain[r["id"]]["choices"]):
            assert c["logprob"] < 0 and len(c["tokens"]) == len(c["logprob_per_token"]) > 0
            assert abs(c["logprob"] - sum(c["logprob_per_token"])) < 1e-6
            if "modules" not in d:  # every module, a prefix: the cache changes nothing
                assert all(abs(a - b) < 1e-4 for a, b in zip(c["logprob_per_token"], p["logprob_per_token"]))
        best = max(range(len(r["choices"])), key=lambda k: r["choices"][k]["logprob"])
        assert r["pred"] == best, r
        answer = d["answer"] if isinstance(d["answer"], int) else d["choices"].index(d["answer"])
        assert r["correct"] == (r["pred"] == answer)
        answered += 1
    else:
        assert len(r["text"]) > 10, r
        assert r["text"] == plain[r["id"]]["text"]
assert summary["rows"] == len(data) and summary["failed"] == 0 and summary["answered"] == answered
assert summary["accuracy"] == sum(r.get("correct", False) for r in rows) / answered
assert summary["accuracy"] >= 0.5, summary  # the real model knows how these stories end
assert summary["check"]["rows"] == 3
print("stories260K accuracy:", summary["accuracy"], "rows/s:", round(summary["rows_per_s"], 1))
PY
    ;;
  eval_check_fidelity)
    # --check on generated rows reports the agreement `promptcache fidelity` measures, with the
    # run's recompute: a prefix row and a row after a gap ("park" left out); at --recompute 1
    # every cached token runs in its full context, so both agree with the no-cache run exactly.
    need_stories
    ex="$src/examples/eval"
    printf '%s\n' '{"id": "prefix", "prompt": "One day, Lily went to the park and", "max_tokens": 12}' \
      '{"id": "gap", "modules": ["instruction", "home"], "prompt": "Tim was tired, so he", "max_tokens": 12}' \
      '{"id": "scored", "prompt": "Lily had a red", "choices": ["ball", "tree"], "answer": 0}' >"$work/d.jsonl"
    for r in none 1; do
      extra=()
      [ "$r" = none ] || extra=(--recompute "$r")
      "$pc" eval --model "$stories" --template plain --schema "$ex/stories.xml" --data "$work/d.jsonl" \
        --out "$work/r-$r.jsonl" --json --check 3 "${extra[@]}" >"$work/sum-$r.json" 2>"$work/err-$r" || fail "eval --check ($r): $(cat "$work/err-$r")"
      expect_in "greedy against no cache" "$work/err-$r"
    done
    python3 - "$work/sum-none.json" "$work/sum-1.json" <<'PY' || fail "bad --check fidelity: $(cat "$work/sum-none.json" "$work/sum-1.json")"
import json, sys
plain, full = (json.loads(open(f).read().strip().splitlines()[-1])["check"] for f in sys.argv[1:3])
for c in (plain, full):
    assert c["rows"] == 3 and c["generated"] == 2 and c["scored"] == 1, c
    for k in ("first_token_agreement", "exact_agreement"):
        assert 0 <= c[k] <= 1, c
    assert c["mean_agreed_tokens"] > 0 and c["mean_first_token_kl"] >= 0, c
assert plain["recompute"] == 0 and full["recompute"] == 1, (plain, full)
assert full["first_token_agreement"] == 1 and full["exact_agreement"] == 1, full
assert full["mean_first_token_kl"] < 1e-6, full
assert full["mean_first_token_kl"] <= plain["mean_first_token_kl"] + 1e-9, (plain, full)
print("eval --check: r = 0", plain, "r = 1", full)
PY
    # A bad share is refused before any row runs.
    "$pc" eval --model "$stories" --template plain --schema "$ex/stories.xml" --data "$work/d.jsonl" \
      --out "$work/bad.jsonl" --check 1 --recompute 1.5 >/dev/null 2>"$work/bad.err" && fail "eval --recompute 1.5 succeeded"
    expect_in "--recompute" "$work/bad.err"
    ;;
  eval_resume)
    # A run killed with SIGKILL mid-way and run again: every id exactly once, with the rows of the
    # first run kept; a line cut short by the kill is removed and its row run again.
    tiny
    printf '%s\n' '<schema name="quiz"><module name="rules">Answer the question about the trip.</module>' \
      '<module name="shots">Q: Where is the hotel? A: near the sea. Q: When do we leave? A: at noon.</module></schema>' >"$work/s.xml"
    python3 - "$work/d.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(600):
        row = {"id": i, "prompt": "Q: question number %d about the trip? A:" % i}
        if i % 2:
            row["choices"] = ["yes", "no, at noon", "near the sea"][: 2 + i % 4 // 2]
            row["answer"] = 1
        else:
            row["max_tokens"] = 12
        f.write(json.dumps(row) + "\n")
PY
    args=(eval --model "$work/tiny" --schema "$work/s.xml" --data "$work/d.jsonl" --out "$work/r.jsonl" --batch 4)
    "$pc" "${args[@]}" >/dev/null 2>"$work/1.err" &
    pid=$!
    for _ in $(seq 1200); do
      [ -f "$work/r.jsonl" ] && [ "$(wc -l <"$work/r.jsonl")" -ge 40 ] && break
      sleep 0.05
    done
    kill -9 $pid 2>/dev/null || fail "the run ended before it could be killed: $(cat "$work/1.err")"
    wait $pid 2>/dev/null
    first=$(wc -l <"$work/r.jsonl")
    { [ "$first" -ge 40 ] && [ "$first" -lt 600 ]; } || fail "killed after $first rows"
    cp "$work/r.jsonl" "$work/first.jsonl"
    printf '{"id": 99999, "text": "cut sh' >>"$work/r.jsonl"  # as if the kill hit a write
    "$pc" "${args[@]}" --json >"$work/sum.json" 2>"$work/2.err" || fail "rerun: $(cat "$work/2.err")"
    expect_in "the last line was cut short" "$work/2.err"
    python3 - "$work/r.jsonl" "$work/first.jsonl" "$work/sum.json" "$first" <<'PY' || fail "resume lost or repeated rows"
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first = [json.loads(l) for l in open(sys.argv[2])]
summary = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
ids = collections.Counter(r["id"] for r in rows)
assert sorted(ids) == list(range(600)), sorted(set(range(600)) - set(ids))
assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1]
assert rows[: len(first)] == first  # the first run's rows are kept as they were
assert summary["resumed"] == int(sys.argv[4]) and summary["rows"] == 600 - int(sys.argv[4]), summary
assert summary["answered"] == 300 and summary["failed"] == 0, summary
PY
    # A third run has nothing left to do.
    "$pc" "${args[@]}" --json >"$work/sum3.json" 2>/dev/null || fail "third run"
    python3 -c 'import json,sys; s=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert s["rows"] == 0 and s["resumed"] == 600, s' "$work/sum3.json" || fail "third run ran rows"
    [ "$(wc -l <"$work/r.jsonl")" = 600 ] || fail "third run wrote lines"
    ;;
  eval_bad_lines)
    # Bad lines are reported with their line numbers and skipped; every good row is answered, in
    # a batch that mixes module sets and lengths; --strict stops at the first bad line after
    # answering the rows before it.
    tiny
    python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
open(work + "/s.xml", "w").write(
    '<schema name="quiz"><module name="rules">Answer the question.</module>\n'
    '<union scaffold="a"><module name="a">Q: Where is the hotel? A: near the sea.</module>\n'
    '<module name="b">Q: When do we leave? A: at noon, after lunch, with the bus.</module></union>\n'
    '<module name="note">Note <parameter name="who" length="4" scaffold="someone"/> is coming.</module>'
    '</schema>\n')
lines = [
    json.dumps({"id": "ok1", "prompt": "Q: Where? A:", "choices": ["sea", "mountain"], "answer": 0}),
    "this is not json",
    json.dumps({"id": "unknown", "modules": ["rules", "nope"], "prompt": "Q: A:", "choices": ["x"]}),
    json.dumps({"id": "notlist", "prompt": "Q: A:", "choices": "yes"}),
    json.dumps({"id": "long", "prompt": "the cat sat on the mat. " * 700, "choices": ["x"]}),
    "",
    json.dumps({"id": "ok2", "modules": [{"name": "note", "arguments": {"who": "Tom"}}],
                "prompt": "Who is coming?", "choices": ["Tom", "nobody at all"], "answer": "Tom"}),
    '{"id": "deep", "prompt": "x", "extra": ' + "[" * 200 + "]" * 200 + "}",
    json.dumps({"id": "union", "modules": ["a", "b"], "prompt": "x", "choices": ["y"]}),
    json.dumps({"id": "badanswer", "prompt": "Q: A:", "choices": ["a", "b"], "answer": 5}),
    json.dumps({"id": "ok1", "prompt": "again", "max_tokens": 3}),
    json.dumps({"id": "ok3", "modules": [{"name": "b"}], "prompt": "Q: When? A:", "max_tokens": 5}),
    json.dumps({"prompt": "Q: A: ", "choices": ["a", "bb", "ccc"]}),
    json.dumps({"id": "other", "prompt": '<prompt schema="trip"><rules/> x</prompt>', "choices": ["y"]}),
]
open(work + "/d.jsonl", "w").write("\n".join(lines) + "\n")
PY
    "$pc" eval --model "$work/tiny" --schema "$work/s.xml" --data "$work/d.jsonl" --out "$work/r.jsonl" \
      --batch 8 --json >"$work/sum.json" 2>"$work/err" || fail "eval exit $?: $(cat "$work/err")"
    for expected in "d.jsonl:2: the line is not valid JSON" "d.jsonl:3: schema 'quiz' has no module 'nope'" \
      "d.jsonl:4: 'choices' must be a list" "d.jsonl:5: the prompt needs positions up to" \
      "d.jsonl:8: the line nests deeper than 64" "d.jsonl:9: modules 'a' and 'b' are members of one union" \
      "d.jsonl:10: 'answer' 5 is not an index" "d.jsonl:11: id \"ok1\" was already used at line 1" \
      "d.jsonl:14: the PML prompt names schema 'trip', but this run evaluates 'quiz'"; do
      expect_in "$expected" "$work/err"
    done
    python3 - "$work/r.jsonl" "$work/sum.json" <<'PY' || fail "wrong rows: $(cat "$work/r.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
summary = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert [r["id"] for r in rows] == ["ok1", "ok2", "ok3", 13], [r["id"] for r in rows]
assert summary["failed"] == 9 and summary["rows"] == 4, summary
assert rows[1]["correct"] in (True, False) and "text" in rows[2] and len(rows[3]["choices"]) == 3
assert len({r["cached_tokens"] for r in rows[:3]}) == 3, rows
PY
    # Each row of that mixed batch equals the row run alone (--batch 1).
    "$pc" eval --model "$work/tiny" --schema "$work/s.xml" --data "$work/d.jsonl" --out "$work/one.jsonl" \
      --batch 1 >/dev/null 2>&1 || fail "eval --batch 1"
    python3 - "$work/r.jsonl" "$work/one.jsonl" <<'PY' || fail "a batched row differs from the row alone"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert [r["id"] for r in a] == [r["id"] for r in b]
for x, y in zip(a, b):
    if "text" in x:
        assert x["text"] == y["text"], (x, y)
        continue
    for c, d in zip(x["choices"], y["choices"]):
        assert c["tokens"] == d["tokens"]
        assert all(abs(p - q) < 1e-4 for p, q in zip(c["logprob_per_token"], d["logprob_per_token"])), (c, d)
PY
    "$pc" eval --model "$work/tiny" --schema "$work/s.xml" --data "$work/d.jsonl" --out "$work/strict.jsonl" \
      --strict >/dev/null 2>"$work/strict.err"
    [ $? -eq 1 ] || fail "--strict: expected exit 1"
    expect_in "d.jsonl:2:" "$work/strict.err"
    grep -q "d.jsonl:3:" "$work/strict.err" && fail "--strict went on after the first bad line"
    [ "$(wc -l <"$work/strict.jsonl")" = 1 ] || fail "--strict: the row before the bad line is missing"
    # --limit: only the first N rows (bad ones count).
    "$pc" eval --model "$work/tiny" --schema "$work/s.xml" --data "$work/d.jsonl" --out "$work/lim.jsonl" \
      --limit 2 --json >"$work/lim.json" 2>/dev/null || fail "--limit"
    python3 -c 'import json,sys; s=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert s["rows"] == 1 and s["failed"] == 1, s' "$work/lim.json" || fail "--limit counted wrong"
    ;;
  *) fail "unknown case" ;;
esac
echo "PASS ($case_name)"
