#include "promptcache/recompute.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"

namespace promptcache {
namespace {

// Where every token of the prompt goes in the no-cache baseline: the baseline lists the prompt's
// tokens in position order (selected spans, arguments in their slots, then the text), so a
// token's baseline position is the rank of its reserved position.
struct BaselineMap {
  std::vector<int64_t> cached_position;  // per cached slot: its baseline position
  std::vector<TokenId> cached_token;     // per cached slot: its token
  std::vector<int64_t> fresh_position;   // per fresh token: its baseline position
};

BaselineMap map_to_baseline(const pml::ResolvedPrompt& resolved, const AssembledPrompt& assembled,
                            const KVCache& cache) {
  const int64_t cached = assembled.cached_tokens;
  const auto fresh = static_cast<int64_t>(assembled.fresh_tokens.size());
  if (cache.length() != cached || cache.shape().batch != 1) {
    throw Error(ErrorKind::kInvalidArgument,
                "recompute: the KV cache must hold exactly the prompt's " + std::to_string(cached) +
                    " assembled slots of one batch row (it holds " +
                    std::to_string(cache.length()) + ")");
  }
  if (cached + fresh != static_cast<int64_t>(resolved.baseline.size())) {
    throw Error(ErrorKind::kInvalidArgument,
                "recompute: the assembled prompt has " + std::to_string(cached + fresh) +
                    " tokens but its baseline " + std::to_string(resolved.baseline.size()),
                resolved.where);
  }
  std::vector<int64_t> reserved(cache.positions().begin(), cache.positions().end());
  reserved.insert(reserved.end(), assembled.fresh_positions.begin(),
                  assembled.fresh_positions.end());
  std::vector<int64_t> order(reserved.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return reserved[a] < reserved[b]; });
  std::vector<int64_t> rank(reserved.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && reserved[order[i]] == reserved[order[i - 1]]) {
      throw Error(ErrorKind::kInvalidArgument,
                  "recompute: two tokens of the prompt share position " +
                      std::to_string(reserved[order[i]]),
                  resolved.where);
    }
    rank[order[i]] = static_cast<int64_t>(i);
  }
  BaselineMap map;
  map.cached_position.assign(rank.begin(), rank.begin() + cached);
  map.fresh_position.assign(rank.begin() + cached, rank.end());
  for (int64_t p : map.cached_position) map.cached_token.push_back(resolved.baseline[p]);
  for (int64_t i = 0; i < fresh; ++i) {
    if (resolved.baseline[map.fresh_position[i]] != assembled.fresh_tokens[i]) {
      throw Error(ErrorKind::kInvalidArgument,
                  "recompute: the prompt's fresh tokens are not where its baseline has them",
                  resolved.where);
    }
  }
  return map;
}

// Which slots each new token sees by position: [queries, slots + queries] bool, the slots at
// `slot_positions` (a hidden slot carries the largest int64) then the new tokens themselves.
torch::Tensor visible_by_position(const std::vector<int64_t>& slot_positions,
                                  const torch::Tensor& query) {
  auto keys = torch::cat({torch::tensor(slot_positions, torch::kInt64), query});
  return keys.unsqueeze(0) <= query.unsqueeze(1);
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Moves the cached slots to their baseline positions: keys are stored with RoPE at their
// reserved position, and RoPE(to) = RoPE(to - from) o RoPE(from), so rotating by the difference
// re-encodes them; values carry no position. Only the slots from the first to the last one whose
// position changes are touched (the modules before the first gap stay where they are, read in
// place from the store when they were): those are copied into the buffer first (a slot held in
// the store's block is materialized, never written there).
void move_to_baseline(const LlamaModel& model, KVCache& cache, const std::vector<int64_t>& to) {
  const auto n = static_cast<int64_t>(to.size());
  if (n == 0) return;
  int64_t lo = n, hi = -1;
  std::vector<int64_t> delta(to.size());
  for (int64_t s = 0; s < n; ++s) {
    delta[s] = to[s] - cache.positions()[s];
    if (delta[s] != 0) {
      lo = std::min(lo, s);
      hi = s;
    }
  }
  if (hi >= lo) {
    std::vector<int64_t> moved(delta.begin() + lo, delta.begin() + hi + 1);
    auto [cos, sin] = model.rope_tables(torch::tensor(moved, torch::kInt64));  // [m, d] f32
    auto keys = cache.all_slots(lo, hi + 1 - lo).select(1, 0);  // [layers, 1, kv_heads, m, d]
    auto k = keys.to(torch::kFloat32);
    keys.copy_(k * cos + rotate_half(k) * sin);
  }
  cache.set_row_positions(0, 0, to);
  cache.forget_sources();
}

// CacheBlend's selection pass over the whole baseline, in a cache of its own: a causal forward
// of layers [0, select_layer), then only select_layer's keys and values (its attention and MLP
// would feed nothing the choice needs). Per cached slot, the squared distance between its K/V on
// select_layer and the stored ones ranks it. The pass's K/V of layers [0, select_layer] are
// exact for every token, and its hidden states (entering select_layer) let the chosen tokens
// start there. The prompt's exact leading run (its first `exact` tokens, held by the first
// cached slots at their own positions) does not run: its stored K/V are the pass's already, and
// its hidden states are never read (its slots are never chosen; they stay zero).
struct DeviationPass {
  KVCache scratch;            // layers [0, kv_layers) of every baseline token, at positions 0..n-1
  torch::Tensor hidden;       // [1, n, hidden]: every token's hidden state entering layer `layers`
  int64_t layers = 0;         // the layers the forward ran
  int64_t kv_layers = 0;      // the layers whose K/V the scratch cache holds (select_layer + 1)
  std::vector<double> score;  // per cached slot
};

DeviationPass deviation_pass(const LlamaModel& model, const pml::ResolvedPrompt& resolved,
                             const BaselineMap& map, const KVCache& cache, int64_t select_layer,
                             int64_t exact) {
  const auto n = static_cast<int64_t>(resolved.baseline.size());
  const int64_t layer = std::clamp<int64_t>(select_layer, 0, model.config().num_hidden_layers - 1);
  DeviationPass pass;
  // Layer 0 reads the embeddings, so at select_layer 0 one whole layer runs (the chosen tokens
  // then start after it); otherwise the layers before select_layer, then its K/V alone.
  pass.layers = std::max<int64_t>(layer, 1);
  pass.kv_layers = layer + 1;
  pass.scratch = model.make_cache(n);
  // The exact run's K/V of the pass's layers, from the cache (slot s holds position s there).
  const int64_t skip = std::clamp<int64_t>(exact, 0, n - 1);
  if (skip > 0) {
    for (int64_t l = 0; l < pass.kv_layers; ++l) {
      pass.scratch.key_slots(l, 0, skip).copy_(cache.key_slots(l, 0, skip));
      pass.scratch.value_slots(l, 0, skip).copy_(cache.value_slots(l, 0, skip));
    }
    std::vector<int64_t> prefix(static_cast<std::size_t>(skip));
    std::iota(prefix.begin(), prefix.end(), int64_t{0});
    pass.scratch.fill_external(skip, prefix);
  }
  const int64_t rest = n - skip;
  std::vector<int64_t> ids(resolved.baseline.begin() + skip, resolved.baseline.end());
  auto tokens = torch::tensor(ids, torch::kInt64).unsqueeze(0);
  auto positions = torch::arange(skip, n, torch::kInt64).unsqueeze(0);
  ForwardOptions options;
  options.layers = pass.layers;
  auto hidden = model.forward(tokens, positions, pass.scratch, options);
  if (layer > 0) {
    auto [keys, values] = model.layer_key_values(layer, hidden, positions);
    pass.scratch.key_slots(layer, skip, rest).copy_(keys);
    pass.scratch.value_slots(layer, skip, rest).copy_(values);
  }
  if (skip > 0) {
    pass.hidden = torch::zeros({1, n, hidden.size(2)}, hidden.options());
    pass.hidden.narrow(1, skip, rest).copy_(hidden);
  } else {
    pass.hidden = hidden;
  }
  const auto cached = static_cast<int64_t>(map.cached_position.size());
  auto index = torch::tensor(map.cached_position, torch::kInt64).to(model.device());
  auto diff = [&](const torch::Tensor& full, const torch::Tensor& stored) {
    // [1, kv_heads, slots, d] -> per slot: the sum over heads and d of the squared difference.
    auto d = full.index_select(2, index).to(torch::kFloat32) - stored.to(torch::kFloat32);
    return d.pow(2).sum({0, 1, 3});
  };
  auto score = diff(pass.scratch.key_slots(layer, 0, n), cache.key_slots(layer, 0, cached)) +
               diff(pass.scratch.value_slots(layer, 0, n), cache.value_slots(layer, 0, cached));
  score = score.to(torch::kCPU, torch::kFloat64).contiguous();
  const double* p = score.data_ptr<double>();
  pass.score.assign(p, p + cached);
  return pass;
}

// The pass's K/V of its layers [from, pass.kv_layers) into slots [0, order.size()) of `cache`:
// slot i takes baseline token order[i]'s (they are the full-context ones).
void pass_states_into(const DeviationPass& pass, KVCache& cache, int64_t from,
                      const std::vector<int64_t>& order, const LlamaModel& model) {
  if (order.empty()) return;
  auto index = torch::tensor(order, torch::kInt64).to(model.device());
  const auto count = static_cast<int64_t>(order.size());
  const int64_t n = pass.scratch.length();
  for (int64_t l = from; l < pass.kv_layers; ++l) {
    cache.key_slots(l, 0, count).copy_(pass.scratch.key_slots(l, 0, n).index_select(2, index));
    cache.value_slots(l, 0, count).copy_(pass.scratch.value_slots(l, 0, n).index_select(2, index));
  }
}

// Runs of the assembled slots: a run starts at every stored block and wherever the reserved
// positions jump. Read before the move to the baseline, which replaces the reserved positions
// and drops the provenance tags.
struct SlotRuns {
  std::vector<int64_t> reserved;  // each slot's reserved position
  std::vector<int64_t> offset;    // each slot's offset in its run
  // Whether the slot is in the run that starts the schema at position 0: its states were
  // computed in exactly this context, so recomputing it changes nothing.
  std::vector<bool> schema_start;
};

SlotRuns slot_runs(const KVCache& cache) {
  SlotRuns runs;
  runs.reserved = cache.positions();
  const std::vector<int64_t>& reserved = runs.reserved;
  const auto n = static_cast<int64_t>(reserved.size());
  std::vector<bool> starts(reserved.size(), false);
  for (int64_t s = 0; s < n; ++s) starts[s] = s == 0 || reserved[s] != reserved[s - 1] + 1;
  for (const SlotSource& tag : cache.sources()) {
    if (tag.slot < n) starts[tag.slot] = true;
  }
  int64_t offset = 0;
  bool prefix = false;
  for (int64_t s = 0; s < n; ++s) {
    if (starts[s]) {
      offset = 0;
      prefix = s == 0 && reserved[0] == 0;
    }
    runs.offset.push_back(offset++);
    runs.schema_start.push_back(prefix);
  }
  return runs;
}

// The boundary criterion: a token's score is minus its offset in its run; the run that starts
// the schema comes last.
std::vector<double> boundary_scores(const SlotRuns& runs) {
  const auto n = static_cast<double>(runs.offset.size());
  std::vector<double> score;
  for (std::size_t s = 0; s < runs.offset.size(); ++s) {
    score.push_back(-static_cast<double>(runs.offset[s]) - (runs.schema_start[s] ? n : 0.0));
  }
  return score;
}

// The attention mass [layers, slots(, ...)] summed over layers [from, layers) for each of the
// first `cached` slots, `from` clamped to [lowest, layers - 1].
std::vector<double> mass_per_slot(const torch::Tensor& mass, int64_t from, int64_t lowest,
                                  int64_t cached) {
  const int64_t layers = mass.size(0);
  from = std::clamp<int64_t>(from, lowest, layers - 1);
  auto per_slot = mass.narrow(0, from, layers - from)
                      .narrow(1, 0, cached)
                      .sum(0)
                      .to(torch::kFloat64)
                      .contiguous();
  const double* p = per_slot.data_ptr<double>();
  return std::vector<double>(p, p + cached);
}

// The attention the fresh tokens pay each cached slot: they run once over the moved slots (at
// their baseline positions, each seeing the slots and fresh tokens before it), and a slot's mass
// is the attention it receives, summed over heads, fresh tokens and the layers from
// `first_layer` on. The fresh tokens' states are dropped again. Empty without fresh tokens.
std::vector<double> attention_mass(const LlamaModel& model, const BaselineMap& map,
                                   const AssembledPrompt& assembled, KVCache& cache,
                                   int64_t first_layer) {
  const auto cached = static_cast<int64_t>(map.cached_position.size());
  const auto fresh = static_cast<int64_t>(map.fresh_position.size());
  if (fresh == 0) return {};
  std::vector<int64_t> ids(assembled.fresh_tokens.begin(), assembled.fresh_tokens.end());
  auto query = torch::tensor(map.fresh_position, torch::kInt64);
  ForwardOptions probe;
  probe.attention_mask = visible_by_position(map.cached_position, query);
  torch::Tensor mass;
  probe.attention_mass = &mass;
  cache.reserve(cached + fresh);
  model.forward(torch::tensor(ids, torch::kInt64).unsqueeze(0), query.unsqueeze(0), cache, probe);
  cache.truncate(cached);
  return mass_per_slot(mass, first_layer, 0, cached);
}

// The attention the fresh tokens pay each cached slot on the layers the pass leaves stale
// ([pass.kv_layers, layers); the last layer's when the pass reached it), probed from the pass:
// the fresh tokens start at pass.layers from its hidden states, reading there the pass's K/V
// (written into the cached slots first: they are exact, and the recompute puts them there anyway)
// and the cache's states above. Empty without fresh tokens.
std::vector<double> probe_from_pass(const LlamaModel& model, const BaselineMap& map,
                                    const AssembledPrompt& assembled, KVCache& cache,
                                    const DeviationPass& pass) {
  const auto cached = static_cast<int64_t>(map.cached_position.size());
  const auto fresh = static_cast<int64_t>(map.fresh_position.size());
  if (fresh == 0) return {};
  pass_states_into(pass, cache, pass.layers, map.cached_position, model);
  std::vector<int64_t> ids(assembled.fresh_tokens.begin(), assembled.fresh_tokens.end());
  auto query = torch::tensor(map.fresh_position, torch::kInt64);
  ForwardOptions probe;
  probe.attention_mask = visible_by_position(map.cached_position, query);
  probe.first_layer = pass.layers;
  probe.hidden = pass.hidden.index_select(1, query.to(pass.hidden.device()));
  torch::Tensor mass;
  probe.attention_mass = &mass;
  cache.reserve(cached + fresh);
  model.forward(torch::tensor(ids, torch::kInt64).unsqueeze(0), query.unsqueeze(0), cache, probe);
  cache.truncate(cached);
  return mass_per_slot(mass, pass.kv_layers, pass.layers, cached);
}

// The attention the fresh tokens and `steps` greedy tokens after them pay each cached slot on
// the layers the pass left stale: the pass's K/V go into the cached slots' layers it ran (exact;
// the recompute puts them there anyway), the fresh tokens run over them and the stored states
// above, then decode greedily, their states dropped again. Empty without fresh tokens.
std::vector<double> probe_lookahead(const LlamaModel& model, const BaselineMap& map,
                                    const AssembledPrompt& assembled, KVCache& cache,
                                    const DeviationPass& pass, int64_t steps) {
  const auto cached = static_cast<int64_t>(map.cached_position.size());
  const auto fresh = static_cast<int64_t>(map.fresh_position.size());
  if (fresh == 0) return {};
  pass_states_into(pass, cache, 0, map.cached_position, model);
  std::vector<int64_t> ids(assembled.fresh_tokens.begin(), assembled.fresh_tokens.end());
  auto query = torch::tensor(map.fresh_position, torch::kInt64);
  ForwardOptions probe;
  probe.attention_mask = visible_by_position(map.cached_position, query);
  torch::Tensor mass;
  probe.attention_mass = &mass;
  cache.reserve(cached + fresh + steps);
  auto logits = model.forward(torch::tensor(ids, torch::kInt64).unsqueeze(0), query.unsqueeze(0),
                              cache, probe);
  torch::Tensor total = mass.narrow(1, 0, cached).clone();
  int64_t position = static_cast<int64_t>(map.cached_position.size() + map.fresh_position.size());
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t token = logits.reshape({-1}).argmax().item<int64_t>();
    ForwardOptions step;
    torch::Tensor step_mass;
    step.attention_mass = &step_mass;
    logits = model.forward(torch::tensor({token}, torch::kInt64).unsqueeze(0),
                           torch::tensor({position++}, torch::kInt64).unsqueeze(0), cache, step);
    total += step_mass.narrow(1, 0, cached);
  }
  cache.truncate(cached);
  return mass_per_slot(total, pass.kv_layers, 0, cached);
}

// The attention criterion: the mass on layers 1.. (layer 0's K/V depend on the token and
// position only, so they are exact after the move); the run that starts the schema comes last.
std::vector<double> attention_scores(const LlamaModel& model, const BaselineMap& map,
                                     const AssembledPrompt& assembled, KVCache& cache,
                                     const SlotRuns& runs) {
  std::vector<double> score = attention_mass(model, map, assembled, cache, 1);
  if (score.empty()) return boundary_scores(runs);  // nothing attends: the boundary order
  for (std::size_t s = 0; s < score.size(); ++s) {
    if (runs.schema_start[s]) score[s] = -1.0 / (1.0 + score[s]);  // below every mass >= 0
  }
  return score;
}

std::vector<int64_t> top_slots(const std::vector<double>& score, int64_t count) {
  std::vector<int64_t> order(score.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return score[a] > score[b]; });
  order.resize(static_cast<std::size_t>(std::min<int64_t>(count, score.size())));
  std::sort(order.begin(), order.end());
  return order;
}

// The firstk criterion (EPIC): the first `k` tokens of every run that does not start the schema.
std::vector<bool> first_k_eligible(const SlotRuns& runs, int64_t k) {
  std::vector<bool> eligible;
  for (std::size_t s = 0; s < runs.offset.size(); ++s) {
    eligible.push_back(!runs.schema_start[s] && runs.offset[s] < k);
  }
  return eligible;
}

// The group of a slot whose states are exact already (AssembledPrompt::exact_tokens): never
// chosen, whatever budget it falls under.
constexpr int kExactSlot = -2;

// Which recompute budget each cached slot falls under: a selected module's own
// (ResolvedPrompt::recompute_budgets, by its slots' reserved positions) or the request's share
// (the shared pool, group -1), and how many slots each recomputes. A budget's count (and the
// share's) is taken of all its slots, exact ones included, and capped at the others: the exact
// slots are never chosen (group kExactSlot).
struct SlotGroups {
  std::vector<int> group;      // per cached slot: index into `count`, -1 (the shared pool), or
                               // kExactSlot
  std::vector<int64_t> count;  // per module budget: the slots it recomputes
  int64_t shared = 0;          // the shared pool's count
  int64_t shared_slots = 0;    // the shared pool's slots that may be chosen (not exact)
  int64_t choosable = 0;       // the slots that may be chosen, every group

  int64_t total() const { return std::accumulate(count.begin(), count.end(), shared); }
};

// `shared` < 0: recompute_count(fraction, the shared pool's slots). `exact`: per slot, whether
// its states are exact already.
SlotGroups slot_groups(const pml::ResolvedPrompt& resolved, const std::vector<int64_t>& reserved,
                       const std::vector<bool>& exact, double fraction, int64_t shared = -1) {
  struct Range {
    int64_t begin, end;
    int group;
  };
  std::vector<Range> ranges;
  for (std::size_t g = 0; g < resolved.recompute_budgets.size(); ++g) {
    for (const auto& [b, e] : resolved.recompute_budgets[g].ranges) {
      ranges.push_back({static_cast<int64_t>(b), static_cast<int64_t>(e), static_cast<int>(g)});
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  SlotGroups groups;
  const std::size_t budgets = resolved.recompute_budgets.size();
  std::vector<int64_t> members(budgets, 0), stale_members(budgets, 0);
  int64_t pool = 0;
  for (std::size_t s = 0; s < reserved.size(); ++s) {
    const int64_t position = reserved[s];
    auto it = std::upper_bound(ranges.begin(), ranges.end(), position,
                               [](int64_t p, const Range& r) { return p < r.begin; });
    int g = -1;
    if (it != ranges.begin() && position < std::prev(it)->end) g = std::prev(it)->group;
    (g >= 0 ? members[static_cast<std::size_t>(g)] : pool) += 1;
    if (exact[s]) {
      groups.group.push_back(kExactSlot);
      continue;
    }
    groups.group.push_back(g);
    ++groups.choosable;
    (g >= 0 ? stale_members[static_cast<std::size_t>(g)] : groups.shared_slots) += 1;
  }
  for (std::size_t g = 0; g < budgets; ++g) {
    const auto count = static_cast<int64_t>(
        resolved.recompute_budgets[g].budget.count(static_cast<std::size_t>(members[g])));
    groups.count.push_back(std::min(count, stale_members[g]));
  }
  groups.shared =
      std::min(shared >= 0 ? shared : recompute_count(fraction, pool), groups.shared_slots);
  return groups;
}

// The best slots by `score` (higher first; ties to the earlier slot), each group's count of
// them, in slot order. With `first`, the slots it marks come before all others, ranked among
// themselves by `first_score`. A slot scored -inf (and not marked) is never taken.
std::vector<int64_t> pick(const std::vector<double>& score, const SlotGroups& groups,
                          const std::vector<bool>* first = nullptr,
                          const std::vector<double>* first_score = nullptr) {
  auto tier = [&](int64_t s) { return first != nullptr && (*first)[s]; };
  auto key = [&](int64_t s) { return tier(s) ? (*first_score)[s] : score[s]; };
  std::vector<int64_t> order(score.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (tier(a) != tier(b)) return tier(a);
    return key(a) > key(b);
  });
  std::vector<int64_t> left = groups.count;
  int64_t shared_left = groups.shared;
  std::vector<int64_t> chosen;
  for (int64_t s : order) {
    if (!tier(s) && score[s] == -std::numeric_limits<double>::infinity()) continue;
    const int g = groups.group[s];
    if (g == kExactSlot) continue;
    int64_t& l = g < 0 ? shared_left : left[static_cast<std::size_t>(g)];
    if (l > 0) {
      chosen.push_back(s);
      --l;
    }
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

// How many tokens the gradual criterion recomputes on each of `layers` layers: 1.5x `count` on
// the first, linearly down to 0.5x on the last (`count` on average), within [1, cached] (none
// when `count` is 0).
std::vector<int64_t> gradual_sizes(int64_t count, int64_t cached, int64_t layers) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < layers; ++i) {
    const double share = layers == 1 ? 1.0 : 1.5 - static_cast<double>(i) / (layers - 1);
    const auto size = static_cast<int64_t>(std::llround(share * static_cast<double>(count)));
    sizes.push_back(count <= 0 ? 0 : std::clamp<int64_t>(size, 1, cached));
  }
  return sizes;
}

// The impact criteria that probe from the pass (kImpactExact, kImpactLookahead): the deviation
// score of select_layer times the attention the probe pays each slot on the layers the pass left
// stale (probe_from_pass, probe_lookahead).
std::vector<int64_t> choose_by_impact_from_pass(
    const LlamaModel& model, const pml::ResolvedPrompt& resolved, const BaselineMap& map,
    const AssembledPrompt& assembled, KVCache& cache, const SlotGroups& groups,
    const RecomputeOptions& options, DeviationPass* pass) {
  DeviationPass local =
      deviation_pass(model, resolved, map, cache, options.select_layer, assembled.exact_tokens);
  const auto mass =
      options.criterion == RecomputeCriterion::kImpactLookahead
          ? probe_lookahead(model, map, assembled, cache, local, kImpactLookaheadTokens)
          : probe_from_pass(model, map, assembled, cache, local);
  std::vector<double> score = local.score;
  for (std::size_t s = 0; s < mass.size(); ++s) score[s] *= mass[s];
  std::vector<int64_t> slots = pick(score, groups);
  if (pass != nullptr) *pass = std::move(local);
  return slots;
}

// The chosen slots, in slot order, with `cache` already at the baseline positions (`runs` read
// before the move); `pass` receives the deviation pass when one ran. For the gradual criterion,
// the slots its first layer recomputes. A module budget's slots are chosen among that module's
// slots, by the same criterion.
std::vector<int64_t> choose(const LlamaModel& model, const pml::ResolvedPrompt& resolved,
                            const BaselineMap& map, const AssembledPrompt& assembled,
                            KVCache& cache, const SlotRuns& runs, const SlotGroups& groups,
                            const RecomputeOptions& options, DeviationPass* pass) {
  const auto cached = static_cast<int64_t>(map.cached_position.size());
  const int64_t count = groups.total();
  if (count <= 0) return {};
  if (count >= groups.choosable) {
    std::vector<int64_t> all;
    for (int64_t s = 0; s < cached; ++s) {
      if (groups.group[s] != kExactSlot) all.push_back(s);
    }
    return all;
  }
  switch (options.criterion) {
    case RecomputeCriterion::kBoundary:
      return pick(boundary_scores(runs), groups);
    case RecomputeCriterion::kRecent:
      return pick(std::vector<double>(runs.reserved.begin(), runs.reserved.end()), groups);
    case RecomputeCriterion::kAttention:
      return pick(attention_scores(model, map, assembled, cache, runs), groups);
    case RecomputeCriterion::kFirstK: {
      // The shared pool takes only first-k slots; a module's budget its module's first slots.
      std::vector<double> score = boundary_scores(runs);
      const std::vector<bool> eligible = first_k_eligible(runs, options.first_k);
      for (std::size_t s = 0; s < score.size(); ++s) {
        if (groups.group[s] < 0 && !eligible[s]) {
          score[s] = -std::numeric_limits<double>::infinity();
        }
      }
      return pick(score, groups);
    }
    case RecomputeCriterion::kDeviation:
    case RecomputeCriterion::kImpact:
    case RecomputeCriterion::kFirstKDeviation:
    case RecomputeCriterion::kFirstKImpact:
    case RecomputeCriterion::kGradual:
      break;
    case RecomputeCriterion::kImpactExact:
    case RecomputeCriterion::kImpactLookahead:
      return choose_by_impact_from_pass(model, resolved, map, assembled, cache, groups, options,
                                        pass);
  }
  DeviationPass local =
      deviation_pass(model, resolved, map, cache, options.select_layer, assembled.exact_tokens);
  if (options.criterion == RecomputeCriterion::kImpact ||
      options.criterion == RecomputeCriterion::kFirstKImpact) {
    // Weighted by the attention the fresh tokens pay on the layers the pass leaves stale.
    const auto mass = attention_mass(model, map, assembled, cache, local.kv_layers);
    for (std::size_t s = 0; s < mass.size(); ++s) local.score[s] *= mass[s];
  }
  std::vector<int64_t> slots;
  if (options.criterion == RecomputeCriterion::kFirstKDeviation ||
      options.criterion == RecomputeCriterion::kFirstKImpact) {
    const std::vector<bool> eligible = first_k_eligible(runs, options.first_k);
    const std::vector<double> order = boundary_scores(runs);
    slots = pick(local.score, groups, &eligible, &order);
  } else if (options.criterion == RecomputeCriterion::kGradual) {
    const int64_t layers = model.config().num_hidden_layers - local.layers;
    SlotGroups first = groups;
    first.shared =
        gradual_sizes(groups.shared, groups.shared_slots, std::max<int64_t>(layers, 1))[0];
    slots = pick(local.score, first);
  } else {
    slots = pick(local.score, groups);
  }
  if (pass != nullptr) *pass = std::move(local);
  return slots;
}

// Per cached slot, whether its states are exact already: it holds one of the prompt's first
// AssembledPrompt::exact_tokens baseline tokens.
std::vector<bool> exact_slots(const BaselineMap& map, const AssembledPrompt& assembled) {
  std::vector<bool> exact;
  for (int64_t p : map.cached_position) exact.push_back(p < assembled.exact_tokens);
  return exact;
}

// Moves the prompt to its baseline positions and chooses the slots (the runs are read first:
// the move replaces the reserved positions and the provenance tags). `shared` as slot_groups'.
std::vector<int64_t> move_and_choose(const LlamaModel& model, const pml::ResolvedPrompt& resolved,
                                     const BaselineMap& map, const AssembledPrompt& assembled,
                                     KVCache& cache, const RecomputeOptions& options,
                                     DeviationPass* pass, SlotGroups* groups_out,
                                     int64_t shared = -1, double* move_ms = nullptr) {
  const SlotRuns runs = slot_runs(cache);
  SlotGroups groups =
      slot_groups(resolved, runs.reserved, exact_slots(map, assembled), options.fraction, shared);
  const double start = now_ms();
  move_to_baseline(model, cache, map.cached_position);
  if (move_ms != nullptr) *move_ms = now_ms() - start;
  auto slots = choose(model, resolved, map, assembled, cache, runs, groups, options, pass);
  if (groups_out != nullptr) *groups_out = std::move(groups);
  return slots;
}

// The gradual criterion's forward (CacheBlend's gradual filtering), after the deviation pass
// chose `slots` (its first layer's set, the last prompt token's slot included when it is a
// cached one): the slots and the fresh tokens run one layer at a time from the pass's last
// layer on, each seeing by position the earlier slots not in the set and the earlier new tokens.
// Before each later layer the set shrinks to gradual_sizes(): the slots whose K/V on that layer,
// projected from their new hidden states, deviate most from the stored ones stay. Each layer's
// K/V go to the slots of the set; the fresh tokens' are kept aside until they are put after the
// cached slots. Returns the logits after the last prompt token; `recomputed` receives the mean
// set size over the layers run.
torch::Tensor gradual_prefill(const LlamaModel& model, const pml::ResolvedPrompt& resolved,
                              const BaselineMap& map, const AssembledPrompt& assembled,
                              KVCache& cache, const DeviationPass& pass, std::vector<int64_t> slots,
                              const SlotGroups& groups, int64_t* recomputed) {
  const auto cached = static_cast<int64_t>(map.cached_position.size());
  const auto n = static_cast<int64_t>(resolved.baseline.size());
  const int64_t layers = model.config().num_hidden_layers, first = pass.layers;
  // The shared pool shrinks; a module budget's slots stay on every layer.
  const auto sizes =
      gradual_sizes(groups.shared, groups.shared_slots, std::max<int64_t>(layers - first, 1));
  // The pass's K/V of select_layer (projected only): what the set reads there.
  std::vector<int64_t> cached_order = map.cached_position;
  pass_states_into(pass, cache, first, cached_order, model);
  torch::Tensor hidden = pass.hidden.clone();  // [1, n, hidden] by baseline position
  std::vector<torch::Tensor> fresh_keys(layers), fresh_values(layers);
  std::vector<int64_t> fresh_positions;
  torch::Tensor logits;
  int64_t total = 0;
  const auto device = model.device();
  for (int64_t l = first; l < layers; ++l) {
    std::size_t kept_always = 0;  // module budgets' slots
    for (int64_t s : slots) {
      kept_always += groups.group[s] >= 0 ? 1 : 0;
    }
    const auto keep =
        static_cast<std::size_t>(sizes[static_cast<std::size_t>(l - first)]) + kept_always;
    if (l > first && keep < slots.size()) {
      std::vector<int64_t> at;
      for (int64_t s : slots) at.push_back(map.cached_position[s]);
      auto pos = torch::tensor(at, torch::kInt64);
      auto [keys, values] =
          model.layer_key_values(l, hidden.index_select(1, pos.to(device)), pos.unsqueeze(0));
      auto index = torch::tensor(slots, torch::kInt64).to(device);
      auto diff = [&](const torch::Tensor& now, const torch::Tensor& stored) {
        auto d = now.to(torch::kFloat32) - stored.index_select(2, index).to(torch::kFloat32);
        return d.pow(2).sum({0, 1, 3});
      };
      auto score = (diff(keys, cache.key_slots(l, 0, cached)) +
                    diff(values, cache.value_slots(l, 0, cached)))
                       .to(torch::kCPU, torch::kFloat64)
                       .contiguous();
      std::vector<double> ranked(score.data_ptr<double>(), score.data_ptr<double>() + slots.size());
      for (std::size_t i = 0; i < slots.size(); ++i) {  // these always stay
        if (at[i] == n - 1 || groups.group[slots[i]] >= 0) {
          ranked[i] = std::numeric_limits<double>::infinity();
        }
      }
      std::vector<int64_t> kept;
      for (int64_t i : top_slots(ranked, static_cast<int64_t>(keep))) kept.push_back(slots[i]);
      slots = std::move(kept);
    }
    // The set and the fresh tokens in position order.
    std::vector<std::pair<int64_t, int64_t>> order;  // (position, slot or -1 - fresh index)
    for (int64_t s : slots) order.emplace_back(map.cached_position[s], s);
    for (std::size_t i = 0; i < assembled.fresh_tokens.size(); ++i) {
      order.emplace_back(map.fresh_position[i], -1 - static_cast<int64_t>(i));
    }
    std::sort(order.begin(), order.end());
    const auto m = static_cast<int64_t>(order.size());
    std::vector<int64_t> ids, positions, fresh_rows;
    for (std::size_t j = 0; j < order.size(); ++j) {
      const auto [position, who] = order[j];
      positions.push_back(position);
      ids.push_back(resolved.baseline[position]);
      if (who < 0) fresh_rows.push_back(static_cast<int64_t>(j));
    }
    std::vector<int64_t> old_positions = map.cached_position;
    for (int64_t s : slots) old_positions[s] = std::numeric_limits<int64_t>::max();
    auto query = torch::tensor(positions, torch::kInt64);
    ForwardOptions forward;
    forward.attention_mask = visible_by_position(old_positions, query);
    forward.first_layer = l;
    forward.layers = l + 1 < layers ? l + 1 : 0;  // the last layer returns the logits
    forward.hidden = hidden.index_select(1, query.to(device));
    cache.reserve(cached + m);
    auto out = model.forward(torch::tensor(ids, torch::kInt64).unsqueeze(0), query.unsqueeze(0),
                             cache, forward);
    total += static_cast<int64_t>(slots.size());
    for (int64_t j = 0; j < m; ++j) {
      const int64_t who = order[static_cast<std::size_t>(j)].second;
      if (who < 0) continue;
      cache.key_slots(l, who, 1).copy_(cache.key_slots(l, cached + j, 1));
      cache.value_slots(l, who, 1).copy_(cache.value_slots(l, cached + j, 1));
    }
    if (!fresh_rows.empty()) {
      auto rows = torch::tensor(fresh_rows, torch::kInt64).to(device);
      fresh_keys[l] = cache.key_slots(l, cached, m).index_select(2, rows);
      fresh_values[l] = cache.value_slots(l, cached, m).index_select(2, rows);
    }
    cache.truncate(cached);
    if (l + 1 < layers) {
      hidden.index_copy_(1, query.to(device), out.to(hidden.scalar_type()));
    } else {
      logits = out;
      for (int64_t j : fresh_rows) fresh_positions.push_back(positions[j]);
    }
  }
  // The fresh tokens after the cached slots: the layers run here, then the pass's (exact) ones.
  const auto fresh = static_cast<int64_t>(fresh_positions.size());
  if (fresh > 0) {
    cache.reserve(cached + fresh);
    for (int64_t l = first; l < layers; ++l) {
      cache.key_slots(l, cached, fresh).copy_(fresh_keys[l]);
      cache.value_slots(l, cached, fresh).copy_(fresh_values[l]);
    }
    cache.fill_external(fresh, fresh_positions);
  }
  cached_order.insert(cached_order.end(), fresh_positions.begin(), fresh_positions.end());
  pass_states_into(pass, cache, 0, cached_order, model);
  *recomputed = total / std::max<int64_t>(layers - first, 1);
  return logits;
}

}  // namespace

RecomputeCriterion parse_recompute_criterion(const std::string& text) {
  if (text == "deviation") return RecomputeCriterion::kDeviation;
  if (text == "boundary") return RecomputeCriterion::kBoundary;
  if (text == "recent") return RecomputeCriterion::kRecent;
  if (text == "attention") return RecomputeCriterion::kAttention;
  if (text == "impact") return RecomputeCriterion::kImpact;
  if (text == "firstk") return RecomputeCriterion::kFirstK;
  if (text == "firstk+deviation") return RecomputeCriterion::kFirstKDeviation;
  if (text == "firstk+impact") return RecomputeCriterion::kFirstKImpact;
  if (text == "gradual") return RecomputeCriterion::kGradual;
  if (text == "impact-exact") return RecomputeCriterion::kImpactExact;
  if (text == "impact-lookahead") return RecomputeCriterion::kImpactLookahead;
  throw Error(ErrorKind::kInvalidArgument,
              "unknown recompute criterion '" + text +
                  "' (use impact, deviation, boundary, recent, attention, firstk, "
                  "firstk+deviation, firstk+impact, gradual, impact-exact or impact-lookahead)");
}

std::string recompute_criterion_name(RecomputeCriterion criterion) {
  switch (criterion) {
    case RecomputeCriterion::kBoundary:
      return "boundary";
    case RecomputeCriterion::kRecent:
      return "recent";
    case RecomputeCriterion::kAttention:
      return "attention";
    case RecomputeCriterion::kImpact:
      return "impact";
    case RecomputeCriterion::kFirstK:
      return "firstk";
    case RecomputeCriterion::kFirstKDeviation:
      return "firstk+deviation";
    case RecomputeCriterion::kFirstKImpact:
      return "firstk+impact";
    case RecomputeCriterion::kGradual:
      return "gradual";
    case RecomputeCriterion::kImpactExact:
      return "impact-exact";
    case RecomputeCriterion::kImpactLookahead:
      return "impact-lookahead";
    case RecomputeCriterion::kDeviation:
      break;
  }
  return "deviation";
}

void check_recompute_fraction(double fraction, const std::string& what) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw Error(ErrorKind::kInvalidArgument,
                what + " must be a fraction in [0, 1], got " + std::to_string(fraction));
  }
}

int64_t recompute_count(double fraction, int64_t cached) {
  check_recompute_fraction(fraction, "recompute");
  if (fraction <= 0 || cached <= 0) return 0;
  const auto count = static_cast<int64_t>(std::llround(fraction * static_cast<double>(cached)));
  return std::clamp<int64_t>(count, 1, cached);
}

bool recompute_requested(const RecomputeOptions& options, const pml::ResolvedPrompt& resolved) {
  return recompute_capacity(options, resolved) > 0;
}

int64_t recompute_capacity(const RecomputeOptions& options, const pml::ResolvedPrompt& resolved) {
  int64_t count = recompute_count(options.fraction, static_cast<int64_t>(resolved.baseline.size()));
  for (const pml::RecomputeBudget& b : resolved.recompute_budgets) {
    std::size_t tokens = 0;
    for (const auto& [begin, end] : b.ranges) tokens += end - begin;
    count += static_cast<int64_t>(b.budget.count(tokens));
  }
  return count;
}

std::vector<int64_t> choose_recompute_slots(const LlamaModel& model,
                                            const pml::ResolvedPrompt& resolved,
                                            const AssembledPrompt& assembled, KVCache& cache,
                                            int64_t count, const RecomputeOptions& options) {
  const BaselineMap map = map_to_baseline(resolved, assembled, cache);
  return move_and_choose(model, resolved, map, assembled, cache, options, nullptr, nullptr,
                         std::max<int64_t>(count, 0));
}

torch::Tensor recompute_prefill(const LlamaModel& model, const pml::ResolvedPrompt& resolved,
                                const AssembledPrompt& assembled, KVCache& cache,
                                const RecomputeOptions& options, RecomputeReport* report) {
  if (options.select_layer < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "recompute: select_layer must be a layer index (>= 0), got " +
                    std::to_string(options.select_layer));
  }
  if (options.first_k < 1 || options.first_k > kMaxRecomputeFirstK) {
    throw Error(ErrorKind::kInvalidArgument, "recompute: first_k must be 1.." +
                                                 std::to_string(kMaxRecomputeFirstK) + ", got " +
                                                 std::to_string(options.first_k));
  }
  const int64_t cached = assembled.cached_tokens;
  const double select_start = now_ms();
  const BaselineMap map = map_to_baseline(resolved, assembled, cache);
  if (cached <= assembled.exact_tokens && !assembled.fresh_tokens.empty() &&
      map.fresh_position == assembled.fresh_positions) {
    // Every cached slot is exact and every token at its baseline position already (a prefix
    // prompt): there is nothing to recompute, so the fresh tokens run as without recompute.
    const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
    std::vector<int64_t> ids(assembled.fresh_tokens.begin(), assembled.fresh_tokens.end());
    const double forward_start = now_ms();
    auto logits =
        model.forward(torch::tensor(ids, int64).unsqueeze(0),
                      torch::tensor(assembled.fresh_positions, int64).unsqueeze(0), cache);
    if (report != nullptr) {
      *report = RecomputeReport{};
      report->forward_ms = now_ms() - forward_start;
    }
    return logits.reshape({-1});
  }
  DeviationPass pass;
  double move_ms = 0;
  SlotGroups groups;
  std::vector<int64_t> selected = move_and_choose(model, resolved, map, assembled, cache, options,
                                                  &pass, &groups, -1, &move_ms);
  // The logits come after the prompt's last token: when that is a cached slot (a prompt whose
  // fresh tokens are all arguments), it runs too.
  const int64_t last = static_cast<int64_t>(resolved.baseline.size()) - 1;
  for (int64_t s = 0; s < cached; ++s) {
    if (map.cached_position[s] == last &&
        !std::binary_search(selected.begin(), selected.end(), s)) {
      selected.insert(std::upper_bound(selected.begin(), selected.end(), s), s);
    }
  }
  const double select_ms = now_ms() - select_start - move_ms;
  if (options.criterion == RecomputeCriterion::kGradual && pass.layers > 0 &&
      pass.layers < model.config().num_hidden_layers) {
    const double forward_start = now_ms();
    int64_t recomputed = 0;
    auto logits = gradual_prefill(model, resolved, map, assembled, cache, pass, selected, groups,
                                  &recomputed);
    if (report != nullptr) {
      report->recomputed_tokens = recomputed;
      report->move_ms = move_ms;
      report->select_ms = select_ms;
      report->forward_ms = now_ms() - forward_start;
      report->finish_ms = 0;
    }
    return logits.reshape({-1});
  }
  // The new tokens in baseline order: the chosen slots and the fresh tokens. Each sees, by
  // position, the earlier slots not chosen and the earlier (and its own) new tokens; the chosen
  // slots' stale states are hidden from all of them.
  struct NewToken {
    int64_t position;
    TokenId token;
    int64_t slot;  // the cached slot it rewrites, or -1 for a fresh token
  };
  std::vector<NewToken> tokens;
  for (int64_t s : selected) tokens.push_back({map.cached_position[s], map.cached_token[s], s});
  for (std::size_t i = 0; i < assembled.fresh_tokens.size(); ++i) {
    tokens.push_back({map.fresh_position[i], assembled.fresh_tokens[i], -1});
  }
  std::sort(tokens.begin(), tokens.end(),
            [](const NewToken& a, const NewToken& b) { return a.position < b.position; });
  const auto m = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> ids, positions;
  for (const auto& t : tokens) {
    ids.push_back(t.token);
    positions.push_back(t.position);
  }
  std::vector<int64_t> old_positions = map.cached_position;
  for (int64_t s : selected) old_positions[s] = std::numeric_limits<int64_t>::max();
  auto query = torch::tensor(positions, torch::kInt64);
  cache.reserve(cached + m);
  ForwardOptions forward;
  forward.attention_mask = visible_by_position(old_positions, query);  // [m, cached + m]
  // After a deviation pass the new tokens start where its forward stopped, from its hidden
  // states: the layers it ran are exact for every token already.
  const int64_t first = pass.layers;
  const int64_t later = model.config().num_hidden_layers - first;
  const int64_t exact = pass.kv_layers;  // the pass's K/V replace every slot's on these layers
  if (first > 0) {
    forward.first_layer = first;
    forward.hidden = pass.hidden.index_select(1, query.to(pass.hidden.device()));
  }
  if (exact > first) {
    // The pass's K/V of layers [first, exact) (select_layer's, projected only) are what the new
    // tokens' attention reads there: in the cached slots before the forward, not stale ones.
    pass_states_into(pass, cache, first, map.cached_position, model);
  }
  const double forward_start = now_ms();
  auto logits = model.forward(torch::tensor(ids, torch::kInt64).unsqueeze(0), query.unsqueeze(0),
                              cache, forward);
  const double finish_start = now_ms();
  // The chosen slots take their recomputed states; the fresh tokens' move down to follow the
  // cached slots (a slot only ever moves down, so none is read after it was overwritten).
  std::vector<int64_t> fresh_positions;
  int64_t next_fresh = cached;
  for (int64_t j = 0; j < m; ++j) {
    const NewToken& t = tokens[j];
    if (t.slot >= 0) {
      if (later > 0) {
        cache.all_slots(t.slot, 1)
            .narrow(0, first, later)
            .copy_(cache.all_slots(cached + j, 1).narrow(0, first, later));
      }
    } else {
      if (next_fresh != cached + j) {
        cache.all_slots(next_fresh, 1).copy_(cache.all_slots(cached + j, 1));
      }
      ++next_fresh;
      fresh_positions.push_back(t.position);
    }
  }
  cache.truncate(next_fresh);
  cache.set_row_positions(0, cached, fresh_positions);
  if (exact > 0) {
    // The pass's layers, for every slot in its final place (cached slots, then fresh ones).
    std::vector<int64_t> order = map.cached_position;
    order.insert(order.end(), fresh_positions.begin(), fresh_positions.end());
    pass_states_into(pass, cache, 0, order, model);
  }
  if (report != nullptr) {
    report->recomputed_tokens = static_cast<int64_t>(selected.size());
    report->move_ms = move_ms;
    report->select_ms = select_ms;
    report->forward_ms = finish_start - forward_start;
    report->finish_ms = now_ms() - finish_start;
  }
  return logits.reshape({-1});
}

}  // namespace promptcache
