// Fuzz entry "redis_value": a value as read from the Redis tier, through sealed::open (the
// LibTorch-free checks every value read from Redis passes before it becomes a tensor;
// src/cache/sealed_states.cpp is part of promptcache_core).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_entries.hpp"
#include "promptcache/cache/sealed_states.hpp"
#include "promptcache/error.hpp"

namespace promptcache::fuzz {
namespace {

using detail::check;

// The dtypes and shapes of the seeds (tests/fuzz/corpus/redis_value/, written by
// write_model_seeds with RedisTier::encode).

struct Expectation {
  sealed::StatesHeader header;
  std::size_t element_size;
};

const std::vector<Expectation>& expectations() {
  static const std::vector<Expectation> e = {
      {{"f32", {1, 2, 1, 3, 2}}, 4},
      {{"bf16", {2, 2, 2, 1, 4}}, 2},
      {{"f16", {1, 2, 1, 0, 2}}, 2},
  };
  return e;
}

// Opens `value` as each expectation: accepted with exactly that many bytes, lying inside the
// value, or refused with promptcache::Error.
void open_each(std::string_view value) {
  for (const Expectation& e : expectations()) {
    try {
      const std::string_view bytes =
          sealed::open(kRedisValueKey, value, kRedisValueSecret, e.header, e.element_size);
      std::size_t want = e.element_size;
      for (int64_t d : e.header.shape) want *= static_cast<std::size_t>(d);
      check(bytes.size() == want, "an accepted value holds another number of bytes");
      check(bytes.empty() || (bytes.data() >= value.data() &&
                              bytes.data() + bytes.size() == value.data() + value.size()),
            "the bytes of an accepted value are not its tail");
    } catch (const Error& err) {
      detail::rejected(err);  // a clean rejection
    }
  }
}

}  // namespace

void redis_value_entry(const std::uint8_t* data, std::size_t size) {
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  open_each(value);
  // Once more with a valid MAC for the rest of the value, so that mutations get past the MAC to
  // the dtype, shape and length checks.
  const std::string resealed = sealed::reseal(kRedisValueKey, value, kRedisValueSecret);
  open_each(resealed);
}

}  // namespace promptcache::fuzz
