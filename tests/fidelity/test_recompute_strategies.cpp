// The recompute strategies compared in docs/fidelity.md (EPIC's first k tokens per module, the
// combinations with a deviation pass, CacheBlend's gradual filtering) and the bounded attention
// of the recompute forward: each block of recomputed rows reads only the slots it can see, with
// the same result as the library attention over the whole cache; a prefix prompt stays exact
// whatever the criterion.
#include "support/catch_torch.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "promptcache/fidelity.hpp"
#include "promptcache/model/cpu_attention.hpp"
#include "promptcache/recompute.hpp"
#include "support/recompute_criteria.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

const char* kSchema = R"(<schema name="story">
  <system>You are a helpful assistant. Keep your answers short and clear.</system>
  <module name="intro">Once upon a time, there was a little girl named Lily.</module>
  <module name="park">She loved to play outside in the park. One day, she saw a big red ball.</module>
  <module name="friend">Her friend Tom came to help, and together they found a long stick.</module>
  <module name="night">When the night came, the stars were bright and the moon was round.</module>
</schema>)";

const char* kGap = R"(<prompt schema="story"><park/><night/>What did they do?</prompt>)";
const char* kPrefix = R"(<prompt schema="story"><intro/><park/>What did Lily see?</prompt>)";

const std::vector<RecomputeCriterion>& kAll = test::all_recompute_criteria();

std::vector<int64_t> choose(Engine& engine, const char* xml, int64_t count,
                            const RecomputeOptions& options) {
  const auto resolved = engine.resolve(pml::parse_prompt_string(xml));
  KVCache cache = engine.model().make_cache(0);
  const auto assembled = Assembler().assemble(resolved, engine.layout("story"), engine.store(),
                                              cache, 0, AssembleOptions{false, true});
  return choose_recompute_slots(engine.model(), resolved, assembled, cache, count, options);
}

// Slot s of `cache` holds baseline position positions()[s]: its K/V of layer l by position.
torch::Tensor by_position(const KVCache& cache, int64_t l) {
  auto index = torch::tensor(cache.positions(), torch::kInt64);
  auto kv = torch::cat({cache.keys(l), cache.values(l)});
  auto out = torch::empty_like(kv);
  out.index_copy_(2, index, kv);
  return out;
}

}  // namespace

TEST_CASE("a masked forward's blocks read only the slots they see, as the full attention does",
          "[fidelity][model]") {
  auto model = test::tiny_model(3);
  if (!cpu_attention_available(model->config().head_dim)) {
    WARN(
        "SKIPPED: the fused CPU attention does not take this head size here; the bounded "
        "blocks are its path");
    return;
  }
  // 300 stored slots at positions 0..299 (even and odd), then 150 new tokens in position order
  // among them, as the recompute forward runs them: every second slot is recomputed, each new
  // token sees the earlier stored slots not recomputed and the earlier new tokens.
  const int64_t stored = 300, fresh = 150;
  auto ids = torch::randint(3, 300, {stored}, torch::kInt64);
  auto prefill = [&] {
    KVCache cache = model->make_cache(stored + fresh);
    model->forward(ids.unsqueeze(0), torch::arange(stored, torch::kInt64).unsqueeze(0), cache);
    return cache;
  };
  std::vector<int64_t> slot_positions, query_positions;
  for (int64_t p = 0; p < stored; ++p) {
    slot_positions.push_back(p % 2 == 1 ? std::numeric_limits<int64_t>::max() : p);
    if (p % 2 == 1) query_positions.push_back(p);
  }
  auto query = torch::tensor(query_positions, torch::kInt64);
  auto keys = torch::cat({torch::tensor(slot_positions, torch::kInt64), query});
  ForwardOptions options;
  options.attention_mask = keys.unsqueeze(0) <= query.unsqueeze(1);
  options.all_logits = true;
  auto new_ids = ids.index_select(0, query).unsqueeze(0);
  KVCache fused_cache = prefill(), library_cache = prefill();
  auto fused = model->forward(new_ids, query.unsqueeze(0), fused_cache, options);
  torch::Tensor mass;  // asking for the attention mass takes the library attention
  options.attention_mass = &mass;
  auto library = model->forward(new_ids, query.unsqueeze(0), library_cache, options);
  REQUIRE(fused.sizes() == library.sizes());
  CHECK((fused - library).abs().max().item<double>() <= 1e-4);
  for (int64_t l = 0; l < model->config().num_hidden_layers; ++l) {
    CHECK((fused_cache.keys(l) - library_cache.keys(l)).abs().max().item<double>() <= 1e-4);
  }
}

TEST_CASE("slot_range cuts runs of slots at both ends", "[fidelity][model]") {
  auto a = torch::arange(4, torch::kFloat32).view({1, 1, 4, 1});
  auto b = torch::arange(4, 10, torch::kFloat32).view({1, 1, 6, 1});
  const std::vector<KVSegment> runs = {{a, a}, {b, b}};
  auto slots = slot_range(runs, 2, 5);  // slots 2..6: two of the first run, three of the second
  REQUIRE(slots.size() == 2);
  CHECK(slots[0].slots() == 2);
  CHECK(slots[1].slots() == 3);
  CHECK(slots[0].keys.flatten()[0].item<float>() == 2);
  CHECK(slots[1].keys.flatten()[2].item<float>() == 6);
  CHECK(slot_range(runs, 4, 6).size() == 1);
  CHECK(slot_range(runs, 3, 0).empty());
}

TEST_CASE("firstk recomputes the first k tokens of every module after a gap", "[fidelity]") {
  auto engine = test::tiny_engine(6);
  engine->add_schema_string(kSchema);
  RecomputeOptions options{0, RecomputeCriterion::kFirstK};
  options.first_k = 1;
  const auto first_tokens = choose(*engine, kGap, 30, options);  // one per run after a gap
  options.first_k = 2;
  const auto firstk = choose(*engine, kGap, 30, options);  // the budget exceeds the set
  // The runs after a gap (park, night, and the schema's own text between modules) are each
  // longer than one token: k = 2 takes two of most, fewer than the budget, exactly what the
  // boundary criterion picks with that budget (offset 0 of every run, then offset 1).
  CHECK(first_tokens.size() >= 2);
  CHECK(firstk.size() > first_tokens.size());
  CHECK(firstk.size() <= 2 * first_tokens.size());
  CHECK(firstk.size() < 30);
  CHECK(firstk == choose(*engine, kGap, static_cast<int64_t>(firstk.size()),
                         RecomputeOptions{0, RecomputeCriterion::kBoundary}));
  for (int64_t s : first_tokens) CHECK(std::binary_search(firstk.begin(), firstk.end(), s));
  // A budget below the set takes offset 0 of every run first.
  CHECK(choose(*engine, kGap, static_cast<int64_t>(first_tokens.size()), options) == first_tokens);
  // The combinations: the first-k slots, then the rest of the budget by the pass's score.
  for (auto criterion : {RecomputeCriterion::kFirstKDeviation, RecomputeCriterion::kFirstKImpact}) {
    INFO(recompute_criterion_name(criterion));
    options.criterion = criterion;
    const auto mixed = choose(*engine, kGap, 25, options);
    CHECK(mixed.size() == 25);
    CHECK(std::is_sorted(mixed.begin(), mixed.end()));
    for (int64_t s : firstk) CHECK(std::binary_search(mixed.begin(), mixed.end(), s));
    CHECK(mixed == choose(*engine, kGap, 25, options));  // deterministic
  }
  for (const char* name : {"firstk", "firstk+deviation", "firstk+impact", "gradual", "impact-exact",
                           "impact-lookahead"}) {
    CHECK(recompute_criterion_name(parse_recompute_criterion(name)) == name);
  }
  // first_k is checked.
  RequestOptions request;
  request.recompute = 0.2;
  request.recompute_criterion = RecomputeCriterion::kFirstK;
  request.recompute_first_k = 0;
  CHECK_THROWS_AS(engine->generate_xml(kGap, test::greedy_params(2), {}, request), Error);
  request.recompute_first_k = kMaxRecomputeFirstK + 1;
  CHECK_THROWS_AS(engine->generate_xml(kGap, test::greedy_params(2), {}, request), Error);
}

TEST_CASE("gradual filtering with one layer after the pass is the deviation criterion",
          "[fidelity]") {
  // The tiny model has two layers: after the layer-1 pass only the last one is recomputed, with
  // nothing to filter, so gradual must give deviation's answer and cache exactly; this checks
  // its layer-by-layer forward and where it puts the fresh tokens' states.
  auto engine = test::tiny_engine(6);
  engine->add_schema_string(kSchema);
  REQUIRE(engine->model().config().num_hidden_layers == 2);
  const auto resolved = engine->resolve(pml::parse_prompt_string(kGap));
  KVCache deviation = engine->model().make_cache(0), gradual = engine->model().make_cache(0);
  const auto a = engine->prefill(resolved, deviation, true, 0, AssembleOptions{false, true},
                                 RecomputeOptions{0.3, RecomputeCriterion::kDeviation});
  const auto b = engine->prefill(resolved, gradual, true, 0, AssembleOptions{false, true},
                                 RecomputeOptions{0.3, RecomputeCriterion::kGradual});
  CHECK(b.recomputed_tokens == a.recomputed_tokens);
  CHECK((a.logits - b.logits).abs().max().item<double>() <= 1e-5);
  REQUIRE(deviation.length() == gradual.length());
  for (int64_t l = 0; l < 2; ++l) {
    CHECK((by_position(deviation, l) - by_position(gradual, l)).abs().max().item<double>() <= 1e-5);
  }
}

TEST_CASE("every criterion keeps a prefix prompt exact and decodes after a gap", "[fidelity]") {
  auto engine = test::tiny_engine(2);
  engine->add_schema_string(kSchema);
  for (auto criterion : kAll) {
    INFO(recompute_criterion_name(criterion));
    FidelityOptions options;
    options.tokens = 12;
    options.recompute = {0.3, criterion};
    const auto prefix = measure_fidelity(*engine, pml::parse_prompt_string(kPrefix), options);
    CHECK(prefix.first_token_kl < 1e-6);
    CHECK(prefix.first_token_agrees);
    CHECK(prefix.exact);
    options.recompute.fraction = 1.0;  // every token: the no-cache answer
    const auto all = measure_fidelity(*engine, pml::parse_prompt_string(kGap), options);
    CHECK(all.first_token_kl < 1e-8);
    CHECK(all.exact);
  }
}

TEST_CASE("on stories260K gradual filtering runs layer by layer and drifts less than r = 0",
          "[fidelity][stories260k]") {
  auto engine = test::stories260k_engine();
  const std::string tale = R"(<schema name="tale">
  <module name="opening">Once upon a time, there was a little girl named Lily.</module>
  <module name="park">She loved to play outside in the park with her red ball.</module>
  <module name="dog">One day, a big dog came and took the ball away.</module>
  <module name="rain">Then it started to rain, and everyone ran home.</module>
</schema>)";
  engine->add_schema_string(tale);
  const auto prompt = pml::parse_prompt_string(
      R"(<prompt schema="tale"><park/><rain/> The next day, Lily</prompt>)");
  FidelityOptions options;
  options.tokens = 16;
  const auto r0 = measure_fidelity(*engine, prompt, options);
  options.recompute = {0.3, RecomputeCriterion::kGradual};
  const auto gradual = measure_fidelity(*engine, prompt, options);
  WARN("stories260K first-token KL: r = 0 " << r0.first_token_kl << ", gradual r = 0.3 "
                                            << gradual.first_token_kl);
  CHECK(gradual.recomputed_tokens > 0);
  CHECK(gradual.first_token_kl < r0.first_token_kl);
  // It decodes from the cache it left: the no-cache continuation stays likely under it.
  CHECK(std::isfinite(gradual.continuation_logprob));
  CHECK(gradual.continuation_logprob >= r0.continuation_logprob - 1e-3 * options.tokens);
}
