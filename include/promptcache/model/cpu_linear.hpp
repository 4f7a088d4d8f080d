// promptcache/model/cpu_linear.hpp — y = x Wᵀ for a few rows of x on the CPU.
//
// A cached request runs only its fresh tokens (a question of 16 tokens, then one token per
// decode step) through the model, so its linear layers multiply a handful of rows by every
// weight matrix. A general GEMM packs each weight matrix on every such call and reads it about
// twice; the kernels here stream each weight row once and reuse it from L1 for all the rows of
// x, which takes the weight GEMMs of a 16-token forward and of a decode step to about half the
// time (docs/benchmarks-history.md). Larger inputs, other dtypes and other devices go to
// torch::linear.
#pragma once

#include <torch/types.h>

#include <string>

namespace promptcache {

// Which kernel linear_layer() uses for small f32 inputs on the CPU.
enum class CpuLinearKernel {
  kNone,    // always torch::linear
  kAvx2,    // AVX2 + FMA
  kAvx512,  // AVX-512F
  // AVX-512F as kAvx512, except that bf16 weights meet x rounded to bf16 in vdpbf16ps
  // (AVX512_BF16) at every row count; see linear_layer.
  kAvx512Bf16,
};

// Up to this many rows of x (tokens times batch) take the kernel; more go to the GEMM. On the
// 2-core AVX2 host (one thread, f32, weights streamed from memory) the kernel stays ahead of the
// GEMM to 256 rows for 768 inputs and falls behind by 1.1-1.2x from ~48 rows for 2048 inputs.
// The limit was 64, and that made a cliff: past 64 tokens a prefill alternated OpenBLAS's
// pthreads (linears) with the OpenMP threads of the fused attention, whose spinning took both
// cores from OpenBLAS; bench-small prefill fell from 442 tok/s at 64 tokens to 296-328 at
// 96-128 (medians worse). At 256 every size runs at 421-458 tok/s (128 tokens: 289 ms against
// 390), decode unchanged (bench_prefill, docs/benchmarks-history.md). OMP_WAIT_POLICY=passive
// removed the cliff as well but cost decoding a third of its speed.
constexpr int64_t kCpuLinearMaxRows = 256;
// Rows of x up to which Q8 weights meet x quantized to 8 bits (see linear_layer). Past 4 rows
// each row's integer pass costs what the first did, while dequantized weight rows serve every
// row of x from registers: bench_linear (2 threads) at 2048x768 gave 0.34 against 0.40 ms at 4
// rows, equal at 6, 0.63 against 0.52 at 8 and 0.88 against 0.67 at 12 (768x2048: 0.37 against
// 0.32 at 4 rows already).
constexpr int64_t kCpuLinearQ8IntegerRows = 4;

// x [..., in] times weight [out, in] transposed: [..., out], as torch::linear(x, weight).
// An f32 x also takes a bf16 or f16 weight (kept so: half the bytes to stream) and gives f32:
// the f32 product with the weight converted to f32, which is exact. The kernels convert as they
// read; more rows than kCpuLinearMaxRows convert the weight (in blocks of rows past 4M
// elements) into a per-thread f32 scratch for LibTorch's GEMM; with the kernels off it is
// torch::linear(x, weight.to(f32)). An int8 weight is Q8 (promptcache/model/q8_weights.hpp):
// up to kCpuLinearQ8IntegerRows rows of x the kernels quantize x as well (blocks of 32, scale =
// max |x| / 127, round to nearest even) and multiply in integers, as llama.cpp does; more rows
// multiply f32 x by the dequantized weights. The reference (kernels off) is always torch::linear
// on dequantize_q8(weight) with f32 x.
// Under kAvx512Bf16 a bf16 weight meets x rounded to bf16 (round to nearest even) instead, at
// every row count: vdpbf16ps multiplies pairs of bf16 and sums in f32, so each output is within
// (2^-8 + 2k 2^-24) sum_i |x_i w_i| of the f32 product (x's rounding, then the f32 sums), and a
// row's output is bitwise the same whatever the other rows of the call (each output is summed in
// one fixed order), as the batch-exact and prefix-exact contracts need. It takes bench-small's
// prefill linears to a third of the widening path's time (docs/benchmarks.md).
torch::Tensor linear_layer(const torch::Tensor& x, const torch::Tensor& weight);

// The kernel in use: the best the processor supports (avx512-bf16, then avx512, then avx2),
// unless select_cpu_linear() chose another or the environment named one when the process
// started: PROMPTCACHE_CPU_KERNELS=off (or 0) turns them all off, =avx512 keeps the exact
// widening bf16 path on an AVX512_BF16 processor, =avx2 the AVX2 kernels (a kernel the
// processor lacks gives the best it has below it).
CpuLinearKernel cpu_linear_kernel();
// Chooses a kernel; returns false (and changes nothing) when this build or processor lacks it.
bool select_cpu_linear(CpuLinearKernel kernel);
// "avx512-bf16", "avx512", "avx2" or "off". The kernel splits the weight rows over kernel_threads()
// (promptcache/model/threads.hpp).
std::string cpu_linear_name(CpuLinearKernel kernel);

}  // namespace promptcache
