// --recompute and --recompute-criterion, shared by run, qa and fidelity (docs/fidelity.md).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "cli_common.hpp"
#include "promptcache/recompute.hpp"

namespace promptcache::cli {

struct RecomputeFlags {
  double fraction = 0;
  std::string criterion = "deviation";
};

inline void add_recompute_flags(CLI::App& app, RecomputeFlags& flags) {
  app.add_option("--recompute", flags.fraction,
                 "share r in [0, 1] of the cached tokens recomputed in the prompt's full context "
                 "(0: plain Prompt Cache, 1: the no-cache result; docs/fidelity.md)")
      ->check(number_in(0, 1))
      ->capture_default_str();
  app.add_option("--recompute-criterion", flags.criterion,
                 "which cached tokens --recompute picks: deviation (CacheBlend's, layer-1 K/V "
                 "against a two-layer full pass), boundary (the tokens after each gap) or recent "
                 "(the tokens nearest the fresh text)")
      ->check(CLI::IsMember({"deviation", "boundary", "recent"}))
      ->capture_default_str();
}

inline RecomputeOptions recompute_options(const RecomputeFlags& flags) {
  return RecomputeOptions{flags.fraction, parse_recompute_criterion(flags.criterion)};
}

}  // namespace promptcache::cli
