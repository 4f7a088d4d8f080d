// Shared by Engine (generate, generate_batch) and BatchSession: how many decode slots a request
// reserves.
#pragma once

#include <algorithm>
#include <cstdint>

namespace promptcache {

// The KV room to reserve for decoding: max_new_tokens, but never more than the context
// (decoding stops there), so an absurd max_new_tokens cannot allocate a huge KV cache.
inline int64_t decode_room(int64_t max_new_tokens, int64_t context) {
  return std::clamp<int64_t>(max_new_tokens, 0, context);
}

}  // namespace promptcache
