#!/usr/bin/env bash
# Plots bench_ttft and bench_prefill results (JSON lines) as PNGs with gnuplot.
#   benchmarks/plot.sh TTFT.jsonl PREFILL.jsonl OUT_DIR
# PREFILL.jsonl may be '-' to leave prefill.png as it is. TTFT rows measured with the CPU kernels
# off (bench_ttft --kernels on,off) are left out. (apt-get install gnuplot-nox)
set -euo pipefail
ttft=$1 prefill=$2 out=${3:-docs/img}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$ttft" "$prefill" "$tmp" <<'PY'
import json, sys
ttft, prefill, tmp = sys.argv[1:4]
rows = [json.loads(l) for l in open(ttft) if l.strip()]
rows = [r for r in rows if r.get("kernels") != "off"] or rows
for fresh in sorted({r["fresh_tokens"] for r in rows}):
    with open(f"{tmp}/ttft_{fresh}.dat", "w") as f:
        for r in rows:
            if r["fresh_tokens"] == fresh:
                f.write(f'{r["schema_tokens"]} {r["uncached_ttft_ms"]} {r["cached_ttft_ms"]} {r["speedup"]}\n')
with open(f"{tmp}/prefill.dat", "w") as f:
    for l in (open(prefill) if prefill != "-" else []):
        if l.strip():
            r = json.loads(l)
            f.write(f'{r["tokens"]} {r["prefill_gflops"]} {r["gemm_gflops"]} {r["prefill_tokens_per_s"]}\n')
PY
fresh_files=$(ls "$tmp"/ttft_*.dat)
plots=""
for f in $fresh_files; do
  n=$(basename "$f" .dat | sed 's/ttft_//')
  plots+="'$f' using 1:2 with linespoints title 'uncached, $n fresh', '$f' using 1:3 with linespoints title 'cached, $n fresh', "
done
gnuplot <<GP
set terminal pngcairo size 800,500
set output '$out/ttft.png'
set title 'Time to first token, bench-small (synthetic), 2-core CPU'
set xlabel 'schema tokens (all modules selected)'
set ylabel 'TTFT (ms, log scale)'
set logscale xy
set key left top
set grid
plot ${plots%, }
GP
[ "$prefill" = "-" ] && { echo "wrote $out/ttft.png"; exit 0; }
gnuplot <<GP
set terminal pngcairo size 800,500
set output '$out/prefill.png'
set title 'Prefill rate vs plain GEMM in the same run, bench-small, 2-core CPU'
set xlabel 'prompt tokens'
set ylabel 'GFLOP/s'
set logscale x
set yrange [0:*]
set key right bottom
set grid
plot '$tmp/prefill.dat' using 1:2 with linespoints title 'prefill', '$tmp/prefill.dat' using 1:3 with linespoints title 'torch::matmul'
GP
echo "wrote $out/ttft.png and $out/prefill.png"
