// --recompute and --recompute-criterion, shared by run, qa and fidelity (docs/fidelity.md).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "cli_common.hpp"
#include "promptcache/recompute.hpp"

namespace promptcache::cli {

struct RecomputeFlags {
  double fraction = 0;
  std::string criterion = "impact";
  int64_t select_layer = 1;
  int64_t first_k = 8;
  CLI::Option* fraction_option = nullptr;  // --recompute, to tell whether it was given
};

inline void add_recompute_flags(CLI::App& app, RecomputeFlags& flags) {
  flags.fraction_option =
      app.add_option("--recompute", flags.fraction,
                     "share r in [0, 1] of the cached tokens recomputed in the prompt's full "
                     "context (0: plain Prompt Cache, 1: the no-cache result; default: the "
                     "schema's recompute attribute, else 0; docs/fidelity.md)")
          ->check(number_in(0, 1));
  app.add_option("--recompute-criterion", flags.criterion,
                 "which cached tokens --recompute picks: impact (their K/V deviation from a "
                 "short full-context pass times the attention the fresh text pays them), deviation "
                 "(CacheBlend's: the deviation alone), gradual (CacheBlend's gradual filtering: "
                 "the deviation re-measured on every layer, the set shrinking), firstk (EPIC: the "
                 "first --recompute-first-k tokens of every module after a gap), firstk+impact, "
                 "firstk+deviation (those first, then the rest of the share by impact/deviation), "
                 "boundary (the tokens after each gap), recent (the tokens nearest the fresh "
                 "text), attention (the tokens the fresh text attends to most), impact-exact "
                 "(impact, its probe starting from the pass) or impact-lookahead (impact, its "
                 "probe decoding 8 greedy tokens too)")
      ->check(CLI::IsMember({"deviation", "boundary", "recent", "attention", "impact", "firstk",
                             "firstk+deviation", "firstk+impact", "gradual", "impact-exact",
                             "impact-lookahead"}))
      ->capture_default_str();
  app.add_option(
         "--recompute-layer", flags.select_layer,
         "impact, deviation: the layer whose K/V deviation ranks the tokens; the layers before it, "
         "then its K/V, are recomputed for every token (about that many of the model's layers "
         "over the prompt)")
      ->check(whole_number(0, 1024))
      ->capture_default_str();
  app.add_option("--recompute-first-k", flags.first_k,
                 "firstk criteria: the tokens recomputed at the start of every module after a gap "
                 "or after other modules (1-32; at most the --recompute share in all)")
      ->check(whole_number(1, kMaxRecomputeFirstK))
      ->capture_default_str();
}

// --recompute when given; unset lets the schema's recompute attribute apply.
inline std::optional<double> given_recompute(const RecomputeFlags& flags) {
  if (flags.fraction_option != nullptr && flags.fraction_option->count() > 0) {
    return flags.fraction;
  }
  return std::nullopt;
}

// The share a prompt of a schema with `schema_default` (its recompute attribute) runs with.
inline RecomputeOptions recompute_options(const RecomputeFlags& flags,
                                          std::optional<double> schema_default = std::nullopt) {
  return RecomputeOptions{given_recompute(flags).value_or(schema_default.value_or(0)),
                          parse_recompute_criterion(flags.criterion), flags.select_layer,
                          flags.first_k};
}

}  // namespace promptcache::cli
