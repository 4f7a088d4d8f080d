// promptcache serve: the engine behind an HTTP API (docs/server.md).
#include <fmt/format.h>

#include <arpa/inet.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>

#include "engine_setup.hpp"
#include "tier_flags.hpp"  // read_secret_file
// The header needs no HTTP library: a build without cpp-httplib still parses the flags.
#include "promptcache/server/server.hpp"
#ifdef PROMPTCACHE_WITH_SERVER
#include "../src/server/http_guard.hpp"  // to check --allowed-* before the model loads
#endif

namespace promptcache::cli {

#ifdef PROMPTCACHE_WITH_SERVER
namespace {

// 127.0.0.0/8, ::1 or localhost: only this machine can connect.
bool loopback(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost") return true;
  unsigned char v4[4], v6[16];
  if (inet_pton(AF_INET, h.c_str(), v4) == 1) return v4[0] == 127;
  if (inet_pton(AF_INET6, h.c_str(), v6) == 1) {
    static const unsigned char one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return std::memcmp(v6, one, 16) == 0;
  }
  return false;
}

}  // namespace
#endif

Command register_serve(CLI::App& root) {
  struct Options {
    ModelOptions model;
    EngineFlags engine;
    std::vector<std::string> schemas;
    std::string host = "127.0.0.1", api_key;
    int port = 8080, max_batch = 16, http_threads = 64;
    server::ServerOptions limits;  // the files, sizes and budgets block below
    std::vector<std::string> allowed_origins, allowed_hosts;  // browsers and names
    std::string api_key_file;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "serve",
      "Serve the model over HTTP: schemas, PML prompts, OpenAI-compatible completions, metrics "
      "and a playground page at /.\n"
      "Example: promptcache serve --model DIR --schema schemas/trip.xml --port 8080\n"
      "         then open http://127.0.0.1:8080/ or see docs/server.md for curl and OpenAI "
      "clients");
  add_model_options(*app, o->model, /*model_required=*/true);
  add_engine_flags(*app, o->engine);
  app->add_option("--schema,-s", o->schemas,
                  "schema XML file to compile before serving (repeatable); its module src files "
                  "are read inside its folder")
      ->check(CLI::ExistingFile);
  // Files, sizes and budgets (docs/server.md, "Security").
  server::ServerOptions& l = o->limits;
  app->add_flag("--allow-src-outside", l.allow_src_outside,
                "let the --schema files' module src attributes name files outside their folder");
  app->add_option("--schema-root", l.schema_root,
                  "schemas posted to /v1/schemas may read module src files inside DIR (real "
                  "paths, symbolic links followed); without it every src in a posted schema is "
                  "refused")
      ->check(CLI::ExistingDirectory);
  app->add_option("--max-body-bytes", l.max_body_bytes,
                  "largest request body; a larger one gets 413")
      ->capture_default_str()
      ->check(whole_number(1, std::size_t{1} << 30));
  app->add_option("--max-json-depth", l.max_json_depth,
                  "deepest nesting of a JSON body; a deeper one gets 400")
      ->capture_default_str()
      ->check(whole_number(2, 1000));
  app->add_option("--max-queue", l.max_queue,
                  "most requests waiting for the batch; more get 429 (0: no limit)")
      ->capture_default_str();
  app->add_option("--max-compiles", l.max_compiles,
                  "most schema compiles waiting or running; more get 429 (0: no limit)")
      ->capture_default_str();
  app->add_option("--max-schemas", l.max_schemas,
                  "most schemas registered at once; more get 429 (0: no limit)")
      ->capture_default_str();
  app->add_option("--max-schema-positions", l.max_schema_positions,
                  "most token positions the registered schemas reserve together; more get 429 "
                  "(0: no limit)")
      ->capture_default_str()
      ->check(whole_number(0, std::numeric_limits<int64_t>::max()));
  app->add_option("--host", o->host, "address to listen on")->capture_default_str();
  app->add_option("--port,-p", o->port, "port to listen on (0: any free port)")
      ->capture_default_str()
      ->check(whole_number(0, 65535));
  app->add_option("--max-batch", o->max_batch,
                  "most requests (prompt and plain) decoding together in one batch")
      ->capture_default_str()
      ->check(whole_number(1, 1024));
  app->add_option("--http-threads", o->http_threads,
                  "connections served at once (each streaming client holds one)")
      ->capture_default_str()
      ->check(whole_number(1, 4096));
  app->add_option("--api-key", o->api_key,
                  "require 'Authorization: Bearer KEY' or 'X-API-Key: KEY' on every endpoint "
                  "but /health and the page at / (default: $PROMPTCACHE_API_KEY; shows in `ps`: "
                  "prefer --api-key-file)")
      ->envname("PROMPTCACHE_API_KEY");
  // Browsers and names, key hygiene (docs/server.md "Browsers, hosts and keys").
  app->add_option("--api-key-file", o->api_key_file,
                  "read the key from the first line of FILE (trailing whitespace dropped), so it "
                  "does not show in `ps`; not with --api-key or $PROMPTCACHE_API_KEY");
  app->add_option("--allowed-origins", o->allowed_origins,
                  "comma list of origins (scheme://host[:port]) whose web pages may call the "
                  "server, with CORS answers; '*': any; 'null': pages without an origin. Requests "
                  "from other origins get 403 (the server's own pages are always allowed)")
      ->delimiter(',');
  app->add_option("--allowed-hosts", o->allowed_hosts,
                  "comma list of Host names (name or name:port) accepted besides the bound "
                  "address, localhost, 127.0.0.1 and [::1]; '*': any. Others get 403 (a guard "
                  "against DNS rebinding)")
      ->delimiter(',');
  return {app, [o]() -> int {
#ifdef PROMPTCACHE_WITH_SERVER
            std::cerr << apply_threads(o->model) << "\n";
            server::ServerOptions options = o->limits;
            options.host = o->host;
            options.port = o->port;
            options.max_batch = o->max_batch;
            options.http_threads = o->http_threads;
            options.api_key = o->api_key;
            if (!o->api_key_file.empty()) {
              if (!o->api_key.empty()) {
                throw UsageError(
                    "--api-key-file and --api-key (or $PROMPTCACHE_API_KEY) both give the key: "
                    "use one");
              }
              options.api_key = read_secret_file(o->api_key_file, "--api-key-file");
            }
            options.allowed_origins = o->allowed_origins;
            options.allowed_hosts = o->allowed_hosts;
            try {  // the Server checks them too; here a typo costs no model load
              server::make_guard_options(options.host, options.allowed_origins,
                                         options.allowed_hosts, options.api_key);
            } catch (const Error& e) {
              throw UsageError(e.message());
            }
            options.cache_dir = o->engine.cache_dir;  // --cache-dir (add_engine_flags)
            options.model_name =
                std::filesystem::path(o->model.model_dir).lexically_normal().filename().string();
            if (options.model_name.empty()) options.model_name = "promptcache";
            server::Server srv(open_engine(o->model, o->engine), options);
            for (const auto& file : o->schemas) srv.add_schema_file(file, progress_bar());
            const int port = srv.bind();
            if (options.api_key.empty() && !loopback(o->host)) {
              std::cerr << "promptcache serve: WARNING: listening on " << o->host
                        << " without an API key: anyone who can reach this address can run "
                           "the model and post schemas. Give a key with --api-key-file FILE "
                           "(or $PROMPTCACHE_API_KEY), or listen on 127.0.0.1 behind a proxy "
                           "(docs/server.md)\n";
            }
            // Scripts wait for this line (and read the port from it with --port 0).
            std::cerr << fmt::format("promptcache serve: listening on http://{}:{}/\n", o->host,
                                     port)
                      << std::flush;
            srv.listen();
            return 0;
#else
            throw UsageError(
                "this build has no server: it was configured with -DPROMPTCACHE_BUILD_SERVER=OFF "
                "(scripts/demo.sh does, to build faster) or without cpp-httplib (Debian: "
                "libcpp-httplib-dev). scripts/build.sh builds everything, `serve` included");
#endif
          }};
}

}  // namespace promptcache::cli
