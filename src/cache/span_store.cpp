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

// A key the store knows: its states live in the tiers (host_, device_) under the key. A request
// holds the slot (a Pin's reference) while it assembles its states.
struct SpanStore::Slot {
  std::string key;
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
      // Evicted from host memory: dropped (when it is the top tier, its id is noted for the
      // eviction listener).
      host_(TierPolicy{"host", budgets.host_bytes,
                       [this](const std::string&, const SpanStates& states) {
                         if (!on_device()) evicted_.push_back(states.id);
                       }}),
      // Evicted from the device: demoted to host memory (unless it holds the span already),
      // where host memory's budget applies next.
      device_(TierPolicy{"device", budgets.device_bytes,
                         [this](const std::string& key, const SpanStates& states) {
                           evicted_.push_back(states.id);
                           if (host_.find(key) != nullptr) return;
                           host_.put(key, SpanStates::from_block(states.kv.to(torch::kCPU),
                                                                 states.begin));
                         }}),
      remote_(std::move(remote)) {
  if (remote_) stats_.remote = remote_->url();
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

const SpanStates* SpanStore::top(const Slot& slot) const {
  return top_tier().find(slot.key);
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
    const Slot& slot = *slots_.at(key->second);
    if (top(slot) != nullptr) {
      ++stats_.shared;
      touch(slot.key);
    } else {
      top_tier().put(slot.key, given);
    }
    canonical.emplace_back(span, *top(slot));
  }
  for (const auto& [span, s] : canonical) states.put(name, span, s);
  if (compiled) stats_.compiled_spans += static_cast<int64_t>(canonical.size());
  enforce_budgets();
  const std::vector<uint64_t> evicted = take_evicted();
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
  lock.unlock();
  notify(evicted);
  return out;
}

bool SpanStore::load_remote(const pml::Layout& layout, CacheStore& states) {
  if (!remote_) return false;
  SchemaSpans schema;
  schema.schema = layout.schema_name;
  schema.keys = span_keys(layout, model_fingerprint(), model_.dtype(), model_.kv_dtype(), mode_);
  schema.layout_fingerprint = layout_fingerprint(layout);
  std::map<std::size_t, SpanStates> got;
  for (const auto& [span, _] : schema.keys) {
    bool rejected = false;
    auto read = read_remote(layout, schema, span, rejected);
    if (!read) return false;
    got.emplace(span, std::move(*read));
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
    device_.drop(key);
    host_.drop(key);
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
    if (const SpanStates* states = top(*slot)) {
      ++stats_.hits;
      touch(slot->key);
      out.states_.put(schema.schema, span, *states);
    } else {
      ++stats_.misses;
      out.states_.put(schema.schema, span, promote(lock, slot, layout, schema, span));
    }
  }
  enforce_budgets();
  const std::vector<uint64_t> evicted = take_evicted();
  lock.unlock();
  notify(evicted);
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
  std::vector<uint64_t> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held.clear();  // under the lock: enforce_budgets counts holders
    enforce_budgets();
    evicted = take_evicted();
  }
  notify(evicted);
}

void SpanStore::set_eviction_listener(std::function<void(uint64_t id)> listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  listener_ = std::move(listener);
}

void SpanStore::notify(const std::vector<uint64_t>& evicted) const {
  if (!listener_) return;
  for (uint64_t id : evicted) listener_(id);
}

bool SpanStore::resident(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return top_tier().holds(id);
}

bool SpanStore::attached(const SlotPtr& slot) const {
  const auto it = slots_.find(slot->key);
  return it != slots_.end() && it->second == slot;
}

SpanStates SpanStore::promote(std::unique_lock<std::mutex>& lock, const SlotPtr& slot,
                              const pml::Layout& layout, const SchemaSpans& schema,
                              std::size_t span) {
  if (const SpanStates* host = on_device() ? host_.find(slot->key) : nullptr) {
    ++stats_.promotions;
    device_.put(slot->key, SpanStates::from_block(host->kv.to(model_.kv_options()), host->begin));
    return *device_.find(slot->key);
  }
  // Not stored in memory: read back from a lower tier (the schema's cache file, the remote
  // store: the first that holds it), else compiled again, without the lock (other requests go
  // on meanwhile).
  struct Lower {
    std::optional<SpanStates> (SpanStore::*read)(const pml::Layout&, const SchemaSpans&,
                                                 std::size_t, bool&);
    int64_t TierStats::*loads;
    int64_t TierStats::*rejected;  // null: the tier counts its own (RedisTier::rejected)
  };
  static constexpr Lower kLower[] = {
      {&SpanStore::read_file, &TierStats::file_loads, &TierStats::file_rejected},
      {&SpanStore::read_remote, &TierStats::remote_loads, nullptr}};
  lock.unlock();
  std::optional<SpanStates> got;
  std::vector<int64_t TierStats::*> counts;  // added under the lock, whatever happens
  const auto count = [&] {
    lock.lock();
    for (auto counter : counts) ++(stats_.*counter);
  };
  try {
    for (const Lower& lower : kLower) {
      bool rejected = false;
      got = (this->*lower.read)(layout, schema, span, rejected);
      if (rejected && lower.rejected != nullptr) counts.push_back(lower.rejected);
      if (got) {
        counts.push_back(&TierStats::promotions);
        counts.push_back(lower.loads);
        break;
      }
    }
    if (!got) {
      got = compile_span(model_, layout, span, mode_, chunk_tokens_);
      counts.push_back(&TierStats::recompiles);
    }
  } catch (...) {
    count();
    throw;
  }
  count();
  if (!attached(slot)) return *got;
  // Else another request brought it meanwhile.
  if (top(*slot) == nullptr) top_tier().put(slot->key, std::move(*got));
  touch(slot->key);
  return *top(*slot);
}

std::optional<SpanStates> SpanStore::read_file(const pml::Layout& layout, const SchemaSpans& schema,
                                               std::size_t span, bool& rejected) {
  if (schema.cache_file.empty() || !std::filesystem::exists(schema.cache_file)) return {};
  try {
    return load_cache_span(schema.cache_file, layout, span, model_, mode_,
                           schema.layout_fingerprint, model_fingerprint());
  } catch (const Error& e) {
    // Never served: a file changed or damaged since the schema was added is skipped.
    std::cerr << "promptcache: warning: " << e.what() << "; compiling span " << span
              << " of schema '" << schema.schema << "' again\n";
    rejected = true;
    return {};
  }
}

std::optional<SpanStates> SpanStore::read_remote(const pml::Layout& layout,
                                                 const SchemaSpans& schema, std::size_t span,
                                                 bool& /*rejected: RedisTier counts them*/) {
  if (!remote_) return {};
  const pml::Span& stored = layout.spans[span];
  const auto& c = model_.config();
  auto block = remote_->get(
      remote_key(model_fingerprint(), schema.layout_fingerprint, span, schema.keys.at(span)),
      model_.kv_dtype(),
      {c.num_hidden_layers, 2, c.num_key_value_heads, static_cast<int64_t>(stored.size()),
       c.head_dim});
  if (!block) return {};
  if (on_device()) *block = block->to(model_.kv_options());
  return SpanStates::from_block(*block, static_cast<int64_t>(stored.begin));
}

uint64_t SpanStore::resident_id(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = slots_.find(key);
  if (it == slots_.end()) return 0;
  const SpanStates* s = top(*it->second);
  return s != nullptr ? s->id : 0;
}

void SpanStore::touch(const std::string& key) {
  host_.touch(key);
  device_.touch(key);
}

bool SpanStore::held(const std::string& key) const {
  // A Pin's reference besides slots_'.
  const auto it = slots_.find(key);
  return it != slots_.end() && it->second.use_count() > 1;
}

void SpanStore::enforce_budgets() {
  // The device first: what it evicts goes to host memory, whose budget applies next.
  const auto is_held = [this](const std::string& key) { return held(key); };
  if (on_device()) device_.evict_over_budget(is_held);
  host_.evict_over_budget(is_held);
}

TierStats SpanStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TierStats s = stats_;
  s.keys = static_cast<int64_t>(slots_.size());
  s.host_spans = host_.metrics().spans;
  s.host_bytes = host_.metrics().bytes;
  s.device_spans = device_.metrics().spans;
  s.device_bytes = device_.metrics().bytes;
  s.evictions = host_.metrics().evictions + device_.metrics().evictions;
  s.remote_rejected = remote_ ? remote_->rejected() : 0;
  return s;
}

void SpanStore::count_file_rejected() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.file_rejected;
}

}  // namespace promptcache
