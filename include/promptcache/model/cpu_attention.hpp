// promptcache/model/cpu_attention.hpp — fused attention of a few query rows per KV head on the
// CPU: the fresh tokens of a cached request, a decode step, and block by block (64 query tokens
// at a time, in LlamaModel) a prefill or a module compile.
//
// Each thread takes whole KV heads and computes scores, mask, softmax and the product with V in
// one pass over its head's slots (src/model/kernels/attention_kernel.inl), instead of four
// library calls per head. Uses the SIMD width of the small-row linear kernels
// (cpu_linear_kernel()); off with them.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace promptcache {

// Whether attend_few_queries() takes f32 heads of size head_dim with the current kernel choice.
bool cpu_attention_available(int64_t head_dim);

// qg [b, kv_heads, rows, d]: rows = groups * n query rows per KV head, group-major (row g * n + i
// is token i of query head g), already scaled by 1/sqrt(d). keys/values [b, kv_heads, slots, d]
// with dense rows of d values (views of the KV cache). mask: [n, slots], [b, n, slots] (one per
// batch row) or undefined (every slot visible); slots before `open` are seen by every row
// whatever the mask says. The KV heads are shared out among `threads` threads.
// Returns [b, kv_heads, rows, d]. Throws Error (kInvalidArgument) for anything else: other
// dtypes or devices, a head size without a kernel (cpu_attention_available), mismatched shapes.
torch::Tensor attend_few_queries(const torch::Tensor& qg, const torch::Tensor& keys,
                                 const torch::Tensor& values, const torch::Tensor& mask,
                                 int64_t open, int threads);

}  // namespace promptcache
