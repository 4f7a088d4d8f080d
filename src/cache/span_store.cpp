#include "promptcache/cache/span_store.hpp"

#include <filesystem>
#include <iostream>
#include <utility>

// Header-only xxHash (Debian libxxhash-dev), as in cache_file.cpp.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "promptcache/cache/cache_file.hpp"
#include "promptcache/error.hpp"

namespace promptcache {
namespace {

void hash_text(XXH3_state_t& state, const std::string& text) {
  const std::uint64_t n = text.size();
  XXH3_128bits_update(&state, &n, sizeof n);
  XXH3_128bits_update(&state, text.data(), text.size());
}

template <typename T>
void hash_value(XXH3_state_t& state, const T& value) {
  XXH3_128bits_update(&state, &value, sizeof value);
}

std::string hex128(XXH128_hash_t h) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

}  // namespace

std::map<std::size_t, std::string> span_keys(const pml::Layout& layout,
                                             const std::string& model_fingerprint,
                                             torch::Dtype dtype, torch::Dtype kv_dtype,
                                             EncodingMode mode) {
  std::map<std::size_t, std::string> keys;
  for (const EncodingPass& pass : encoding_passes(layout, mode)) {
    // One running hash per pass: a stored span's key covers every span before it in the pass
    // (what it attended to when it was encoded) and itself, token ids and positions.
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_128bits_reset(&state);
    hash_text(state, "promptcache-span-v1");
    hash_text(state, model_fingerprint);
    hash_text(state, dtype_name(dtype));
    hash_text(state, dtype_name(kv_dtype));
    hash_text(state, to_string(mode));
    for (std::size_t s : pass.spans) {
      const pml::Span& span = layout.spans[s];
      hash_value(state, static_cast<std::uint64_t>(span.begin));
      hash_value(state, static_cast<std::uint64_t>(span.size()));
      XXH3_128bits_update(&state, span.tokens.data(), span.tokens.size() * sizeof(TokenId));
      const bool stored = std::find(pass.stored.begin(), pass.stored.end(), s) != pass.stored.end();
      if (stored && span.size() > 0) keys.emplace(s, hex128(XXH3_128bits_digest(&state)));
    }
  }
  return keys;
}

// One key's states in each tier, and its place in each tier's LRU list.
// A slot's states in one memory tier, and its place in that tier's LRU list while held there.
struct SpanStore::Residence {
  SpanStates states;
  bool held = false;
  std::list<Slot*>::iterator at;
};

struct SpanStore::Slot {
  std::string key;
  Residence host, device;
  int64_t owners = 0;  // SchemaSpans naming the key
};

std::string remote_key(const std::string& model_fingerprint, const std::string& layout_fingerprint,
                       std::size_t span, const std::string& span_key) {
  return "promptcache:span:" + model_fingerprint + ":" + layout_fingerprint + ":" +
         std::to_string(span) + ":" + span_key;
}

SpanStore::SpanStore(const LlamaModel& model, EncodingMode mode, int64_t chunk_tokens,
                     TierBudgets budgets, std::unique_ptr<RedisTier> remote)
    : model_(model),
      mode_(mode),
      chunk_tokens_(chunk_tokens),
      budgets_(budgets),
      host_{{}, &Slot::host, &TierStats::host_bytes, &TierStats::host_spans, budgets.host_bytes},
      device_{{},
              &Slot::device,
              &TierStats::device_bytes,
              &TierStats::device_spans,
              budgets.device_bytes},
      remote_(std::move(remote)) {
  if (remote_) stats_.remote = remote_->url();
  if (budgets.host_bytes < 0 || budgets.device_bytes < 0) {
    throw Error(ErrorKind::kInvalidArgument, "tier byte budgets must not be negative");
  }
  stats_.max_host_bytes = budgets.host_bytes;
  stats_.max_device_bytes = on_device() ? budgets.device_bytes : 0;
}

SpanStore::~SpanStore() = default;

const std::string& SpanStore::model_fingerprint() {
  std::call_once(fingerprint_once_, [&] { fingerprint_ = promptcache::model_fingerprint(model_); });
  return fingerprint_;
}

bool SpanStore::on_device() const {
  return !model_.device().is_cpu();
}

SpanStates& SpanStore::top(Slot& slot) const {
  return (on_device() ? slot.device : slot.host).states;
}

std::shared_ptr<const SchemaSpans> SpanStore::adopt(const pml::Layout& layout, CacheStore& states,
                                                    const std::string& cache_file, bool compiled) {
  const std::string& name = layout.schema_name;
  auto keys = span_keys(layout, model_fingerprint(), model_.dtype(), model_.kv_dtype(), mode_);
  std::vector<std::string> owned;
  for (const auto& [_, key] : keys) owned.push_back(key);
  // Released when the last holder of the schema's spans drops them (its engine entry).
  std::shared_ptr<SchemaSpans> out(new SchemaSpans, [this, owned](SchemaSpans* spans) {
    release(owned);
    delete spans;
  });
  out->schema = name;
  out->keys = std::move(keys);
  out->cache_file = cache_file;
  out->layout_fingerprint = layout_fingerprint(layout);
  std::vector<std::pair<std::size_t, SpanStates>> canonical;
  std::unique_lock<std::mutex> lock(mutex_);
  for (const auto& key : owned) {
    SlotPtr& slot = slots_[key];
    if (!slot) {
      slot = std::make_shared<Slot>();
      slot->key = key;
    }
    ++slot->owners;
  }
  for (const auto& [span, given] : states.spans_of(name)) {
    const auto key = out->keys.find(span);
    if (key == out->keys.end()) continue;
    Slot& slot = *slots_.at(key->second);
    if (top(slot).kv.defined()) {
      ++stats_.shared;
      touch(slot);
    } else {
      put(top_tier(), slot, given);
    }
    canonical.emplace_back(span, top(slot));
  }
  for (const auto& [span, s] : canonical) states.put(name, span, s);
  if (compiled) stats_.compiled_spans += static_cast<int64_t>(canonical.size());
  enforce_budgets();
  if (remote_) {
    // Written without the lock (a network round trip per span); the states are the schema's.
    std::vector<std::pair<std::string, SpanStates>> missing;
    for (const auto& [span, s] : canonical) {
      missing.emplace_back(
          remote_key(fingerprint_, out->layout_fingerprint, span, out->keys.at(span)), s);
    }
    lock.unlock();
    int64_t puts = 0;
    // Freshly compiled spans overwrite what the store holds (`compile --force` replaces a value
    // it distrusts; otherwise the value is the same); loaded ones are written only when missing.
    for (const auto& [key, s] : missing) {
      if ((compiled || !remote_->contains(key)) && remote_->put(key, s.kv)) ++puts;
    }
    lock.lock();
    stats_.remote_puts += puts;
  }
  return out;
}

bool SpanStore::load_remote(const pml::Layout& layout, CacheStore& states) {
  if (!remote_) return false;
  const auto keys =
      span_keys(layout, model_fingerprint(), model_.dtype(), model_.kv_dtype(), mode_);
  const std::string layout_fp = layout_fingerprint(layout);
  const auto& c = model_.config();
  std::map<std::size_t, SpanStates> got;
  for (const auto& [span, key] : keys) {
    const std::vector<int64_t> shape = {c.num_hidden_layers, 2, c.num_key_value_heads,
                                        static_cast<int64_t>(layout.spans[span].size()),
                                        c.head_dim};
    auto block =
        remote_->get(remote_key(fingerprint_, layout_fp, span, key), model_.kv_dtype(), shape);
    if (!block) return false;
    if (on_device()) *block = block->to(model_.kv_options());
    got.emplace(span,
                SpanStates::from_block(*block, static_cast<int64_t>(layout.spans[span].begin)));
  }
  states.erase_schema(layout.schema_name);
  for (auto& [span, s] : got) states.put(layout.schema_name, span, std::move(s));
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.remote_loads += static_cast<int64_t>(got.size());
  return true;
}

void SpanStore::release(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& key : keys) {
    auto it = slots_.find(key);
    if (it == slots_.end() || --it->second->owners > 0) continue;
    drop(device_, *it->second);
    drop(host_, *it->second);
    slots_.erase(it);  // a request holding it keeps its own reference until it ends
  }
}

SpanStore::Pin SpanStore::pin(const pml::Layout& layout, const SchemaSpans& schema,
                              const std::vector<std::size_t>& spans) {
  Pin out;
  out.store_ = this;
  std::unique_lock<std::mutex> lock(mutex_);
  for (std::size_t span : spans) {
    const auto key = schema.keys.find(span);
    if (key == schema.keys.end()) continue;  // not a stored span (fresh text, empty)
    const auto it = slots_.find(key->second);
    SlotPtr slot;
    if (it != slots_.end()) {
      slot = it->second;
    } else {  // only while the schema is being released: served, not stored again
      slot = std::make_shared<Slot>();
      slot->key = key->second;
    }
    out.held_.push_back(slot);  // held from here on: never evicted under this request
    if (top(*slot).kv.defined()) {
      ++stats_.hits;
      touch(*slot);
      out.states_.put(schema.schema, span, top(*slot));
    } else {
      ++stats_.misses;
      out.states_.put(schema.schema, span, promote(lock, slot, layout, schema, span));
    }
  }
  enforce_budgets();
  return out;
}

SpanStore::Pin::Pin(Pin&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      states_(std::move(other.states_)),
      held_(std::move(other.held_)) {}

SpanStore::Pin& SpanStore::Pin::operator=(Pin&& other) noexcept {
  if (this != &other) {
    if (store_ != nullptr) store_->unpin(held_);
    store_ = std::exchange(other.store_, nullptr);
    states_ = std::move(other.states_);
    held_ = std::move(other.held_);
  }
  return *this;
}

SpanStore::Pin::~Pin() {
  if (store_ != nullptr) store_->unpin(held_);
}

void SpanStore::unpin(std::vector<SlotPtr>& held) {
  std::lock_guard<std::mutex> lock(mutex_);
  held.clear();  // under the lock: enforce_budgets counts holders
  enforce_budgets();
}

bool SpanStore::attached(const SlotPtr& slot) const {
  const auto it = slots_.find(slot->key);
  return it != slots_.end() && it->second == slot;
}

SpanStates SpanStore::promote(std::unique_lock<std::mutex>& lock, const SlotPtr& slot,
                              const pml::Layout& layout, const SchemaSpans& schema,
                              std::size_t span) {
  if (on_device() && slot->host.held) {
    ++stats_.promotions;
    const SpanStates& host = slot->host.states;
    put(device_, *slot, SpanStates::from_block(host.kv.to(model_.kv_options()), host.begin));
    return slot->device.states;
  }
  // Not stored in memory: re-read from the schema's cache file, else compiled again, without
  // the lock (other requests go on meanwhile).
  lock.unlock();
  SpanStates got;
  bool from_file = false, from_remote = false, file_rejected = false;
  try {
    if (!schema.cache_file.empty() && std::filesystem::exists(schema.cache_file)) {
      try {
        got = load_cache_span(schema.cache_file, layout, span, model_, mode_,
                              schema.layout_fingerprint, model_fingerprint());
        from_file = true;
      } catch (const Error& e) {
        // Never served: a file changed or damaged since the schema was added is skipped.
        std::cerr << "promptcache: warning: " << e.what() << "; compiling span " << span
                  << " of schema '" << schema.schema << "' again\n";
        file_rejected = true;
      }
    }
    if (!from_file && remote_) {
      const pml::Span& stored = layout.spans[span];
      const auto& c = model_.config();
      auto block = remote_->get(
          remote_key(fingerprint_, schema.layout_fingerprint, span, schema.keys.at(span)),
          model_.kv_dtype(),
          {c.num_hidden_layers, 2, c.num_key_value_heads, static_cast<int64_t>(stored.size()),
           c.head_dim});
      if (block) {
        if (on_device()) *block = block->to(model_.kv_options());
        got = SpanStates::from_block(*block, static_cast<int64_t>(stored.begin));
        from_remote = true;
      }
    }
    if (!from_file && !from_remote) {
      got = compile_span(model_, layout, span, mode_, chunk_tokens_);
    }
  } catch (...) {
    lock.lock();
    if (file_rejected) ++stats_.file_rejected;
    throw;
  }
  lock.lock();
  if (file_rejected) ++stats_.file_rejected;
  if (from_file || from_remote) {
    ++stats_.promotions;
    ++(from_file ? stats_.file_loads : stats_.remote_loads);
  } else {
    ++stats_.recompiles;
  }
  if (!attached(slot)) return got;
  // Else another request brought it meanwhile.
  if (!top(*slot).kv.defined()) put(top_tier(), *slot, std::move(got));
  touch(*slot);
  return top(*slot);
}

uint64_t SpanStore::resident_id(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = slots_.find(key);
  if (it == slots_.end()) return 0;
  const SpanStates& s = top(*it->second);
  return s.kv.defined() ? s.id : 0;
}

void SpanStore::put(MemoryTier& tier, Slot& slot, SpanStates states) {
  drop(tier, slot);
  Residence& r = slot.*tier.residence;
  r.states = std::move(states);
  stats_.*tier.bytes += r.states.bytes();
  ++(stats_.*tier.spans);
  tier.lru.push_front(&slot);
  r.at = tier.lru.begin();
  r.held = true;
}

void SpanStore::drop(MemoryTier& tier, Slot& slot) {
  Residence& r = slot.*tier.residence;
  if (!r.held) return;
  stats_.*tier.bytes -= r.states.bytes();
  --(stats_.*tier.spans);
  tier.lru.erase(r.at);
  r = Residence();
}

void SpanStore::touch(Slot& slot) {
  for (MemoryTier* tier : {&host_, &device_}) {
    const Residence& r = slot.*tier->residence;
    if (r.held) tier->lru.splice(tier->lru.begin(), tier->lru, r.at);
  }
}

void SpanStore::evict_over_budget(MemoryTier& tier, const std::function<void(Slot&)>& before_drop) {
  if (tier.budget <= 0) return;
  // A slot a request holds (a Pin's reference besides slots_') is skipped: it stays over budget
  // until the request's assembly is done and a later request evicts it.
  auto held = [&](const Slot& slot) { return slots_.at(slot.key).use_count() > 1; };
  for (auto it = tier.lru.end(); stats_.*tier.bytes > tier.budget && it != tier.lru.begin();) {
    Slot& slot = **--it;
    if (held(slot)) continue;
    if (before_drop) before_drop(slot);
    drop(tier, slot);
    ++stats_.evictions;
    it = tier.lru.end();  // restart from the least recently used
  }
}

void SpanStore::enforce_budgets() {
  if (on_device()) {
    evict_over_budget(device_, [&](Slot& slot) {
      if (slot.host.held) return;
      const SpanStates& states = slot.device.states;  // demoted to host memory
      put(host_, slot, SpanStates::from_block(states.kv.to(torch::kCPU), states.begin));
    });
  }
  evict_over_budget(host_, nullptr);
}

TierStats SpanStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TierStats s = stats_;
  s.keys = static_cast<int64_t>(slots_.size());
  s.remote_rejected = remote_ ? remote_->rejected() : 0;
  return s;
}

void SpanStore::count_file_rejected() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.file_rejected;
}

}  // namespace promptcache
