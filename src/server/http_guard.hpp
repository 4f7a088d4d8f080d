// What the server checks in a request's headers before any route runs (issue 31, "browsers and
// names" and "key hygiene"): the Host header (DNS-rebinding guard), the Origin header (web pages
// of other sites), the Content-Type of POSTs (a text/plain or form POST needs no CORS preflight,
// so a foreign page could send one), CORS answers for the origins that are allowed, and the API
// key. Pure functions over header values: no httplib here, so they are unit-tested directly.
//
// Every decision is made on parsed values (a Host is split into name and port, an Origin into
// scheme, host and port), never by searching the raw text.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace promptcache::server {

// What the guard allows, in canonical form (make_guard_options builds it from ServerOptions).
struct GuardOptions {
  // The bound address (ServerOptions::host), lower-cased, IPv6 without brackets.
  std::string bound_host;
  // Origins as "scheme://host[:port]" (lower-cased, default port dropped), "*" (any origin but
  // "null") or "null" (pages with an opaque origin: sandboxed frames, file:// pages).
  std::vector<std::string> allowed_origins;
  // Host names (and "name:port" entries, which match that port only) accepted besides the bound
  // address, localhost, 127.0.0.1 and [::1]; "*": any Host.
  std::vector<std::string> allowed_hosts;
  // Empty: no key is asked for.
  std::string api_key;
};

// Validates and canonicalises the entries (each may itself be a comma list);
// Error(kInvalidArgument) naming the flag (--allowed-origins, --allowed-hosts, --api-key) for an
// entry that is not an origin / host name, or a key that is not printable ASCII without spaces.
GuardOptions make_guard_options(const std::string& bound_host,
                                const std::vector<std::string>& allowed_origins,
                                const std::vector<std::string>& allowed_hosts,
                                const std::string& api_key);

// "a, b,,c" -> {"a", "b", "c"}: split at commas, spaces and tabs trimmed, empty entries dropped.
std::vector<std::string> split_list(std::string_view text);

// A Host header (or --allowed-hosts entry) split into its parts: `name` lower-cased, without
// the brackets of an IPv6 literal and without one trailing dot; `port` when one was given.
// Nothing when it is not `name[:port]` / `[ipv6][:port]` (a name may hold letters, digits, '-',
// '.' and '_'; a port is 1 to 5 digits up to 65535).
struct HostPort {
  std::string name;
  std::optional<int> port;
  bool ipv6 = false;  // given in brackets (and a valid IPv6 address)
};
std::optional<HostPort> parse_host(std::string_view text);

// "scheme://host[:port]" lower-cased with the scheme's default port (http 80, https 443)
// dropped; nothing when `text` is not an origin (a path, user info, query or a bad host).
std::optional<std::string> canonical_origin(std::string_view text);

// True when `name` (as parse_host gives it) is an IPv4 dotted quad or an IPv6 address.
bool is_ip_literal(std::string_view name, bool ipv6);

// The Host rule: absent (HTTP/1.0) is allowed; else the bound address, localhost, 127.0.0.1,
// [::1] (any port), an --allowed-hosts entry, or -- when bound to 0.0.0.0 or :: -- any IP literal.
bool host_allowed(const GuardOptions& g, const std::optional<std::string>& host);

// The Origin rule (for a request whose Host passed host_allowed): the server's own origin
// ("http://" or "https://" + the Host header), an entry of allowed_origins, or any origin when
// the list holds "*"; the literal "null" only when listed.
bool origin_allowed(const GuardOptions& g, std::string_view origin,
                    const std::optional<std::string>& host);

// media_type(content_type) (request.hpp) is application/json, or application/xml when `xml_too`.
bool content_type_allowed(std::string_view content_type, bool xml_too);

// Constant-time comparison: its running time depends on the length of `presented` only, never on
// where the first differing byte is or on the expected key.
bool key_equal(std::string_view expected, std::string_view presented);

// The key from "Authorization: Bearer KEY" (scheme case-insensitive) or "X-API-Key: KEY"
// matches g.api_key (always true when no key is set). Query parameters are never read.
bool key_presented(const GuardOptions& g, const std::optional<std::string>& authorization,
                   const std::optional<std::string>& x_api_key);

// The request as the guard sees it: method, path (no query) and the headers it reads (nothing
// when absent; a header sent twice is given joined by ", ", which no rule accepts).
struct GuardRequest {
  std::string method;
  std::string path;
  std::optional<std::string> host, origin, content_type, authorization, x_api_key;
};

// What to do with it: `status` 0 lets the route run; 204 answers a preflight (no body); 401, 403
// or 415 refuse it with error_json(message, error_type). `headers` go on the response in every
// case (CORS headers for an allowed origin, WWW-Authenticate with a 401).
struct GuardDecision {
  int status = 0;
  std::string error_type;
  std::string message;
  std::vector<std::pair<std::string, std::string>> headers;
};

// The checks in order: Host (403), Origin (403), the OPTIONS preflight (204), the API key (401;
// not for /health, the static playground page at / and preflights), the POST content type (415;
// /v1/schemas takes application/json or application/xml, the other POSTs application/json).
GuardDecision check_request(const GuardOptions& g, const GuardRequest& req);

}  // namespace promptcache::server
