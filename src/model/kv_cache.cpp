#include "promptcache/model/kv_cache.hpp"

#include <algorithm>

#include "promptcache/error.hpp"

namespace promptcache {

KVCache::KVCache(const KVCacheShape& shape, torch::TensorOptions options)
    : shape_(shape), options_(options) {
  if (shape.layers <= 0 || shape.batch <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.capacity < 0) {
    throw Error(ErrorKind::kInvalidArgument, "KV cache shape must be positive");
  }
  allocate(shape.capacity);
  positions_.reserve(shape.capacity);
}

void KVCache::allocate(int64_t capacity) {
  // One buffer for all layers, K and V: [layers, 2, batch, kv_heads, capacity, head_dim]. The
  // per-layer K/V tensors are views of it, and all_slots() copies a whole span in one call.
  all_ = torch::empty({shape_.layers, 2, shape_.batch, shape_.kv_heads, capacity, shape_.head_dim},
                      options_);
  k_.clear();
  v_.clear();
  for (int64_t l = 0; l < shape_.layers; ++l) {
    k_.push_back(all_[l][0]);
    v_.push_back(all_[l][1]);
  }
}

torch::Tensor KVCache::all_slots(int64_t begin, int64_t count) const {
  return all_.narrow(4, begin, count);
}

torch::Tensor KVCache::keys(int64_t layer) const {
  return k_.at(layer).narrow(2, 0, length_);
}
torch::Tensor KVCache::values(int64_t layer) const {
  return v_.at(layer).narrow(2, 0, length_);
}

torch::Tensor KVCache::key_slots(int64_t layer, int64_t begin, int64_t count) const {
  return k_.at(layer).narrow(2, begin, count);
}
torch::Tensor KVCache::value_slots(int64_t layer, int64_t begin, int64_t count) const {
  return v_.at(layer).narrow(2, begin, count);
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
  for (int64_t p : positions) max_position_ = std::max(max_position_, p);
}

void KVCache::reserve(int64_t capacity) {
  if (capacity <= shape_.capacity) return;
  const torch::Tensor old = all_;
  allocate(capacity);
  all_.narrow(4, 0, length_).copy_(old.narrow(4, 0, length_));
  shape_.capacity = capacity;
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
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const auto to = static_cast<int64_t>(j);
    if (rows[j] == to) continue;  // ascending: a row only moves down, onto one already dropped
    all_.narrow(2, to, 1)
        .narrow(4, 0, length_)
        .copy_(all_.narrow(2, rows[j], 1).narrow(4, 0, length_));
  }
  shape_.batch = static_cast<int64_t>(rows.size());
  all_ = all_.narrow(2, 0, shape_.batch);
  for (int64_t l = 0; l < shape_.layers; ++l) {
    k_[l] = all_[l][0];
    v_[l] = all_[l][1];
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
