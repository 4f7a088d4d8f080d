// promptcache/model/cpu_ops.hpp — the elementwise steps of a layer, fused, for a few rows on the
// CPU: RMSNorm, and RoPE with the queries' scaling and the keys' and values' move into the KV
// cache.
//
// A cached request runs 16 fresh tokens through the model. Each of those steps done with library
// calls is several small operators (RMSNorm six, RoPE of q and k about fourteen, then the scaling
// and the copies into the cache), each of which costs some microseconds of dispatch and
// allocation for a few kilobytes of work. Here each step is one pass over the rows: on
// bench-small, the time of a 16-token forward outside its linear layers, lm_head and attention
// went from 5.3 to 3.3 ms (of 34 ms), at 64 tokens from 9.7 to 7.2 ms (docs/benchmarks-history.md).
// LlamaModel takes these for f32 inputs of up to kCpuLinearMaxRows rows while the small-row kernels
// are on (the same rule as linear_layer); longer inputs keep the library operators, whose dispatch
// is small next to their work.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace promptcache {

// Whether the fused steps take `x`: f32 on the CPU, at most kCpuLinearMaxRows rows (all dims but
// the last), the small-row kernels on (cpu_linear_kernel() is not kNone), no gradient wanted.
bool cpu_small_ops_apply(const torch::Tensor& x);

// weight * x / sqrt(mean(x^2) + eps) over the last dim, as the Llama RMSNorm. x [..., h] f32 on
// the CPU, weight [h] f32. Returns a new dense tensor shaped as x.
torch::Tensor cpu_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The attention's inputs from the projections of n tokens:
//   q [b, n, heads * d] -> returned [b, heads, n, d], dense, RoPE applied and times `q_scale`
//     (which is also [b, kv_heads, groups * n, d] with group-major rows, as attend_few_queries
//     takes it);
//   k, v [b, n, kv_heads * d] -> written to key_dst, value_dst [b, kv_heads, n, d] (views of the
//     KV cache whose rows of d values are dense), keys with RoPE applied.
// cos, sin [b, n, d] f32: the rotation of each token (HF layout: the two halves repeat). Every
// tensor f32 on the CPU, d even. Throws Error (kInvalidArgument) on shapes that do not match.
torch::Tensor cpu_rope_into_cache(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const torch::Tensor& cos,
                                  const torch::Tensor& sin, double q_scale,
                                  const torch::Tensor& key_dst, const torch::Tensor& value_dst);

}  // namespace promptcache
