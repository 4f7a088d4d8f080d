// llama_attention.cpp — the attention of one layer, by path: the fused CPU kernel
// (cpu_attention.hpp) block by block, KV heads split over threads with library calls, the
// blocked library attention (also the path that reports attention mass), and LibTorch 2.x's
// scaled_dot_product_attention; and the sliding window's mask. Every path takes the same
// LayerInputs, so what a layer sees does not depend on which path runs it: ALiBi included,
// whose bias each path computes from the same slot and query positions (alibi_scores below,
// the kernel's AttentionBias).
#include "promptcache/model/llama.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <cmath>
#include <exception>
#include <limits>
#include <mutex>

#include "layer_ops.hpp"
#include "promptcache/model/cpu_attention.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/cpu_ops.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/model/work_pool.hpp"

namespace promptcache {

using layer_ops::head_norm;
using layer_ops::rotate_half;
using layer_ops::with_bias;

namespace {

// Attention on the CPU goes KV head by KV head over threads through the fused kernel
// (promptcache/model/cpu_attention.hpp) for f32 heads whose size it takes. Where it does not
// apply, up to this many fresh tokens go through attend_split_heads below, longer inputs through
// the blocked attention.
constexpr int64_t kFewQueriesMaxTokens = 64;

// ALiBi's addition to the scores of query tokens [q0, q0 + rows) over slots [0, visible):
// [b, kv_heads, groups * rows, visible] f32 (rows group-major, as the attention stacks them),
// slope of the row's query head times (slot position - query position). slopes [heads],
// key_positions [b, slots], query_positions [b, n], f32 on one device.
torch::Tensor alibi_scores(const torch::Tensor& slopes, const torch::Tensor& key_positions,
                           const torch::Tensor& query_positions, int64_t hkv, int64_t q0,
                           int64_t rows, int64_t visible) {
  const int64_t b = key_positions.size(0), groups = slopes.size(0) / hkv;
  auto keys = key_positions.narrow(1, 0, visible).reshape({b, 1, 1, 1, visible});
  auto queries = query_positions.narrow(1, q0, rows).reshape({b, 1, 1, rows, 1});
  return (slopes.view({1, hkv, groups, 1, 1}) * (keys - queries))
      .view({b, hkv, groups * rows, visible});
}

// Attention of a few (pre-scaled) query rows per KV head over every slot with library calls, the
// KV heads shared out among `threads` threads: the fallback of the fused kernel (bf16 on the CPU,
// head sizes that are not a multiple of 8). OpenBLAS runs single-threaded meanwhile (each thread
// makes its own calls).
// qg [b, kv_heads, groups * n, d] (group-major rows), keys/values [b, kv_heads, slots, d],
// mask [n, slots], [b, n, slots] (one per batch row) or undefined; slots before `open` are seen
// by every row.
torch::Tensor attend_split_heads(const torch::Tensor& qg, const torch::Tensor& keys,
                                 const torch::Tensor& values, const torch::Tensor& mask,
                                 int64_t open, int threads, const torch::Tensor& alibi) {
  const int64_t b = qg.size(0), hkv = qg.size(1), rows = qg.size(2), d = qg.size(3);
  const int64_t slots = keys.size(2);
  auto out = torch::empty({b, hkv, rows, d}, qg.options());
  torch::Tensor closed;  // [(b,) n, slots - open]: where a row must not look
  if (mask.defined() && open < slots) closed = mask.narrow(-1, open, slots - open).logical_not();
  const int64_t n = mask.defined() ? mask.size(-2) : rows;
  const int saved_blas = blas_threads();
  if (saved_blas > 1) set_blas_threads(1);
  std::exception_ptr error;
  std::mutex error_mutex;
  // Grad and inference modes are thread-local: the worker threads take the caller's, so that
  // writing into `out` (made here) is allowed under an application's InferenceMode.
  const bool inference = c10::InferenceMode::is_enabled();
  const bool grad = at::GradMode::is_enabled();
  // On the kernel work pool (a chunk per batch row and KV head), not an OpenMP team: a team's
  // barrier waits for a thread another process holds (include/promptcache/model/work_pool.hpp).
  parallel_chunks(b * hkv, threads, [&](int64_t task) {
    const int64_t bi = task / hkv, h = task % hkv;
    try {
      c10::InferenceMode inference_mode(inference);
      at::AutoGradMode grad_mode(grad);
      auto scores = at::mm(qg[bi][h], keys[bi][h].t());
      if (scores.scalar_type() != torch::kFloat32) scores = scores.to(torch::kFloat32);
      if (alibi.defined()) scores.add_(alibi[bi][h]);
      if (closed.defined()) {
        scores.view({rows / n, n, slots})
            .narrow(-1, open, slots - open)
            .masked_fill_(closed.dim() == 3 ? closed[bi] : closed,
                          -std::numeric_limits<float>::infinity());
      }
      auto dst = out[bi][h];
      at::mm_out(dst, scores.softmax(-1).to(values.scalar_type()), values[bi][h]);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  });
  if (saved_blas > 1) set_blas_threads(saved_blas);
  if (error) std::rethrow_exception(error);
  return out;
}

// The fused kernel over q [b, heads, n, d] (scaled) and the runs of slots `slots`
// (KVCache::segments) in blocks of kFusedBlockTokens query tokens, each block against the slots it
// may see: a few fresh tokens are one block; a prefill, a module compile or a long question take
// several. Against the blocked attention (OpenBLAS GEMMs with single-threaded mask and softmax
// passes between them), 1024- and 2048-token prefills of bench-small ran 15-20% faster and a
// 100-token question over 2048 slots 1.5x faster (docs/benchmarks-history.md).
constexpr int64_t kFusedBlockTokens = 64;

// Under an explicit mask, the columns a block of rows reads: the cached slots [0, past) up to
// the last one any row sees (and at least the `open` ones), then the new tokens' slots [past,
// total) up to the last one any row sees. For recompute.hpp's forward (chosen slots in position
// order among the stored ones), a block's rows see only the slots before their positions, so it
// reads about the prefix they can see instead of the whole assembled cache. `slots`, `mask`
// ([.., rows, total]) and, where defined, the ALiBi slot positions `keys` ([b, total]) are
// narrowed to those columns.
void bound_block_columns(std::vector<KVSegment>& slots, torch::Tensor& mask, torch::Tensor& keys,
                         int64_t past, int64_t& open) {
  const int64_t total = mask.size(-1);
  auto seen = mask.reshape({-1, total}).any(0).to(torch::kCPU).contiguous();
  const bool* v = seen.data_ptr<bool>();
  int64_t hi_past = std::min(open, past), hi_new = 0;
  for (int64_t c = past - 1; c >= hi_past; --c) {
    if (v[c]) {
      hi_past = c + 1;
      break;
    }
  }
  for (int64_t c = total - 1; c >= past; --c) {
    if (v[c]) {
      hi_new = c + 1 - past;
      break;
    }
  }
  if (hi_past == past && hi_new == total - past) return;
  auto kept = first_slots(slots, hi_past);
  for (auto& s : slot_range(slots, past, hi_new)) kept.push_back(std::move(s));
  slots = std::move(kept);
  mask = torch::cat({mask.narrow(-1, 0, hi_past), mask.narrow(-1, past, hi_new)}, -1);
  if (keys.defined()) {
    keys = torch::cat({keys.narrow(-1, 0, hi_past), keys.narrow(-1, past, hi_new)}, -1);
  }
  open = std::min(open, hi_past);
}

// `bias`: ALiBi over all n query tokens and every slot (AttentionBias), or undefined.
torch::Tensor attend_fused_blocks(const torch::Tensor& q, const std::vector<KVSegment>& slots,
                                  const torch::Tensor& mask, bool causal, int64_t past,
                                  int64_t open_slots, int threads, const AttentionBias& bias) {
  const int64_t b = q.size(0), hq = q.size(1), n = q.size(2), d = q.size(3);
  const int64_t hkv = slots.front().keys.size(1), groups = hq / hkv;
  int64_t total = 0;
  for (const auto& s : slots) total += s.slots();
  const bool bounded = !causal && mask.defined();  // blocks read only the columns they see
  if (n <= kFusedBlockTokens && !bounded) {        // one block: the kernel's output is the result
    return attend_few_queries(q.reshape({b, hkv, groups * n, d}), slots, mask,
                              causal ? past : open_slots, threads, bias)
        .view({b, hq, n, d});
  }
  auto out = torch::empty({b, hq, n, d}, q.options());
  for (int64_t i0 = 0; i0 < n; i0 += kFusedBlockTokens) {
    const int64_t rows = std::min(kFusedBlockTokens, n - i0);
    const int64_t visible = causal ? past + i0 + rows : total;
    torch::Tensor block_mask;
    if (mask.defined()) block_mask = mask.narrow(-2, i0, rows).narrow(-1, 0, visible);
    // Under the causal rule row i0 sees every slot before past + i0.
    int64_t open = causal ? past + i0 : std::min(open_slots, visible);
    auto block_slots = first_slots(slots, visible);
    AttentionBias block_bias;
    if (bias.defined()) {
      block_bias.slopes = bias.slopes;
      block_bias.key_positions = bias.key_positions.narrow(-1, 0, visible);
      block_bias.query_positions = bias.query_positions.narrow(-1, i0, rows);
    }
    if (bounded) bound_block_columns(block_slots, block_mask, block_bias.key_positions, past, open);
    auto block = attend_few_queries(q.narrow(2, i0, rows).reshape({b, hkv, groups * rows, d}),
                                    block_slots, block_mask, open, threads, block_bias);
    out.narrow(2, i0, rows).copy_(block.view({b, hq, rows, d}));
  }
  return out;
}

}  // namespace

torch::Tensor LlamaModel::attention(const Layer& layer, int64_t index, const torch::Tensor& x,
                                    KVCache& cache, const LayerInputs& in) const {
  const torch::Tensor& mask = in.mask;
  const bool causal = in.causal;
  const int64_t open_slots = in.open_slots;
  const int64_t b = x.size(0), n = x.size(1), d = config_.head_dim;
  const int64_t hq = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const int64_t groups = hq / hkv;
  // Scaling the queries costs n x d per head instead of n x slots for the scores (SDPA scales
  // by itself).
  const double q_scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto q = linear_layer(x, layer.wq);
  auto k = linear_layer(x, layer.wk);
  auto v = linear_layer(x, layer.wv);
  if (layer.bq.defined()) {
    q.add_(layer.bq);
    k.add_(layer.bk);
    v.add_(layer.bv);
  }
  if (layer.q_norm.defined()) {  // RMSNorm over each head's d values, before RoPE
    q = head_norm(q, layer.q_norm, hq, config_.rms_norm_eps, in.small_ops);
    k = head_norm(k, layer.k_norm, hkv, config_.rms_norm_eps, in.small_ops);
  }
  bool q_scaled = false;
  if (in.small_ops) {
    // One pass: rotated, scaled queries [b, hq, n, d]; keys and values straight into the cache.
    auto [key_dst, value_dst] = cache.pending_slots(index, n);
    if (key_dst.scalar_type() == torch::kFloat32) {
      q = cpu_rope_into_cache(q, k, v, in.cos, in.sin, q_scale, key_dst, value_dst);
    } else {
      // A bf16/f16 cache: rotated in f32, then rounded by the same conversion as
      // write_pending's, so a token's stored K/V do not depend on the path that made them.
      auto keys_f32 = torch::empty(key_dst.sizes(), q.options());
      auto values_f32 = torch::empty(value_dst.sizes(), q.options());
      q = cpu_rope_into_cache(q, k, v, in.cos, in.sin, q_scale, keys_f32, values_f32);
      key_dst.copy_(keys_f32);
      value_dst.copy_(values_f32);
    }
    q_scaled = true;
  } else {
    const torch::Tensor &cos = in.cos, &sin = in.sin;
    q = q.view({b, n, hq, d}).transpose(1, 2);
    k = k.view({b, n, hkv, d}).transpose(1, 2);
    v = v.view({b, n, hkv, d}).transpose(1, 2);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    cache.write_pending(index, k, v);
  }
  const int64_t total = cache.length() + n;
  // The fused kernel reads the slots where they are, module states left in the store included;
  // the other paths take views of the buffer, which copy those in first.
  const bool fused = in.fused_attention && !in.attention_mass.defined();
  torch::Tensor keys, values;
  if (!fused) {
    keys = cache.key_slots(index, 0, total);
    values = cache.value_slots(index, 0, total);
    // A bf16/f16 cache under f32 compute, read without the fused kernel (kernels off, a head
    // size it does not take): converted for the library calls.
    if (keys.scalar_type() != q.scalar_type()) {
      keys = keys.to(q.scalar_type());
      values = values.to(q.scalar_type());
    }
  }
  // Grouped-query attention without copying K/V: the query heads that share a KV head are
  // stacked along the row axis, so one matmul per KV head serves the whole group.
  torch::Tensor out;
  const bool alibi = in.key_positions.defined();
#if TORCH_VERSION_MAJOR >= 2
  if (sdpa_ && !in.attention_mass.defined()) {
    auto qg = q.reshape({b, hkv, groups * n, d});
    // An absent mask must be nullopt: an optional holding an undefined tensor is an error there.
    c10::optional<torch::Tensor> grouped_mask;
    // Rows are group-major (g * n + i), so the mask repeats along the row axis; a per-batch-row
    // mask [b, n, slots] becomes [b, 1, groups * n, slots], broadcast over the KV heads.
    torch::Tensor grouped;
    if (mask.defined()) {
      grouped =
          mask.dim() == 3 ? mask.repeat({1, groups, 1}).unsqueeze(1) : mask.repeat({groups, 1});
      grouped_mask = grouped;
    }
    // ALiBi: an additive mask, the bias where the bool mask lets a row see, -inf elsewhere.
    if (alibi) {
      auto additive =
          alibi_scores(alibi_slopes_, in.key_positions, in.query_positions, hkv, 0, n, total);
      if (grouped.defined()) {
        additive.masked_fill_(grouped.logical_not(), -std::numeric_limits<float>::infinity());
      }
      grouped_mask = additive.to(qg.scalar_type());
    }
    out = at::scaled_dot_product_attention(qg, keys, values, grouped_mask);
    // reshape, not view: the fused CUDA kernels may return [b, rows, heads, d] memory seen as
    // [b, heads, rows, d], which cannot be viewed as [b, hq, n, d].
    out = out.reshape({b, hq, n, d}).transpose(1, 2).reshape({b, n, hq * d});
    // The mask says it all for SDPA: causal is not needed.
    return with_bias(linear_layer(out, layer.wo), layer.bo);
  }
#endif
  // Queries go in blocks: score memory stays bounded, and under the causal rule a block needs
  // only the keys up to its own last row (half the work of a full square for a long prefill).
  constexpr int64_t kBlock = 256;
  const int64_t past = total - n;
  if (!q_scaled) q = q * q_scale;
  const int threads = kernel_threads();
  // Only alongside the small-row linear kernels: interleaved with multi-threaded OpenBLAS
  // linears, the two thread pools spin against each other (a 16-token forward ran 2.5x slower).
  const bool split_heads = !fused && !in.attention_mass.defined() && q.device().is_cpu() &&
                           n <= kFewQueriesMaxTokens && hkv > 1 && threads > 1 &&
                           cpu_linear_kernel() != CpuLinearKernel::kNone;
  if (fused) {
    // For a few fresh tokens in one block, for longer inputs block by block.
    AttentionBias bias;
    if (alibi) bias = {alibi_slopes_, in.key_positions, in.query_positions};
    out = attend_fused_blocks(q, cache.segments(index, total), mask, causal, past, open_slots,
                              threads, bias);
  } else if (split_heads) {
    torch::Tensor bias;
    if (alibi) {
      bias = alibi_scores(alibi_slopes_, in.key_positions, in.query_positions, hkv, 0, n, total);
    }
    out = attend_split_heads(q.reshape({b, hkv, groups * n, d}), keys, values, mask,
                             causal ? past : open_slots, threads, bias);
  } else if (n > kBlock) {
    out = torch::empty({b, hq, n, d}, q.options());
  }
  for (int64_t i0 = fused || split_heads ? n : 0; i0 < n; i0 += kBlock) {
    const int64_t rows = std::min(kBlock, n - i0);
    const int64_t visible = causal ? past + i0 + rows : total;
    auto qb = q.narrow(2, i0, rows).reshape({b, hkv, groups * rows, d});
    auto scores = torch::matmul(qb, keys.narrow(2, 0, visible).transpose(-1, -2));
    if (scores.scalar_type() != torch::kFloat32) scores = scores.to(torch::kFloat32);
    if (alibi) {
      scores.add_(alibi_scores(alibi_slopes_, in.key_positions, in.query_positions, hkv, i0, rows,
                               visible));
    }
    // Slots every row of this block sees need no masking: only the rest of the columns is
    // filled (for fresh tokens over assembled modules, that is a few columns out of thousands).
    // (Under the causal rule row i0 already sees every slot before past + i0.)
    const int64_t open = causal ? past + i0 : open_slots;
    if (mask.defined() && open < visible) {
      auto closed = mask.narrow(-2, i0, rows).narrow(-1, open, visible - open).logical_not();
      if (closed.dim() == 3) closed = closed.unsqueeze(1).unsqueeze(1);  // [b, 1, 1, rows, cols]
      scores.view({b, hkv, groups, rows, visible})
          .narrow(-1, open, visible - open)
          .masked_fill_(closed, -std::numeric_limits<float>::infinity());
    }
    auto probs = scores.softmax(-1);
    if (in.attention_mass.defined()) {
      in.attention_mass.narrow(0, 0, visible).add_(probs.sum({0, 1, 2}).to(torch::kCPU));
    }
    auto block = torch::matmul(probs.to(values.scalar_type()), values.narrow(2, 0, visible));
    if (n <= kBlock) {
      out = block;
    } else {
      out.narrow(2, i0, rows).copy_(block.view({b, hq, rows, d}));
    }
  }
  out = out.view({b, hq, n, d}).transpose(1, 2).reshape({b, n, hq * d});
  return with_bias(linear_layer(out, layer.wo), layer.bo);
}

LlamaModel::LayerInputs LlamaModel::windowed(const LayerInputs& full,
                                             const torch::Tensor& positions, const KVCache& cache,
                                             int64_t n) const {
  const int64_t window = config_.traits.sliding_window;
  const int64_t b = cache.shape().batch, past = cache.length();
  // Each row's slot positions: the cache's, then the new tokens'.
  auto query = positions.to(torch::kCPU, torch::kInt64).expand({b, n}).contiguous();
  auto keys = layer_ops::slot_positions(positions, cache, n);
  // A slot position of -1 is a slot a batch row leaves empty: the caller's mask hides it anyway.
  auto visible = keys.unsqueeze(1) > (query - window).unsqueeze(2);  // [b, n, past + n]
  if (visible.all().item<bool>()) return full;
  LayerInputs out = full;
  visible = visible.to(full.cos.device());
  if (full.mask.defined()) {
    out.mask = full.mask.logical_and(visible);
  } else {  // a single new token (decoding): every slot but those the window hides
    out.mask = visible;
  }
  out.causal = false;
  out.open_slots =
      out.mask.reshape({-1, past + n}).all(0).to(torch::kInt32).cumprod(0).sum().item<int64_t>();
  return out;
}

}  // namespace promptcache
