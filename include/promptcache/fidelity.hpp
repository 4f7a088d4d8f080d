// promptcache/fidelity.hpp — how far a cached answer drifts from the no-cache one
// (docs/fidelity.md).
//
// For one prompt, measure_fidelity runs the no-cache prefill (the baseline sequence at positions
// 0..n-1) and the cached one (assembled states, with FidelityOptions::recompute), and compares:
// the first-token distributions (KL divergence, top-1 agreement), the greedy continuations of
// `tokens` tokens (how many agree before the first divergence, whether all do), and the
// log-likelihood of the no-cache greedy continuation under the cached run (teacher-forced).
// Neither run touches the engine's request buffer or the stored states.
#pragma once

#include <cstdint>
#include <vector>

#include "promptcache/engine.hpp"

namespace promptcache {

struct FidelityOptions {
  int64_t tokens = 32;  // greedy continuation length compared (a stream ends after EOS)
  RecomputeOptions recompute;
  bool in_place = true;  // AssembleOptions::in_place for the cached run
};

struct PromptFidelity {
  double first_token_kl = 0;  // KL(no-cache || cached) of the first-token distributions, nats
  bool first_token_agrees = false;
  int64_t compared_tokens = 0;  // tokens of the no-cache greedy continuation (<= tokens)
  int64_t agreed_tokens = 0;    // greedy tokens equal before the first divergence
  bool exact = false;           // the two greedy continuations are identical
  // Sum of log p_cached(t_i | prompt, t_<i) over the no-cache greedy continuation t, nats; and
  // the same under the no-cache run, for reference (their difference is the drift's cost).
  double continuation_logprob = 0;
  double baseline_logprob = 0;
  double cached_ttft_ms = 0;    // assembly + (recompute +) fresh prefill
  double baseline_ttft_ms = 0;  // the no-cache prefill
  // How close a call the no-cache run made where the two diverge: its log-probability of its
  // own greedy token minus that of its runner-up (nats) at the first differing step; -1 when
  // the continuations agree. A small margin is a near-tie that any drift may flip.
  double divergence_margin = -1;
  double first_token_margin = 0;  // the same margin at the first generated token
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t recomputed_tokens = 0;
  int64_t exact_tokens = 0;  // cached tokens in the exact leading run (Response::exact_tokens)
  std::vector<TokenId> baseline_continuation, cached_continuation;
};

struct FidelitySummary {
  int64_t prompts = 0;
  double mean_first_token_kl = 0;
  double first_token_agreement = 0;  // share of prompts whose first tokens agree
  double mean_agreed_tokens = 0;
  double exact_agreement = 0;         // share of prompts whose whole greedy continuations agree
  double mean_logprob_per_token = 0;  // continuation_logprob / compared_tokens, mean
  double mean_baseline_logprob_per_token = 0;  // baseline_logprob / compared_tokens, mean
  double cached_ttft_ms = 0;                   // means
  double baseline_ttft_ms = 0;
  double recomputed_share = 0;  // recomputed / cached tokens over all prompts
  // Over the prompts whose continuations diverge: the median no-cache margin at the divergence
  // (nats; 0 when none diverge) and the share of them under 0.5 nats (near-ties).
  double median_divergence_margin = 0;
  double near_tie_divergences = 0;
};

PromptFidelity measure_fidelity(const Engine& engine, const pml::Prompt& prompt,
                                const FidelityOptions& options = {});
FidelitySummary summarize_fidelity(const std::vector<PromptFidelity>& results);

// KL(p || q) of the softmax distributions of two logit vectors ([vocab] each), in nats.
double logits_kl(const torch::Tensor& p_logits, const torch::Tensor& q_logits);

}  // namespace promptcache
