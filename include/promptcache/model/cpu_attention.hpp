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
#include <vector>

namespace promptcache {

// One run of slots the attention reads: keys and values [b or 1, kv_heads, count, head_dim]
// (a batch of 1 serves every batch row) with dense rows of head_dim values. A KV cache whose
// module states stay in the store's blocks hands its slots over as several runs
// (KVCache::segments).
struct KVSegment {
  torch::Tensor keys, values;
  int64_t slots() const { return keys.size(2); }
};

// The first `count` slots of a list of runs (the runs they fall in, the last one cut short).
std::vector<KVSegment> first_slots(const std::vector<KVSegment>& segments, int64_t count);
// Slots [begin, begin + count) of a list of runs (the runs they fall in, cut at both ends).
std::vector<KVSegment> slot_range(const std::vector<KVSegment>& segments, int64_t begin,
                                  int64_t count);

// ALiBi for attend_few_queries(): query row r of KV head h (token i = r % n of query head
// h * groups + r / n) gets slopes[h * groups + r / n] * (key_positions[slot] - query_positions[i])
// added to its score of each slot, before the mask. All f32 on the CPU; positions per batch row
// ([b, ...], or [1, ...] for every row). Undefined slopes: no bias.
struct AttentionBias {
  torch::Tensor slopes;           // [kv_heads * groups]
  torch::Tensor key_positions;    // [b or 1, slots]
  torch::Tensor query_positions;  // [b or 1, n]
  bool defined() const { return slopes.defined(); }
};

// Whether attend_few_queries() takes f32 heads of size head_dim with the current kernel choice.
bool cpu_attention_available(int64_t head_dim);
// Whether it takes keys and values of these options (f32, bf16 or f16 on the CPU) with heads of
// head_dim: the rule by which the model's attention reads a KV cache through it, and so reads
// slots the cache holds by reference in place. bf16/f16 keys and values are converted to f32 as
// they are read (or multiplied as stored, cpu_attention_bf16_dot); queries, scores and the
// output stay f32.
bool cpu_attention_takes(const torch::TensorOptions& options, int64_t head_dim);

// Whether attend_few_queries() multiplies bf16 keys and values of heads of size head_dim as
// stored, with vdpbf16ps (the AVX-512 BF16 kernels selected, cpu_linear.hpp), for calls of
// kernels::kAttendLaneMinRows (12) query rows and more: the queries and the softmax weights go
// in as a high and a low bf16 part each, so the result is the f32 attention over the bf16 states
// to about 2^-16 relative (another order of sums). Fewer rows (decode steps), f32 and f16 keys
// and values convert as above.
bool cpu_attention_bf16_dot(int64_t head_dim);

// qg [b, kv_heads, rows, d]: rows = groups * n query rows per KV head, group-major (row g * n + i
// is token i of query head g), already scaled by 1/sqrt(d). The slots are the runs of
// `segments` in order (at least one; see KVSegment). mask: [n, slots], [b, n, slots] (one per
// batch row) or undefined (every slot visible); slots before `open` are seen by every row
// whatever the mask says. The KV heads are shared out among `threads` threads. `bias`: ALiBi (see
// AttentionBias), whose query positions give n when there is no mask.
// The queries are f32; keys and values of every run are f32, bf16 or f16, all of one dtype.
// Returns [b, kv_heads, rows, d] f32. Throws Error (kInvalidArgument) for anything else: other
// dtypes or devices, a head size without a kernel (cpu_attention_available), mismatched shapes.
torch::Tensor attend_few_queries(const torch::Tensor& qg, const std::vector<KVSegment>& segments,
                                 const torch::Tensor& mask, int64_t open, int threads,
                                 const AttentionBias& bias = {});

// The same over one run: keys/values [b, kv_heads, slots, d] (views of the KV cache).
torch::Tensor attend_few_queries(const torch::Tensor& qg, const torch::Tensor& keys,
                                 const torch::Tensor& values, const torch::Tensor& mask,
                                 int64_t open, int threads, const AttentionBias& bias = {});

}  // namespace promptcache
