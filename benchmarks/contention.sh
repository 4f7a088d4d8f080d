#!/usr/bin/env bash
# Decode rate when other processes hold the cores: `promptcache generate --json` on one model,
# first on an idle machine, then beside 1 and 2 busy processes (`while :; do :; done`, nice 0),
# for each CLI binary given (e.g. a build before and after a change, measured in the same run so
# the machine's state is the same for both). One JSON line per (binary, busy processes, repeat);
# the last lines give each binary's median tokens/s per busy count.
#
#   benchmarks/contention.sh MODEL BIN [BIN...]
#
# Environment: TOKENS (new tokens, 64), REPEATS (runs per cell, 3), BUSY (busy-process counts,
# "0 1 2"), TEXT (the prompt), EXTRA (more generate flags, e.g. "--weights bf16").
set -euo pipefail
if (($# < 2)); then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
model=$1
shift
tokens=${TOKENS:-64}
repeats=${REPEATS:-3}
busy_counts=${BUSY:-0 1 2}
text=${TEXT:-Once upon a time}
read -r -a extra <<<"${EXTRA:-}"
busy_pids=()
stop_busy() {
  for pid in "${busy_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${busy_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  busy_pids=()
}
trap stop_busy EXIT
results=$(mktemp)
echo "{\"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\"," \
  "\"cores\": $(nproc), \"loadavg_before\": \"$(cut -d' ' -f1-4 /proc/loadavg)\"}"
for busy in $busy_counts; do
  for ((i = 0; i < busy; i++)); do
    bash -c 'while :; do :; done' &
    busy_pids+=($!)
  done
  sleep 1
  for ((r = 0; r < repeats; r++)); do
    # Alternate the binaries within a repeat, so a change in the machine hits both alike.
    for bin in "$@"; do
      rate=$("$bin" generate --model "$model" --text "$text" -n "$tokens" --json "${extra[@]}" \
        2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["decode_tokens_per_s"])')
      line="{\"binary\": \"$bin\", \"busy\": $busy, \"repeat\": $r, \"decode_tokens_per_s\": $rate}"
      echo "$line"
      echo "$line" >>"$results"
    done
  done
  stop_busy
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cells = {}
for r in rows:
    cells.setdefault((r["binary"], r["busy"]), []).append(r["decode_tokens_per_s"])
for (binary, busy), rates in cells.items():
    print(json.dumps({"binary": binary, "busy": busy, "median_decode_tokens_per_s": round(statistics.median(rates), 1), "runs": len(rates)}))
PY
rm -f "$results"
