// promptcache/cache/redis_tier.hpp — compiled spans in a Redis server shared by many processes.
//
// A span's states are one Redis string, sealed with a keyed MAC (HMAC-SHA256 under a secret every
// process of a deployment shares, --cache-secret), so that whoever can write to the Redis server
// but does not hold the secret cannot make a process serve states of their choosing:
//
//   promptcache-span-v2 <64 hex digits: the MAC>\n
//   <dtype> <dims> <size>...\n
//   <the raw little-endian bytes of the [layers, 2, kv_heads, n, head_dim] block>
//
// The MAC covers the format marker, the Redis key the value is stored under and every byte after
// the first line, so a value cannot be changed, nor moved to another key. Values are checked on
// read, the MAC first: a value that fails (another secret, another key, a changed byte, an
// unkeyed promptcache-span-v1 value of an earlier version, another dtype or shape) is a miss with
// one warning line on stderr, counted (rejected(), TierStats::remote_rejected), never served; the
// span is compiled again and its value replaced. A server that
// cannot be reached, or that goes away, is a miss too (one warning; the other tiers serve, and
// the connection is tried again after a pause): never an error, never a wrong answer.
// With a TTL (connect's ttl_seconds, the CLI's --redis-ttl), every value is stored with that
// expiry and each use refreshes it (a read that finds it, a check that finds it there before a
// write is skipped): spans no process uses for that long leave the server on their own. Without
// one, keys never expire and the Redis server's own policy (maxmemory) is the only limit.
// Built with hiredis (Debian libhiredis-dev); without it, RedisTier::connect refuses with an
// error saying so.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace promptcache {

class RedisTier {
 public:
  // "redis://HOST:PORT" (or "HOST:PORT"; port 6379 when left out). Error(kInvalidArgument) for a
  // malformed URL or a build without hiredis. Connects lazily: a server not up yet is a warning
  // at the first use, not an error here. Ignores SIGPIPE process-wide unless the program
  // installed a handler (a write to a server that went away must be an error, not the end).
  // `secret`: the deployment's MAC key (any bytes); Error(kInvalidArgument) when empty.
  // `ttl_seconds`: each value's expiry, refreshed on use (0: none); Error(kInvalidArgument)
  // outside [0, kMaxTtlSeconds].
  static std::unique_ptr<RedisTier> connect(const std::string& url, const std::string& secret,
                                            int64_t ttl_seconds = 0);
  static constexpr int64_t kMaxTtlSeconds = int64_t{10} * 365 * 24 * 3600;  // ten years
  // Error(kInvalidArgument) unless 0 <= ttl_seconds <= kMaxTtlSeconds (`url` names the tier).
  static void check_ttl(const std::string& url, int64_t ttl_seconds);
  ~RedisTier();
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  // The block stored under `key` if its MAC holds and it has this dtype and shape; nullopt
  // otherwise (absent, unreachable, or refused with a warning and counted in rejected()). On the
  // CPU (copied out of the reply).
  std::optional<torch::Tensor> get(const std::string& key, torch::Dtype dtype,
                                   const std::vector<int64_t>& shape);
  // Stores a block (any device; copied to the CPU). False when the server is unreachable.
  bool put(const std::string& key, const torch::Tensor& block);
  // Stores `value` as it is (put() stores encode(block); tests store damaged values).
  bool put_value(const std::string& key, const std::string& value);
  // Whether `key` is stored (false when unreachable); with a TTL, refreshes it when it is.
  bool contains(const std::string& key);
  // The milliseconds before `key` expires: -1 when it never does, nullopt when it is absent or
  // the server unreachable (tests and tools; counts as no use).
  std::optional<int64_t> expires_in_ms(const std::string& key);
  int64_t ttl_seconds() const { return ttl_seconds_; }
  const std::string& url() const { return url_; }
  // Values get() refused because they failed a check (not absent ones, not an unreachable
  // server), since connect().
  int64_t rejected() const { return rejected_.load(); }

  // The value put() stores for `block` under `key`, sealed with `secret` (tests damage it on
  // purpose). Error(kInvalidArgument) for an empty secret.
  static std::string encode(const std::string& key, const torch::Tensor& block,
                            const std::string& secret);
  // The block `value` holds, read from `key`: Error(kCacheFile) saying why unless its MAC under
  // `secret` holds for `key` and it holds states of exactly this dtype and shape. The MAC is
  // checked before anything else of the value is read; nothing is allocated before the length
  // of the bytes matches `shape` (the caller's, never the value's). On the CPU.
  static torch::Tensor decode(const std::string& key, std::string_view value,
                              const std::string& secret, torch::Dtype dtype,
                              const std::vector<int64_t>& shape);
  // `value` with its MAC recomputed for `key` and `secret` (its first line replaced by a valid
  // one; a value without a first line gets one in front): the fuzz target and tests use it to
  // reach the checks behind the MAC.
  static std::string reseal(const std::string& key, std::string_view value,
                            const std::string& secret);

 private:
  RedisTier(std::string url, std::string host, int port, std::string secret, int64_t ttl_seconds);
  struct Connection;
  // The connection, (re)made when down and the retry pause is over; null when unreachable.
  Connection* ready();
  void lost(const std::string& why);

  std::string url_, host_;
  int port_ = 0;
  std::string secret_;
  int64_t ttl_seconds_ = 0;
  std::atomic<int64_t> rejected_{0};
  std::mutex mutex_;  // one command at a time on the one connection
  std::unique_ptr<Connection> connection_;
  std::chrono::steady_clock::time_point retry_after_{};
  bool warned_ = false;  // the unreachable warning is printed once per outage
};

}  // namespace promptcache
