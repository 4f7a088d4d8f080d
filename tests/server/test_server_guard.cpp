// The Host, Origin, content-type, CORS and API key rules through a running server (the rules
// themselves: test_http_guard.cpp). After every refusal the server still answers a good request.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "server/server_fixture.hpp"

using nlohmann::json;
using namespace promptcache;
using namespace promptcache::test;

namespace {

// A good request answers: the server is still up and serving.
void still_answers(const TestServer& s, const httplib::Headers& headers = {}) {
  Posted r = post(s, "/v1/completions", json{{"prompt", "The cat"}, {"max_tokens", 2}}.dump(), {},
                  headers);
  INFO(r.body);
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["choices"][0]["text"].is_string());
}

json error_body(const std::string& body, const std::string& type) {
  INFO(body);
  const json j = json::parse(body);
  CHECK(j["error"]["type"] == type);
  CHECK(j["error"]["message"].is_string());
  return j;
}

std::string own_origin(const TestServer& s) {
  return "http://127.0.0.1:" + std::to_string(s.port);
}

// Sends `raw` on a new connection and returns everything the server answers until it closes the
// connection (or 20 s pass). With `later`, waits for the first answer (500 ms) before sending
// `later` on the same connection, as a slow client's body arrives after its headers were read.
std::string raw_exchange(const TestServer& s, const std::string& raw,
                         const std::string& later = "") {
  const int fd = connect_loopback(s);
  const auto send_all = [fd](const std::string& data) {
    std::size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<std::size_t>(n);
    }
  };
  std::string out;
  char buf[4096];
  send_all(raw);
  if (!later.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    send_all(later);
  }
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("serve guard: a foreign Origin is refused with 403 JSON", "[server][guard]") {
  TestServer s;
  const json body = {{"prompt", "The cat"}, {"max_tokens", 2}};
  for (const char* origin : {"https://evil.com", "null", "http://127.0.0.1.evil.com",
                             "http://localhost:1", "http://127.0.0.1"}) {
    INFO(origin);
    Posted r = post(s, "/v1/completions", body.dump(), {}, {{"Origin", origin}});
    CHECK(r.status == 403);
    error_body(r.body, "permission_error");
    auto get = s.client().Get("/v1/schemas", {{"Origin", origin}});
    REQUIRE(get);
    CHECK(get->status == 403);
    CHECK(!get->has_header("Access-Control-Allow-Origin"));
    still_answers(s);
  }
  // The server's own pages (the playground posts with its own origin).
  Posted own = post(s, "/v1/completions", body.dump(), {}, {{"Origin", own_origin(s)}});
  CHECK(own.status == 200);
  // Nothing was compiled or run for the refused requests.
  CHECK(metric(s, "promptcache_requests_total{endpoint=\"/v1/completions\",code=\"403\"}") == 5);
}

TEST_CASE("serve guard: POSTs must be application/json (or XML for schemas): 415",
          "[server][guard]") {
  TestServer s;
  const std::string body = json{{"prompt", "The cat"}, {"max_tokens", 2}}.dump();
  for (const char* type :
       {"text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x", "application/jsonx", "application/xml"}) {
    INFO(type);
    Posted r = post(s, "/v1/completions", body, {}, {}, type);
    CHECK(r.status == 415);
    error_body(r.body, "invalid_request_error");
    still_answers(s);
  }
  Posted upper = post(s, "/v1/completions", body, {}, {}, "Application/JSON; charset=UTF-8");
  CHECK(upper.status == 200);
  Posted schema_text = post(s, "/v1/schemas", docs_schema(), {}, {}, "text/plain");
  CHECK(schema_text.status == 415);
  Posted schema_xml =
      post(s, "/v1/schemas?stream=false", docs_schema(), {}, {}, "application/xml; charset=utf-8");
  CHECK(schema_xml.status == 200);
  Posted schema_json = post(s, "/v1/schemas?stream=false",
                            json{{"xml", docs_schema("docs2")}}.dump(), {}, {}, "application/json");
  CHECK(schema_json.status == 200);
}

TEST_CASE("serve guard: allowed origins get CORS headers and preflights", "[server][guard]") {
  server::ServerOptions options;
  options.allowed_origins = {"https://app.example.com", "http://localhost:3000"};
  TestServer s(options);
  const std::string body = json{{"prompt", "The cat"}, {"max_tokens", 2}}.dump();
  httplib::Client c = s.client();
  SECTION("simple requests") {
    auto r = c.Post("/v1/completions", {{"Origin", "https://app.example.com"}}, body,
                    "application/json");
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->get_header_value("Access-Control-Allow-Origin") == "https://app.example.com");
    CHECK(r->get_header_value("Vary") == "Origin");
    auto get = c.Get("/v1/models", {{"Origin", "http://localhost:3000"}});
    REQUIRE(get);
    CHECK(get->status == 200);
    CHECK(get->get_header_value("Access-Control-Allow-Origin") == "http://localhost:3000");
    // Errors of an allowed origin carry the headers too, so its page can read them.
    auto missing = c.Get("/v1/nothing", {{"Origin", "https://app.example.com"}});
    REQUIRE(missing);
    CHECK(missing->status == 404);
    CHECK(missing->get_header_value("Access-Control-Allow-Origin") == "https://app.example.com");
    // No CORS headers without an Origin, nor for another origin.
    auto plain = c.Get("/v1/models");
    REQUIRE(plain);
    CHECK(!plain->has_header("Access-Control-Allow-Origin"));
    auto other = c.Get("/v1/models", {{"Origin", "http://localhost:3001"}});
    REQUIRE(other);
    CHECK(other->status == 403);
    CHECK(!other->has_header("Access-Control-Allow-Origin"));
  }
  SECTION("preflights") {
    const httplib::Headers preflight = {
        {"Origin", "https://app.example.com"},
        {"Access-Control-Request-Method", "POST"},
        {"Access-Control-Request-Headers", "authorization, content-type"}};
    auto r = c.Options("/v1/chat/completions", preflight);
    REQUIRE(r);
    CHECK(r->status == 204);
    CHECK(r->get_header_value("Access-Control-Allow-Origin") == "https://app.example.com");
    CHECK(r->get_header_value("Access-Control-Allow-Headers") ==
          "Authorization, X-API-Key, Content-Type");
    CHECK(r->get_header_value("Access-Control-Allow-Methods").find("POST") != std::string::npos);
    CHECK(r->body.empty());
    auto foreign = c.Options("/v1/chat/completions", {{"Origin", "https://evil.com"},
                                                      {"Access-Control-Request-Method", "POST"}});
    REQUIRE(foreign);
    CHECK(foreign->status == 403);
    CHECK(!foreign->has_header("Access-Control-Allow-Origin"));
    error_body(foreign->body, "permission_error");
    still_answers(s);
  }
}

TEST_CASE("serve guard: a Host that is not the server's is refused (DNS rebinding)",
          "[server][guard]") {
  TestServer s;
  const std::string port = std::to_string(s.port);
  for (const std::string& host : std::vector<std::string>{
           "evil.com", "evil.com:" + port, "localhost.evil.com:" + port,
           "127.0.0.1.evil.com:" + port, "localhost:" + port + ".evil.com", "0.0.0.0:" + port}) {
    INFO(host);
    auto health = s.client().Get("/health", {{"Host", host}});
    REQUIRE(health);
    CHECK(health->status == 403);
    error_body(health->body, "permission_error");
    Posted r = post(s, "/v1/completions", json{{"prompt", "x"}}.dump(), {}, {{"Host", host}});
    CHECK(r.status == 403);
    still_answers(s);
  }
  for (const std::string& host :
       std::vector<std::string>{"localhost:" + port, "LOCALHOST:" + port, "127.0.0.1:" + port,
                                "[::1]:" + port, std::string("localhost")}) {
    INFO(host);
    auto health = s.client().Get("/health", {{"Host", host}});
    REQUIRE(health);
    CHECK(health->status == 200);
  }
  // HTTP/1.0 without a Host header is allowed.
  const std::string answer = raw_exchange(s, "GET /health HTTP/1.0\r\n\r\n");
  CHECK(answer.rfind("HTTP/1.1 200", 0) == 0);
  // Two Host headers are refused.
  const std::string two =
      raw_exchange(s,
                   "GET /health HTTP/1.1\r\nHost: localhost\r\nHost: evil.com\r\n"
                   "Connection: close\r\n\r\n");
  CHECK(two.rfind("HTTP/1.1 403", 0) == 0);

  server::ServerOptions options;
  options.allowed_hosts = {"models.example.com"};
  TestServer listed(options);
  auto named = listed.client().Get("/health", {{"Host", "models.example.com:8080"}});
  REQUIRE(named);
  CHECK(named->status == 200);
  auto other = listed.client().Get("/health", {{"Host", "example.com"}});
  REQUIRE(other);
  CHECK(other->status == 403);
}

TEST_CASE("serve guard: a request hidden in a refused body is never run", "[server][guard]") {
  TestServer s;
  // A page may send any text as a text/plain body; were the connection kept after the refusal,
  // the server would read that body as the next request, without the page's Origin.
  const std::string inner_body = json{{"prompt", "The cat"}, {"max_tokens", 2}}.dump();
  const std::string inner =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(inner_body.size()) + "\r\n\r\n" + inner_body;
  for (const auto& [headers, status] : std::vector<std::pair<std::string, std::string>>{
           {"Origin: https://evil.com\r\nContent-Type: text/plain\r\n", "403"},
           {"Content-Type: text/plain\r\n", "415"},
           {"Host: evil.com\r\nContent-Type: application/json\r\n", "403"}}) {
    INFO(headers);
    std::string raw = "POST /v1/completions HTTP/1.1\r\n";
    if (headers.find("Host:") == std::string::npos) raw += "Host: 127.0.0.1\r\n";
    raw += headers + "Content-Length: " + std::to_string(inner.size()) + "\r\n\r\n";
    // The body with the headers, and the body after the answer.
    for (const bool slow : {false, true}) {
      INFO("body sent " << (slow ? "after the answer" : "with the headers"));
      const std::string answer = slow ? raw_exchange(s, raw, inner) : raw_exchange(s, raw + inner);
      INFO(answer);
      CHECK(answer.rfind("HTTP/1.1 " + status, 0) == 0);
      CHECK(count(answer, "HTTP/1.1 ") == 1);
      CHECK(answer.find("\"choices\"") == std::string::npos);
    }
  }
  CHECK(metric(s, "promptcache_requests_total{endpoint=\"/v1/completions\",code=\"200\"}") == -1);
  still_answers(s);
}

TEST_CASE("serve guard: the API key from a header only", "[server][guard]") {
  server::ServerOptions options;
  options.api_key = "s3cret-key";
  TestServer s(options);
  httplib::Client c = s.client();
  for (const httplib::Headers& good :
       std::vector<httplib::Headers>{{{"Authorization", "Bearer s3cret-key"}},
                                     {{"Authorization", "bearer s3cret-key"}},
                                     {{"X-API-Key", "s3cret-key"}}}) {
    auto r = c.Get("/v1/schemas", good);
    REQUIRE(r);
    CHECK(r->status == 200);
    still_answers(s, good);
  }
  for (const httplib::Headers& bad :
       std::vector<httplib::Headers>{{},
                                     {{"Authorization", "Bearer s3cret"}},
                                     {{"Authorization", "Bearer s3cret-key2"}},
                                     {{"Authorization", "Bearer S3CRET-KEY"}},
                                     {{"Authorization", "s3cret-key"}},
                                     {{"Authorization", "Basic s3cret-key"}},
                                     {{"X-API-Key", "s3cret-ke"}},
                                     {{"X-API-Key", "Bearer s3cret-key"}}}) {
    auto r = c.Get("/v1/schemas", bad);
    REQUIRE(r);
    CHECK(r->status == 401);
    CHECK(r->get_header_value("WWW-Authenticate") == "Bearer");
    error_body(r->body, "authentication_error");
    Posted p = post(s, "/v1/completions", json{{"prompt", "x"}}.dump(), {}, bad);
    CHECK(p.status == 401);
  }
  // Never from the query string.
  for (const char* path : {"/v1/schemas?api_key=s3cret-key", "/metrics?api_key=s3cret-key",
                           "/v1/models?key=s3cret-key"}) {
    INFO(path);
    auto r = c.Get(path);
    REQUIRE(r);
    CHECK(r->status == 401);
  }
  Posted q = post(s, "/v1/completions?api_key=s3cret-key", json{{"prompt", "x"}}.dump());
  CHECK(q.status == 401);
  // The playground page and /health need no key (the page asks for it and sends the header).
  auto page = c.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  still_answers(s, {{"X-API-Key", "s3cret-key"}});
}

TEST_CASE("serve guard: bad --allowed-origins / --allowed-hosts entries stop the server",
          "[server][guard]") {
  server::ServerOptions bad_origin;
  bad_origin.allowed_origins = {"localhost:3000"};
  CHECK_THROWS_AS(server::Server(tiny_engine(), bad_origin), Error);
  server::ServerOptions bad_host;
  bad_host.allowed_hosts = {"http://example.com"};
  CHECK_THROWS_AS(server::Server(tiny_engine(), bad_host), Error);
}
