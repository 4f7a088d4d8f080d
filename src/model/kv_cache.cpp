#include "promptcache/model/kv_cache.hpp"

#include <algorithm>
#include <cstring>

#include "promptcache/error.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/model/work_pool.hpp"

namespace promptcache {
namespace {

// Copies a block [layers, 2, kv_heads, n, head_dim] into dst [layers, 2, batch, kv_heads, n,
// head_dim] (every batch row gets it). On the CPU each (layer, K/V, row, head) run of
// n x head_dim values is contiguous on both sides and goes through memcpy; LibTorch's strided
// copy_ (single-threaded here) ran at about half of memcpy's rate.
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
  const int64_t blocks = dst.size(0) * 2;  // (layer, K/V) pairs
  // One core does not saturate memory: a large span is shared out among the kernel threads
  // (a block per layer and K/V; small spans stay on the calling thread).
  const int64_t bytes = blocks * dst.size(2) * dst.size(3) * run;
  const int threads = bytes >= (int64_t{1} << 20) ? kernel_threads() : 1;
  // On the kernel work pool, not an OpenMP team: a team's barrier waits for a thread another
  // process holds, and its threads spin after the copy (include/promptcache/model/work_pool.hpp).
  parallel_chunks(blocks, threads, [&](int64_t block) {
    const int64_t l = block / 2, kv = block % 2;
    for (int64_t b = 0; b < dst.size(2); ++b) {
      for (int64_t h = 0; h < dst.size(3); ++h) {
        const int64_t to =
            l * dst.stride(0) + kv * dst.stride(1) + b * dst.stride(2) + h * dst.stride(3);
        const int64_t from = ((l * 2 + kv) * src.size(2) + h) * src.size(3) * src.size(4);
        std::memcpy(out + to * item, in + from * item, static_cast<std::size_t>(run));
      }
    }
  });
}

}  // namespace

KVCache::KVCache(const KVCacheShape& shape, torch::TensorOptions options)
    : shape_(shape), options_(options) {
  if (shape.layers <= 0 || shape.batch <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.capacity < 0) {
    throw Error(ErrorKind::kInvalidArgument, "KV cache shape must be positive");
  }
  reallocate(shape.batch, shape.capacity);
  positions_.reserve(shape.capacity);
}

void KVCache::reallocate(int64_t rows, int64_t capacity) {
  // One buffer for all layers, K and V: [layers, 2, rows, kv_heads, capacity, head_dim]. The
  // per-layer K/V tensors are views of it, and all_slots() copies a whole span in one call.
  const torch::Tensor old = all_;
  rows_all_ =
      torch::empty({shape_.layers, 2, rows, shape_.kv_heads, capacity, shape_.head_dim}, options_);
  shape_.capacity = capacity;
  view_rows(shape_.batch);
  if (!old.defined()) return;
  // Only the slots the buffer itself holds: held runs were never written there.
  for (const SlotRun& run : slot_runs(length_)) {
    if (run.held != nullptr) continue;
    all_.narrow(4, run.begin, run.count).copy_(old.narrow(4, run.begin, run.count));
  }
}

void KVCache::view_rows(int64_t rows) {
  shape_.batch = rows;
  all_ = rows_all_.narrow(2, 0, rows);
  k_.resize(static_cast<std::size_t>(shape_.layers));
  v_.resize(static_cast<std::size_t>(shape_.layers));
  for (int64_t l = 0; l < shape_.layers; ++l) {
    k_[l] = all_[l][0];
    v_[l] = all_[l][1];
  }
}

torch::Tensor KVCache::all_slots(int64_t begin, int64_t count) const {
  materialize(begin, begin + count);
  return all_.narrow(4, begin, count);
}

torch::Tensor KVCache::keys(int64_t layer) const {
  materialize(0, length_);
  return k_.at(layer).narrow(2, 0, length_);
}
torch::Tensor KVCache::values(int64_t layer) const {
  materialize(0, length_);
  return v_.at(layer).narrow(2, 0, length_);
}

torch::Tensor KVCache::key_slots(int64_t layer, int64_t begin, int64_t count) const {
  materialize(begin, begin + count);
  return k_.at(layer).narrow(2, begin, count);
}
torch::Tensor KVCache::value_slots(int64_t layer, int64_t begin, int64_t count) const {
  materialize(begin, begin + count);
  return v_.at(layer).narrow(2, begin, count);
}

bool KVCache::block_shape_fits(const torch::Tensor& block) const {
  return block.dim() == 5 && block.size(0) == shape_.layers && block.size(1) == 2 &&
         block.size(2) == shape_.kv_heads && block.size(4) == shape_.head_dim;
}

void KVCache::write_block(int64_t slot, const torch::Tensor& block, int64_t row) {
  if (!block_shape_fits(block)) {
    throw Error(ErrorKind::kInvalidArgument,
                "KV cache write_block: a block must be [layers, 2, kv_heads, n, head_dim] = [" +
                    std::to_string(shape_.layers) + ", 2, " + std::to_string(shape_.kv_heads) +
                    ", n, " + std::to_string(shape_.head_dim) + "]");
  }
  const int64_t n = block.size(3);
  if (slot < 0 || slot + n > shape_.capacity || row >= shape_.batch) {
    throw Error(ErrorKind::kInvalidArgument, "KV cache write_block outside the buffer");
  }
  materialize(slot, slot + n);  // a held run there would otherwise shadow what is written
  auto dst = all_.narrow(4, slot, n);
  if (row >= 0) dst = dst.narrow(2, row, 1);
  copy_block(dst, block);
}

void KVCache::append_block(const torch::Tensor& block, const std::vector<int64_t>& positions) {
  const auto n = static_cast<int64_t>(positions.size());
  const bool shape_ok = block_shape_fits(block) && block.size(3) == n && block.is_contiguous();
  if (!shape_ok || block.scalar_type() != c10::typeMetaToScalarType(options_.dtype()) ||
      block.device() != all_.device()) {
    throw Error(ErrorKind::kInvalidArgument,
                "KV cache append_block: the block must be a dense [layers, 2, kv_heads, " +
                    std::to_string(n) + ", head_dim] tensor of the cache's dtype and device");
  }
  if (n == 0) return;
  if (length_ + n > shape_.capacity) {
    throw Error(ErrorKind::kContextOverflow,
                "KV cache full: " + std::to_string(length_) + " + " + std::to_string(n) +
                    " tokens exceed its capacity of " + std::to_string(shape_.capacity));
  }
  // Each layer's K and V views, made once here: the attention asks for them at every forward
  // (one view per layer and K/V, instead of the several a select-and-narrow chain makes).
  HeldBlock held{block, length_, n, {}, {}};
  const int64_t head = n * shape_.head_dim, kv = shape_.kv_heads * head;
  for (int64_t l = 0; l < shape_.layers; ++l) {
    for (int64_t which = 0; which < 2; ++which) {
      (which == 0 ? held.k : held.v)
          .push_back(block.as_strided({1, shape_.kv_heads, n, shape_.head_dim},
                                      {kv, head, shape_.head_dim, 1},
                                      block.storage_offset() + (2 * l + which) * kv));
    }
  }
  held_.push_back(std::move(held));
  fill_external(n, positions);
}

int64_t KVCache::block_slots() const {
  int64_t slots = 0;
  for (const auto& h : held_) slots += h.count;
  return slots;
}

std::vector<KVSegment> KVCache::segments(int64_t layer, int64_t count) const {
  if (layer < 0 || layer >= shape_.layers || count < 0 || count > shape_.capacity) {
    throw Error(ErrorKind::kInvalidArgument, "KV cache segments outside the buffer");
  }
  std::vector<KVSegment> out;
  for (const SlotRun& run : slot_runs(count)) {
    if (run.held == nullptr) {
      out.push_back(
          {k_[layer].narrow(2, run.begin, run.count), v_[layer].narrow(2, run.begin, run.count)});
    } else if (run.count == run.held->kv.size(3)) {
      out.push_back({run.held->k[layer], run.held->v[layer]});
    } else {
      out.push_back(
          {run.held->k[layer].narrow(2, 0, run.count), run.held->v[layer].narrow(2, 0, run.count)});
    }
  }
  return out;
}

std::vector<KVCache::SlotRun> KVCache::slot_runs(int64_t end) const {
  std::vector<SlotRun> runs;
  int64_t slot = 0;
  for (const auto& h : held_) {
    if (h.slot >= end) break;
    if (h.slot > slot) runs.push_back({slot, h.slot - slot, nullptr});
    const int64_t count = std::min(h.count, end - h.slot);
    runs.push_back({h.slot, count, &h});
    slot = h.slot + count;
  }
  if (end > slot) runs.push_back({slot, end - slot, nullptr});
  return runs;
}

void KVCache::materialize(int64_t begin, int64_t end) const {
  if (held_.empty()) return;
  std::vector<HeldBlock> kept;
  for (auto& h : held_) {
    if (h.slot < end && h.slot + h.count > begin) {
      copy_block(all_.narrow(4, h.slot, h.count), h.kv.narrow(3, 0, h.count));
    } else {
      kept.push_back(std::move(h));
    }
  }
  held_ = std::move(kept);
}

void KVCache::write_pending(int64_t layer, const torch::Tensor& k, const torch::Tensor& v) {
  auto [keys, values] = pending_slots(layer, k.size(2));
  keys.copy_(k);
  values.copy_(v);
}

std::pair<torch::Tensor, torch::Tensor> KVCache::pending_slots(int64_t layer, int64_t n) const {
  if (length_ + n > shape_.capacity) {
    throw Error(ErrorKind::kContextOverflow,
                "KV cache full: " + std::to_string(length_) + " + " + std::to_string(n) +
                    " tokens exceed its capacity of " + std::to_string(shape_.capacity));
  }
  return {k_.at(layer).narrow(2, length_, n), v_.at(layer).narrow(2, length_, n)};
}

void KVCache::commit(const std::vector<int64_t>& positions) {
  fill_external(static_cast<int64_t>(positions.size()), positions);
}

void KVCache::fill_external(int64_t count, const std::vector<int64_t>& positions) {
  if (static_cast<int64_t>(positions.size()) != count || length_ + count > shape_.capacity) {
    throw Error(ErrorKind::kInvalidArgument, "KV cache fill does not match its capacity");
  }
  length_ += count;
  positions_.insert(positions_.end(), positions.begin(), positions.end());
  for (auto& row : row_positions_) {
    if (!row.empty()) row.insert(row.end(), positions.begin(), positions.end());
  }
  for (int64_t p : positions) max_position_ = std::max(max_position_, p);
}

const std::vector<int64_t>& KVCache::row_positions(int64_t row) const {
  if (row < 0 || row >= shape_.batch) {
    throw Error(ErrorKind::kInvalidArgument,
                "KV cache row_positions: no batch row " + std::to_string(row));
  }
  const auto r = static_cast<std::size_t>(row);
  return r < row_positions_.size() && !row_positions_[r].empty() ? row_positions_[r] : positions_;
}

void KVCache::set_row_positions(int64_t row, int64_t begin, const std::vector<int64_t>& positions) {
  const auto n = static_cast<int64_t>(positions.size());
  if (row < 0 || row >= shape_.batch || begin < 0 || begin + n > length_) {
    throw Error(ErrorKind::kInvalidArgument,
                "KV cache set_row_positions outside the filled slots of its rows");
  }
  if (row == 0) {
    // Rows that follow row 0's positions keep the ones they have.
    if (shape_.batch > 1 &&
        !std::equal(positions.begin(), positions.end(), positions_.begin() + begin)) {
      row_positions_.resize(static_cast<std::size_t>(shape_.batch));
      for (std::size_t r = 1; r < row_positions_.size(); ++r) {
        if (row_positions_[r].empty()) row_positions_[r] = positions_;
      }
    }
    std::copy(positions.begin(), positions.end(), positions_.begin() + begin);
    max_position_ =
        positions_.empty() ? -1 : *std::max_element(positions_.begin(), positions_.end());
    return;
  }
  if (std::equal(positions.begin(), positions.end(), row_positions(row).begin() + begin)) return;
  row_positions_.resize(static_cast<std::size_t>(shape_.batch));
  auto& mine = row_positions_[static_cast<std::size_t>(row)];
  if (mine.empty()) mine = positions_;
  std::copy(positions.begin(), positions.end(), mine.begin() + begin);
}

void KVCache::reserve(int64_t capacity) {
  if (capacity <= shape_.capacity) return;
  // Rows keep_rows dropped stay allocated, for add_rows to take back.
  reallocate(rows_all_.defined() ? rows_all_.size(2) : shape_.batch, capacity);
}

void KVCache::clear() {
  truncate(0);
}

void KVCache::truncate(int64_t length) {
  if (length < 0 || length > length_) {
    throw Error(ErrorKind::kInvalidArgument, "KV cache truncate beyond its length");
  }
  length_ = length;
  positions_.resize(length);
  for (auto& row : row_positions_) {
    if (!row.empty()) row.resize(length);
  }
  held_.erase(std::remove_if(held_.begin(), held_.end(),
                             [&](const HeldBlock& h) { return h.slot >= length; }),
              held_.end());
  for (auto& h : held_) h.count = std::min(h.count, length - h.slot);
  sources_.erase(std::remove_if(sources_.begin(), sources_.end(),
                                [&](const SlotSource& t) { return t.slot + t.count > length; }),
                 sources_.end());
  max_position_ = positions_.empty() ? -1 : *std::max_element(positions_.begin(), positions_.end());
}

void KVCache::keep_rows(const std::vector<int64_t>& rows) {
  if (rows.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "KV cache keep_rows: no rows to keep");
  }
  for (std::size_t j = 0; j < rows.size(); ++j) {
    if (rows[j] < 0 || rows[j] >= shape_.batch || (j > 0 && rows[j] <= rows[j - 1])) {
      throw Error(ErrorKind::kInvalidArgument,
                  "KV cache keep_rows: rows must be ascending batch rows below " +
                      std::to_string(shape_.batch) + ", got " + std::to_string(rows[j]));
    }
  }
  const auto runs = slot_runs(length_);
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const auto to = static_cast<int64_t>(j);
    if (rows[j] == to) continue;  // ascending: a row only moves down, onto one already dropped
    for (const SlotRun& run : runs) {
      if (run.held != nullptr) continue;  // held runs serve every row: nothing to move there
      all_.narrow(2, to, 1)
          .narrow(4, run.begin, run.count)
          .copy_(all_.narrow(2, rows[j], 1).narrow(4, run.begin, run.count));
    }
  }
  if (!row_positions_.empty()) {
    std::vector<std::vector<int64_t>> kept;
    for (int64_t r : rows) kept.push_back(row_positions(r));
    positions_ = kept[0];
    max_position_ =
        positions_.empty() ? -1 : *std::max_element(positions_.begin(), positions_.end());
    for (auto& row : kept) {
      if (row == positions_) row.clear();
    }
    kept[0].clear();
    row_positions_ = std::move(kept);
  }
  view_rows(static_cast<int64_t>(rows.size()));
}

void KVCache::add_rows(int64_t n) {
  if (n <= 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "KV cache add_rows: n must be positive, got " + std::to_string(n));
  }
  if (!rows_all_.defined()) {
    throw Error(ErrorKind::kInvalidArgument,
                "KV cache add_rows: the cache has no buffer (default-constructed; make it with a "
                "shape first)");
  }
  const int64_t old_rows = shape_.batch;
  if (old_rows + n > rows_all_.size(2)) {
    // Twice the rows allocated before, so a batch growing row by row copies its states rarely.
    reallocate(std::max(old_rows + n, 2 * rows_all_.size(2)), shape_.capacity);
  }
  view_rows(old_rows + n);
  if (length_ > 0) {
    // Existing rows that follow row 0 keep doing so (an empty entry); the new rows hold nothing.
    row_positions_.resize(static_cast<std::size_t>(shape_.batch));
    for (int64_t r = old_rows; r < shape_.batch; ++r) {
      row_positions_[static_cast<std::size_t>(r)].assign(static_cast<std::size_t>(length_), -1);
    }
  }
}

void KVCache::tag_source(const SlotSource& tag) {
  if (tag.slot < 0 || tag.count <= 0 || tag.slot + tag.count > length_) {
    throw Error(ErrorKind::kInvalidArgument, "KV cache source tag outside the filled slots");
  }
  sources_.push_back(tag);
}

int64_t KVCache::bytes_per_token() const {
  const int64_t item =
      static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options_.dtype())));
  return 2 * shape_.layers * shape_.kv_heads * shape_.head_dim * item;
}

}  // namespace promptcache
