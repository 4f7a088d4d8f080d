#include "promptcache/cache/store.hpp"

#include <atomic>

namespace promptcache {

uint64_t SpanStates::next_id() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

void CacheStore::put(const std::string& schema, std::size_t span, SpanStates states) {
  auto& spans = entries_[schema];
  auto it = spans.find(span);
  if (it != spans.end()) bytes_ -= it->second.bytes();
  bytes_ += states.bytes();
  spans[span] = std::move(states);
}

const SpanStates* CacheStore::find(const std::string& schema, std::size_t span) const {
  auto s = entries_.find(schema);
  if (s == entries_.end()) return nullptr;
  auto it = s->second.find(span);
  return it == s->second.end() ? nullptr : &it->second;
}

void CacheStore::erase_schema(const std::string& schema) {
  auto s = entries_.find(schema);
  if (s == entries_.end()) return;
  for (const auto& [_, states] : s->second) bytes_ -= states.bytes();
  entries_.erase(s);
}

const std::map<std::size_t, SpanStates>& CacheStore::spans_of(const std::string& schema) const {
  static const std::map<std::size_t, SpanStates> kNone;
  auto s = entries_.find(schema);
  return s == entries_.end() ? kNone : s->second;
}

int64_t CacheStore::bytes(const std::string& schema) const {
  int64_t total = 0;
  for (const auto& [_, states] : spans_of(schema)) total += states.bytes();
  return total;
}

int64_t CacheStore::tokens(const std::string& schema) const {
  int64_t total = 0;
  for (const auto& [_, states] : spans_of(schema)) total += states.length();
  return total;
}

}  // namespace promptcache
