#include "promptcache/cache/assembler.hpp"

#include <algorithm>
#include <cstring>

#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"

namespace promptcache {
namespace {

// Copies a stored block [layers, 2, kv_heads, n, head_dim] into cache slots
// [layers, 2, batch, kv_heads, n, head_dim] (every batch row gets it). On the CPU each
// (layer, K/V, row, head) run of n x head_dim values is contiguous on both sides and goes through
// memcpy; LibTorch's strided copy_ (single-threaded here) ran at about half of memcpy's rate.
void copy_block(const torch::Tensor& dst, const torch::Tensor& src) {
  const bool runs = dst.device().is_cpu() && src.device().is_cpu() &&
                    dst.scalar_type() == src.scalar_type() && src.is_contiguous() &&
                    dst.stride(5) == 1 && dst.stride(4) == dst.size(5);
  if (!runs) {
    dst.copy_(src.unsqueeze(2));  // one call for the whole span: the batch dimension broadcasts
    return;
  }
  const int64_t run = src.size(3) * src.size(4) * src.element_size();
  auto* out = static_cast<char*>(dst.data_ptr());
  const auto* in = static_cast<const char*>(src.data_ptr());
  const int64_t item = dst.element_size();
  for (int64_t l = 0; l < dst.size(0); ++l) {
    for (int64_t kv = 0; kv < 2; ++kv) {
      for (int64_t b = 0; b < dst.size(2); ++b) {
        for (int64_t h = 0; h < dst.size(3); ++h) {
          const int64_t to =
              l * dst.stride(0) + kv * dst.stride(1) + b * dst.stride(2) + h * dst.stride(3);
          const int64_t from = ((l * 2 + kv) * src.size(2) + h) * src.size(3) * src.size(4);
          std::memcpy(out + to * item, in + from * item, static_cast<std::size_t>(run));
        }
      }
    }
  }
}

}  // namespace

AssembledPrompt Assembler::assemble(const pml::ResolvedPrompt& prompt, const pml::Layout& layout,
                                    const CacheStore& store, KVCache& cache, int64_t extra_capacity,
                                    bool reuse) const {
  const double start = now_ms();
  AssembledPrompt out;
  struct Copy {
    const SpanStates* states;
    int64_t slot;
    SlotSource tag() const { return {states->id, slot, states->length()}; }
  };
  std::vector<Copy> copies;
  std::vector<int64_t> cached_positions;
  TokenId last_cached_token = -1;
  auto add_fresh = [&](const std::vector<TokenId>& tokens, std::size_t begin) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      out.fresh_tokens.push_back(tokens[i]);
      out.fresh_positions.push_back(static_cast<int64_t>(begin + i));
    }
  };
  for (std::size_t index : prompt.spans) {
    const pml::Span& span = layout.spans.at(index);
    if (span.kind == pml::SpanKind::kParameter) {
      auto arg = std::find_if(prompt.arguments.begin(), prompt.arguments.end(),
                              [&](const pml::PlacedArgument& a) { return a.span == index; });
      if (arg != prompt.arguments.end()) add_fresh(arg->tokens, arg->begin);
      continue;
    }
    if (!span.cacheable) {
      add_fresh(span.tokens, span.begin);
      continue;
    }
    if (span.size() == 0) continue;
    const SpanStates* states = store.find(layout.schema_name, index);
    if (states == nullptr || states->length() != static_cast<int64_t>(span.size()) ||
        states->begin != static_cast<int64_t>(span.begin)) {
      throw Error(ErrorKind::kCacheFile,
                  "no compiled states for this span of schema '" + layout.schema_name +
                      "' (compile the schema before assembling prompts)",
                  span.where);
    }
    copies.push_back({states, out.cached_tokens});
    out.cached_tokens += states->length();
    for (std::size_t t = 0; t < span.size(); ++t) {
      cached_positions.push_back(static_cast<int64_t>(span.begin + t));
    }
    last_cached_token = span.tokens.back();
  }
  add_fresh(prompt.text_tokens, prompt.text_begin);

  const int64_t needed = out.cached_tokens + static_cast<int64_t>(out.fresh_tokens.size());
  // The leading spans the cache already holds from an earlier request (same blocks, same slots)
  // stay; everything after them is dropped and copied anew.
  std::size_t kept = 0;
  if (reuse) {
    const auto& held = cache.sources();
    while (kept < copies.size() && kept < held.size() && held[kept] == copies[kept].tag()) ++kept;
  }
  const int64_t kept_slots =
      kept == 0 ? 0 : copies[kept - 1].slot + copies[kept - 1].states->length();
  cache.truncate(kept_slots);
  cache.reserve(needed + std::max<int64_t>(extra_capacity, 0));
  for (std::size_t i = kept; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    copy_block(cache.all_slots(c.slot, c.states->length()), c.states->kv);
    out.kv_bytes += c.states->bytes();
  }
  cache.fill_external(
      out.cached_tokens - kept_slots,
      std::vector<int64_t>(cached_positions.begin() + kept_slots, cached_positions.end()));
  for (std::size_t i = kept; i < copies.size(); ++i) cache.tag_source(copies[i].tag());
  out.reused_tokens = kept_slots;
  if (out.fresh_tokens.empty() && out.cached_tokens > 0) {
    // Nothing fresh: the last cached token is run again so the model has logits to start from
    // (its recomputed states equal the stored ones when it sits at the end of its context).
    cache.truncate(out.cached_tokens - 1);
    out.fresh_tokens.push_back(last_cached_token);
    out.fresh_positions.push_back(cached_positions.back());
    out.cached_tokens -= 1;
    out.reused_tokens = std::min(out.reused_tokens, out.cached_tokens);
  }
  if (out.fresh_tokens.empty()) {
    throw Error(ErrorKind::kPrompt, "the prompt selects no tokens at all", layout.root().where);
  }
  if (kept < copies.size()) synchronize(cache.all_slots(0, 1));
  out.ms = now_ms() - start;
  return out;
}

}  // namespace promptcache
