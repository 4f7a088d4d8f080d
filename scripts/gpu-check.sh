#!/usr/bin/env bash
# GPU check: builds promptcache against PyTorch's bundled LibTorch (2.x, CUDA), runs the model,
# engine and contract suites on the GPU, then bench_ttft in f16 and bf16 and bench_batch in f16,
# and prints a summary (also written to $OUT/summary.txt, with the test logs and the benchmarks'
# JSON lines beside it: eight files, what the device tool brings back at most).
#
#   scripts/gpu-debs.sh                         # here, once: the Debian packages, into .gpu-debs/
#   scripts/gpu-check.sh [--device cuda|cpu] [--repeats N] [--schema 512,1024,2048,4096]
#
# Needs: python3 with torch (or TORCH_CMAKE_PREFIX set to LibTorch's cmake folder), cmake and a
# C++17 compiler. The Debian -dev packages this project needs (pugixml, fmt, nlohmann-json,
# catch2, cli11, sentencepiece) are used from the system when present; otherwise the .deb files in
# $DEB_DIR (default .gpu-debs) are unpacked into a private prefix (dpkg-deb, or ar + tar).
# --device cpu runs the same steps on the CPU: a dry run of this script on a machine without a GPU
# (with --schema 512 --repeats 1: f16 on a CPU is slow).
set -uo pipefail
caller=$(pwd)
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
[ -n "${OUT:-}" ] && OUT=$(absolute "$OUT")
[ -n "${DEB_DIR:-}" ] && DEB_DIR=$(absolute "$DEB_DIR")
[ -n "${BUILD_DIR:-}" ] && BUILD_DIR=$(absolute "$BUILD_DIR")
cd "$(dirname "$0")/.."
device=cuda
repeats=3
schema=512,1024,2048,4096
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=${2:?--device needs cuda or cpu}; shift 2 ;;
    --repeats) repeats=${2:?--repeats needs a number}; shift 2 ;;
    --schema) schema=${2:?--schema needs a list of token counts}; shift 2 ;;
    *) echo "gpu-check: unknown argument '$1' (usage: scripts/gpu-check.sh [--device cuda|cpu] [--repeats N] [--schema LIST])" >&2; exit 2 ;;
  esac
done
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
: >"$out/summary.txt"
log() { echo "[gpu-check] $*" | tee -a "$out/summary.txt"; }
failures=0
start=$(date +%s)
elapsed() { echo "$(($(date +%s) - start)) s"; }

# --- LibTorch ---------------------------------------------------------------------------------
abi_flags=()
if [ -n "${TORCH_CMAKE_PREFIX:-}" ]; then
  prefix_path=$TORCH_CMAKE_PREFIX
  log "LibTorch from TORCH_CMAKE_PREFIX=$prefix_path"
else
  prefix_path=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
    log "python3 with torch is not available (or set TORCH_CMAKE_PREFIX)"; exit 1; }
  log "torch $(python3 -c 'import torch;print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')"
  # Wheels state their std::string ABI; the Debian libraries below use the C++11 one.
  abi=$(python3 -c 'import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null)
  if [ -n "$abi" ]; then
    [ "$abi" = 1 ] || log "warning: this torch uses the pre-C++11 string ABI; libfmt from Debian will not link"
    abi_flags=(-DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$abi")
  fi
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | while read -r l; do log "gpu: $l"; done
  # LibTorch's CMake config otherwise compiles and runs a probe to find the architecture.
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
  [ -n "$arch" ] && export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch}
fi
log "$(c++ --version | head -1); $(cmake --version | head -1); $(nproc) cores"

# --- the Debian packages, unpacked when given ------------------------------------------------
# The prefix comes before the system's in every search path, so unpacking is safe even where some
# of the packages are installed. It lives in the build folder: $OUT is copied back by the device
# tool and should hold logs only.
build=${BUILD_DIR:-build-gpu}
deb_dir=${DEB_DIR:-.gpu-debs}
extra_prefix=""
if [ -d "$deb_dir" ] && ls "$deb_dir"/*.deb >/dev/null 2>&1; then
  root="$(pwd)/$build/debroot"
  case "$build" in /*) root="$build/debroot" ;; esac
  rm -rf "$root" && mkdir -p "$root"
  for d in "$deb_dir"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$d" "$root"
    else  # a .deb is an ar archive holding data.tar.*
      member=$(ar t "$d" | grep '^data.tar')
      case "$member" in
        *.xz) z=-J ;; *.gz) z=-z ;; *.zst) z=--zstd ;; *.bz2) z=-j ;; *) z= ;;
      esac
      ar p "$d" "$member" | tar -x $z -C "$root" -f -
    fi || { log "could not unpack $d"; exit 1; }
  done
  lib=$(ls -d "$root"/usr/lib/*-linux-gnu 2>/dev/null | head -1)
  lib=${lib:-$root/usr/lib}
  extra_prefix=";$root/usr;$lib/cmake;$root/usr/lib/cmake;$root/usr/share/cmake"
  export CPATH="$root/usr/include${CPATH:+:$CPATH}"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$root/usr/bin:$PATH"  # spm_train, which the tests use to train tokenizers
  export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
  log "unpacked $(ls "$deb_dir"/*.deb | wc -l) packages from $deb_dir into $root"
fi
command -v spm_train >/dev/null || log "warning: spm_train is missing; tests that train a tokenizer will fail"

# --- build ------------------------------------------------------------------------------------
# (${abi_flags[@]+...}: an empty array is an unbound variable under set -u before bash 4.4.)
# The configure and build logs stay in the build folder unless they failed: the device tool
# brings back at most 8 files from $OUT.
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix_path$extra_prefix" \
  ${abi_flags[@]+"${abi_flags[@]}"} -DPROMPTCACHE_BUILD_EXAMPLES=OFF >"$build/configure.log" 2>&1 ||
  { cp "$build/configure.log" "$out/"; log "configure FAILED (configure.log):"
    tail -30 "$build/configure.log" | tee -a "$out/summary.txt"; exit 1; }
targets=(model_tests cache_tests contract_tests bench_ttft bench_batch)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >"$build/build.log" 2>&1 ||
  { cp "$build/build.log" "$out/"; log "build FAILED (build.log):"
    grep -m20 -E 'error|undefined reference' "$build/build.log" | tee -a "$out/summary.txt"; exit 1; }
log "build ok after $(elapsed)"

# --- tests on the device ----------------------------------------------------------------------
export PROMPTCACHE_TEST_DEVICE=$device
for suite in model_tests cache_tests contract_tests; do
  if "$build/tests/$suite" >"$out/$suite.log" 2>&1; then
    log "$suite (device $device): $(grep -E '^(All tests passed|test cases)' "$out/$suite.log" | tail -1)"
  else
    failures=$((failures + 1))
    log "$suite (device $device) FAILED:"
    grep -E -A8 'FAILED|^/.*: (error|fatal)' "$out/$suite.log" | head -40 | tee -a "$out/summary.txt"
    tail -3 "$out/$suite.log" | tee -a "$out/summary.txt"
  fi
done
log "tests done after $(elapsed)"

# --- benchmarks in half precision ------------------------------------------------------------
# run_bench LABEL JSONL TABLE COMMAND...: runs a benchmark into JSONL (stderr to bench.err) and
# prints the table the function TABLE makes of it, or counts a failure.
run_bench() {
  local label=$1 jsonl=$2 table=$3
  shift 3
  if "$@" >"$jsonl" 2>>"$out/bench.err"; then
    log "$label:"
    "$table" "$jsonl" | tee -a "$out/summary.txt"
  else
    failures=$((failures + 1))
    log "$label FAILED: $(tail -3 "$out/bench.err")"
  fi
}
ttft_table() {
  python3 - "$1" <<'PY'
import json, sys
print("schema fresh  uncached_ms  cached_ms  speedup  warm_ms  assembly_ms  assembly/copy  same_token")
for line in open(sys.argv[1]):
    j = json.loads(line)
    print(f"{j['schema_tokens']:6} {j['fresh_tokens']:5} {j['uncached_ttft_ms']:12.2f} {j['cached_ttft_ms']:10.2f} "
          f"{j['speedup']:7.1f}x {j['warm_cached_ttft_ms']:8.2f} {j['assembly_ms']:12.3f} "
          f"{j['assembly_to_memcpy']:13.2f}  {j['same_first_token']}")
PY
}
batch_table() {
  python3 - "$1" <<'PY'
import json, sys
print("batch  one_by_one_ms  batch_ms  speedup  last_ttft_one_by_one_ms  batch_ttft_ms  same_tokens")
for line in open(sys.argv[1]):
    j = json.loads(line)
    print(f"{j['batch']:5} {j['sequential_ms']:14.1f} {j['batch_ms']:9.1f} {j['speedup']:7.2f}x "
          f"{j['sequential_last_ttft_ms']:24.1f} {j['batch_ttft_ms']:14.1f}  {j['same_tokens']}")
PY
}
for dtype in f16 bf16; do
  run_bench "bench_ttft $device $dtype" "$out/bench_ttft_$dtype.jsonl" ttft_table \
    "$build/benchmarks/bench_ttft" --device "$device" --dtype "$dtype" --repeats "$repeats" --schema "$schema"
done
# Prompts with different modules, one batch vs one by one. A dry run on the CPU (f16 is slow
# there) runs one small batch.
batch_args=()
[ "$device" = cpu ] && batch_args=(--batch 2 --doc-tokens 64 --new 4)
run_bench "bench_batch $device f16" "$out/bench_batch_f16.jsonl" batch_table \
  "$build/benchmarks/bench_batch" --device "$device" --dtype f16 --repeats "$repeats" ${batch_args[@]+"${batch_args[@]}"}
log "done after $(elapsed): $failures failure(s); logs in $out"
[ "$failures" -eq 0 ]
