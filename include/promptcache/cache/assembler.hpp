// promptcache/cache/assembler.hpp — THE place where stored states are stitched into one cache.
//
// For a resolved prompt the assembler places the selected cacheable spans' states, in document
// order with their original position ids, into a reusable KVCache (by reference where the
// cache's attention reads them in place, else copied), and lists the fresh tokens
// the model must still run: argument tokens at their parameter's positions, spans of
// cache="false" modules at theirs, then the prompt's text right after the largest position used.
// Fresh tokens then attend to every assembled slot and to earlier fresh tokens — which is the
// KV cache's ordinary causal rule, so no special mask is needed (except in a batch, where each
// row sees only its own slots).
#pragma once

#include <cstdint>
#include <vector>

#include "promptcache/cache/store.hpp"
#include "promptcache/model/kv_cache.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"

namespace promptcache {

struct AssembledPrompt {
  std::vector<TokenId> fresh_tokens;
  std::vector<int64_t> fresh_positions;
  int64_t cached_tokens = 0;  // slots filled from the store
  int64_t reused_tokens = 0;  // of those, slots the cache already held (not copied again)
  // Of the cached slots filled now, those left in the store's blocks, read there by the
  // attention (KVCache::append_block); the others were copied.
  int64_t in_place_tokens = 0;
  int64_t kv_bytes = 0;       // bytes copied
  int64_t max_position = -1;  // the largest position id the prompt uses (cached or fresh)
  // The prompt's first baseline tokens whose stored states are the no-cache prefill's
  // (exact_prefix_tokens in cache/compiler.hpp): recompute never chooses their slots. Set by
  // the engine, which knows the encoding mode; 0 (nothing assumed exact) otherwise.
  int64_t exact_tokens = 0;
  double ms = 0;
};

// One prompt of a batch: its resolution and the layout of its schema (prompts of one batch may
// use different schemas).
struct BatchPrompt {
  const pml::ResolvedPrompt* resolved = nullptr;
  const pml::Layout* layout = nullptr;
  // Where its states are; null: the store passed to assemble_batch (an Engine keeps each schema's
  // states apart, so one version can be replaced while requests use another).
  const CacheStore* store = nullptr;
};

// Several prompts assembled into the rows of one batch KV cache. Row i holds prompt i's stored
// states at slots [0, rows[i].cached_tokens) and zeros after them up to cached_slots (the
// longest row; a zeroed or re-run slot must be masked out for that row); the fresh tokens of
// every row come after cached_slots.
struct AssembledBatch {
  std::vector<AssembledPrompt> rows;
  int64_t cached_slots = 0;  // slots the assembled region spans
  int64_t fresh_slots = 0;   // the most fresh tokens of any row
  double ms = 0;
};

struct AssembleOptions {
  // Keep the leading spans the cache still holds from an earlier assembly (the same stored
  // blocks at the same slots, see KVCache::sources) rather than filling them again.
  bool reuse = true;
  // Leave the spans in the store's blocks where the cache's attention reads them in place (f32,
  // bf16 or f16 on the CPU with the fused kernel, cpu_attention_takes): nothing is copied. false,
  // or anywhere else, copies every span into the cache.
  bool in_place = true;
};

class Assembler {
 public:
  // Fills `cache` (grown if needed to hold the prompt plus `extra_capacity` slots) and returns
  // the fresh part; see AssembleOptions for what is kept, referenced or copied. Everything after
  // the kept spans is replaced. Error(kCacheFile) if a cacheable span has no stored states
  // (schema not compiled).
  AssembledPrompt assemble(const pml::ResolvedPrompt& prompt, const pml::Layout& layout,
                           const CacheStore& store, KVCache& cache, int64_t extra_capacity,
                           const AssembleOptions& options = {}) const;

  // Assembles every prompt into its own row of `cache` (whose batch must equal the number of
  // prompts; it is cleared, then grown to hold cached_slots + fresh_slots + extra_capacity).
  // Each span is copied once per row that selects it; nothing is reused across calls or read in
  // place.
  AssembledBatch assemble_batch(const std::vector<BatchPrompt>& prompts, const CacheStore& store,
                                KVCache& cache, int64_t extra_capacity) const;
};

}  // namespace promptcache
