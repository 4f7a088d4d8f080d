// promptcache/cache/redis_tier.hpp — compiled spans in a Redis server shared by many processes.
//
// A span's states are one Redis string: a text header (format, dtype, shape, XXH3 checksum of
// the bytes) and the raw little-endian bytes of its [layers, 2, kv_heads, n, head_dim] block.
// Values are checked on read like cache files: a value of another format, dtype or shape, or
// whose bytes do not match the checksum, is a miss with a warning, never served. A server that
// cannot be reached, or that goes away, is a miss too (one warning; the other tiers serve, and
// the connection is tried again after a pause): never an error, never a wrong answer.
// Built with hiredis (Debian libhiredis-dev); without it, RedisTier::connect refuses with an
// error saying so.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace promptcache {

class RedisTier {
 public:
  // "redis://HOST:PORT" (or "HOST:PORT"; port 6379 when left out). Error(kInvalidArgument) for a
  // malformed URL or a build without hiredis. Connects lazily: a server not up yet is a warning
  // at the first use, not an error here. Ignores SIGPIPE process-wide unless the program
  // installed a handler (a write to a server that went away must be an error, not the end).
  static std::unique_ptr<RedisTier> connect(const std::string& url);
  ~RedisTier();
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  // The block stored under `key` if it has this dtype and shape and its checksum holds; nullopt
  // otherwise (absent, unreachable, or refused with a warning). On the CPU (copied out of the
  // reply).
  std::optional<torch::Tensor> get(const std::string& key, torch::Dtype dtype,
                                   const std::vector<int64_t>& shape);
  // Stores a block (any device; copied to the CPU). False when the server is unreachable.
  bool put(const std::string& key, const torch::Tensor& block);
  // Stores `value` as it is (put() stores encode(block); tests store damaged values).
  bool put_value(const std::string& key, const std::string& value);
  // Whether `key` is stored (false when unreachable).
  bool contains(const std::string& key);
  const std::string& url() const { return url_; }

  // The value put() stores for `block` (tests corrupt it on purpose).
  static std::string encode(const torch::Tensor& block);

 private:
  RedisTier(std::string url, std::string host, int port);
  struct Connection;
  // The connection, (re)made when down and the retry pause is over; null when unreachable.
  Connection* ready();
  void lost(const std::string& why);

  std::string url_, host_;
  int port_ = 0;
  std::mutex mutex_;  // one command at a time on the one connection
  std::unique_ptr<Connection> connection_;
  std::chrono::steady_clock::time_point retry_after_{};
  bool warned_ = false;  // the unreachable warning is printed once per outage
};

}  // namespace promptcache
