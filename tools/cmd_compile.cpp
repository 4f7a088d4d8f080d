// promptcache compile: compile a schema's modules once and keep their states in a file (or a
// cache folder), so later runs, `qa` sessions and servers load them instead of compiling.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "engine_setup.hpp"
#include "promptcache/cache/cache_file.hpp"
#include "tier_flags.hpp"

namespace promptcache::cli {

Command register_compile(CLI::App& root) {
  struct Options {
    bool allow_src_outside = false;
    std::string schema, out;
    ModelOptions model;
    EngineFlags engine;
    bool force = false, json = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "compile",
      "Compile a schema's modules and save their states (a full prefill of each module, once).\n"
      "Examples:\n"
      "  promptcache compile schemas/trip.xml --model DIR --out trip.states\n"
      "  promptcache compile schemas/trip.xml --model DIR --cache-dir ~/.cache/promptcache\n"
      "  promptcache compile schemas/trip.xml --model DIR --redis redis://127.0.0.1:6379\n"
      "A file that already matches the schema, model, dtypes and encoding is left as it is\n"
      "(--force compiles again); run, qa and serve take the same --cache-dir.");
  app->add_option("schema", o->schema, "schema XML file")->required()->check(CLI::ExistingFile);
  add_src_flag(*app, o->allow_src_outside);
  add_model_options(*app, o->model);
  add_engine_flags(*app, o->engine);
  app->add_option("--out,-o", o->out, "states file to write (or use --cache-dir)");
  app->add_flag("--force", o->force,
                "compile even when the file or Redis holds the states, and replace them");
  app->add_flag("--json", o->json, "print one JSON object with what was done");
  return {app, [o]() {
            if (o->out.empty() && o->engine.cache_dir.empty() && o->engine.redis.empty()) {
              throw UsageError(
                  "compile: say where the states go: --out FILE, --cache-dir DIR or --redis URL");
            }
            const auto schema = read_schema_file(o->schema, o->allow_src_outside);
            print_warnings(schema.warnings);
            auto engine = open_engine(o->model, o->engine);
            std::string file = states_file(*engine, schema, o->out, o->engine);
            // --force compiles past the file and Redis; the old file stays until the new one
            // replaces it (a failed compile leaves it).
            engine->add_schema(
                schema, o->json ? Engine::ProgressCallback() : progress_bar(), file,
                o->force ? Engine::StatesPolicy::kRecompile : Engine::StatesPolicy::kReuse);
            const CompileReport& r = engine->compile_report(schema.name);
            const bool loaded = r.source.rfind("loaded from", 0) == 0;
            if (file.empty()) file = engine->tier_stats().remote;  // --redis alone
            if (o->json) {
              nlohmann::json j = {{"schema", schema.name},
                                  {"file", file},
                                  {"up_to_date", loaded},
                                  {"source", r.source},
                                  {"tokens_stored", r.tokens_stored},
                                  {"bytes", r.bytes},
                                  {"ms", r.ms},
                                  {"tiers", tier_stats_json(engine->tier_stats())}};
              std::cout << j.dump() << "\n";
            } else if (loaded) {
              std::cout << fmt::format("{}: up to date ({} tokens, {:.1f} MB): {}\n", schema.name,
                                       r.tokens_stored, r.bytes / 1e6, file);
            } else {
              std::cout << fmt::format("{}: compiled {} tokens ({:.1f} MB) in {:.1f} s: {}\n",
                                       schema.name, r.tokens_stored, r.bytes / 1e6, r.ms / 1e3,
                                       file);
            }
            return 0;
          }};
}

}  // namespace promptcache::cli
