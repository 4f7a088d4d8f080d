#include "promptcache/cache/assembler.hpp"

#include <algorithm>

#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/cpu_attention.hpp"

namespace promptcache {
namespace {

// What one prompt needs: the stored blocks to copy (in slot order) and the fresh tokens.
struct Plan {
  struct Copy {
    const SpanStates* states;
    int64_t slot;
    SlotSource tag() const { return {states->id, slot, states->length()}; }
  };
  std::vector<Copy> copies;
  std::vector<int64_t> cached_positions;  // one per copied slot
  int64_t copied = 0;                     // slots the copies fill
  AssembledPrompt out;                    // fresh tokens and positions, cached_tokens, max_position
};

Plan plan(const pml::ResolvedPrompt& prompt, const pml::Layout& layout, const CacheStore& store) {
  Plan p;
  AssembledPrompt& out = p.out;
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
    p.copies.push_back({states, p.copied});
    p.copied += states->length();
    for (std::size_t t = 0; t < span.size(); ++t) {
      p.cached_positions.push_back(static_cast<int64_t>(span.begin + t));
    }
    last_cached_token = span.tokens.back();
  }
  add_fresh(prompt.text_tokens, prompt.text_begin);
  out.cached_tokens = p.copied;
  if (out.fresh_tokens.empty() && p.copied > 0) {
    // Nothing fresh: the last cached token is run again so the model has logits to start from
    // (its recomputed states equal the stored ones when it sits at the end of its context).
    // Its slot is copied but not counted as cached: the run writes it again.
    out.fresh_tokens.push_back(last_cached_token);
    out.fresh_positions.push_back(p.cached_positions.back());
    out.cached_tokens -= 1;
  }
  if (out.fresh_tokens.empty()) {
    throw Error(ErrorKind::kPrompt, "the prompt selects no tokens at all", layout.root().where);
  }
  for (int64_t pos : p.cached_positions) out.max_position = std::max(out.max_position, pos);
  for (int64_t pos : out.fresh_positions) out.max_position = std::max(out.max_position, pos);
  return p;
}

}  // namespace

AssembledPrompt Assembler::assemble(const pml::ResolvedPrompt& prompt, const pml::Layout& layout,
                                    const CacheStore& store, KVCache& cache, int64_t extra_capacity,
                                    const AssembleOptions& options) const {
  const double start = now_ms();
  Plan p = plan(prompt, layout, store);
  AssembledPrompt out = std::move(p.out);
  const auto& copies = p.copies;
  const int64_t needed = out.cached_tokens + static_cast<int64_t>(out.fresh_tokens.size());
  // The leading spans the cache already holds from an earlier request (same blocks, same slots)
  // stay; everything after them is dropped and filled anew.
  std::size_t kept = 0;
  if (options.reuse) {
    const auto& held = cache.sources();
    while (kept < copies.size() && kept < held.size() && held[kept] == copies[kept].tag()) ++kept;
  }
  const int64_t kept_slots =
      kept == 0 ? 0 : copies[kept - 1].slot + copies[kept - 1].states->length();
  cache.truncate(kept_slots);
  cache.reserve(needed + std::max<int64_t>(extra_capacity, 0));
  // Only where the attention reads held slots in place (the fused CPU kernel): anywhere else the
  // first forward would copy them in anyway, so they are copied here and the time shows as
  // assembly.
  const bool in_place =
      options.in_place && cpu_attention_takes(cache.options(), cache.shape().head_dim);
  bool copied = false;
  for (std::size_t i = kept; i < copies.size(); ++i) {
    const auto& c = copies[i];
    const auto first = p.cached_positions.begin() + c.slot;
    std::vector<int64_t> positions(first, first + c.states->length());
    // (A block the cache cannot hold as it is, say one a caller built strided or put on another
    // device, is copied.)
    const torch::Tensor& block = c.states->kv;
    if (in_place && block.is_contiguous() &&
        block.scalar_type() == c10::typeMetaToScalarType(cache.options().dtype()) &&
        block.device().is_cpu()) {
      cache.append_block(c.states->kv, positions);
      out.in_place_tokens += c.states->length();
    } else {
      cache.write_block(c.slot, c.states->kv);
      cache.fill_external(c.states->length(), positions);
      out.kv_bytes += c.states->bytes();
      copied = true;
    }
    cache.tag_source(c.tag());
  }
  // A re-run last token (see plan) leaves its slot to the forward.
  if (out.cached_tokens < p.copied) {
    cache.truncate(out.cached_tokens);
    out.in_place_tokens = std::min(out.in_place_tokens, out.cached_tokens - kept_slots);
  }
  out.reused_tokens = std::min(kept_slots, out.cached_tokens);
  if (copied) synchronize(copies.back().states->kv);
  out.ms = now_ms() - start;
  return out;
}

AssembledBatch Assembler::assemble_batch(const std::vector<BatchPrompt>& prompts,
                                         const CacheStore& store, KVCache& cache,
                                         int64_t extra_capacity) const {
  const double start = now_ms();
  const auto rows = static_cast<int64_t>(prompts.size());
  if (rows == 0 || cache.shape().batch != rows) {
    throw Error(ErrorKind::kInvalidArgument, "assemble_batch: " + std::to_string(rows) +
                                                 " prompts for a KV cache of batch " +
                                                 std::to_string(cache.shape().batch));
  }
  std::vector<Plan> plans;
  AssembledBatch batch;
  for (const auto& prompt : prompts) {
    plans.push_back(
        plan(*prompt.resolved, *prompt.layout, prompt.store != nullptr ? *prompt.store : store));
    batch.cached_slots = std::max(batch.cached_slots, plans.back().copied);
    batch.fresh_slots =
        std::max(batch.fresh_slots, static_cast<int64_t>(plans.back().out.fresh_tokens.size()));
  }
  cache.clear();
  cache.reserve(batch.cached_slots + batch.fresh_slots + std::max<int64_t>(extra_capacity, 0));
  for (int64_t row = 0; row < rows; ++row) {
    Plan& p = plans[row];
    for (const auto& c : p.copies) {
      cache.write_block(c.slot, c.states->kv, row);
      p.out.kv_bytes += c.states->bytes();
    }
    // The slots a shorter row leaves empty are zeroed, not left as they were: a masked slot
    // still enters the attention product with weight 0, and 0 x NaN would be NaN.
    if (p.copied < batch.cached_slots) {
      cache.all_slots(p.copied, batch.cached_slots - p.copied).narrow(2, row, 1).zero_();
    }
    batch.rows.push_back(std::move(p.out));
  }
  // Row 0's position ids (-1 for its empty slots).
  std::vector<int64_t> positions = plans[0].cached_positions;
  positions.resize(batch.cached_slots, -1);
  cache.fill_external(batch.cached_slots, positions);
  for (int64_t row = 1; row < rows; ++row) {  // and each other row its own
    std::vector<int64_t> own = plans[row].cached_positions;
    own.resize(batch.cached_slots, -1);
    cache.set_row_positions(row, 0, own);
  }
  synchronize(cache.all_slots(0, 1));
  batch.ms = now_ms() - start;
  return batch;
}

}  // namespace promptcache
