#!/usr/bin/env bash
# GPU check: builds promptcache against PyTorch's bundled LibTorch (2.x, CUDA), runs the engine
# and contract suites on the GPU and bench_ttft in f16, and prints a summary.
# Needs: an NVIDIA GPU, python3 with torch (CUDA build), cmake, a C++17 compiler. The Debian
# -dev packages this project needs (pugixml, fmt, nlohmann-json, catch2, cli11) are taken from
# the system when present, or unpacked from .deb files given in $DEB_DIR with dpkg -x.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
log() { echo "[gpu-check] $*" | tee -a "$out/summary.txt"; }

prefix_path=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
  log "python3 with torch is not available"; exit 1; }
log "torch $(python3 -c 'import torch;print(torch.__version__, torch.version.cuda, torch.cuda.is_available())')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | while read -r l; do log "gpu: $l"; done

extra_prefix=""
if [ -n "${DEB_DIR:-}" ]; then
  mkdir -p "$out/debroot"
  for d in "$DEB_DIR"/*.deb; do dpkg -x "$d" "$out/debroot"; done
  extra_prefix=";$out/debroot/usr;$out/debroot/usr/lib/x86_64-linux-gnu/cmake;$out/debroot/usr/share/cmake"
  export CPATH="$out/debroot/usr/include${CPATH:+:$CPATH}"
fi
# PyTorch wheels are built with the pre-C++11 std::string ABI unless they say otherwise.
abi=$(python3 -c 'import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
build=build-gpu
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix_path$extra_prefix" \
  -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$abi" -DPROMPTCACHE_PCH=ON >"$out/configure.log" 2>&1 \
  || { log "configure failed (see configure.log)"; tail -20 "$out/configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" >"$out/build.log" 2>&1 \
  || { log "build failed (see build.log)"; grep -m20 error "$out/build.log"; exit 1; }
log "build ok"

export PROMPTCACHE_TEST_DEVICE=cuda
for suite in cache_tests contract_tests model_tests; do
  if "$build/tests/$suite" >"$out/$suite.log" 2>&1; then
    log "$suite (device cuda): $(tail -2 "$out/$suite.log" | tr -s '\n' ' ')"
  else
    log "$suite (device cuda) FAILED: $(tail -4 "$out/$suite.log" | tr -s '\n' ' ')"
  fi
done
for dtype in f16 bf16; do
  if "$build/benchmarks/bench_ttft" --device cuda --dtype "$dtype" --repeats 3 >"$out/bench_ttft_$dtype.jsonl" 2>"$out/bench_ttft_$dtype.err"; then
    log "bench_ttft cuda $dtype:"; cat "$out/bench_ttft_$dtype.jsonl" | tee -a "$out/summary.txt"
  else
    log "bench_ttft cuda $dtype FAILED: $(tail -3 "$out/bench_ttft_$dtype.err")"
  fi
done
log "done; logs in $out"
