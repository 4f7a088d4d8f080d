#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of tests/fuzz (docs/fuzzing.md).
#
#   scripts/fuzz.sh build                    configure + build ${BUILD_DIR:-build-fuzz} (clang)
#   scripts/fuzz.sh run [TARGET|all] [SECS]  fuzz each target (or one) for SECS seconds (600)
#   scripts/fuzz.sh replay [TARGET|all]      run the seeds and saved crashes once (fast)
#   scripts/fuzz.sh list                     the target names
#   scripts/fuzz.sh ci [SECS]                CI's pass (scripts/test.sh): build the LibTorch-free
#                                            targets, fuzz each for SECS seconds (30) from the
#                                            seeds and regressions; fails on any finding
#
# run: one target at a time, one job, one worker, -rss_limit_mb=4096 -timeout=10, under nice.
# New coverage goes to BUILD_DIR/corpus/TARGET/ (tests/fuzz/corpus/TARGET/ is read, not
# written); crashing inputs to BUILD_DIR/findings/TARGET/; the logs to
# BUILD_DIR/logs/TARGET/round-N.log (a timeout that does not reproduce on its own is set aside
# and fuzzing resumes for the rest of the time, in a new round).
# Per target it prints executions, coverage (edges and features) and the number of findings.
# Copy a finding into tests/fuzz/regressions/TARGET/ once it is fixed: the replay test
# (fuzz_replay in the normal build, `replay` here) then keeps it fixed.
# Environment: BUILD_DIR, CXX (clang++-14), FUZZ_ARGS (extra libFuzzer flags), NICE (10),
# JOBS (build jobs, 2), NO_BUILD=1 (run/replay what is already built), FUZZ_CI_SECONDS (ci: 30),
# FUZZ_CI_TARGETS (ci: the targets, default the LibTorch-free ones; "all" for every target).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD_DIR:-build-fuzz}
cxx=${CXX:-clang++-14}
nice_level=${NICE:-10}
targets=(schema prompt tokenizer_json sentencepiece safetensors cache_file redis_value)
declare -A dict=([schema]=pml.dict [prompt]=pml.dict [tokenizer_json]=json.dict
  [safetensors]=json.dict [cache_file]=json.dict)
# The server's edge and config.json (issue 31).
targets+=(http_request openai_json posted_pml config_json)
dict+=([http_request]=request.dict [openai_json]=request.dict [posted_pml]=posted_pml.dict
  [config_json]=config.dict)
# An eval dataset's lines (issue 33).
targets+=(eval_row)
dict+=([eval_row]=request.dict)
# Jinja chat templates (issue 34).
targets+=(chat_template)
dict+=([chat_template]=jinja.dict)
# GGUF model files (issue 34).
targets+=(gguf)
# What CI fuzzes: the targets that link no LibTorch (redis_value checks values through the
# LibTorch-free sealed::open). Their clang build takes minutes; the clang build of the LibTorch
# library (safetensors, cache_file) would add ~20 minutes to CI, and those two keep their seeds
# and regressions replayed by fuzz_replay in the normal pass (docs/fuzzing.md, "In CI").
ci_targets=(schema prompt tokenizer_json sentencepiece http_request openai_json posted_pml
  config_json redis_value eval_row chat_template gguf)

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

build() {
  [[ ${NO_BUILD:-0} == 1 ]] && return 0
  local launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    # Paths under the checkout are hashed relative to it, so a clone elsewhere (CI) hits the cache.
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
    # Precompiled headers are only cached with this sloppiness.
    export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  fi
  nice -n "$nice_level" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" -DPROMPTCACHE_FUZZ=ON \
    -DPROMPTCACHE_BUILD_TESTS=OFF -DPROMPTCACHE_BUILD_BENCHMARKS=OFF \
    -DPROMPTCACHE_BUILD_EXAMPLES=OFF >/dev/null
  nice -n "$nice_level" cmake --build "$build" --target "${selected[@]/#/fuzz_}" \
    -j"${JOBS:-2}"
}

select_targets() {
  local want=${1:-all}
  if [[ $want == all ]]; then
    selected=("${targets[@]}")
  elif [[ " ${targets[*]} " == *" $want "* ]]; then
    selected=("$want")
  else
    echo "fuzz.sh: unknown target '$want' (targets: ${targets[*]})" >&2
    exit 2
  fi
}

# Executions, coverage and findings of one run, from its log and findings folder.
# Executions (summed over the rounds), coverage and findings of one target's run.
summary() {
  local t=$1 out=$2 seconds=$3 rounds=$4 spurious=$5
  local execs=0 n cov ft corp findings last
  for log in "$out"/round-*.log; do
    n=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
    execs=$((execs + ${n:-0}))
    last=$log
  done
  cov=$(grep -o 'cov: [0-9]*' "$last" | tail -1 | grep -o '[0-9]*$' || true)
  ft=$(grep -o 'ft: [0-9]*' "$last" | tail -1 | grep -o '[0-9]*$' || true)
  corp=$(grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' "$last" | tail -1 | cut -d' ' -f2 || true)
  # Only this run's: earlier findings stay in the folder until they are cleaned up.
  findings=$(find "$build/findings/$t" -maxdepth 1 -type f ! -name 'slow-unit-*' \
    -newer "$out/started" 2>/dev/null | wc -l)
  printf '%-15s %6ss  executions %-10s coverage %-6s features %-7s corpus %-12s findings %s' \
    "$t" "$seconds" "$execs" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$findings"
  ((rounds > 1)) && printf '  (%s rounds, %s spurious timeouts)' "$rounds" "$spurious"
  printf '\n'
  ((execs > 0))
}

run() {
  local seconds=$1 status=0
  for t in "${selected[@]}"; do
    local out="$root/$build/logs/$t"
    rm -rf "$out"
    mkdir -p "$out" "$build/corpus/$t" "$build/findings/$t/spurious"
    touch "$out/started"
    local args=(-rss_limit_mb=4096 -timeout=10 -jobs=1 -workers=1 -print_final_stats=1
      -artifact_prefix="$root/$build/findings/$t/")
    [[ -n ${dict[$t]:-} ]] && args+=(-dict="$root/tests/fuzz/${dict[$t]}")
    # libFuzzer exits at once on a folder that does not exist: only those that do are passed.
    local dirs=("$root/$build/corpus/$t")
    [[ -d tests/fuzz/corpus/$t ]] && dirs+=("$root/tests/fuzz/corpus/$t")
    [[ -d tests/fuzz/regressions/$t ]] && dirs+=("$root/tests/fuzz/regressions/$t")
    echo "== fuzzing $t for ${seconds}s (logs: $build/logs/$t/round-N.log)"
    local begin round=0 spurious=0 remaining=$seconds
    begin=$(date +%s)
    while ((remaining > 0)); do
      round=$((round + 1))
      touch "$out/round-$round.started"
      # With -jobs=1 -workers=1 libFuzzer runs the fuzzing in one child process whose output
      # goes to fuzz-0.log in the current folder. Single-threaded LibTorch/OpenMP/BLAS: one
      # input at a time on one core.
      (cd "$out" && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n "$nice_level" \
        "$root/$build/fuzz/fuzz_$t" -max_total_time="$remaining" "${args[@]}" ${FUZZ_ARGS:-} \
        "${dirs[@]}" >"driver-$round.log" 2>&1) || true
      local log="$out/round-$round.log"
      if [[ -f $out/fuzz-0.log ]]; then
        mv "$out/fuzz-0.log" "$log"
      else
        cp "$out/driver-$round.log" "$log"
      fi
      remaining=$((seconds - ($(date +%s) - begin)))
      grep -q -E '^==[0-9]+==ERROR|ERROR: libFuzzer|deadly signal' "$log" || break
      # A timeout may be the machine, not the input: on this shared machine a niced process is
      # sometimes stopped or starved for many seconds. Each new timeout is run again on its
      # own; one that then passes is set aside (findings/TARGET/spurious/) and fuzzing resumes
      # for the rest of the time. Anything else ends the run.
      local real=0
      while IFS= read -r -d '' f; do
        if ! grep -q 'ERROR: libFuzzer: timeout' "$log" || [[ $(basename "$f") != timeout-* ]]; then
          real=1
        elif OMP_NUM_THREADS=1 "$root/$build/fuzz/fuzz_$t" -timeout=10 "$f" >/dev/null 2>&1; then
          echo "   $(basename "$f"): timeout not reproducible on its own: set aside, resuming"
          mv "$f" "$build/findings/$t/spurious/"
          spurious=$((spurious + 1))
        else
          real=1
        fi
      done < <(find "$build/findings/$t" -maxdepth 1 -type f ! -name 'slow-unit-*' \
        -newer "$out/round-$round.started" -print0)
      if ((real)); then
        status=1
        grep -E -A30 '^==[0-9]+==ERROR|ERROR: libFuzzer|deadly signal|uncaught|terminate' \
          "$log" | grep -v '^    #[0-9]' | head -40 || true
        break
      fi
    done
    # A target that ran no input has not been fuzzed: that fails the pass, never a silent 0.
    summary "$t" "$out" "$seconds" "$round" "$spurious" || {
      echo "   $t ran no input (see $build/logs/$t/round-1.log)"
      status=1
    }
  done
  return $status
}

replay() {
  local status=0
  for t in "${selected[@]}"; do
    OMP_NUM_THREADS=1 bash tests/fuzz/replay_inputs.sh "$build/fuzz/fuzz_$t" \
      tests/fuzz/corpus/$t tests/fuzz/regressions/$t || status=1
  done
  return $status
}

mode=${1:-}
case $mode in
  build)
    select_targets "${2:-all}"
    build
    ;;
  run)
    select_targets "${2:-all}"
    build
    run "${3:-600}"
    ;;
  replay)
    select_targets "${2:-all}"
    build
    replay
    ;;
  list) printf '%s\n' "${targets[@]}" ;;
  ci)
    # One banner per step, as scripts/sanitize.sh prints them, so the CI log shows the pass.
    seconds=${2:-${FUZZ_CI_SECONDS:-30}}
    want=${FUZZ_CI_TARGETS:-${ci_targets[*]}}
    [[ $want == all ]] && want=${targets[*]}
    read -r -a selected <<<"$want"
    for t in "${selected[@]}"; do
      [[ " ${targets[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t'" >&2; exit 2; }
    done
    start=$(date +%s)
    printf '\n======== fuzz pass (ci): build %s in %s (clang, ASan + UBSan) ========\n' \
      "${selected[*]}" "$build"
    build
    built=$(date +%s)
    printf '\n======== fuzz pass (ci): fuzz each target for %ss ========\n' "$seconds"
    status=0
    run "$seconds" || status=$?
    end=$(date +%s)
    printf '\n======== fuzz pass (ci): %s (build %s s, fuzzing %s s) ========\n' \
      "$( ((status == 0)) && echo passed || echo 'FAILED: a target found something (above)')" \
      "$((built - start))" "$((end - built))"
    exit "$status"
    ;;
  *) usage ;;
esac
