#!/usr/bin/env bash
# Builds the library and a test suite with a sanitizer in their own build folder and runs it
# once (docs/reliability.md, "Sanitizers").
#
#   scripts/sanitize.sh asan   AddressSanitizer + UBSan (PROMPTCACHE_SANITIZE) into build-asan:
#                              every Catch2 suite (scripts/test.sh runs this after the normal
#                              suite)
#   scripts/sanitize.sh tsan   ThreadSanitizer (PROMPTCACHE_TSAN) into build-tsan: the server's
#                              tests (tests/server) and concurrency_tests (the engine's 8-thread
#                              stress test, the span and Redis tiers, stored states, the kernel
#                              work pool), each suite one process; scripts/test.sh runs this
#                              after the ASan pass
#
# The ASan pass runs every Catch2 test of the library's suites, those on the real stories260K
# model and the contract suites at the bf16 defaults included: tokenizers, Jinja, PML, cache,
# engine, batch, contracts, the bad-input catalogue, the kernels, GGUF, fidelity with recompute
# and the server (tests/server, in process over a tiny model). CLI scripts, examples and the fuzz
# replays stay in the normal pass (the fuzz targets run under ASan + UBSan themselves). Each pass
# builds only the targets its tests link. Environment: BUILD_DIR (build-asan / build-tsan), JOBS
# (build jobs, 2), NICE (10).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
jobs=${JOBS:-2}
nice_level=${NICE:-10}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
fi
common=(-DCMAKE_BUILD_TYPE=Release -DPROMPTCACHE_BUILD_BENCHMARKS=OFF
  -DPROMPTCACHE_BUILD_EXAMPLES=OFF "${launcher[@]}")

banner() { printf '\n======== %s ========\n' "$*"; }

case "$mode" in
  asan)
    build=${BUILD_DIR:-build-asan}
    targets=(pml_tests bpe_tests jinja_tests cache_tests contract_tests bad_input_tests
      model_tests fidelity_tests server_tests)
    # Built and run where CMake configured them (tokenizer_tests: where libsentencepiece is).
    optional=(tokenizer_tests)
    # CTest entries besides the suites' "suite:test case" ones: the contract suites at the bf16
    # defaults.
    also='contract_tests_bf16_default'
    whole_suites=0
    flags=(-DPROMPTCACHE_SANITIZE=ON)
    # LibTorch's and OpenBLAS's allocations live until exit; a leak report at exit is theirs.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    ;;
  tsan)
    build=${BUILD_DIR:-build-tsan}
    targets=(server_tests concurrency_tests)
    optional=()
    # Under TSan each suite is one CTest entry (tests/CMakeLists.txt): one process per suite.
    whole_suites=1
    flags=(-DPROMPTCACHE_TSAN=ON)
    # Debian's LibTorch and libgomp are not instrumented: tests/tsan.supp names only their frames.
    # One OpenMP/intra-op thread keeps LibTorch's own pool out of the run; the library's kernel
    # work pool (instrumented) still runs with its default threads.
    export TSAN_OPTIONS=${TSAN_OPTIONS:-"suppressions=$PWD/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1 history_size=4"}
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    ;;
  *)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac

start=$(date +%s)
banner "sanitizer pass ($mode): configure and build ${targets[*]} in $build"
cmake -S . -B "$build" "${common[@]}" "${flags[@]}" >/dev/null
# The target list read whole before grep looks at it: `cmake ... | grep -q` under pipefail failed
# whenever grep's early exit cut cmake's output (SIGPIPE), and the suite was silently left out.
configured=$(cmake --build "$build" --target help)
for target in "${optional[@]}"; do
  if grep -qw "$target" <<<"$configured"; then
    targets+=("$target")
  else
    echo "sanitizer pass ($mode): $target is not configured in this build; its tests do not run"
  fi
done
suites=$(IFS='|'; echo "${targets[*]}")
if ((whole_suites)); then
  include="^(${suites})\$"
else
  # Every test of the suites built (CTest names "suite:test case"), and the `also` entries.
  include="^((${suites}):|${also}\$)"
fi
nice -n "$nice_level" cmake --build "$build" -j"$jobs" --target "${targets[@]}"
built=$(date +%s)
banner "sanitizer pass ($mode): run (${ASAN_OPTIONS:+ASAN_OPTIONS=$ASAN_OPTIONS }${TSAN_OPTIONS:+TSAN_OPTIONS=$TSAN_OPTIONS})"
status=0
nice -n "$nice_level" ctest --test-dir "$build" --output-on-failure -j"$jobs" \
  -R "$include" --no-tests=error || status=$?
end=$(date +%s)
banner "sanitizer pass ($mode): $( ((status == 0)) && echo passed || echo FAILED)" \
  "(build $((built - start)) s, tests $((end - built)) s)"
exit "$status"
