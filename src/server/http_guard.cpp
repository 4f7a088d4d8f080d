#include "http_guard.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "promptcache/error.hpp"
#include "request.hpp"  // media_type

namespace promptcache::server {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string lowered(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), lower);
  return out;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// A header value as it may appear in an error message: at most 100 bytes, controls as '?'.
std::string shown(std::string_view s) {
  std::string out(s.substr(0, 100));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return s.size() > 100 ? out + "..." : out;
}

std::optional<std::array<unsigned char, 16>> ipv6_bytes(const std::string& name) {
  std::array<unsigned char, 16> bytes{};
  if (inet_pton(AF_INET6, name.c_str(), bytes.data()) != 1) return std::nullopt;
  return bytes;
}

bool ipv4_literal(const std::string& name) {
  unsigned char bytes[4];
  return inet_pton(AF_INET, name.c_str(), bytes) == 1;
}

// Two host names (as parse_host gives them) name the same host: equal strings, or the same
// IPv6 address however it is spelled ("::1" and "0:0:0:0:0:0:0:1").
bool same_host(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const auto x = ipv6_bytes(a), y = ipv6_bytes(b);
  return x && y && *x == *y;
}

bool wildcard_address(const std::string& bound) {
  if (bound == "0.0.0.0") return true;
  const auto b = ipv6_bytes(bound);
  return b && *b == std::array<unsigned char, 16>{};
}

// The port of `text` after a host ("" when none); nothing when it is not ":" + 1-5 digits <= 65535.
std::optional<std::optional<int>> parse_port(std::string_view text) {
  if (text.empty()) return std::optional<int>();
  if (text.front() != ':' || text.size() < 2 || text.size() > 6) return std::nullopt;
  int port = 0;
  for (char c : text.substr(1)) {
    if (!is_digit(c)) return std::nullopt;
    port = port * 10 + (c - '0');
  }
  if (port > 65535) return std::nullopt;
  return std::optional<int>(port);
}

bool listed(const std::vector<std::string>& list, std::string_view entry) {
  return std::find(list.begin(), list.end(), entry) != list.end();
}

std::string canonical_host_entry(const HostPort& h) {
  std::string out = h.ipv6 ? "[" + h.name + "]" : h.name;
  if (h.port) out += ":" + std::to_string(*h.port);
  return out;
}

const char* const kMethods = "GET, POST, DELETE, OPTIONS";

}  // namespace

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  while (true) {
    const std::size_t comma = text.find(',');
    const std::string_view entry = trim(text.substr(0, comma));
    if (!entry.empty()) out.emplace_back(entry);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

std::optional<HostPort> parse_host(std::string_view text) {
  HostPort out;
  std::string_view rest;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    out.name = lowered(text.substr(1, close - 1));
    out.ipv6 = true;
    if (!ipv6_bytes(out.name)) return std::nullopt;
    rest = text.substr(close + 1);
  } else {
    const std::size_t colon = text.find(':');
    const std::string_view name = text.substr(0, colon);
    if (name.empty()) return std::nullopt;
    for (char c : name) {
      if (!(is_alpha(c) || is_digit(c) || c == '-' || c == '.' || c == '_')) return std::nullopt;
    }
    out.name = lowered(name);
    // "localhost." is "localhost" (a fully qualified spelling); one dot only.
    if (out.name.size() > 1 && out.name.back() == '.') out.name.pop_back();
    if (out.name.empty() || out.name.back() == '.') return std::nullopt;
    rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon);
  }
  const auto port = parse_port(rest);
  if (!port) return std::nullopt;
  out.port = *port;
  return out;
}

std::optional<std::string> canonical_origin(std::string_view text) {
  const std::size_t sep = text.find("://");
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  const std::string scheme = lowered(text.substr(0, sep));
  if (!is_alpha(scheme.front())) return std::nullopt;
  for (char c : scheme) {
    if (!(is_alpha(c) || is_digit(c) || c == '+' || c == '-' || c == '.')) return std::nullopt;
  }
  // parse_host refuses '/', '?', '#' and '@' in the name: no path, query or user info.
  auto host = parse_host(text.substr(sep + 3));
  if (!host) return std::nullopt;
  if ((scheme == "http" && host->port == 80) || (scheme == "https" && host->port == 443)) {
    host->port.reset();
  }
  return scheme + "://" + canonical_host_entry(*host);
}

bool is_ip_literal(std::string_view name, bool ipv6) {
  const std::string n(name);
  return ipv6 ? ipv6_bytes(n).has_value() : ipv4_literal(n);
}

GuardOptions make_guard_options(const std::string& bound_host,
                                const std::vector<std::string>& allowed_origins,
                                const std::vector<std::string>& allowed_hosts,
                                const std::string& api_key) {
  GuardOptions g;
  std::string_view bound = trim(bound_host);
  if (bound.size() >= 2 && bound.front() == '[' && bound.back() == ']') {
    bound = bound.substr(1, bound.size() - 2);
  }
  g.bound_host = lowered(bound);
  if (g.bound_host.size() > 1 && g.bound_host.back() == '.') g.bound_host.pop_back();
  for (const std::string& item : allowed_origins) {
    for (const std::string& entry : split_list(item)) {
      if (entry == "*" || entry == "null") {
        g.allowed_origins.push_back(entry);
        continue;
      }
      const auto origin = canonical_origin(entry);
      if (!origin) {
        throw Error(ErrorKind::kInvalidArgument,
                    "--allowed-origins: '" + shown(entry) +
                        "' is not an origin: write scheme://host[:port] (e.g. "
                        "http://localhost:3000, no path or trailing slash), '*' for any origin "
                        "or 'null' for pages without one");
      }
      g.allowed_origins.push_back(*origin);
    }
  }
  for (const std::string& item : allowed_hosts) {
    for (const std::string& entry : split_list(item)) {
      if (entry == "*") {
        g.allowed_hosts.push_back(entry);
        continue;
      }
      const auto host = parse_host(entry);
      if (!host) {
        throw Error(ErrorKind::kInvalidArgument,
                    "--allowed-hosts: '" + shown(entry) +
                        "' is not a host name: write name[:port] (e.g. models.example.com, "
                        "[fd00::1]:8080) or '*' for any Host");
      }
      g.allowed_hosts.push_back(canonical_host_entry(*host));
    }
  }
  for (char c : api_key) {
    if (c <= 0x20 || c >= 0x7f) {
      throw Error(
          ErrorKind::kInvalidArgument,
          "--api-key / --api-key-file: the key must be printable ASCII without spaces (it is "
          "sent in an HTTP header)");
    }
  }
  g.api_key = api_key;
  return g;
}

bool host_allowed(const GuardOptions& g, const std::optional<std::string>& host) {
  if (!host) return true;
  if (listed(g.allowed_hosts, "*")) return true;
  const auto h = parse_host(*host);
  if (!h) return false;
  if (h->name == "localhost" || h->name == "127.0.0.1" || same_host(h->name, "::1")) return true;
  if (!g.bound_host.empty() && same_host(h->name, g.bound_host)) return true;
  if (wildcard_address(g.bound_host) && is_ip_literal(h->name, h->ipv6)) return true;
  for (const std::string& entry : g.allowed_hosts) {
    const auto e = parse_host(entry);
    if (e && same_host(e->name, h->name) && (!e->port || e->port == h->port)) return true;
  }
  return false;
}

bool origin_allowed(const GuardOptions& g, std::string_view origin,
                    const std::optional<std::string>& host) {
  if (origin == "null") return listed(g.allowed_origins, "null");
  const auto o = canonical_origin(origin);
  if (!o) return false;
  if (listed(g.allowed_origins, "*") || listed(g.allowed_origins, *o)) return true;
  if (host && host_allowed(g, host)) {
    // Pages served by this server, directly or through a TLS proxy that keeps the Host header.
    for (const char* scheme : {"http://", "https://"}) {
      const auto own = canonical_origin(scheme + *host);
      if (own && *own == *o) return true;
    }
  }
  return false;
}

bool content_type_allowed(std::string_view content_type, bool xml_too) {
  const std::string media = media_type(content_type);
  return media == "application/json" || (xml_too && media == "application/xml");
}

bool key_equal(std::string_view expected, std::string_view presented) {
  if (expected.empty()) return presented.empty();
  // Every byte of `presented` is compared (against the key repeated), and the differences are
  // OR-ed together: no early exit, no branch on the bytes.
  unsigned char diff = expected.size() == presented.size() ? 0 : 1;
  const std::size_t n = expected.size();
  for (std::size_t i = 0; i < presented.size(); ++i) {
    diff |= static_cast<unsigned char>(presented[i] ^ expected[i % n]);
  }
  return diff == 0;
}

bool key_presented(const GuardOptions& g, const std::optional<std::string>& authorization,
                   const std::optional<std::string>& x_api_key) {
  if (g.api_key.empty()) return true;
  bool ok = false;
  if (authorization) {
    const std::string_view value = trim(*authorization);
    const std::size_t space = value.find_first_of(" \t");
    if (space != std::string_view::npos && lowered(value.substr(0, space)) == "bearer") {
      const std::string_view token = trim(value.substr(space));
      ok |= !token.empty() && key_equal(g.api_key, token);
    }
  }
  if (x_api_key) {
    const std::string_view token = trim(*x_api_key);
    ok |= !token.empty() && key_equal(g.api_key, token);
  }
  return ok;
}

GuardDecision check_request(const GuardOptions& g, const GuardRequest& req) {
  GuardDecision d;
  const auto refuse = [&d](int status, const char* type, std::string message) {
    d.status = status;
    d.error_type = type;
    d.message = std::move(message);
    return d;
  };
  if (!host_allowed(g, req.host)) {
    return refuse(403, "permission_error",
                  "Host '" + shown(*req.host) +
                      "' is not a name of this server (a guard against DNS rebinding); to "
                      "reach it by that name, start the server with --allowed-hosts NAME");
  }
  if (req.origin) {
    if (!origin_allowed(g, *req.origin, req.host)) {
      return refuse(403, "permission_error",
                    "requests from web pages of origin '" + shown(*req.origin) +
                        "' are refused; to let such pages call this server, start it with "
                        "--allowed-origins ORIGIN");
    }
    d.headers.emplace_back("Access-Control-Allow-Origin", *req.origin);
    d.headers.emplace_back("Vary", "Origin");
  }
  if (req.method == "OPTIONS") {
    d.status = 204;
    if (req.origin) {
      d.headers.emplace_back("Access-Control-Allow-Methods", kMethods);
      d.headers.emplace_back("Access-Control-Allow-Headers",
                             "Authorization, X-API-Key, Content-Type");
      d.headers.emplace_back("Access-Control-Max-Age", "600");
    } else {
      d.headers.emplace_back("Allow", kMethods);
    }
    return d;
  }
  const bool open_path = req.path == "/health" || req.path == "/";
  if (!open_path && !key_presented(g, req.authorization, req.x_api_key)) {
    d.headers.emplace_back("WWW-Authenticate", "Bearer");
    return refuse(401, "authentication_error",
                  "a valid API key is required: send \"Authorization: Bearer KEY\" or "
                  "\"X-API-Key: KEY\"");
  }
  if (req.method == "POST") {
    const bool xml_too = req.path == "/v1/schemas";
    if (!req.content_type || !content_type_allowed(*req.content_type, xml_too)) {
      const std::string got = req.content_type ? "'" + shown(*req.content_type) + "'" : "none";
      return refuse(415, "invalid_request_error",
                    "POST " + shown(req.path) + " takes Content-Type: application/json" +
                        (xml_too ? " or application/xml" : "") + " (got " + got + ")");
    }
  }
  return d;
}

}  // namespace promptcache::server
