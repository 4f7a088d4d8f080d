// promptcache run: answer a PML prompt against a compiled schema, with or without the cache.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "engine_setup.hpp"
#include "recompute_flags.hpp"
#include "tier_flags.hpp"

namespace promptcache::cli {

nlohmann::json response_json(const Response& r, bool cached) {
  return {{"text", r.text},
          {"token_ids", r.tokens},
          {"cached", cached},
          {"stop_reason", to_string(r.stop_reason)},
          {"ttft_ms", r.timings.ttft_ms},
          {"assembly_ms", r.timings.assembly_ms},
          {"prefill_ms", r.timings.fresh_prefill_ms},
          {"decode_tokens_per_s", r.timings.decode_tokens_per_s()},
          {"cached_tokens", r.cached_tokens},
          {"reused_tokens", r.reused_tokens},
          {"in_place_tokens", r.in_place_tokens},
          {"fresh_tokens", r.fresh_tokens},
          {"recomputed_tokens", r.recomputed_tokens},
          {"exact_tokens", r.exact_tokens},
          {"kv_bytes", r.kv_bytes}};
}

Command register_run(CLI::App& root) {
  struct Options {
    bool allow_src_outside = false;
    ModelOptions model;
    SamplingOptions sampling;
    EngineFlags engine;
    RecomputeFlags recompute;
    std::string schema, cache_file;
    std::vector<std::string> prompts;
    bool no_cache = false, stats = false, json = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "run",
      "Answer a PML prompt: stored module states are assembled, only fresh tokens are run.\n"
      "Example: promptcache run --model DIR --schema schemas/trip.xml --prompt "
      "schemas/trip.prompt.xml --stats\n"
      "         add --cache trip.states to keep compiled states between runs, --no-cache to "
      "compare;\n"
      "         several --prompt files are answered together as one batch");
  add_model_options(*app, o->model);
  add_sampling_options(*app, o->sampling);
  add_engine_flags(*app, o->engine);
  add_recompute_flags(*app, o->recompute);
  app->add_option("--schema,-s", o->schema, "schema XML file")
      ->required()
      ->check(CLI::ExistingFile);
  add_src_flag(*app, o->allow_src_outside);
  app->add_option("--prompt,-p", o->prompts,
                  "prompt XML file; repeat it (or list several) to answer them as one batch")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--cache", o->cache_file,
                  "states file: loaded when it matches, else compiled and saved there");
  app->add_flag("--no-cache", o->no_cache, "run the same tokens as one ordinary prefill");
  app->add_flag(
      "--stats", o->stats,
      "print TTFT, assembly/prefill split, tokens/s, how the schema's states came to be "
      "and the span tiers' stats (JSON; with --json in each object: schema_source, tiers)");
  app->add_flag("--json", o->json,
                "print one JSON object (a line per prompt for a batch) instead of streaming");
  return {app, [o]() {
            auto engine = open_engine(o->model, o->engine);
            std::vector<pml::Prompt> prompts;
            for (const auto& file : o->prompts) {
              prompts.push_back(pml::parse_prompt_file(file));
              print_warnings(prompts.back().warnings);
            }
            const auto schema = read_schema_file(o->schema, o->allow_src_outside);
            print_warnings(schema.warnings);
            engine->add_schema(schema, progress_bar(),
                               states_file(*engine, schema, o->cache_file, o->engine));
            const auto& first = prompts.front();
            if (o->stats) std::cerr << "[" << engine->compile_report(first.schema).source << "]\n";
            SamplingParams params = o->sampling.params;
            params.stop_strings = o->sampling.stop;
            const bool cached = !o->no_cache;
            RequestOptions request{cached};
            request.recompute = given_recompute(o->recompute);
            const RecomputeOptions recompute = recompute_options(o->recompute);
            request.recompute_criterion = recompute.criterion;
            request.recompute_select_layer = recompute.select_layer;
            request.recompute_first_k = recompute.first_k;
            if (prompts.size() > 1) {
              // One batch: the answers come when every prompt is done, each under its file name.
              const auto responses = engine->generate_batch(prompts, params, {}, request);
              for (std::size_t i = 0; i < responses.size(); ++i) {
                if (o->json) {
                  auto j = response_json(responses[i], cached);
                  j["prompt"] = o->prompts[i];
                  if (o->stats) add_tier_stats(j, *engine, first.schema);
                  std::cout << j.dump() << "\n";
                } else {
                  std::cout << "--- " << o->prompts[i] << "\n"
                            << responses[i].text << "\n"
                            << std::flush;  // before its stats line on stderr
                  if (o->stats) print_stats(responses[i], cached);
                }
              }
              if (o->stats && !o->json) print_tier_stats(*engine);
              return 0;
            }
            TokenCallback stream;
            if (!o->json) {
              stream = [](TokenId, const std::string& s) {
                std::cout << s << std::flush;
                return true;
              };
            }
            const auto r = engine->generate(first, params, stream, request);
            if (o->json) {
              auto j = response_json(r, cached);
              if (o->stats) add_tier_stats(j, *engine, first.schema);
              std::cout << j.dump() << "\n";
            } else {
              std::cout << "\n";
              if (o->stats) {
                print_stats(r, cached);
                print_tier_stats(*engine);
              }
            }
            return 0;
          }};
}

}  // namespace promptcache::cli
