// promptcache fidelity: how far the cached answers of prompts drift from the no-cache ones, and
// what --recompute buys back (docs/fidelity.md).
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "engine_setup.hpp"
#include "promptcache/fidelity.hpp"
#include "recompute_flags.hpp"

namespace promptcache::cli {

namespace {

nlohmann::json fidelity_json(const PromptFidelity& f) {
  return {{"first_token_kl", f.first_token_kl},
          {"first_token_agrees", f.first_token_agrees},
          {"compared_tokens", f.compared_tokens},
          {"agreed_tokens", f.agreed_tokens},
          {"exact", f.exact},
          {"continuation_logprob", f.continuation_logprob},
          {"baseline_logprob", f.baseline_logprob},
          {"cached_ttft_ms", f.cached_ttft_ms},
          {"baseline_ttft_ms", f.baseline_ttft_ms},
          {"prompt_tokens", f.prompt_tokens},
          {"cached_tokens", f.cached_tokens},
          {"recomputed_tokens", f.recomputed_tokens},
          {"exact_tokens", f.exact_tokens},
          {"first_token_margin", f.first_token_margin},
          {"divergence_margin", f.divergence_margin},
          {"baseline_continuation", f.baseline_continuation},
          {"cached_continuation", f.cached_continuation}};
}

nlohmann::json summary_json(const FidelitySummary& s, const FidelityOptions& o) {
  return {{"summary", true},
          {"prompts", s.prompts},
          {"recompute", o.recompute.fraction},
          {"criterion", recompute_criterion_name(o.recompute.criterion)},
          {"tokens", o.tokens},
          {"mean_first_token_kl", s.mean_first_token_kl},
          {"first_token_agreement", s.first_token_agreement},
          {"mean_agreed_tokens", s.mean_agreed_tokens},
          {"exact_agreement", s.exact_agreement},
          {"mean_logprob_per_token", s.mean_logprob_per_token},
          {"mean_baseline_logprob_per_token", s.mean_baseline_logprob_per_token},
          {"cached_ttft_ms", s.cached_ttft_ms},
          {"baseline_ttft_ms", s.baseline_ttft_ms},
          {"recomputed_share", s.recomputed_share},
          {"median_divergence_margin", s.median_divergence_margin},
          {"near_tie_divergences", s.near_tie_divergences}};
}

}  // namespace

Command register_fidelity(CLI::App& root) {
  struct Options {
    bool allow_src_outside = false;
    ModelOptions model;
    EngineFlags engine;
    RecomputeFlags recompute;
    std::string schema, cache_file;
    std::vector<std::string> prompts;
    int64_t tokens = 32;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "fidelity",
      "Compare cached against no-cache answers: first-token KL and agreement, greedy agreement\n"
      "over --tokens tokens, log-likelihood of the no-cache continuation under the cached run.\n"
      "Example: promptcache fidelity --model DIR --schema S.xml --prompt a.xml b.xml "
      "--recompute 0.1 --json");
  add_model_options(*app, o->model);
  add_engine_flags(*app, o->engine);
  add_recompute_flags(*app, o->recompute);
  app->add_option("--schema,-s", o->schema, "schema XML file")
      ->required()
      ->check(CLI::ExistingFile);
  add_src_flag(*app, o->allow_src_outside);
  app->add_option("--prompt,-p", o->prompts, "prompt XML files (of that schema)")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--cache", o->cache_file,
                  "states file: loaded when it matches, else compiled and saved there");
  app->add_option("--tokens,-n", o->tokens, "greedy tokens compared per prompt")
      ->check(whole_number(1, 4096))
      ->capture_default_str();
  app->add_flag("--json", o->json, "a JSON line per prompt, then a summary line");
  return {app, [o]() {
            auto engine = open_engine(o->model, o->engine);
            const auto schema = read_schema_file(o->schema, o->allow_src_outside);
            print_warnings(schema.warnings);
            engine->add_schema(schema, progress_bar(), o->cache_file);
            FidelityOptions options;
            options.tokens = o->tokens;
            options.recompute = recompute_options(o->recompute, schema.recompute);
            std::vector<PromptFidelity> results;
            for (const auto& file : o->prompts) {
              const auto prompt = pml::parse_prompt_file(file);
              print_warnings(prompt.warnings);
              results.push_back(measure_fidelity(*engine, prompt, options));
              const auto& f = results.back();
              if (o->json) {
                auto j = fidelity_json(f);
                j["prompt"] = file;
                std::cout << j.dump() << "\n" << std::flush;
              } else {
                std::cout << fmt::format(
                    "{}: first token {} (KL {:.4f}), {}/{} greedy tokens agree{}, "
                    "log-lik {:.2f} (no cache {:.2f}), TTFT {:.1f} vs {:.1f} ms, {} of {} cached "
                    "recomputed\n",
                    file, f.first_token_agrees ? "agrees" : "differs", f.first_token_kl,
                    f.agreed_tokens, f.compared_tokens, f.exact ? " (exact)" : "",
                    f.continuation_logprob, f.baseline_logprob, f.cached_ttft_ms,
                    f.baseline_ttft_ms, f.recomputed_tokens, f.cached_tokens);
              }
            }
            const auto s = summarize_fidelity(results);
            if (o->json) {
              std::cout << summary_json(s, options).dump() << "\n";
            } else {
              std::cout << fmt::format(
                  "{} prompts, recompute {} ({}): first-token agreement {:.1f}%, mean KL {:.4f}, "
                  "{}-token exact agreement {:.1f}% (mean {:.1f} agree), log-lik/token {:.3f} "
                  "(no cache {:.3f}), TTFT {:.1f} vs {:.1f} ms\n",
                  s.prompts, options.recompute.fraction,
                  recompute_criterion_name(options.recompute.criterion),
                  100 * s.first_token_agreement, s.mean_first_token_kl, o->tokens,
                  100 * s.exact_agreement, s.mean_agreed_tokens, s.mean_logprob_per_token,
                  s.mean_baseline_logprob_per_token, s.cached_ttft_ms, s.baseline_ttft_ms);
            }
            return 0;
          }};
}

}  // namespace promptcache::cli
