// promptcache/cache/sealed_states.hpp — the sealed byte format of the Redis tier's values
// (redis_tier.hpp), without LibTorch: whoever reads a value from Redis reads it through open()
// first, so the checks on untrusted bytes can be fuzzed in a build without LibTorch
// (tests/fuzz, target redis_value).
//
//   promptcache-span-v2 <64 hex digits: HMAC-SHA256>\n
//   <dtype> <dims> <size>...\n
//   <the raw little-endian bytes>
//
// The MAC is keyed with the deployment's secret and covers the format marker, the key the value
// is stored under and every byte after the first line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace promptcache::sealed {

// What a value holds: a dtype name ("f32", "bf16", "f16": dtype_name() of llama.hpp) and a shape.
struct StatesHeader {
  std::string dtype;
  std::vector<int64_t> shape;
};

// `bytes` (the raw states, header.shape x the dtype's size) sealed for `key` under `secret`.
// Error(kInvalidArgument) for an empty secret.
std::string seal(std::string_view key, const StatesHeader& header, std::string_view bytes,
                 const std::string& secret);

// The raw bytes `value` holds (a view into `value`), read from `key`: Error(kCacheFile) saying
// why unless its MAC under `secret` holds for `key` and it holds exactly `expected` with
// `element_size` bytes per element. The MAC is checked before anything else of the value is
// read; the header line is bounded (256 bytes, 8 dimensions); the byte count is checked against
// `expected` (the caller's shape, never the value's) without overflow.
std::string_view open(std::string_view key, std::string_view value, const std::string& secret,
                      const StatesHeader& expected, std::size_t element_size);

// `value` with its MAC recomputed for `key` and `secret` (its first line replaced by a valid
// one; a value without a first line gets one in front): the fuzz target and tests use it to reach
// the checks behind the MAC.
std::string reseal(std::string_view key, std::string_view value, const std::string& secret);

// Overwrites `secret`'s bytes with zeros in a way the compiler keeps (OPENSSL_cleanse): for a
// secret's holder going away.
void wipe(std::string& secret);

}  // namespace promptcache::sealed
