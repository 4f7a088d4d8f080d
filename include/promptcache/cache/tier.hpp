// promptcache/cache/tier.hpp — one memory tier of stored spans: a byte budget, an LRU order,
// eviction and its accounting, the same code for every memory (host memory, the device).
//
// The span store (span_store.hpp) keeps a key's states in up to two memory tiers. They behave
// the same — a span put in is the most recently used, a span used again moves to the front, and
// when the tier's bytes exceed its budget the least recently used spans that no request holds
// are evicted — and differ only in a small policy (TierPolicy): a name, a budget, and what
// becomes of an evicted span (the device demotes it to host memory; host memory drops it, and
// the lower tiers — the schema's cache file, Redis, the model — serve it again). The tier's
// metrics (spans, bytes, evictions) are its own, so the store's statistics are a sum of them.
// Not thread-safe: the owner's lock guards every call.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "promptcache/cache/store.hpp"

namespace promptcache {

// How a tier differs from another.
struct TierPolicy {
  std::string name;    // "host", "device"
  int64_t budget = 0;  // bytes; 0: no limit (nothing is evicted)
  // Sees each evicted span before the tier drops it (null: dropped only).
  std::function<void(const std::string& key, const SpanStates& states)> on_evict;
};

struct TierMetrics {
  int64_t spans = 0;      // spans held now
  int64_t bytes = 0;      // their bytes (SpanStates::bytes)
  int64_t evictions = 0;  // spans evicted over the budget so far
};

class Tier {
 public:
  explicit Tier(TierPolicy policy);

  const std::string& name() const { return policy_.name; }
  int64_t budget() const { return policy_.budget; }
  const TierMetrics& metrics() const { return metrics_; }

  // The states held for `key`, null when none; the LRU order does not change.
  const SpanStates* find(const std::string& key) const;
  // Whether it holds the block with this id (SpanStates::id).
  bool holds(uint64_t id) const { return ids_.count(id) > 0; }
  // Holds `states` for `key` (replacing what it held), as the most recently used.
  void put(const std::string& key, SpanStates states);
  // Forgets `key`'s states (not an eviction: no policy, no count); false when it held none.
  bool drop(const std::string& key);
  // Makes `key` the most recently used, when held.
  void touch(const std::string& key);
  // Evicts least recently used spans for which `held` is false (a request holds the others:
  // they stay, over budget, until a later call) until the tier is within its budget; each goes
  // through the policy's on_evict first. Returns how many it evicted.
  int64_t evict_over_budget(const std::function<bool(const std::string& key)>& held);

 private:
  struct Entry {
    SpanStates states;
    std::list<std::string>::iterator at;  // in lru_
  };
  TierPolicy policy_;
  std::list<std::string> lru_;  // most recently used first
  std::unordered_map<std::string, Entry> entries_;
  std::unordered_set<uint64_t> ids_;  // the blocks held (SpanStates::id)
  TierMetrics metrics_;
};

}  // namespace promptcache
