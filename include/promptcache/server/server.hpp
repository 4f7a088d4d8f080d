// promptcache/server/server.hpp — `promptcache serve`: the engine behind an HTTP API.
//
//   auto server = promptcache::server::Server(promptcache::Engine::open(dir), {});
//   server.add_schema_file("schemas/docqa.xml");
//   server.listen();  // blocks; or start() to serve from a background thread
//
// Endpoints (docs/server.md): POST/GET/DELETE /v1/schemas, POST /v1/prompt (PML prompts, SSE
// with "stream": true), OpenAI-compatible /v1/chat/completions and /v1/completions, GET /health,
// GET /metrics (Prometheus), GET / (the playground page). One scheduler thread owns the Engine;
// prompt requests waiting together run as one batch (Engine::generate_batch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "promptcache/engine.hpp"

namespace promptcache::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (port() tells which)
  int max_batch = 16;
  int http_threads = 64;  // connections served at once (each streaming client holds one)
  std::string api_key;    // when set, every endpoint but /health wants "Authorization: Bearer KEY"
  std::string cache_dir;  // when set, compiled states are kept there (cache_file_name)
  std::string model_name = "promptcache";  // the "model" of OpenAI responses

  // Files and sizes (docs/server.md, "Security"). Posted schemas read no src files unless
  // schema_root is set: then only files inside it (its real path, symbolic links followed).
  std::string schema_root;
  bool allow_src_outside = false;  // add_schema_file: src may leave the schema file's folder
  std::size_t max_body_bytes = std::size_t{4} << 20;  // larger bodies: 413
  int max_json_depth = 64;                            // deeper JSON bodies: 400
  // Budgets (0: none); over one a request gets 429 naming it.
  std::size_t max_queue = 256;                      // requests waiting for the batch
  std::size_t max_compiles = 2;                     // compiles waiting or running
  std::size_t max_schemas = 64;                     // schemas registered
  int64_t max_schema_positions = int64_t{1} << 20;  // their reserved positions, summed

  // Browsers and names (http_guard.hpp)
  // api_key (above) is read from "Authorization: Bearer KEY" or "X-API-Key: KEY" only and
  // compared in constant time; /health and the static playground page at / need none.
  // Requests with an Origin header are refused (403) unless it is the server's own origin or
  // listed here ("scheme://host[:port]"; "*": any origin; "null": pages without an origin);
  // allowed origins get CORS headers. Entries may be comma lists.
  std::vector<std::string> allowed_origins;
  // Host header names accepted besides the bound address, localhost, 127.0.0.1 and [::1] (and any
  // IP literal when bound to 0.0.0.0 or ::): "name" or "name:port"; "*": any. Others get 403.
  std::vector<std::string> allowed_hosts;
};

class Server {
 public:
  Server(std::unique_ptr<Engine> engine, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Compiles a schema file before serving (its src attributes name files inside its folder,
  // anywhere with allow_src_outside); progress as Engine::add_schema reports it. Throws
  // promptcache::Error.
  void add_schema_file(const std::string& path, const Engine::ProgressCallback& progress = {});

  // Binds host:port (Error(kIo) when it cannot) and returns the port.
  int bind();
  // Serves until stop(); binds first when bind() was not called.
  void listen();
  // bind() and listen() on a background thread; returns the port.
  int start();
  // Stops accepting, refuses queued requests, ends running generations at their next token.
  void stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace promptcache::server
