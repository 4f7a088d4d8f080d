// promptcache/model/cpu_linear.hpp — y = x Wᵀ for a few rows of x on the CPU.
//
// A cached request runs only its fresh tokens (a question of 16 tokens, then one token per
// decode step) through the model, so its linear layers multiply a handful of rows by every
// weight matrix. A general GEMM packs each weight matrix on every such call and reads it about
// twice; the kernels here stream each weight row once and reuse it from L1 for all the rows of
// x, which takes the weight GEMMs of a 16-token forward and of a decode step to about half the
// time (docs/benchmarks.md). Larger inputs, other dtypes and other devices go to torch::linear.
#pragma once

#include <torch/types.h>

#include <string>

namespace promptcache {

// Which kernel linear_layer() uses for small f32 inputs on the CPU.
enum class CpuLinearKernel {
  kNone,    // always torch::linear
  kAvx2,    // AVX2 + FMA
  kAvx512,  // AVX-512F
};

// Up to this many rows of x (tokens times batch) take the kernel; more go to the GEMM, which
// catches up around 128 rows on the development machine.
constexpr int64_t kCpuLinearMaxRows = 64;

// x [..., in] times weight [out, in] transposed: [..., out], as torch::linear(x, weight).
torch::Tensor linear_layer(const torch::Tensor& x, const torch::Tensor& weight);

// The kernel in use: the best the processor supports, unless PROMPTCACHE_CPU_KERNELS=off was
// set in the environment or select_cpu_linear() chose another.
CpuLinearKernel cpu_linear_kernel();
// Chooses a kernel; returns false (and changes nothing) when this build or processor lacks it.
bool select_cpu_linear(CpuLinearKernel kernel);
// "avx512", "avx2" or "off". The kernel splits the weight rows over kernel_threads()
// (promptcache/model/threads.hpp).
std::string cpu_linear_name(CpuLinearKernel kernel);

}  // namespace promptcache
