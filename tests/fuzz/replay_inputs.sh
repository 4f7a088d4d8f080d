#!/usr/bin/env bash
# replay_inputs.sh FUZZ_BINARY DIR... — runs a libFuzzer binary once over every file in the
# folders (missing folders are skipped; README.md files describe a folder and are skipped), as
# `scripts/fuzz.sh replay` and the CTest entries of the fuzz build do. Exit status: the binary's.
set -euo pipefail
binary=$1
shift
files=()
for dir in "$@"; do
  [[ -d $dir ]] || continue
  while IFS= read -r -d '' f; do files+=("$f"); done \
    < <(find "$dir" -type f ! -name README.md -print0 | sort -z)
done
if ((${#files[@]} == 0)); then
  echo "$(basename "$binary"): no inputs"
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Each file argument runs once. Leaks are findings too.
set +e
"$binary" -rss_limit_mb=4096 -timeout=10 -detect_leaks=1 "${files[@]}" >"$log" 2>&1
status=$?
set -e
grep -v -e '^Running: ' -e '^Executed ' "$log" || true
echo "$(basename "$binary"): ${#files[@]} inputs replayed, exit status $status"
exit "$status"
