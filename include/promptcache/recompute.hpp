// promptcache/recompute.hpp — closing the gap between modular reuse and a full prefill
// (docs/fidelity.md).
//
// A module's stored states were computed without the modules a prompt puts before it (or with
// other ones), so they miss that attention. A recomputing request (RequestOptions::recompute = r)
// pays for a share r of the reused tokens, CacheBlend style:
//   1. the whole prompt moves to the no-cache baseline's positions 0..n-1: each stored key is
//      rotated from its reserved position to its place in the baseline (RoPE of the difference;
//      values do not depend on the position), so the gaps between selected modules close;
//   2. r x (cached tokens) slots are chosen by a criterion (RecomputeCriterion), never among the
//      prompt's exact leading run (AssembledPrompt::exact_tokens: its states are the no-cache
//      ones already, and a selection pass starts after it); a prefix prompt, all of whose cached
//      slots are in it, recomputes nothing;
//   3. those tokens and the fresh tokens run through the model together, each attending causally
//      by position to every earlier token: stored states for the slots not chosen, recomputed
//      ones for the chosen; every chosen slot's K/V in the request's buffer is overwritten.
//      After the impact or deviation criterion's pass (layers 0..select_layer - 1 over every
//      token, then select_layer's K/V only) they start at select_layer from the pass's hidden
//      states, and the pass's K/V of layers 0..select_layer replace every slot's (exact there).
// r = 1 recomputes every token and so equals the no-cache prefill (float rounding aside);
// r = 0 is plain Prompt Cache (nothing here runs). The store's states are never written: a
// slot read in place from the store is copied into the buffer before it changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "promptcache/cache/assembler.hpp"
#include "promptcache/model/kv_cache.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/pml/prompt.hpp"

namespace promptcache {

enum class RecomputeCriterion {
  // CacheBlend's: the slots whose K/V on RecomputeOptions::select_layer (default 1) deviate
  // most from a full-context pass over the whole prompt (layers 0..select_layer - 1 over every
  // token, then select_layer's K/V projections; the chosen tokens then skip those layers).
  kDeviation,
  // The slots right after a gap: the first tokens of every run of contiguous positions that
  // does not start the schema, taken round-robin (offset 0 of every run, then 1, ...). Free.
  kBoundary,
  // The cached tokens nearest the fresh text (the largest positions), which the first generated
  // token attends to most in small models. Free.
  kRecent,
  // The slots the fresh tokens attend to most: one probe forward of the fresh tokens over the
  // moved (still stale) states, summing the attention each slot receives on every layer but the
  // first (whose K/V are exact once moved); the block that starts the schema at position 0 comes
  // last (its states were computed in this context). Costs about one cached prefill.
  kAttention,
  // The default: kDeviation's score times the attention the fresh tokens pay each slot on the
  // layers the pass leaves stale (a probe forward as kAttention's): a slot's estimated effect on
  // the answer, not only how wrong its states are. The pass's cost plus about one cached prefill.
  kImpact,
  // EPIC's static choice: the first RecomputeOptions::first_k tokens of every run that does not
  // start the schema (every module after a gap or after other modules), round-robin as
  // kBoundary, at most the share's count (fewer when the runs are short or few). Free.
  kFirstK,
  // kFirstK's slots first, then the rest of the share by kDeviation's score / kImpact's.
  kFirstKDeviation,
  kFirstKImpact,
  // CacheBlend's gradual filtering: the deviation pass picks 1.5x the share's count; the chosen
  // tokens then run layer by layer, and before each later layer the set shrinks (linearly, to
  // half the count on the last layer: the count on average) to those whose K/V on that layer,
  // projected from their new hidden states, deviate most from the stored ones.
  kGradual,
  // kImpact with the probe run from the pass: the fresh tokens start at select_layer from the
  // pass's hidden states and read the pass's (exact) K/V there, the stored (stale) ones above,
  // instead of running every layer over the stale states. Cheaper than kImpact's probe, and its
  // attention is the one the recomputed model will pay on the layers the pass left stale.
  kImpactExact,
  // kImpact whose probe looks ahead: with the pass's (exact) K/V in the layers it ran and the
  // stored ones above, the fresh tokens run and then decode kImpactLookaheadTokens greedily;
  // a slot's weight is the attention all of them pay it on the layers the pass left stale (the
  // continuation reads the states as the fresh tokens do).
  kImpactLookahead,
};

// The greedy tokens kImpactLookahead's probe decodes.
constexpr int64_t kImpactLookaheadTokens = 8;

// "deviation" / "boundary" / "recent" / "attention" / "impact" / "firstk" / "firstk+deviation" /
// "firstk+impact" / "gradual" / "impact-exact" / "impact-lookahead"; Error(kInvalidArgument) naming
// the value otherwise.
RecomputeCriterion parse_recompute_criterion(const std::string& text);
std::string recompute_criterion_name(RecomputeCriterion criterion);

struct RecomputeOptions {
  double fraction = 0;  // r in [0, 1]: the share of the cached tokens recomputed
  RecomputeCriterion criterion = RecomputeCriterion::kImpact;
  // kImpact*, kDeviation: the layer whose K/V deviation ranks the cached tokens (clamped to the
  // model's last layer). The pass runs layers [0, select_layer) over every token, then
  // select_layer's K/V, and keeps the K/V of layers [0, select_layer] for all of them (they are
  // exact); the chosen tokens are recomputed from select_layer on.
  int64_t select_layer = 1;
  // kFirstK*: the tokens recomputed at the start of every module after the first (1..32).
  int64_t first_k = 8;
};

// The largest RecomputeOptions::first_k.
constexpr int64_t kMaxRecomputeFirstK = 32;

// Error(kInvalidArgument) unless 0 <= fraction <= 1 (`what` names the option).
void check_recompute_fraction(double fraction, const std::string& what);

// How many of `cached` tokens a fraction recomputes (rounded to nearest, at least one when
// fraction > 0 and there is a cached token).
int64_t recompute_count(double fraction, int64_t cached);

struct RecomputeReport {
  int64_t recomputed_tokens = 0;
  // Where the time went (wall ms; on an accelerator the forward's work may land in a later
  // phase, which synchronizes): moving the slots to the baseline positions, choosing them (the
  // deviation pass), the recompute forward, and putting the new states in their slots.
  double move_ms = 0;
  double select_ms = 0;
  double forward_ms = 0;
  double finish_ms = 0;
};

// Module budgets (ResolvedPrompt::recompute_budgets: recompute="..." on a <module> or on its
// reference in a prompt): each selected module with one recomputes its own count of its cached
// slots, chosen among them by the criterion; the share `fraction` applies to the cached slots of
// the other modules only (the shared pool). With the gradual criterion a budget's slots run on
// every layer and only the shared pool's set shrinks.
//
// Whether a prompt recomputes anything (a share above 0, or a module budget above 0), and an
// upper bound of the tokens it recomputes (the room recompute_prefill needs beyond the prompt).
bool recompute_requested(const RecomputeOptions& options, const pml::ResolvedPrompt& resolved);
int64_t recompute_capacity(const RecomputeOptions& options, const pml::ResolvedPrompt& resolved);

// Runs after the assembler filled `cache` with the prompt's cached slots [0,
// assembled.cached_tokens) and before any fresh token ran: moves the prompt to its baseline
// positions, recomputes the chosen slots with the fresh tokens and returns the logits after the
// last prompt token ([vocab] float32). The cache then holds the prompt's slots at its baseline
// positions, ready for decoding; its provenance tags are dropped (the slots no longer equal the
// stored blocks). It needs room for assembled.cached_tokens + recompute_count(...) +
// fresh tokens slots. When every cached slot is in the exact leading run and the fresh tokens
// follow it, only the fresh tokens run, as without recompute (the slots and tags stay).
torch::Tensor recompute_prefill(const LlamaModel& model, const pml::ResolvedPrompt& resolved,
                                const AssembledPrompt& assembled, KVCache& cache,
                                const RecomputeOptions& options, RecomputeReport* report = nullptr);

// The slots recompute_prefill would choose, in slot order (deterministic: ties go to the
// earlier slot), with `count` slots (at most) from the shared pool (all cached slots when the
// prompt has no module budget) and each module budget's own. `cache` as for recompute_prefill;
// it is moved to the baseline positions (and impact-exact / impact-lookahead write the pass's
// exact K/V into the layers it ran).
std::vector<int64_t> choose_recompute_slots(const LlamaModel& model,
                                            const pml::ResolvedPrompt& resolved,
                                            const AssembledPrompt& assembled, KVCache& cache,
                                            int64_t count, const RecomputeOptions& options);

}  // namespace promptcache
