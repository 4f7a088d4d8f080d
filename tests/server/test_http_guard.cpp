// http_guard: the Host, Origin, content-type, CORS and API key rules of `promptcache serve`, on
// header values alone (tests/server/test_server_guard.cpp has them through a running server).
#include "http_guard.hpp"
#include "request.hpp"

#include <string>

#include "promptcache/error.hpp"
#include "support/catch.hpp"

using namespace promptcache;
using namespace promptcache::server;

namespace {

GuardOptions options(const std::string& host = "127.0.0.1", std::vector<std::string> origins = {},
                     std::vector<std::string> hosts = {}, const std::string& key = "") {
  return make_guard_options(host, origins, hosts, key);
}

GuardRequest request(const std::string& method, const std::string& path,
                     std::optional<std::string> host = std::string("127.0.0.1:8080")) {
  GuardRequest r;
  r.method = method;
  r.path = path;
  r.host = std::move(host);
  if (method == "POST") r.content_type = "application/json";
  return r;
}

std::string header(const GuardDecision& d, const std::string& name) {
  for (const auto& [k, v] : d.headers) {
    if (k == name) return v;
  }
  return "";
}

bool host_ok(const GuardOptions& g, const char* host) {
  return host_allowed(g, std::optional<std::string>(host));
}

}  // namespace

TEST_CASE("http_guard: comma lists", "[server][guard]") {
  CHECK(split_list("") == std::vector<std::string>{});
  CHECK(split_list(" , ,") == std::vector<std::string>{});
  CHECK(split_list("a") == std::vector<std::string>{"a"});
  CHECK(split_list(" a ,b,, \tc ") == std::vector<std::string>{"a", "b", "c"});
  // Entries of the options may themselves be comma lists.
  const GuardOptions g =
      options("127.0.0.1", {"http://a.test, https://b.test:8443", "http://c.test"}, {"x.test,y"});
  CHECK(g.allowed_origins ==
        std::vector<std::string>{"http://a.test", "https://b.test:8443", "http://c.test"});
  CHECK(g.allowed_hosts == std::vector<std::string>{"x.test", "y"});
}

TEST_CASE("http_guard: Host headers are parsed, not searched", "[server][guard]") {
  auto h = parse_host("LocalHost:8080");
  REQUIRE(h);
  CHECK(h->name == "localhost");
  CHECK(h->port == 8080);
  CHECK(!h->ipv6);
  h = parse_host("[::1]:8080");
  REQUIRE(h);
  CHECK(h->name == "::1");
  CHECK(h->ipv6);
  CHECK(h->port == 8080);
  h = parse_host("localhost.");
  REQUIRE(h);
  CHECK(h->name == "localhost");
  CHECK(!h->port);
  for (const char* bad :
       {"", ":8080", "localhost:", "localhost:65536", "localhost:123456", "localhost:80a",
        "localhost:-1", "local host", "localhost@evil.com", "evil.com/localhost", "[::1", "[::1]x",
        "[not-ipv6]", "::1", "localhost:8080:8080", "localhost..", ".", "a%2fb",
        "localhost\r\nX: y"}) {
    INFO(bad);
    CHECK(!parse_host(bad));
  }
}

TEST_CASE("http_guard: the Host rule (DNS-rebinding guard)", "[server][guard]") {
  const GuardOptions g = options("127.0.0.1");
  for (const char* ok : {"127.0.0.1", "127.0.0.1:8080", "localhost", "localhost:1", "LOCALHOST:80",
                         "LocalHost", "localhost.", "[::1]", "[::1]:8080", "[0:0:0:0:0:0:0:1]:9"}) {
    INFO(ok);
    CHECK(host_ok(g, ok));
  }
  for (const char* bad :
       {"evil.com", "evil.com:8080", "localhost.evil.com", "127.0.0.1.evil.com", "127.0.0.1.nip.io",
        "evil-localhost", "localhost:8080.evil.com", "0.0.0.0", "127.0.0.2", "192.168.1.5", "[::2]",
        "[::ffff:127.0.0.1]", "", " localhost", "localhost,evil.com", "127.0.0.1, evil.com"}) {
    INFO(bad);
    CHECK(!host_ok(g, bad));
  }
  // A request without Host (HTTP/1.0) is allowed.
  CHECK(host_allowed(g, std::nullopt));
}

TEST_CASE("http_guard: the bound address, --allowed-hosts, wildcard binds", "[server][guard]") {
  const GuardOptions named = options("Models.Example.LAN");
  CHECK(host_ok(named, "models.example.lan:8080"));
  CHECK(host_ok(named, "localhost"));
  CHECK(!host_ok(named, "other.example.lan"));
  CHECK(!host_ok(named, "192.168.1.5"));

  const GuardOptions v6 = options("[fd00::1]");
  CHECK(host_ok(v6, "[fd00::1]:8080"));
  CHECK(host_ok(v6, "[FD00:0:0::1]"));
  CHECK(!host_ok(v6, "[fd00::2]"));

  const GuardOptions listed = options("127.0.0.1", {}, {"api.example.com", "proxy.test:443"});
  CHECK(host_ok(listed, "api.example.com"));
  CHECK(host_ok(listed, "API.example.com:8080"));
  CHECK(host_ok(listed, "proxy.test:443"));
  CHECK(!host_ok(listed, "proxy.test"));
  CHECK(!host_ok(listed, "proxy.test:8443"));
  CHECK(!host_ok(listed, "example.com"));
  CHECK(!host_ok(listed, "api.example.com.evil.com"));
  CHECK(!host_ok(listed, "evilapi.example.com"));

  const GuardOptions any = options("127.0.0.1", {}, {"*"});
  CHECK(host_ok(any, "evil.com"));
  CHECK(host_ok(any, "anything at all"));

  // Bound to every address: any IP literal (no rebinding vector), still no foreign names.
  for (const char* wildcard : {"0.0.0.0", "::", "[::]"}) {
    INFO(wildcard);
    const GuardOptions w = options(wildcard);
    CHECK(host_ok(w, "192.168.1.5:8080"));
    CHECK(host_ok(w, "10.0.0.7"));
    CHECK(host_ok(w, "[fd00::1]:8080"));
    CHECK(host_ok(w, "localhost"));
    CHECK(!host_ok(w, "evil.com"));
    CHECK(!host_ok(w, "192.168.1.5.evil.com"));
    CHECK(!host_ok(w, "192.168.1"));
    CHECK(!host_ok(w, "0x7f.0.0.1"));
    CHECK(!host_ok(w, "fd00::1"));  // IPv6 without brackets is not a Host
  }
  CHECK(is_ip_literal("10.1.2.3", false));
  CHECK(!is_ip_literal("10.1.2", false));
  CHECK(!is_ip_literal("256.1.2.3", false));
  CHECK(is_ip_literal("::1", true));
  CHECK(!is_ip_literal("::g", true));
}

TEST_CASE("http_guard: origins are canonicalised", "[server][guard]") {
  CHECK(canonical_origin("http://localhost:8080") == "http://localhost:8080");
  CHECK(canonical_origin("HTTP://LocalHost:8080") == "http://localhost:8080");
  CHECK(canonical_origin("http://example.com:80") == "http://example.com");
  CHECK(canonical_origin("https://example.com:443") == "https://example.com");
  CHECK(canonical_origin("https://example.com:80") == "https://example.com:80");
  CHECK(canonical_origin("http://[::1]:8080") == "http://[::1]:8080");
  for (const char* bad :
       {"", "null", "localhost:8080", "http://", "http:/localhost", "http://localhost/",
        "http://localhost:8080/path", "http://user@host", "http://host?q", "http://host#f",
        "://host", "1http://host", "http://host:99999", "http://[::1", "ht tp://host"}) {
    INFO(bad);
    CHECK(!canonical_origin(bad));
  }
}

TEST_CASE("http_guard: the Origin rule", "[server][guard]") {
  const GuardOptions g = options("127.0.0.1", {"https://app.example.com", "http://localhost:3000"});
  const std::optional<std::string> host = std::string("127.0.0.1:8080");
  // The server's own origin: its own pages (the playground), directly or through a TLS proxy.
  CHECK(origin_allowed(g, "http://127.0.0.1:8080", host));
  CHECK(origin_allowed(g, "HTTP://127.0.0.1:8080", host));
  CHECK(origin_allowed(g, "https://127.0.0.1:8080", host));
  CHECK(origin_allowed(g, "http://localhost:8080", std::string("localhost:8080")));
  CHECK(origin_allowed(g, "http://localhost", std::string("localhost:80")));
  // Another port of the same host is another origin.
  CHECK(!origin_allowed(g, "http://127.0.0.1:8081", host));
  CHECK(!origin_allowed(g, "http://localhost:8080", host));
  CHECK(!origin_allowed(g, "http://127.0.0.1", host));
  // Listed origins, compared after lower-casing scheme and host.
  CHECK(origin_allowed(g, "https://app.example.com", host));
  CHECK(origin_allowed(g, "https://APP.Example.com", host));
  CHECK(origin_allowed(g, "https://app.example.com:443", host));
  CHECK(origin_allowed(g, "http://localhost:3000", host));
  CHECK(!origin_allowed(g, "http://app.example.com", host));
  CHECK(!origin_allowed(g, "https://app.example.com:8443", host));
  CHECK(!origin_allowed(g, "https://app.example.com.evil.com", host));
  CHECK(!origin_allowed(g, "https://evil.com", host));
  CHECK(!origin_allowed(g, "http://localhost:3001", host));
  CHECK(!origin_allowed(g, "https://app.example.com/", host));
  CHECK(!origin_allowed(g, "https://app.example.com, https://evil.com", host));
  // null: pages without an origin (sandboxed frames, file://) only when listed; "*" is not enough.
  CHECK(!origin_allowed(g, "null", host));
  CHECK(!origin_allowed(g, "", host));
  const GuardOptions any = options("127.0.0.1", {"*"});
  CHECK(origin_allowed(any, "https://evil.com", host));
  CHECK(!origin_allowed(any, "null", host));
  CHECK(!origin_allowed(any, "not an origin", host));
  const GuardOptions with_null = options("127.0.0.1", {"null"});
  CHECK(origin_allowed(with_null, "null", host));
  CHECK(!origin_allowed(with_null, "https://evil.com", host));
  // Without a Host header there is no own origin; with a foreign Host neither.
  CHECK(!origin_allowed(g, "http://127.0.0.1:8080", std::nullopt));
  CHECK(!origin_allowed(g, "http://evil.com", std::string("evil.com")));
}

TEST_CASE("http_guard: malformed option entries are refused at start", "[server][guard]") {
  CHECK_THROWS_AS(options("127.0.0.1", {"localhost:3000"}), Error);
  CHECK_THROWS_AS(options("127.0.0.1", {"http://localhost:3000/"}), Error);
  CHECK_THROWS_AS(options("127.0.0.1", {}, {"http://example.com"}), Error);
  CHECK_THROWS_AS(options("127.0.0.1", {}, {"example.com/x"}), Error);
  CHECK_THROWS_AS(options("127.0.0.1", {}, {}, "has space"), Error);
  CHECK_THROWS_AS(options("127.0.0.1", {}, {}, "tab\tkey"), Error);
  try {
    options("127.0.0.1", {"localhost:3000"});
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kInvalidArgument);
    CHECK(std::string(e.what()).find("--allowed-origins") != std::string::npos);
  }
  CHECK_NOTHROW(options("127.0.0.1", {"*", "null", "https://a.test"}, {"*", "[fd00::1]:80"},
                        "k3y-with_symbols!~"));
}

TEST_CASE("http_guard: POST content types", "[server][guard]") {
  CHECK(media_type("Application/JSON; charset=UTF-8") == "application/json");
  CHECK(media_type(" application/xml ") == "application/xml");
  CHECK(media_type("") == "");
  for (const char* ok :
       {"application/json", "Application/JSON", "application/json; charset=utf-8",
        "application/json;charset=UTF-8", " application/json ", "application/json ; foo=bar"}) {
    INFO(ok);
    CHECK(content_type_allowed(ok, false));
    CHECK(content_type_allowed(ok, true));
  }
  CHECK(content_type_allowed("application/xml", true));
  CHECK(content_type_allowed("APPLICATION/XML; charset=utf-8", true));
  CHECK(!content_type_allowed("application/xml", false));
  for (const char* bad :
       {"", "text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x", "application/jsonx", "application/json-seq",
        "xapplication/json", "application/json x", "application/json, text/plain", "text/xml",
        "application/xml+json", "application/", "json"}) {
    INFO(bad);
    CHECK(!content_type_allowed(bad, true));
  }
}

TEST_CASE("http_guard: the API key comparison", "[server][guard]") {
  CHECK(key_equal("s3cret", "s3cret"));
  for (const char* bad : {"", "s", "s3cre", "s3cret ", "s3cretX", "S3CRET", "x3cret", "s3cres",
                          "s3crets3cret", "s3cret/s3cret"}) {
    INFO(bad);
    CHECK(!key_equal("s3cret", bad));
  }
  // A presented key that repeats the expected one (the loop wraps around it) is still wrong.
  CHECK(!key_equal("ab", "abab"));
  CHECK(!key_equal("", "x"));

  const GuardOptions g = options("127.0.0.1", {}, {}, "s3cret");
  const auto ok = [&](std::optional<std::string> auth, std::optional<std::string> x) {
    return key_presented(g, auth, x);
  };
  CHECK(ok("Bearer s3cret", std::nullopt));
  CHECK(ok("bearer s3cret", std::nullopt));
  CHECK(ok("BEARER   s3cret ", std::nullopt));
  CHECK(ok(std::nullopt, "s3cret"));
  CHECK(ok(std::nullopt, " s3cret "));
  CHECK(ok("Basic czNjcmV0", "s3cret"));
  CHECK(ok("Bearer wrong", "s3cret"));
  CHECK(!ok(std::nullopt, std::nullopt));
  CHECK(!ok("s3cret", std::nullopt));
  CHECK(!ok("Bearer", std::nullopt));
  CHECK(!ok("Bearer ", std::nullopt));
  CHECK(!ok("Bearers3cret", std::nullopt));
  CHECK(!ok("Basic s3cret", std::nullopt));
  CHECK(!ok("Bearer s3cre", std::nullopt));
  CHECK(!ok("Bearer s3cretX", std::nullopt));
  CHECK(!ok("Bearer s3cret s3cret", std::nullopt));
  CHECK(!ok("Bearer s3cret, Bearer s3cret", std::nullopt));
  CHECK(!ok(std::nullopt, ""));
  CHECK(!ok(std::nullopt, "s3cre"));
  CHECK(!ok(std::nullopt, "Bearer s3cret"));
  // No key set: everything passes.
  CHECK(key_presented(options(), std::nullopt, std::nullopt));
}

TEST_CASE("http_guard: check_request puts the rules in order", "[server][guard]") {
  const GuardOptions g = options("127.0.0.1", {"https://app.example.com"}, {}, "s3cret");
  GuardRequest r = request("POST", "/v1/prompt");
  r.authorization = "Bearer s3cret";
  CHECK(check_request(g, r).status == 0);
  CHECK(check_request(g, r).headers.empty());

  SECTION("a foreign Host comes first") {
    r.host = "evil.com:8080";
    r.origin = "https://evil.com";
    r.content_type = "text/plain";
    const GuardDecision d = check_request(g, r);
    CHECK(d.status == 403);
    CHECK(d.error_type == "permission_error");
    CHECK(d.message.find("--allowed-hosts") != std::string::npos);
    CHECK(d.headers.empty());
  }
  SECTION("a foreign Origin: 403 with no CORS headers") {
    r.origin = "https://evil.com";
    const GuardDecision d = check_request(g, r);
    CHECK(d.status == 403);
    CHECK(d.error_type == "permission_error");
    CHECK(d.message.find("--allowed-origins") != std::string::npos);
    CHECK(header(d, "Access-Control-Allow-Origin").empty());
  }
  SECTION("an allowed Origin gets CORS headers, on refusals too") {
    r.origin = "https://app.example.com";
    GuardDecision d = check_request(g, r);
    CHECK(d.status == 0);
    CHECK(header(d, "Access-Control-Allow-Origin") == "https://app.example.com");
    CHECK(header(d, "Vary") == "Origin");
    r.authorization.reset();
    d = check_request(g, r);
    CHECK(d.status == 401);
    CHECK(header(d, "Access-Control-Allow-Origin") == "https://app.example.com");
    CHECK(header(d, "WWW-Authenticate") == "Bearer");
  }
  SECTION("the key: 401, but not for /health, / and preflights") {
    r.authorization.reset();
    GuardDecision d = check_request(g, r);
    CHECK(d.status == 401);
    CHECK(d.error_type == "authentication_error");
    CHECK(check_request(g, request("GET", "/health")).status == 0);
    CHECK(check_request(g, request("GET", "/")).status == 0);
    CHECK(check_request(g, request("GET", "/metrics")).status == 401);
    CHECK(check_request(g, request("GET", "/v1/schemas")).status == 401);
    CHECK(check_request(g, request("DELETE", "/v1/schemas/x")).status == 401);
    CHECK(check_request(g, request("GET", "/health/")).status == 401);
    GuardRequest pre = request("OPTIONS", "/v1/prompt");
    pre.content_type.reset();
    pre.origin = "https://app.example.com";
    CHECK(check_request(g, pre).status == 204);
    // /health is still under the Host check.
    CHECK(check_request(g, request("GET", "/health", std::string("evil.com"))).status == 403);
  }
  SECTION("the content type of POSTs: 415") {
    for (const char* bad : {"text/plain", "application/x-www-form-urlencoded", "application/xml",
                            "application/jsonx"}) {
      INFO(bad);
      r.content_type = bad;
      const GuardDecision d = check_request(g, r);
      CHECK(d.status == 415);
      CHECK(d.error_type == "invalid_request_error");
      CHECK(d.message.find("application/json") != std::string::npos);
    }
    r.content_type.reset();
    CHECK(check_request(g, r).status == 415);
    GuardRequest schema = request("POST", "/v1/schemas");
    schema.authorization = "Bearer s3cret";
    schema.content_type = "application/xml; charset=utf-8";
    CHECK(check_request(g, schema).status == 0);
    schema.content_type = "application/json";
    CHECK(check_request(g, schema).status == 0);
    schema.content_type = "text/xml";
    CHECK(check_request(g, schema).status == 415);
    // GET and DELETE carry no body to check.
    GuardRequest get = request("GET", "/v1/schemas");
    get.authorization = "Bearer s3cret";
    get.content_type = "text/plain";
    CHECK(check_request(g, get).status == 0);
  }
  SECTION("preflights") {
    GuardRequest pre = request("OPTIONS", "/v1/chat/completions");
    pre.content_type.reset();
    pre.origin = "https://app.example.com";
    GuardDecision d = check_request(g, pre);
    CHECK(d.status == 204);
    CHECK(header(d, "Access-Control-Allow-Origin") == "https://app.example.com");
    CHECK(header(d, "Vary") == "Origin");
    CHECK(header(d, "Access-Control-Allow-Headers") == "Authorization, X-API-Key, Content-Type");
    CHECK(header(d, "Access-Control-Allow-Methods").find("POST") != std::string::npos);
    pre.origin = "https://evil.com";
    d = check_request(g, pre);
    CHECK(d.status == 403);
    CHECK(header(d, "Access-Control-Allow-Origin").empty());
    pre.origin = "null";
    CHECK(check_request(g, pre).status == 403);
    // OPTIONS without an Origin is not a preflight: the methods, no CORS headers.
    pre.origin.reset();
    d = check_request(g, pre);
    CHECK(d.status == 204);
    CHECK(header(d, "Access-Control-Allow-Origin").empty());
    CHECK(!header(d, "Allow").empty());
  }
  SECTION("the header values shown in messages are cut and cleaned") {
    r.host = std::string(500, 'a') + "\x01.evil";
    const GuardDecision d = check_request(g, r);
    CHECK(d.status == 403);
    CHECK(d.message.size() < 400);
    CHECK(d.message.find('\x01') == std::string::npos);
  }
}
