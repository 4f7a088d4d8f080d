// A promptcache server on a free port of 127.0.0.1, in this process, over a tiny random model;
// and the client calls the server tests make (cpp-httplib's client).
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "promptcache/server/server.hpp"
#include "support/tiny_model.hpp"

namespace promptcache::test {

// Eight one-sentence documents and a question slot: prompts pick different documents.
inline std::string docs_schema(const std::string& name = "docs") {
  static const char* texts[] = {"The cat sat on the mat and looked at the garden.",
                                "A little dog ran to the park with a red ball.",
                                "The bird sang a song in the tall green tree.",
                                "Tom and Lily baked a cake for their mother.",
                                "The boat sailed across the lake in the morning.",
                                "A small girl found a shiny stone near the river.",
                                "The old man told a story about the big storm.",
                                "The sun was warm and the children played outside."};
  std::string xml = "<schema name=\"" + name + "\"><system>You answer questions.</system>";
  for (int i = 0; i < 8; ++i) {
    xml += "<module name=\"d" + std::to_string(i) + "\">" + texts[i] + "</module>";
  }
  return xml + "</schema>";
}

inline std::string docs_prompt(int i) {
  static const char* questions[] = {"What happened?", "Who was there?", "Where was it?",
                                    "Why did it happen?"};
  return "<prompt schema=\"docs\"><d" + std::to_string(i % 8) + "/><user>" + questions[i % 4] +
         "</user></prompt>";
}

// The tiny model with a context of 32768 positions: generations long enough (tens of thousands
// of tokens) that a test can be sure to disconnect before one ends, on any device.
// endless: no EOS id, so a generation runs to its max_new_tokens and only its client going away
// (or the server stopping) ends it sooner; the random model's greedy text may reach EOS after a
// few thousand tokens, and how soon depends on last-bit differences between batch layouts.
inline std::unique_ptr<Engine> long_context_engine(bool endless = false) {
  ModelConfig c = tiny_config();
  c.max_position_embeddings = 32768;
  if (endless) c.eos_token_ids.clear();
  EngineOptions options;
  options.chat_template = "llama-2";
  return std::make_unique<Engine>(
      LlamaModel::from_tensors(c, random_llama_weights(c, 1, 0.15), test_load_options()),
      load_sentencepiece_tokenizer(tiny_tokenizer_path()), options);
}

struct TestServer {
  explicit TestServer(server::ServerOptions options = {},
                      std::unique_ptr<Engine> engine = tiny_engine()) {
    options.port = 0;
    srv = std::make_unique<server::Server>(std::move(engine), options);
    port = srv->start();
  }
  ~TestServer() { srv->stop(); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(120));
    return c;
  }
  std::unique_ptr<server::Server> srv;
  int port = 0;
};

// The data lines of a server-sent event stream, each parsed (except "[DONE]", kept as a string).
inline std::vector<nlohmann::json> sse_events(const std::string& body) {
  std::vector<nlohmann::json> out;
  std::size_t at = 0;
  while (at < body.size()) {
    std::size_t end = body.find('\n', at);
    if (end == std::string::npos) end = body.size();
    const std::string line = body.substr(at, end - at);
    at = end + 1;
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string data = line.substr(6);
    out.push_back(data == "[DONE]" ? nlohmann::json("[DONE]") : nlohmann::json::parse(data));
  }
  return out;
}

// POSTs `body` and collects the response; `on_chunk` may stop reading (return false) to drop the
// connection, as a client that goes away does.
struct Posted {
  int status = 0;
  std::string body;
  httplib::Error error = httplib::Error::Success;
};
inline Posted post(const TestServer& s, const std::string& path, const std::string& body,
                   const std::function<bool(const std::string&)>& on_chunk = {},
                   const httplib::Headers& headers = {},
                   const std::string& content_type = "application/json") {
  httplib::Client c = s.client();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body;
  req.set_header("Content-Type", content_type);
  Posted out;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.body.append(data, n);
    return on_chunk ? on_chunk(std::string(data, n)) : true;
  };
  auto res = c.send(req);
  out.error = res.error();
  if (res) out.status = res->status;
  return out;
}

inline nlohmann::json post_json(const TestServer& s, const std::string& path,
                                const nlohmann::json& body, int expect_status = 200) {
  Posted r = post(s, path, body.dump());
  INFO(path << " " << body.dump() << " -> " << r.status << " " << r.body);
  REQUIRE(r.status == expect_status);
  return nlohmann::json::parse(r.body);
}

inline nlohmann::json get_json(const TestServer& s, const std::string& path,
                               int expect_status = 200) {
  auto res = s.client().Get(path);
  REQUIRE(res);
  INFO(path << " -> " << res->status << " " << res->body);
  REQUIRE(res->status == expect_status);
  return nlohmann::json::parse(res->body);
}

// Posts a schema and waits for its compile stream to end; returns the events.
inline std::vector<nlohmann::json> post_schema(const TestServer& s, const std::string& xml) {
  Posted r = post(s, "/v1/schemas", xml, {}, {}, "application/xml");
  INFO(r.body);
  REQUIRE(r.status == 200);
  return sse_events(r.body);
}

// A value of a metrics line ("name{labels} value"), or -1 when absent.
// A raw TCP connection to the server (a receive timeout of 20 s), for clients httplib cannot
// play: half-sent requests, clients that hang up at a chosen byte. The caller closes it.
inline int connect_loopback(const TestServer& s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(s.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

inline double metric(const TestServer& s, const std::string& series) {
  auto res = s.client().Get("/metrics");
  REQUIRE(res);
  std::size_t at = res->body.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(res->body.substr(at + series.size() + 2));
}

}  // namespace promptcache::test
