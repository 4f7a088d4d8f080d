// promptcache serve: the engine behind an HTTP API (docs/server.md).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "engine_setup.hpp"
#ifdef PROMPTCACHE_WITH_SERVER
#include "promptcache/server/server.hpp"
#endif

namespace promptcache::cli {

Command register_serve(CLI::App& root) {
  struct Options {
    ModelOptions model;
    EngineFlags engine;
    std::vector<std::string> schemas;
    std::string host = "127.0.0.1", api_key;
    int port = 8080, max_batch = 16, http_threads = 64;
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
                  "schema XML file to compile before serving (repeatable)")
      ->check(CLI::ExistingFile);
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
                  "require 'Authorization: Bearer KEY' on every endpoint but /health "
                  "(default: $PROMPTCACHE_API_KEY)")
      ->envname("PROMPTCACHE_API_KEY");
  return {app, [o]() -> int {
#ifdef PROMPTCACHE_WITH_SERVER
            std::cerr << apply_threads(o->model) << "\n";
            server::ServerOptions options;
            options.host = o->host;
            options.port = o->port;
            options.max_batch = o->max_batch;
            options.http_threads = o->http_threads;
            options.api_key = o->api_key;
            options.cache_dir = o->engine.cache_dir;  // --cache-dir (add_engine_flags)
            options.model_name =
                std::filesystem::path(o->model.model_dir).lexically_normal().filename().string();
            if (options.model_name.empty()) options.model_name = "promptcache";
            server::Server srv(open_engine(o->model, o->engine), options);
            for (const auto& file : o->schemas) srv.add_schema_file(file, progress_bar());
            const int port = srv.bind();
            // Scripts wait for this line (and read the port from it with --port 0).
            std::cerr << fmt::format("promptcache serve: listening on http://{}:{}/\n", o->host,
                                     port)
                      << std::flush;
            srv.listen();
            return 0;
#else
            throw UsageError(
                "this build has no server: cpp-httplib was not found when it was configured "
                "(Debian: libcpp-httplib-dev; scripts/install-deps.sh), so `serve` is missing");
#endif
          }};
}

}  // namespace promptcache::cli
