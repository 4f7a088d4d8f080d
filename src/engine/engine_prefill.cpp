// src/engine/engine_prefill.cpp — planning and running a prompt's prefill: the context checks
// made before any memory is reserved, where each token goes (the stored modules' slots assembled
// at their reserved positions, or the no-cache baseline at 0..n-1), the recompute pass when one is
// asked for, and for a batch the padding and visibility mask that keep every row position-correct.
#include <algorithm>
#include <numeric>

#include "promptcache/engine.hpp"
#include "promptcache/error.hpp"

namespace promptcache {
namespace {

// A prompt's no-cache baseline: its whole token sequence as fresh tokens at positions 0..n-1.
AssembledPrompt baseline_prompt(const pml::ResolvedPrompt& resolved) {
  if (resolved.baseline.empty()) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
  AssembledPrompt a;
  a.fresh_tokens = resolved.baseline;
  a.fresh_positions.resize(a.fresh_tokens.size());
  std::iota(a.fresh_positions.begin(), a.fresh_positions.end(), int64_t{0});
  a.max_position = static_cast<int64_t>(a.fresh_tokens.size()) - 1;
  return a;
}

// Error(kContextOverflow) when `what` needs positions up to `max_position`, past the model's
// context, at `where` (the prompt's file and element).
void check_context(int64_t max_position, int64_t limit, const std::string& what,
                   const SourceLocation& where) {
  if (max_position >= limit) {
    throw Error(ErrorKind::kContextOverflow,
                what + " needs positions up to " + std::to_string(max_position) +
                    " but the model's context is " + std::to_string(limit),
                where);
  }
}

// The largest position a prompt will use, known before it is assembled: checked first, so a
// prompt past the context never has a KV cache of its size reserved (with a large model, one
// that far past the context could need more memory than the machine has). Cached, the fresh
// text comes last and ends at next_position(); the baseline packs its tokens from 0.
int64_t max_position_of(const pml::ResolvedPrompt& resolved, bool use_cache) {
  return static_cast<int64_t>(use_cache ? resolved.next_position() : resolved.baseline.size()) - 1;
}

}  // namespace

Engine::Prefill Engine::prefill(const pml::ResolvedPrompt& resolved, KVCache& cache, bool use_cache,
                                int64_t extra_capacity, const AssembleOptions& assembly,
                                const RecomputeOptions& recompute) const {
  const EntryPtr held = use_cache ? entry(resolved.schema) : nullptr;
  return prefill_with(held.get(), resolved, cache, use_cache, extra_capacity, assembly, recompute);
}

Engine::Prefill Engine::prefill_with(const SchemaEntry* schema, const pml::ResolvedPrompt& resolved,
                                     KVCache& cache, bool use_cache, int64_t extra_capacity,
                                     const AssembleOptions& assembly,
                                     const RecomputeOptions& recompute) const {
  Prefill out;
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  const int64_t limit = model_->config().max_position_embeddings;
  check_context(max_position_of(resolved, use_cache), limit, "the prompt", resolved.where);
  if (use_cache) {
    // Room for the recomputed tokens, which run after the cached slots before they move back.
    const int64_t recomputed = recompute_capacity(recompute, resolved);
    // Held while they are assembled (then the KV cache's own references keep what it reads).
    const SpanStore::Pin pinned = spans_->pin(schema->layout, *schema->spans, resolved.spans);
    out.assembled = Assembler().assemble(resolved, schema->layout, pinned.states(), cache,
                                         extra_capacity + recomputed, assembly);
    if (recomputed > 0) {
      out.assembled.exact_tokens =
          static_cast<int64_t>(exact_prefix_tokens(schema->layout, resolved, options_.encoding));
    }
  } else {
    out.assembled = baseline_prompt(resolved);
    cache.clear();
    cache.reserve(static_cast<int64_t>(resolved.baseline.size()) + extra_capacity);
  }
  check_context(out.assembled.max_position, limit, "the prompt", resolved.where);
  const auto& fresh = out.assembled.fresh_tokens;
  const double start = now_ms();
  std::vector<int64_t> ids(fresh.begin(), fresh.end());
  if (use_cache && recompute_requested(recompute, resolved) && out.assembled.cached_tokens > 0) {
    RecomputeReport report;
    out.logits = recompute_prefill(*model_, resolved, out.assembled, cache, recompute, &report);
    out.recomputed_tokens = report.recomputed_tokens;
  } else {
    out.logits =
        model_
            ->forward(torch::tensor(ids, int64).unsqueeze(0),
                      torch::tensor(out.assembled.fresh_positions, int64).unsqueeze(0), cache)
            .reshape({-1});
  }
  synchronize(out.logits);
  out.prefill_ms = now_ms() - start;
  return out;
}
Engine::BatchPrefill Engine::prefill_batch(const std::vector<pml::ResolvedPrompt>& resolved,
                                           KVCache& cache, bool use_cache,
                                           int64_t extra_capacity) const {
  std::vector<EntryPtr> entries;
  if (use_cache) {
    for (const auto& r : resolved) entries.push_back(entry(r.schema));
  }
  return prefill_batch_with(entries, resolved, cache, use_cache, extra_capacity);
}

Engine::BatchPrefill Engine::prefill_batch_with(const std::vector<EntryPtr>& entries,
                                                const std::vector<pml::ResolvedPrompt>& resolved,
                                                KVCache& cache, bool use_cache,
                                                int64_t extra_capacity) const {
  BatchPrefill out;
  const auto rows = static_cast<int64_t>(resolved.size());
  if (rows == 0 || cache.shape().batch != rows) {
    throw Error(ErrorKind::kInvalidArgument, "prefill_batch: " + std::to_string(rows) +
                                                 " prompts for a KV cache of batch " +
                                                 std::to_string(cache.shape().batch));
  }
  const int64_t limit = model_->config().max_position_embeddings;
  for (int64_t i = 0; i < rows; ++i) {
    check_context(max_position_of(resolved[i], use_cache), limit,
                  "prompt " + std::to_string(i + 1) + " of the batch", resolved[i].where);
  }
  AssembledBatch& batch = out.assembled;
  if (use_cache) {
    std::vector<BatchPrompt> prompts;
    std::vector<SpanStore::Pin> pinned;  // each row's states, held while they are assembled
    pinned.reserve(resolved.size());
    for (std::size_t i = 0; i < resolved.size(); ++i) {
      pinned.push_back(spans_->pin(entries[i]->layout, *entries[i]->spans, resolved[i].spans));
      prompts.push_back({&resolved[i], &entries[i]->layout, &pinned[i].states()});
    }
    batch = Assembler().assemble_batch(prompts, CacheStore(), cache, extra_capacity);
  } else {
    for (const auto& r : resolved) {
      batch.rows.push_back(baseline_prompt(r));
      batch.fresh_slots = std::max(batch.fresh_slots, static_cast<int64_t>(r.baseline.size()));
    }
    cache.clear();
    cache.reserve(batch.fresh_slots + std::max<int64_t>(extra_capacity, 0));
  }
  for (int64_t i = 0; i < rows; ++i) {
    check_context(batch.rows[i].max_position, limit,
                  "prompt " + std::to_string(i + 1) + " of the batch", resolved[i].where);
  }
  // Row i's fresh tokens end at the same slot as every other row's (padding goes first), so the
  // last column of the batch holds every row's last token. A padding token sees only itself.
  const int64_t c = batch.cached_slots, f = batch.fresh_slots;
  out.visible = torch::zeros({rows, cache.capacity()}, torch::kBool);
  auto ids = torch::zeros({rows, f}, torch::kInt64);
  auto positions = torch::zeros({rows, f}, torch::kInt64);
  auto cols = torch::arange(c + f, torch::kInt64);
  auto causal =
      cols.unsqueeze(0) <= (torch::arange(f, torch::kInt64) + c).unsqueeze(1);  // [f, c+f]
  auto mask = causal.unsqueeze(0).repeat({rows, 1, 1});
  auto diagonal = mask.accessor<bool, 3>();
  for (int64_t i = 0; i < rows; ++i) {
    const AssembledPrompt& a = batch.rows[i];
    const auto n = static_cast<int64_t>(a.fresh_tokens.size());
    const int64_t pad = f - n;
    out.visible[i].narrow(0, 0, a.cached_tokens).fill_(true);
    out.visible[i].narrow(0, c + pad, cache.capacity() - c - pad).fill_(true);
    ids[i].narrow(0, pad, n).copy_(
        torch::tensor(std::vector<int64_t>(a.fresh_tokens.begin(), a.fresh_tokens.end())));
    positions[i].narrow(0, pad, n).copy_(torch::tensor(a.fresh_positions));
    mask[i].logical_and_(out.visible[i].narrow(0, 0, c + f).unsqueeze(0));
    mask[i].narrow(0, 0, pad).fill_(false);
    for (int64_t j = 0; j < pad; ++j) diagonal[i][j][c + j] = true;
  }
  const double start = now_ms();
  ForwardOptions options;
  options.attention_mask = mask;
  out.logits = model_->forward(ids, positions, cache, options).reshape({rows, -1});
  synchronize(out.logits);
  out.prefill_ms = now_ms() - start;
  return out;
}

}  // namespace promptcache
