// promptcache/cache/store.hpp — where compiled module states live.
//
// Keyed by schema name and span index (pml::Layout::spans). Each entry holds the span's K (RoPE
// applied at its reserved positions) and V for every layer in one block.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace promptcache {

struct SpanStates {
  // [layers, 2 (K, V), kv_heads, n, head_dim]: one block, so assembly copies a span in one call.
  torch::Tensor kv;
  torch::Tensor k;  // view of kv: [layers, kv_heads, n, head_dim]
  torch::Tensor v;
  int64_t begin = 0;  // position id of the first token; tokens sit at begin .. begin + n - 1
  // Unique per block made by from_block (never reused), so a KV cache can tell which blocks it
  // already holds (KVCache::sources) even after the store replaced or dropped them.
  uint64_t id = 0;
  int64_t length() const { return k.defined() ? k.size(2) : 0; }
  // Exactly 2 x layers x kv_heads x n x head_dim x dtype size.
  int64_t bytes() const { return kv.defined() ? kv.numel() * kv.element_size() : 0; }

  // Wraps a [layers, 2, kv_heads, n, head_dim] block.
  static SpanStates from_block(torch::Tensor kv, int64_t begin) {
    SpanStates s;
    s.kv = std::move(kv);
    s.k = s.kv.select(1, 0);
    s.v = s.kv.select(1, 1);
    s.begin = begin;
    s.id = next_id();
    return s;
  }

 private:
  static uint64_t next_id();
};

class CacheStore {
 public:
  void put(const std::string& schema, std::size_t span, SpanStates states);
  const SpanStates* find(const std::string& schema, std::size_t span) const;
  bool contains_schema(const std::string& schema) const { return entries_.count(schema) > 0; }
  // Drops every entry of a schema (before recompiling it).
  void erase_schema(const std::string& schema);
  const std::map<std::size_t, SpanStates>& spans_of(const std::string& schema) const;

  int64_t bytes() const { return bytes_; }          // all schemas
  int64_t bytes(const std::string& schema) const;   // one schema
  int64_t tokens(const std::string& schema) const;  // stored tokens of one schema

 private:
  std::map<std::string, std::map<std::size_t, SpanStates>> entries_;
  int64_t bytes_ = 0;
};

}  // namespace promptcache
