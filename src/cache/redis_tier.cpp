#include "promptcache/cache/redis_tier.hpp"

#include <signal.h>

#include <cstring>
#include <iostream>

#include "promptcache/cache/sealed_states.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/llama.hpp"

#ifdef PROMPTCACHE_WITH_REDIS
#include <hiredis/hiredis.h>
#endif

namespace promptcache {
namespace {

// How long a lost server is left alone before the next try.
constexpr auto kRetryPause = std::chrono::seconds(2);

}  // namespace

#ifdef PROMPTCACHE_WITH_REDIS

struct RedisTier::Connection {
  redisContext* context = nullptr;
  ~Connection() {
    if (context != nullptr) redisFree(context);
  }
};

namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

std::unique_ptr<RedisTier> RedisTier::connect(const std::string& url, const std::string& secret,
                                              int64_t ttl_seconds) {
  check_ttl(url, ttl_seconds);
  std::string rest = url;
  const std::string scheme = "redis://";
  if (rest.rfind(scheme, 0) == 0) rest = rest.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string host = rest;
  int port = 6379;
  const auto colon = rest.rfind(':');
  if (colon != std::string::npos) {
    host = rest.substr(0, colon);
    const std::string digits = rest.substr(colon + 1);
    const bool numeric = !digits.empty() && digits.size() <= 5 &&
                         digits.find_first_not_of("0123456789") == std::string::npos;
    port = numeric ? std::stoi(digits) : 0;
    if (port <= 0 || port > 65535) {
      throw Error(ErrorKind::kInvalidArgument,
                  "redis URL '" + url + "': the port must be a number from 1 to 65535");
    }
  }
  if (host.empty() || host.find_first_of("/@? ") != std::string::npos) {
    throw Error(ErrorKind::kInvalidArgument,
                "redis URL '" + url + "': expected redis://HOST:PORT (no user, path or options)");
  }
  if (secret.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "redis " + url +
                    ": a Redis tier needs a secret to seal its values with, so that whoever can "
                    "write to the server cannot inject states (the CLI's --cache-secret S, "
                    "--cache-secret-file FILE or $PROMPTCACHE_CACHE_SECRET; the same in every "
                    "process sharing the server)");
  }
  // hiredis writes with write(): a server that went away would end the process with SIGPIPE
  // instead of an error the tier degrades on. Ignored unless the program handles it itself.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  return std::unique_ptr<RedisTier>(new RedisTier(url, host, port, secret, ttl_seconds));
}

RedisTier::~RedisTier() {
  sealed::wipe(secret_);
}

RedisTier::Connection* RedisTier::ready() {
  if (connection_) return connection_.get();
  const auto now = std::chrono::steady_clock::now();
  if (now < retry_after_) return nullptr;
  auto c = std::make_unique<Connection>();
  const timeval connect_timeout{0, 500 * 1000};
  c->context = redisConnectWithTimeout(host_.c_str(), port_, connect_timeout);
  if (c->context == nullptr || c->context->err != 0) {
    lost(c->context != nullptr ? c->context->errstr : "cannot allocate a connection");
    return nullptr;
  }
  const timeval command_timeout{2, 0};
  redisSetTimeout(c->context, command_timeout);
  if (warned_) std::cerr << "promptcache: redis " << url_ << " is reachable again\n";
  warned_ = false;
  connection_ = std::move(c);
  return connection_.get();
}

void RedisTier::lost(const std::string& why) {
  connection_.reset();
  retry_after_ = std::chrono::steady_clock::now() + kRetryPause;
  if (!warned_) {
    std::cerr << "promptcache: warning: redis " << url_ << " is unreachable (" << why
              << "); serving from the local tiers\n";
  }
  warned_ = true;
}

std::optional<torch::Tensor> RedisTier::get(const std::string& key, torch::Dtype dtype,
                                            const std::vector<int64_t>& shape) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection* c = ready();
  if (c == nullptr) return std::nullopt;
  // With a TTL, the read refreshes it (EXPIRE pipelined behind the GET: one round trip, any
  // server version; a key that is absent stays absent).
  const auto size = static_cast<std::size_t>(key.size());
  const bool refresh = ttl_seconds_ > 0;
  bool sent = redisAppendCommand(c->context, "GET %b", key.data(), size) == REDIS_OK;
  if (sent && refresh) {
    sent = redisAppendCommand(c->context, "EXPIRE %b %lld", key.data(), size,
                              static_cast<long long>(ttl_seconds_)) == REDIS_OK;
  }
  void* raw = nullptr;
  if (!sent || redisGetReply(c->context, &raw) != REDIS_OK) {
    lost(c->context->errstr);
    return std::nullopt;
  }
  Reply reply(static_cast<redisReply*>(raw));
  if (refresh) {
    void* expired = nullptr;
    if (redisGetReply(c->context, &expired) != REDIS_OK) {
      lost(c->context->errstr);
      return std::nullopt;
    }
    freeReplyObject(expired);  // EXPIRE's 0 or 1: nothing to act on
  }
  if (reply->type == REDIS_REPLY_NIL) return std::nullopt;
  // Reported and counted, never served: the caller compiles the span again (and replaces the
  // value).
  auto refuse = [&](const std::string& why) -> std::optional<torch::Tensor> {
    ++rejected_;
    std::cerr << "promptcache: warning: redis " << url_ << " key '" << key
              << "' failed its check: " << why << "; not used, compiling again\n";
    return std::nullopt;
  };
  if (reply->type != REDIS_REPLY_STRING) return refuse("not a string value");
  try {
    return decode(key, std::string_view(reply->str, reply->len), secret_, dtype, shape);
  } catch (const Error& e) {
    return refuse(e.message());
  }
}

bool RedisTier::put(const std::string& key, const torch::Tensor& block) {
  return put_value(key, encode(key, block, secret_));
}

bool RedisTier::put_value(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection* c = ready();
  if (c == nullptr) return false;
  const auto size = static_cast<std::size_t>(key.size());
  Reply reply(static_cast<redisReply*>(
      ttl_seconds_ > 0
          ? redisCommand(c->context, "SET %b %b EX %lld", key.data(), size, value.data(),
                         value.size(), static_cast<long long>(ttl_seconds_))
          : redisCommand(c->context, "SET %b %b", key.data(), size, value.data(), value.size())));
  if (!reply) {
    lost(c->context->errstr);
    return false;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    std::cerr << "promptcache: warning: redis " << url_ << " refused to store '" << key
              << "': " << std::string(reply->str, reply->len) << "\n";
    return false;
  }
  return true;
}

bool RedisTier::contains(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection* c = ready();
  if (c == nullptr) return false;
  const auto size = static_cast<std::size_t>(key.size());
  // With a TTL, EXPIRE both answers (1: the key is there) and refreshes it: a value the engine
  // found there is one it uses.
  Reply reply(static_cast<redisReply*>(
      ttl_seconds_ > 0 ? redisCommand(c->context, "EXPIRE %b %lld", key.data(), size,
                                      static_cast<long long>(ttl_seconds_))
                       : redisCommand(c->context, "EXISTS %b", key.data(), size)));
  if (!reply) {
    lost(c->context->errstr);
    return false;
  }
  return reply->type == REDIS_REPLY_INTEGER && reply->integer > 0;
}

std::optional<int64_t> RedisTier::expires_in_ms(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection* c = ready();
  if (c == nullptr) return std::nullopt;
  Reply reply(static_cast<redisReply*>(
      redisCommand(c->context, "PTTL %b", key.data(), static_cast<std::size_t>(key.size()))));
  if (!reply) {
    lost(c->context->errstr);
    return std::nullopt;
  }
  // PTTL: -2 absent, -1 no expiry, else the milliseconds left.
  if (reply->type != REDIS_REPLY_INTEGER || reply->integer == -2) return std::nullopt;
  return static_cast<int64_t>(reply->integer);
}

#else  // built without hiredis

struct RedisTier::Connection {};

RedisTier::~RedisTier() = default;

std::unique_ptr<RedisTier> RedisTier::connect(const std::string& url, const std::string&, int64_t) {
  throw Error(ErrorKind::kInvalidArgument,
              "redis URL '" + url +
                  "': this promptcache was built without hiredis, so it has no Redis tier "
                  "(Debian: libhiredis-dev; scripts/install-deps.sh, then build again)");
}

std::optional<torch::Tensor> RedisTier::get(const std::string&, torch::Dtype,
                                            const std::vector<int64_t>&) {
  return std::nullopt;
}
bool RedisTier::put(const std::string&, const torch::Tensor&) {
  return false;
}
bool RedisTier::put_value(const std::string&, const std::string&) {
  return false;
}
bool RedisTier::contains(const std::string&) {
  return false;
}
std::optional<int64_t> RedisTier::expires_in_ms(const std::string&) {
  return std::nullopt;
}
RedisTier::Connection* RedisTier::ready() {
  return nullptr;
}
void RedisTier::lost(const std::string&) {}

#endif

RedisTier::RedisTier(std::string url, std::string host, int port, std::string secret,
                     int64_t ttl_seconds)
    : url_(std::move(url)),
      host_(std::move(host)),
      port_(port),
      secret_(std::move(secret)),
      ttl_seconds_(ttl_seconds) {}

void RedisTier::check_ttl(const std::string& url, int64_t ttl_seconds) {
  if (ttl_seconds < 0 || ttl_seconds > kMaxTtlSeconds) {
    throw Error(ErrorKind::kInvalidArgument,
                "redis " + url + ": the TTL must be from 1 to " + std::to_string(kMaxTtlSeconds) +
                    " seconds (0: keys never expire), got " + std::to_string(ttl_seconds));
  }
}

// The value format and its checks are LibTorch-free (sealed_states.hpp); here only the tensor.
std::string RedisTier::encode(const std::string& key, const torch::Tensor& block,
                              const std::string& secret) {
  const auto dense = block.to(torch::kCPU).contiguous();
  const auto bytes = static_cast<std::size_t>(dense.numel() * dense.element_size());
  const std::string_view raw(static_cast<const char*>(dense.data_ptr()), bytes);
  return sealed::seal(key, {dtype_name(dense.scalar_type()), dense.sizes().vec()},
                      bytes > 0 ? raw : std::string_view(), secret);
}

std::string RedisTier::reseal(const std::string& key, std::string_view value,
                              const std::string& secret) {
  return sealed::reseal(key, value, secret);
}

torch::Tensor RedisTier::decode(const std::string& key, std::string_view value,
                                const std::string& secret, torch::Dtype dtype,
                                const std::vector<int64_t>& shape) {
  const std::string_view bytes = sealed::open(key, value, secret, {dtype_name(dtype), shape},
                                              static_cast<std::size_t>(c10::elementSize(dtype)));
  auto block = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  if (!bytes.empty()) std::memcpy(block.data_ptr(), bytes.data(), bytes.size());
  return block;
}

}  // namespace promptcache
