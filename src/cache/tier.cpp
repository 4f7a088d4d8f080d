// One memory tier's budget, LRU order, eviction and metrics (promptcache/cache/tier.hpp); the
// span store instantiates it for host memory and the device with their policies.
#include "promptcache/cache/tier.hpp"

#include <utility>

#include "promptcache/error.hpp"

namespace promptcache {

Tier::Tier(TierPolicy policy) : policy_(std::move(policy)) {
  if (policy_.budget < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "the " + policy_.name + " tier's byte budget must not be negative");
  }
}

const SpanStates* Tier::find(const std::string& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second.states;
}

void Tier::put(const std::string& key, SpanStates states) {
  drop(key);
  lru_.push_front(key);
  Entry& e = entries_[key];
  e.states = std::move(states);
  e.at = lru_.begin();
  ids_.insert(e.states.id);
  metrics_.bytes += e.states.bytes();
  ++metrics_.spans;
}

bool Tier::drop(const std::string& key) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  metrics_.bytes -= it->second.states.bytes();
  --metrics_.spans;
  ids_.erase(it->second.states.id);
  lru_.erase(it->second.at);
  entries_.erase(it);
  return true;
}

void Tier::touch(const std::string& key) {
  const auto it = entries_.find(key);
  if (it != entries_.end()) lru_.splice(lru_.begin(), lru_, it->second.at);
}

int64_t Tier::evict_over_budget(const std::function<bool(const std::string& key)>& held) {
  if (policy_.budget <= 0) return 0;
  int64_t evicted = 0;
  // From the least recently used towards the front; a held span is stepped over.
  auto it = lru_.end();
  while (metrics_.bytes > policy_.budget && it != lru_.begin()) {
    --it;
    if (held && held(*it)) continue;
    const auto entry = entries_.find(*it);
    if (policy_.on_evict) policy_.on_evict(*it, entry->second.states);
    metrics_.bytes -= entry->second.states.bytes();
    --metrics_.spans;
    ++metrics_.evictions;
    ids_.erase(entry->second.states.id);
    ++evicted;
    entries_.erase(entry);
    it = lru_.erase(it);  // the next step goes to the span before it
  }
  return evicted;
}

}  // namespace promptcache
