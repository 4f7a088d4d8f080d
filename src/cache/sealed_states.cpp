// The Redis tier's sealed values (sealed_states.hpp): HMAC-SHA256 under the deployment's secret,
// checked MAC first. No LibTorch here (it is part of promptcache_core, so the redis_value fuzz
// target builds without it); OpenSSL (libcrypto) is seen here only.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "promptcache/cache/sealed_states.hpp"
#include "promptcache/error.hpp"

namespace promptcache::sealed {
namespace {

// v2: sealed with a keyed MAC over the key and the value (v1 carried a bare XXH3 checksum: its
// values are refused and replaced).
constexpr std::string_view kFormat = "promptcache-span-v2";
constexpr std::string_view kUnkeyedFormat = "promptcache-span-v1";
constexpr std::size_t kMacBytes = 32;
constexpr std::size_t kMaxHeader = 256;  // the dtype and shape line, newline included
constexpr std::size_t kMaxDims = 8;

using Mac = std::array<unsigned char, kMacBytes>;

struct MacDeleter {
  void operator()(EVP_MAC* m) const { EVP_MAC_free(m); }
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

[[noreturn]] void crypto_failed(const char* what) {
  throw Error(ErrorKind::kInvalidArgument,
              std::string("libcrypto could not compute HMAC-SHA256 (") + what + ")");
}

void require_secret(const std::string& secret) {
  if (secret.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "the Redis tier needs a secret to seal its values with (the CLI's "
                "--cache-secret, --cache-secret-file or PROMPTCACHE_CACHE_SECRET)");
  }
}

// HMAC-SHA256 under `secret` of: the format marker, a NUL, the key's length (8 bytes,
// little-endian), the key, and `body` (everything after the value's first line).
Mac compute_mac(const std::string& secret, std::string_view key, std::string_view body) {
  require_secret(secret);
  // Fetched once: a fetched algorithm may be shared by threads (each call has its own context).
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (hmac == nullptr) crypto_failed("no HMAC");
  std::unique_ptr<EVP_MAC_CTX, MacDeleter> ctx(EVP_MAC_CTX_new(hmac));
  if (!ctx) crypto_failed("no context");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                               OSSL_PARAM_construct_end()};
  unsigned char length[8];
  std::uint64_t n = key.size();
  for (unsigned char& b : length) {
    b = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  const auto update = [&](const void* data, std::size_t size) {
    if (EVP_MAC_update(ctx.get(), static_cast<const unsigned char*>(data), size) != 1)
      crypto_failed("update");
  };
  if (EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
                   params) != 1) {
    crypto_failed("init");
  }
  update(kFormat.data(), kFormat.size());
  update("", 1);
  update(length, sizeof length);
  update(key.data(), key.size());
  update(body.data(), body.size());
  Mac mac{};
  std::size_t written = 0;
  if (EVP_MAC_final(ctx.get(), mac.data(), &written, mac.size()) != 1 || written != mac.size())
    crypto_failed("final");
  return mac;
}

std::string hex(const Mac& mac) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * mac.size());
  for (unsigned char b : mac) {
    out += digits[b >> 4];
    out += digits[b & 0xf];
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The first line of a sealed value: "<format> <MAC>\n".
std::string first_line(const Mac& mac) {
  return std::string(kFormat) + ' ' + hex(mac) + '\n';
}

[[noreturn]] void refuse(const std::string& why) {
  throw Error(ErrorKind::kCacheFile, why);
}

// The next space- or end-delimited word of `line` from `at` (advanced past it and one space).
std::string_view word(std::string_view line, std::size_t& at) {
  if (at > line.size()) return {};
  const std::size_t end = std::min(line.find(' ', at), line.size());
  const std::string_view w = line.substr(at, end - at);
  at = end + 1;
  return w;
}

bool parse_count(std::string_view text, int64_t& out) {
  if (text.empty() || text.size() > 18) return false;  // no sign, no overflow
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && out >= 0;
}

}  // namespace

std::string seal(std::string_view key, const StatesHeader& header, std::string_view bytes,
                 const std::string& secret) {
  require_secret(secret);
  std::string body = header.dtype + ' ' + std::to_string(header.shape.size());
  for (int64_t d : header.shape) body += ' ' + std::to_string(d);
  body += '\n';
  body.append(bytes.data(), bytes.size());
  return first_line(compute_mac(secret, key, body)) + body;
}

std::string reseal(std::string_view key, std::string_view value, const std::string& secret) {
  const std::size_t eol = value.find('\n');
  const std::string_view body = eol == std::string_view::npos ? value : value.substr(eol + 1);
  return first_line(compute_mac(secret, key, body)) + std::string(body);
}

std::string_view open(std::string_view key, std::string_view value, const std::string& secret,
                      const StatesHeader& expected, std::size_t element_size) {
  require_secret(secret);
  // 1. The first line: the format and the MAC, checked before anything else is read.
  const std::size_t mac_line = kFormat.size() + 1 + 2 * kMacBytes + 1;
  if (value.substr(0, kUnkeyedFormat.size() + 1) == std::string(kUnkeyedFormat) + ' ') {
    refuse("an unkeyed value of an earlier version (" + std::string(kUnkeyedFormat) + ", no MAC)");
  }
  if (value.size() < mac_line ||
      value.substr(0, kFormat.size() + 1) != std::string(kFormat) + ' ' ||
      value[mac_line - 1] != '\n') {
    refuse("not a promptcache span value (" + std::string(kFormat) + ")");
  }
  Mac stored{};
  for (std::size_t i = 0; i < kMacBytes; ++i) {
    const int hi = hex_digit(value[kFormat.size() + 1 + 2 * i]);
    const int lo = hex_digit(value[kFormat.size() + 2 + 2 * i]);
    if (hi < 0 || lo < 0) refuse("not a promptcache span value (its MAC is not 64 hex digits)");
    stored[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  const std::string_view body = value.substr(mac_line);
  const Mac want = compute_mac(secret, key, body);
  if (CRYPTO_memcmp(stored.data(), want.data(), kMacBytes) != 0) {
    refuse(
        "its MAC does not match: written with another --cache-secret, stored under another key, "
        "or changed");
  }
  // 2. The dtype and shape line, bounded: the caller's dtype and shape are the only ones taken.
  const std::size_t eol = body.substr(0, kMaxHeader).find('\n');
  if (eol == std::string_view::npos) refuse("no dtype and shape line");
  const std::string_view line = body.substr(0, eol);
  std::size_t at = 0;
  const std::string_view dtype_text = word(line, at);
  if (dtype_text != expected.dtype) {
    refuse("states of dtype '" + std::string(dtype_text) + "', not " + expected.dtype);
  }
  int64_t dims = 0;
  if (!parse_count(word(line, at), dims) || dims > static_cast<int64_t>(kMaxDims))
    refuse("a malformed shape");
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < dims; ++i) {
    int64_t d = 0;
    if (!parse_count(word(line, at), d)) refuse("a malformed shape");
    sizes.push_back(d);
  }
  if (at <= line.size()) refuse("a malformed shape (trailing words)");
  if (sizes != expected.shape) refuse("states of another shape");
  // 3. The bytes: exactly the shape's.
  std::size_t bytes = element_size;
  for (int64_t d : expected.shape) {
    if (d < 0 || (d > 0 && bytes > SIZE_MAX / static_cast<std::size_t>(d)))
      refuse("states of another shape");
    bytes *= static_cast<std::size_t>(d);
  }
  if (body.size() - eol - 1 != bytes) refuse("truncated or overlong value");
  return body.substr(eol + 1);
}

void wipe(std::string& secret) {
  OPENSSL_cleanse(secret.data(), secret.size());
}

}  // namespace promptcache::sealed
