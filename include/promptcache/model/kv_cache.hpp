// promptcache/model/kv_cache.hpp — an explicit, preallocated, position-aware KV cache.
//
// Per layer, K and V live in one buffer each of shape [batch, kv_heads, capacity, head_dim].
// Slots [0, length) are filled; appending writes in place (no re-concatenation while decoding).
// Keys are stored with RoPE already applied at the token's own position id, so a slot's contents
// do not depend on where in the buffer it sits — which is what lets the Prompt Cache assembler
// copy module states into any slot order. The cache also remembers every slot's position id.
//
// Slots may also be filled by reference (append_block): their states stay in a stored module
// block and the fused CPU attention reads them there (segments()), so assembling a request
// copies nothing. Every accessor that hands out the buffer's own memory for those slots copies
// the blocks in first, so a caller that does not know about them still sees the right states.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "promptcache/model/cpu_attention.hpp"

namespace promptcache {

struct KVCacheShape {
  int64_t layers = 0;
  int64_t batch = 1;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t capacity = 0;
};

// Which stored block a run of slots was copied from (see KVCache::tag_source).
struct SlotSource {
  uint64_t source = 0;  // the block's id (SpanStates::id)
  int64_t slot = 0;
  int64_t count = 0;
  bool operator==(const SlotSource& o) const {
    return source == o.source && slot == o.slot && count == o.count;
  }
};

class KVCache {
 public:
  KVCache() = default;
  KVCache(const KVCacheShape& shape, torch::TensorOptions options);

  const KVCacheShape& shape() const { return shape_; }
  int64_t length() const { return length_; }
  int64_t capacity() const { return shape_.capacity; }
  int64_t layers() const { return shape_.layers; }
  torch::TensorOptions options() const { return options_; }
  bool empty() const { return length_ == 0; }

  // Views of the filled slots [0, length) of one layer: [batch, kv_heads, length, head_dim].
  // These and the other views below first copy in any block-held slots they cover.
  torch::Tensor keys(int64_t layer) const;
  torch::Tensor values(int64_t layer) const;
  // Views of slots [begin, begin + count) of one layer, for writing (assembler) or reading.
  torch::Tensor key_slots(int64_t layer, int64_t begin, int64_t count) const;
  torch::Tensor value_slots(int64_t layer, int64_t begin, int64_t count) const;

  // Slots [begin, begin + count) of every layer's K and V at once:
  // [layers, 2 (K, V), batch, kv_heads, count, head_dim].
  torch::Tensor all_slots(int64_t begin, int64_t count) const;

  // Copies a stored block [layers, 2 (K, V), kv_heads, n, head_dim] into slots
  // [slot, slot + n) of every batch row, or of batch row `row` (>= 0) only; the length does not
  // change (fill_external records the slots). On the CPU each head's run goes through memcpy,
  // shared out among the kernel threads for a large block.
  void write_block(int64_t slot, const torch::Tensor& block, int64_t row = -1);

  // Fills slots [length, length + n) by reference: `block` [layers, 2, kv_heads, n, head_dim]
  // (same dtype and device) holds their states, shared by every batch row, and is kept alive
  // here; nothing is copied until an accessor needs the slots in the buffer.
  void append_block(const torch::Tensor& block, const std::vector<int64_t>& positions);
  // Slots held by reference to a block, not in the buffer.
  int64_t block_slots() const;
  // Slots [0, count) of one layer (count may reach into the pending slots) as runs in slot
  // order: a block-held run as [1, kv_heads, n, head_dim] views of its block, the rest as views
  // of the buffer. Copies nothing.
  std::vector<KVSegment> segments(int64_t layer, int64_t count) const;

  // Writes k, v ([batch, kv_heads, n, head_dim]) into slots [length, length + n) of one layer.
  // The length advances only on commit(), after every layer has written its part.
  void write_pending(int64_t layer, const torch::Tensor& k, const torch::Tensor& v);
  // The same slots as views ({keys, values}, each [batch, kv_heads, n, head_dim]) for a caller
  // that writes them itself; throws kContextOverflow as write_pending does when they do not fit.
  std::pair<torch::Tensor, torch::Tensor> pending_slots(int64_t layer, int64_t n) const;
  // Makes the n pending slots part of the cache and records their position ids.
  void commit(const std::vector<int64_t>& positions);

  // Position ids of slots [0, length) (of batch row 0); max_position() is -1 for an empty cache.
  const std::vector<int64_t>& positions() const { return positions_; }
  // Position ids of slots [0, length) of one batch row: rows of a batch assembled from different
  // prompts hold different positions in the same slots (-1 for a slot a row leaves empty). Rows
  // never set differently have row 0's. The sliding-window rule reads them.
  const std::vector<int64_t>& row_positions(int64_t row) const;
  // Records the position ids of filled slots [begin, begin + positions.size()) of one row.
  void set_row_positions(int64_t row, int64_t begin, const std::vector<int64_t>& positions);
  int64_t max_position() const { return max_position_; }

  // Marks slots as filled after the caller wrote them directly through key_slots/value_slots.
  void fill_external(int64_t count, const std::vector<int64_t>& positions);
  // Grows the buffers to at least `capacity` slots, keeping the contents.
  void reserve(int64_t capacity);
  // Forgets the contents (buffers are kept for reuse).
  void clear();
  // Drops slots [length, old length): used to roll back to a shared prefix. A block-held run
  // that the cut goes through keeps its first slots by reference.
  void truncate(int64_t length);

  // Keeps only the given batch rows (ascending), in place: row j takes row rows[j]'s filled
  // slots and the batch shrinks to rows.size(). Nothing is allocated and only moved rows are
  // copied (a batch drops its finished rows so); slots, positions, provenance and block-held
  // runs (the same for every row) are kept.
  void keep_rows(const std::vector<int64_t>& rows);
  // Adds n empty batch rows after the current ones (a batch admitting new prompts): their filled
  // slots hold no states (position -1) until the caller writes them. Rows keep_rows dropped are
  // taken back without allocating; beyond them the buffer grows (to twice its rows at least),
  // copying the filled slots.
  void add_rows(int64_t n);

  // Provenance, for the assembler: records that filled slots [slot, slot + count) hold a copy of
  // stored block `source`, so a later request selecting the same blocks at the same slots can
  // keep them instead of copying again. A record is forgotten as soon as its slots may change
  // (clear, or truncate below its end); appending never touches it.
  void tag_source(const SlotSource& tag);
  const std::vector<SlotSource>& sources() const { return sources_; }
  // Forgets every provenance record, for a caller that rewrote slots (recompute.hpp).
  void forget_sources() { sources_.clear(); }

  // Bytes one token occupies across all layers: 2 x layers x kv_heads x head_dim x dtype size.
  int64_t bytes_per_token() const;

 private:
  // Slots [slot, slot + count) whose states are the first `count` tokens of `kv`.
  struct HeldBlock {
    torch::Tensor kv;  // [layers, 2, kv_heads, n, head_dim], n >= count
    int64_t slot = 0;
    int64_t count = 0;
    std::vector<torch::Tensor> k, v;  // per layer: [1, kv_heads, n, head_dim] views of kv
  };
  // A new buffer of `rows` batch rows and `capacity` slots (at least the current ones) holding
  // the current rows' filled slots (those the buffer itself holds); then view_rows(batch).
  // Every growth goes through here: the constructor, reserve and add_rows.
  void reallocate(int64_t rows, int64_t capacity);
  // Makes the first `rows` allocated rows the batch: all_, k_ and v_ become views of them.
  // Every narrowing goes through here: reallocate, keep_rows and add_rows.
  void view_rows(int64_t rows);
  // Slots [begin, begin + count), held by `held` (its first count slots) or, when null, by the
  // buffer itself.
  struct SlotRun {
    int64_t begin = 0, count = 0;
    const HeldBlock* held = nullptr;
  };
  // Slots [0, end) as such runs, in slot order.
  std::vector<SlotRun> slot_runs(int64_t end) const;
  // Whether `block` is [layers, 2, kv_heads, n, head_dim] for this cache (any n).
  bool block_shape_fits(const torch::Tensor& block) const;
  // Copies every block-held run overlapping slots [begin, end) into the buffer.
  void materialize(int64_t begin, int64_t end) const;

  KVCacheShape shape_;
  torch::TensorOptions options_;
  torch::Tensor all_;             // [layers, 2, batch, kv_heads, capacity, head_dim]
  torch::Tensor rows_all_;        // all allocated rows (keep_rows narrows all_ to a prefix of it)
  std::vector<torch::Tensor> k_;  // per layer views of all_: [batch, kv_heads, capacity, head_dim]
  std::vector<torch::Tensor> v_;
  int64_t length_ = 0;
  std::vector<int64_t> positions_;
  // Per batch row, that row's position ids when they differ from row 0's (else empty).
  std::vector<std::vector<int64_t>> row_positions_;
  int64_t max_position_ = -1;
  std::vector<SlotSource> sources_;
  // In slot order. Mutable: copying a block into the buffer does not change what the cache holds.
  mutable std::vector<HeldBlock> held_;
};

}  // namespace promptcache
