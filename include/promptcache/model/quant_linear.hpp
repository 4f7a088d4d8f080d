// promptcache/model/quant_linear.hpp — y = x Wᵀ on the CPU for block-quantized weights (GGML's
// Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K as uint8 [n, k / B, bytes] tensors,
// promptcache/model/ggml_quant.hpp), computed from the blocks directly. linear_layer()
// (cpu_linear.hpp) sends such weights here.
//
// Every path multiplies x rounded to 8 bits per block with the weights: blocks of 32 values for
// Q4_0/Q5_0/Q5_1/Q8_0 weights, of 256 for the K-quants (as llama.cpp's Q8_0 and Q8_K activations),
// each block's d = max |x| / 127 and x -> nearbyint(x / d) * d; the rounding costs ~0.7% RMS of
// each output against f32 x (docs/architecture.md). With the kernels on, every row count takes the
// integer kernels: they multiply those 8-bit values with the weight blocks in integers (AVX2
// maddubs/madd, AVX-512 VNNI vpdpbusd, or the scalar reference; all three bitwise the same), and
// a row's result is bitwise the same whatever the other rows of the call. That is what the
// prefix-exact and batch-exact contracts need: the rounding of x is a step function, so the last
// bits by which a GEMM's sums move with the rows of its call (1e-7) flip some roundings in the
// next layer, and those flips moved a tiny model's logits by 2% of their largest value between a
// cached and an uncached prefill (measured with the dequantize + GEMM path for many rows, which
// llama.cpp-style prefill would take; tests/contracts/test_quant_contracts.cpp). The dequantize +
// GEMM path (quant_linear_dequant: the weight dequantized a block of rows at a time into an f32
// scratch for LibTorch's GEMM with the rounded x) stays for comparison (bench_linear).
#pragma once

#include <torch/types.h>

#include <optional>
#include <string>

namespace promptcache {

enum class QuantKernel { kScalar, kAvx2, kAvx512Vnni };
// Whether this build and processor have the kernel (kScalar always).
bool quant_kernel_available(QuantKernel kernel);
std::string quant_kernel_name(QuantKernel kernel);  // "scalar", "avx2", "avx512-vnni"
// The integer kernel linear_layer uses under the current CpuLinearKernel (cpu_linear_kernel()):
// avx512-vnni where the selection is an AVX-512 one and the processor has AVX512_VNNI (and BW,
// VL), else avx2 where the selection is not off, else none (nullopt: the reference path).
std::optional<QuantKernel> quant_kernel_in_use();

// x [..., k] f32 (CPU) times a block-quantized weight [n, k / B, bytes]: f32 [..., n]. Throws
// kInvalidArgument when the weight is not block-quantized or its k differs from x's. With the
// kernels off (PROMPTCACHE_CPU_KERNELS=off) it is torch::linear(quant_rounded_x(x, w),
// dequantize(w)), the reference; x on another device goes that way too (the blocks dequantized
// on the CPU and moved: LlamaModel dequantizes block weights at load for other devices instead).
torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& weight);

// The integer path with the given kernel (tests and benchmarks).
torch::Tensor quant_linear_integer(const torch::Tensor& x, const torch::Tensor& weight,
                                   QuantKernel kernel);
// x rounded as every path rounds it (f32, x's shape and device).
torch::Tensor quant_rounded_x(const torch::Tensor& x, const torch::Tensor& weight);
// The weight's f32 values as the dequantize + GEMM path makes them with `kernel`'s instruction
// set (AVX2 for both SIMD kernels): bitwise ggml::dequantize(weight) (tests).
torch::Tensor dequantize_with(const torch::Tensor& weight, QuantKernel kernel);
// The dequantize + GEMM path at any row count (tests and benchmarks).
torch::Tensor quant_linear_dequant(const torch::Tensor& x, const torch::Tensor& weight);

}  // namespace promptcache
