#!/usr/bin/env bash
# GGUF files of bench-small or another synthetic shape (BF16, Q8_0, Q4_K_M, written by
# `promptcache convert`) run by
# bench_prefill --model and, on the same files in the same run, by llama.cpp (node-llama-cpp@3.21.1's
# prebuilt CPU binary from npm, installed under the build tree on first use; never committed).
# One JSON line per file, engine and token count on stdout (docs/benchmarks.md "GGUF files").
#
#   benchmarks/gguf_bench.sh BUILD_DIR WORK_DIR [THREADS] [TOKENS] [DECODE_STEPS] [REPEATS] [SHAPE]
set -euo pipefail
build=$1
work=$2
threads=${3:-2}
tokens=${4:-16,128}
steps=${5:-32}
repeats=${6:-3}
shape=${7:-bench-small}
here=$(cd "$(dirname "$0")" && pwd)
cli=$build/promptcache
prefix=$build/npm-llama
mkdir -p "$work"
if [ ! -d "$work/$shape" ]; then
  "$cli" make-model --shape "$shape" --out "$work/$shape" --seed 1 >/dev/null
fi
for type in bf16 q8_0 q4_k_m; do
  [ -f "$work/$shape-$type.gguf" ] ||
    "$cli" convert --model "$work/$shape" --out "$work/$shape-$type.gguf" --type "$type" >&2
done
llama=yes
if [ ! -f "$prefix/node_modules/node-llama-cpp/package.json" ]; then
  mkdir -p "$prefix"
  NODE_LLAMA_CPP_SKIP_DOWNLOAD=true timeout 900 npm install --no-audit --no-fund --prefer-offline \
    --fetch-retries 1 --prefix "$prefix" node-llama-cpp@3.21.1 >"$prefix/npm-install.log" 2>&1 ||
    { echo "gguf_bench: npm install of node-llama-cpp failed; llama.cpp left out" >&2; llama=no; }
fi
for type in bf16 q8_0 q4_k_m; do
  file=$work/$shape-$type.gguf
  "$build/benchmarks/bench_prefill" --model "$file" --tokens "$tokens" --decode-steps "$steps" \
    --repeats "$repeats" --threads "$threads"
  if [ "$llama" = yes ]; then
    node "$here/llama_cpp_bench.mjs" "$prefix" "$file" "$threads" "$tokens" "$steps" "$repeats"
  fi
done
