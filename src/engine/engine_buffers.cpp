// src/engine/engine_buffers.cpp — the pool of KV buffers. A request takes a buffer no other
// request holds and gives it back when it returns; a single prompt's buffer keeps its contents, so
// the next prompt that selects the same leading modules reuses them. The pool also lets go of what
// it must not keep: states of a replaced schema version (forget_buffers_of) and slots read from
// blocks the span tiers evicted (release_evicted, give_back), so a free buffer never holds evicted
// memory alive.
#include "promptcache/engine.hpp"

namespace promptcache {

void Engine::forget_buffers_of(const std::string& name) {
  // A free KV buffer that still holds the old version's states could never reuse them (their
  // block ids are gone), and one that refers to them in place would keep them in memory: it is
  // emptied. Buffers in use now are emptied when they come back (give_back).
  std::lock_guard<std::mutex> lock(pool_mutex_);
  for (auto& b : free_buffers_) {
    if (b->schema == name) {
      b->cache.clear();
      b->schema.clear();
      b->entry = nullptr;
    }
  }
}

namespace {

// Cuts `cache` short before the first run of slots copied or read from a stored block that
// `gone` says the span tiers no longer hold (evicted): a block read in place is let go with it,
// and no later request could keep those slots anyway (a span brought back is a new block).
template <typename Gone>
void cut_before_gone(KVCache& cache, const Gone& gone) {
  for (const SlotSource& s : cache.sources()) {
    if (gone(s.source)) {
      cache.truncate(s.slot);
      return;
    }
  }
}

}  // namespace

void Engine::release_evicted(uint64_t id) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  for (auto& b : free_buffers_) {
    cut_before_gone(b->cache, [id](uint64_t source) { return source == id; });
  }
}

// --- The KV buffer pool ----------------------------------------------------------------------
// A request takes a buffer no other request holds and gives it back when it returns; the pool
// keeps as many as requests ran at once. A single prompt's buffer keeps its contents, so the next
// prompt that selects the same leading modules reuses them (RequestOptions::reuse_buffer): a
// prompt gets the free buffer that holds the longest run of its leading stored blocks.

std::unique_ptr<Engine::PooledBuffer> Engine::take_buffer(const SchemaEntry& entry,
                                                          const pml::ResolvedPrompt& resolved) {
  // The ids of the stored blocks the prompt selects, in slot order (what KVCache::sources of a
  // buffer assembled for it would list).
  std::vector<uint64_t> wanted;
  for (std::size_t index : resolved.spans) {
    const auto key = entry.spans->keys.find(index);
    if (key == entry.spans->keys.end()) continue;
    if (const uint64_t id = spans_->resident_id(key->second)) wanted.push_back(id);
  }
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    std::size_t best = free_buffers_.size(), best_kept = 0;
    // From the most recently given back, so an idle engine hands its one buffer to each request.
    for (std::size_t i = free_buffers_.size(); i-- > 0;) {
      const auto& held = free_buffers_[i]->cache.sources();
      std::size_t kept = 0;
      while (kept < held.size() && kept < wanted.size() && held[kept].source == wanted[kept]) {
        ++kept;
      }
      if (best == free_buffers_.size() || kept > best_kept) {
        best = i;
        best_kept = kept;
      }
    }
    if (best < free_buffers_.size()) {
      auto buffer = std::move(free_buffers_[best]);
      free_buffers_.erase(free_buffers_.begin() + static_cast<std::ptrdiff_t>(best));
      return buffer;
    }
  }
  auto buffer = std::make_unique<PooledBuffer>();
  buffer->cache = model_->make_cache(0);
  return buffer;
}

std::unique_ptr<Engine::PooledBuffer> Engine::take_batch_buffer(int64_t rows) {
  std::unique_ptr<PooledBuffer> replaced;  // freed before the new buffer is made
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    for (auto it = free_batch_buffers_.rbegin(); it != free_batch_buffers_.rend(); ++it) {
      if ((*it)->cache.shape().batch == rows) {
        auto buffer = std::move(*it);
        free_batch_buffers_.erase(std::next(it).base());
        return buffer;
      }
    }
    // A buffer of another batch size is replaced by this one, so the pool never holds more
    // batch buffers than batches ran at once.
    if (!free_batch_buffers_.empty()) {
      replaced = std::move(free_batch_buffers_.front());
      free_batch_buffers_.erase(free_batch_buffers_.begin());
    }
  }
  replaced.reset();
  auto buffer = std::make_unique<PooledBuffer>();
  buffer->cache = model_->make_cache(0, rows);
  return buffer;
}

void Engine::give_back(std::unique_ptr<PooledBuffer> buffer, bool batch, bool finished) {
  if (!buffer) return;
  if (!finished) {
    buffer->cache.clear();
    buffer->schema.clear();
    buffer->entry = nullptr;
  }
  std::lock_guard<std::mutex> lock(pool_mutex_);
  if (batch) {
    free_batch_buffers_.push_back(std::move(buffer));
    return;
  }
  // States of a version of the schema replaced while the request ran: see publish. (The request
  // still holds its entry, so the address cannot belong to a newer one.)
  if (buffer->entry != nullptr) {
    std::shared_lock<std::shared_mutex> schemas(schemas_mutex_);
    auto it = schemas_.find(buffer->schema);
    if (it == schemas_.end() || it->second.get() != buffer->entry) {
      buffer->cache.clear();
      buffer->schema.clear();
      buffer->entry = nullptr;
    }
  }
  // Blocks evicted while the request ran (release_evicted sees only the free buffers). Checked
  // under pool_mutex_: an eviction after this check finds the buffer in free_buffers_.
  cut_before_gone(buffer->cache, [this](uint64_t source) { return !spans_->resident(source); });
  free_buffers_.push_back(std::move(buffer));
}

}  // namespace promptcache
