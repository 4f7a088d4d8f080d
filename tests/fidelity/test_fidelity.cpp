// Fidelity measurement and recompute (docs/fidelity.md): identical inputs agree, prefix prompts
// agree at r = 0, r = 1 equals the no-cache logits, the store is never written, the criteria are
// deterministic (attention mass included), and a recomputed buffer is not reused as if it held the
// stored states.
#include "support/catch_torch.hpp"

#include <map>
#include <optional>

#include "promptcache/batch_session.hpp"
#include "promptcache/fidelity.hpp"
#include "promptcache/recompute.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

const char* kStory = R"(<schema name="story">
  <system>You are a helpful assistant. Keep your answers short and clear.</system>
  <module name="intro">Once upon a time, there was a little girl named Lily.</module>
  <module name="park">She loved to play outside in the park. One day, she saw a big red ball.</module>
  <module name="friend">Her friend Tom came to help, and together they found a long stick.</module>
  <module name="home">At home, mother made <parameter name="food" length="6"/> for dinner.</module>
  <module name="night">When the night came, the stars were bright and the moon was round.</module>
</schema>)";

// For stories260K, in the style of the TinyStories it was trained on.
const char* kTale = R"(<schema name="tale">
  <module name="opening">Once upon a time, there was a little girl named Lily.</module>
  <module name="park">She loved to play outside in the park with her red ball.</module>
  <module name="dog">One day, a big dog came and took the ball away.</module>
  <module name="rain">Then it started to rain, and everyone ran home.</module>
  <module name="cake">Mom made a big cake with pink flowers on top.</module>
</schema>)";

// Modules out of their schema context: a gap before "friend" and "night", an argument.
const char* kGapPrompt =
    R"(<prompt schema="story"><friend/><home food="hot soup"/><night/>What did they do?</prompt>)";
const char* kPrefixPrompt =
    R"(<prompt schema="story"><intro/><park/><friend/>What did Lily see?</prompt>)";

std::vector<torch::Tensor> store_snapshot(const Engine& engine, const std::string& schema) {
  std::vector<torch::Tensor> out;
  for (const auto& [_, states] : engine.store().spans_of(schema)) out.push_back(states.kv.clone());
  return out;
}

// The story schema with recompute="0.5", in an engine of its own.
std::unique_ptr<Engine> engine_with_default_recompute() {
  auto engine = test::tiny_engine(6);
  std::string schema = kStory;
  schema.replace(0, std::string(R"(<schema name="story">)").size(),
                 R"(<schema name="story" recompute="0.5">)");
  engine->add_schema_string(schema);
  return engine;
}

}  // namespace

TEST_CASE("forward with ForwardOptions::layers runs only the first layers", "[fidelity][model]") {
  auto model = test::tiny_model(3);
  const std::vector<int64_t> ids = {5, 17, 42, 9, 100, 7};
  auto tokens = torch::tensor(ids).unsqueeze(0);
  auto positions = torch::arange(6, torch::kInt64).unsqueeze(0);
  KVCache full = model->make_cache(6), part = model->make_cache(6);
  auto logits = model->forward(tokens, positions, full);
  ForwardOptions options;
  options.layers = 1;
  auto hidden = model->forward(tokens, positions, part, options);
  CHECK(hidden.sizes() == at::IntArrayRef({1, 6, model->config().hidden_size}));
  CHECK(part.length() == 6);
  CHECK(torch::equal(part.keys(0), full.keys(0)));
  CHECK(torch::equal(part.values(0), full.values(0)));
  CHECK(logits.size(-1) == model->config().vocab_size);
  // The next layer's K/V alone, from those hidden states: what the full forward wrote there.
  auto [keys, values] = model->layer_key_values(1, hidden, positions);
  CHECK((keys - full.keys(1)).abs().max().item<double>() <= 1e-5);
  CHECK((values - full.values(1)).abs().max().item<double>() <= 1e-5);
  CHECK((keys - full.keys(0)).abs().max().item<double>() > 1e-3);  // another layer's differ
  CHECK_THROWS_AS(model->layer_key_values(model->config().num_hidden_layers, hidden, positions),
                  Error);
}

TEST_CASE("ForwardOptions::attention_mass: each new token's weights sum to one per head",
          "[fidelity][model]") {
  auto model = test::tiny_model(3);
  const int64_t layers = model->config().num_hidden_layers;
  const int64_t heads = model->config().num_attention_heads;
  auto prompt = torch::tensor(std::vector<int64_t>{5, 17, 42, 9, 100, 7}).unsqueeze(0);
  auto fresh = torch::tensor(std::vector<int64_t>{11, 12, 13}).unsqueeze(0);
  auto fresh_positions = torch::arange(6, 9, torch::kInt64).unsqueeze(0);
  KVCache plain = model->make_cache(9), probed = model->make_cache(9);
  for (KVCache* c : {&plain, &probed}) {
    model->forward(prompt, torch::arange(6, torch::kInt64).unsqueeze(0), *c);
  }
  auto expected = model->forward(fresh, fresh_positions, plain);
  // Slot 2 hidden from every new token: it receives nothing.
  auto mask = torch::ones({3, 9}, torch::kBool).tril(6);
  mask.select(1, 2).fill_(false);
  ForwardOptions masked;
  masked.attention_mask = mask;
  KVCache other = model->make_cache(9);
  model->forward(prompt, torch::arange(6, torch::kInt64).unsqueeze(0), other);
  torch::Tensor hidden_mass;
  masked.attention_mass = &hidden_mass;
  model->forward(fresh, fresh_positions, other, masked);
  CHECK(hidden_mass.select(1, 2).abs().max().item<double>() == 0.0);
  // The causal default: the logits are those without the output, every row sums to one.
  ForwardOptions options;
  torch::Tensor mass;
  options.attention_mass = &mass;
  auto logits = model->forward(fresh, fresh_positions, probed, options);
  CHECK((logits - expected).abs().max().item<double>() <= 1e-5);
  REQUIRE(mass.sizes() == at::IntArrayRef({layers, 9}));
  for (int64_t l = 0; l < layers; ++l) {
    CHECK(mass[l].sum().item<double>() == Approx(static_cast<double>(3 * heads)).epsilon(1e-4));
    // The last slot is seen by the last new token only (causal): at most one weight per head.
    CHECK(mass[l][8].item<double>() <= static_cast<double>(heads) + 1e-4);
    CHECK(mass[l].min().item<double>() > 0.0);  // every visible slot gets some weight
  }
}

TEST_CASE("identical inputs: KL 0 and full agreement", "[fidelity]") {
  auto logits = torch::randn({400});
  CHECK(logits_kl(logits, logits) == 0.0);
  CHECK(logits_kl(logits, logits * 2) > 0.0);
  auto engine = test::tiny_engine(1);
  engine->add_schema_string(kStory);
  // A prompt of text only: the cached run is the no-cache run.
  FidelityOptions options;
  options.tokens = 12;
  const auto f = measure_fidelity(
      *engine, pml::parse_prompt_string(R"(<prompt schema="story">Tell me a story.</prompt>)"),
      options);
  CHECK(f.first_token_kl < 1e-9);
  CHECK(f.first_token_agrees);
  CHECK(f.exact);
  CHECK(f.agreed_tokens == f.compared_tokens);
  CHECK(f.compared_tokens >= 1);
  CHECK(f.continuation_logprob == Approx(f.baseline_logprob).margin(1e-4));
  const auto s = summarize_fidelity({f, f});
  CHECK(s.prompts == 2);
  CHECK(s.first_token_agreement == 1.0);
  CHECK(s.exact_agreement == 1.0);
}

TEST_CASE("prefix prompts agree fully at r = 0", "[fidelity]") {
  for (std::uint64_t seed : {1, 2}) {
    auto engine = test::tiny_engine(seed);
    engine->add_schema_string(kStory);
    FidelityOptions options;
    options.tokens = 16;
    const auto f = measure_fidelity(*engine, pml::parse_prompt_string(kPrefixPrompt), options);
    CHECK(f.cached_tokens > 0);
    CHECK(f.recomputed_tokens == 0);
    CHECK(f.first_token_kl < 1e-6);
    CHECK(f.first_token_agrees);
    CHECK(f.exact);
  }
}

TEST_CASE("a gap prompt drifts at r = 0 and r = 1 equals the no-cache logits", "[fidelity]") {
  auto engine = test::tiny_engine(2);
  engine->add_schema_string(kStory);
  // The second prompt ends in a cached token (its only fresh tokens are an argument's).
  for (const char* xml :
       {kGapPrompt, R"(<prompt schema="story"><friend/><home food="hot soup"/></prompt>)"}) {
    INFO(xml);
    const auto resolved = engine->resolve(pml::parse_prompt_string(xml));
    KVCache plain = engine->model().make_cache(0);
    const auto base = engine->prefill(resolved, plain, false);
    for (RecomputeCriterion criterion :
         {RecomputeCriterion::kDeviation, RecomputeCriterion::kBoundary,
          RecomputeCriterion::kRecent, RecomputeCriterion::kAttention,
          RecomputeCriterion::kImpact}) {
      for (bool in_place : {true, false}) {
        KVCache cached = engine->model().make_cache(0), full = engine->model().make_cache(0);
        const auto r0 =
            engine->prefill(resolved, cached, true, 0, AssembleOptions{false, in_place});
        CHECK((r0.logits - base.logits).abs().max().item<double>() > 1e-3);  // it does drift
        const auto r1 = engine->prefill(resolved, full, true, 0, AssembleOptions{false, in_place},
                                        RecomputeOptions{1.0, criterion});
        // Every cached slot but the exact leading run (the system prompt before "friend's" gap).
        CHECK(r1.assembled.exact_tokens > 0);
        CHECK(r1.recomputed_tokens == r0.assembled.cached_tokens - r1.assembled.exact_tokens);
        const double diff = (r1.logits - base.logits).abs().max().item<double>();
        INFO("criterion " << recompute_criterion_name(criterion) << ", in place " << in_place
                          << ": max abs logit diff " << diff);
        CHECK(diff <= 1e-4);
        // The whole KV cache equals the no-cache one, slot for slot (by position).
        REQUIRE(full.length() == plain.length());
        std::vector<int64_t> order(full.positions().begin(), full.positions().end());
        std::vector<int64_t> sorted = order;
        std::sort(sorted.begin(), sorted.end());
        CHECK(sorted == plain.positions());  // the baseline's positions 0..n-1
        auto index = torch::tensor(order, torch::kInt64);
        for (int64_t l = 0; l < full.layers(); ++l) {
          auto keys = torch::empty_like(full.keys(l)), values = torch::empty_like(full.values(l));
          keys.index_copy_(2, index, full.keys(l));
          values.index_copy_(2, index, full.values(l));
          CHECK((keys - plain.keys(l)).abs().max().item<double>() <= 1e-4);
          CHECK((values - plain.values(l)).abs().max().item<double>() <= 1e-4);
        }
      }
    }
  }
}

TEST_CASE(
    "the deviation pass keeps exact layers for every token and through all layers is no cache",
    "[fidelity]") {
  auto engine = test::tiny_engine(6);
  engine->add_schema_string(kStory);
  const auto resolved = engine->resolve(pml::parse_prompt_string(kGapPrompt));
  KVCache plain = engine->model().make_cache(0);
  const auto base = engine->prefill(resolved, plain, false);
  const int64_t layers = engine->model().config().num_hidden_layers;
  for (int64_t select_layer : {int64_t{1}, layers - 1}) {
    INFO("select_layer " << select_layer);
    KVCache cache = engine->model().make_cache(0);
    const auto out =
        engine->prefill(resolved, cache, true, 0, AssembleOptions{false, true},
                        RecomputeOptions{0.3, RecomputeCriterion::kDeviation, select_layer});
    REQUIRE(out.recomputed_tokens > 0);
    REQUIRE(out.recomputed_tokens < out.assembled.cached_tokens);
    // Slot s of `cache` holds baseline position positions()[s]: compare by position.
    REQUIRE(cache.length() == plain.length());
    auto index = torch::tensor(cache.positions(), torch::kInt64);
    auto layer_diff = [&](int64_t l) {
      auto keys = torch::empty_like(cache.keys(l)), values = torch::empty_like(cache.values(l));
      keys.index_copy_(2, index, cache.keys(l));
      values.index_copy_(2, index, cache.values(l));
      return std::max((keys - plain.keys(l)).abs().max().item<double>(),
                      (values - plain.values(l)).abs().max().item<double>());
    };
    for (int64_t l = 0; l <= select_layer; ++l) CHECK(layer_diff(l) <= 1e-4);
    const double logit_diff = (out.logits - base.logits).abs().max().item<double>();
    if (select_layer == layers - 1) {
      CHECK(logit_diff <= 1e-4);  // every layer came from the full pass
    } else {
      CHECK(layer_diff(layers - 1) > 1e-4);  // the stale slots' later layers were kept
      CHECK(logit_diff > 1e-6);
    }
  }
}

TEST_CASE("a schema's recompute attribute is the default share and a request overrides it",
          "[fidelity]") {
  auto engine = engine_with_default_recompute();
  SamplingParams one;
  one.max_new_tokens = 1;
  const auto by_default = engine->generate_xml(kGapPrompt, one);
  CHECK(by_default.recomputed_tokens == recompute_count(0.5, by_default.cached_tokens));
  RequestOptions request;
  request.recompute = 0;
  CHECK(engine->generate_xml(kGapPrompt, one, {}, request).recomputed_tokens == 0);
  request.recompute = 1;
  const auto all = engine->generate_xml(kGapPrompt, one, {}, request);
  // All but the exact leading run (the system prompt before the gap), which is never chosen.
  const auto exact = static_cast<int64_t>(exact_prefix_tokens(
      engine->layout("story"), engine->resolve(pml::parse_prompt_string(kGapPrompt)),
      EncodingMode::kScaffold));
  CHECK(exact > 0);
  CHECK(all.recomputed_tokens == all.cached_tokens - exact);
}

TEST_CASE("batches recompute as single prompts do: the schema's default and a request's share",
          "[fidelity]") {
  auto engine = engine_with_default_recompute();
  SamplingParams params;
  params.max_new_tokens = 8;
  const std::vector<pml::Prompt> prompts = {pml::parse_prompt_string(kGapPrompt),
                                            pml::parse_prompt_string(kPrefixPrompt)};
  for (std::optional<double> share :
       {std::optional<double>(), std::optional<double>(0.25), std::optional<double>(0.0)}) {
    RequestOptions request;
    request.recompute = share;
    std::vector<Response> alone;
    for (const auto& p : prompts) alone.push_back(engine->generate(p, params, {}, request));
    CHECK(alone[0].recomputed_tokens ==
          recompute_count(share.value_or(0.5), alone[0].cached_tokens));
    // generate_batch, and rows admitted into a running BatchSession, give each prompt what it
    // gets alone, its recomputed tokens included.
    const auto batch = engine->generate_batch(prompts, params, {}, request);
    BatchSession session(*engine);
    std::vector<std::optional<BatchSession::RowId>> ids;
    ids.push_back(session.admit(prompts[0], params, {}, request));
    session.step();
    ids.push_back(session.admit(prompts[1], params, {}, request));
    std::map<BatchSession::RowId, Response> joined;
    while (!session.empty()) {
      for (auto& done : session.step()) joined[done.id] = std::move(done.response);
    }
    REQUIRE(batch.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      INFO("prompt " << i << ", share " << share.value_or(-1));
      CHECK(batch[i].tokens == alone[i].tokens);
      CHECK(batch[i].recomputed_tokens == alone[i].recomputed_tokens);
      REQUIRE(ids[i].has_value());
      CHECK(joined.at(*ids[i]).tokens == alone[i].tokens);
      CHECK(joined.at(*ids[i]).recomputed_tokens == alone[i].recomputed_tokens);
    }
  }
}

TEST_CASE("recompute never writes the stored states", "[fidelity]") {
  auto engine = test::tiny_engine(4);
  engine->add_schema_string(kStory);
  const auto before = store_snapshot(*engine, "story");
  SamplingParams greedy;
  greedy.max_new_tokens = 6;
  for (double r : {0.2, 0.5, 1.0}) {
    for (bool in_place : {true, false}) {
      RequestOptions request;
      request.recompute = r;
      request.in_place = in_place;
      const auto out = engine->generate_xml(kGapPrompt, greedy, {}, request);
      CHECK(out.recomputed_tokens > 0);
    }
  }
  const auto after = store_snapshot(*engine, "story");
  REQUIRE(before.size() == after.size());
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(before[i], after[i]));
}

TEST_CASE("a recomputed buffer is not kept for the next request", "[fidelity]") {
  auto engine = test::tiny_engine(5);
  auto fresh_engine = test::tiny_engine(5);
  engine->add_schema_string(kStory);
  fresh_engine->add_schema_string(kStory);
  SamplingParams greedy;
  greedy.max_new_tokens = 8;
  greedy.stop_at_eos = false;
  RequestOptions recompute;
  recompute.recompute = 0.5;
  engine->generate_xml(kGapPrompt, greedy, {}, recompute);
  const auto next = engine->generate_xml(kGapPrompt, greedy);  // r = 0, buffer reuse on
  const auto expected = fresh_engine->generate_xml(kGapPrompt, greedy);
  CHECK(next.reused_tokens == 0);
  CHECK(next.tokens == expected.tokens);
}

TEST_CASE("recompute criteria choose slots deterministically", "[fidelity]") {
  auto engine = test::tiny_engine(6);
  engine->add_schema_string(kStory);
  const auto resolved = engine->resolve(pml::parse_prompt_string(kGapPrompt));
  const auto& layout = engine->layout("story");
  for (RecomputeCriterion criterion :
       {RecomputeCriterion::kDeviation, RecomputeCriterion::kBoundary, RecomputeCriterion::kRecent,
        RecomputeCriterion::kAttention, RecomputeCriterion::kImpact}) {
    std::vector<std::vector<int64_t>> picks;
    int64_t cached = 0;
    for (int run = 0; run < 2; ++run) {
      KVCache cache = engine->model().make_cache(0);
      const auto assembled = Assembler().assemble(resolved, layout, engine->store(), cache, 0,
                                                  AssembleOptions{false, run == 0});
      cached = assembled.cached_tokens;
      picks.push_back(choose_recompute_slots(engine->model(), resolved, assembled, cache, 5,
                                             RecomputeOptions{0, criterion}));
      // The cache now holds the baseline positions of the cached tokens.
      for (int64_t p : cache.positions()) CHECK(p < static_cast<int64_t>(resolved.baseline.size()));
    }
    CHECK(picks[0] == picks[1]);
    CHECK(picks[0].size() == 5);
    CHECK(std::is_sorted(picks[0].begin(), picks[0].end()));
    CHECK(picks[0].back() < cached);
    if (criterion == RecomputeCriterion::kBoundary || criterion == RecomputeCriterion::kAttention) {
      // Slot 0 starts the schema (BOS, system prompt: exact), so the first picks are the first
      // tokens after each gap (boundary) or the most attended ones elsewhere, never slot 0.
      CHECK(picks[0].front() > 0);
    }
    if (criterion == RecomputeCriterion::kRecent) {  // the five cached slots nearest the text
      CHECK(picks[0] ==
            std::vector<int64_t>{cached - 5, cached - 4, cached - 3, cached - 2, cached - 1});
    }
  }
}

TEST_CASE("recompute fractions are checked", "[fidelity]") {
  CHECK(recompute_count(0.0, 100) == 0);
  CHECK(recompute_count(0.05, 100) == 5);
  CHECK(recompute_count(0.001, 100) == 1);
  CHECK(recompute_count(1.0, 100) == 100);
  CHECK_THROWS_AS(recompute_count(1.5, 100), Error);
  CHECK_THROWS_AS(recompute_count(-0.1, 100), Error);
  CHECK_THROWS_AS(parse_recompute_criterion("random"), Error);
  auto engine = test::tiny_engine(1);
  engine->add_schema_string(kStory);
  RequestOptions request;
  request.recompute = 2;
  CHECK_THROWS_AS(engine->generate_batch({pml::parse_prompt_string(kGapPrompt)}, {}, {}, request),
                  Error);
  CHECK_THROWS_AS(engine->generate_xml(kGapPrompt, {}, {}, request), Error);
  request.recompute = 0.5;
  request.recompute_select_layer = -1;
  CHECK_THROWS_AS(engine->generate_xml(kGapPrompt, {}, {}, request), Error);
}

TEST_CASE("recompute on stories260K: r = 1 equals no cache, r = 0.5 drifts less than r = 0",
          "[fidelity][stories260k]") {
  auto engine = test::stories260k_engine();
  engine->add_schema_string(kTale);
  const auto prompt = pml::parse_prompt_string(
      R"(<prompt schema="tale"><dog/><rain/> The next day, Lily</prompt>)");
  FidelityOptions options;
  options.tokens = 24;
  const auto r0 = measure_fidelity(*engine, prompt, options);
  options.recompute.fraction = 1.0;
  const auto r1 = measure_fidelity(*engine, prompt, options);
  CHECK(r1.first_token_kl < 1e-8);
  CHECK(r1.exact);
  options.recompute.fraction = 0.5;
  const auto half = measure_fidelity(*engine, prompt, options);
  WARN("stories260K gap prompt KL: r=0 " << r0.first_token_kl << ", r=0.5 " << half.first_token_kl
                                         << ", r=1 " << r1.first_token_kl);
  CHECK(half.first_token_kl <= r0.first_token_kl);
}

TEST_CASE("on stories260K the impact criterion drifts less than deviation alone at r = 0.2",
          "[fidelity][stories260k]") {
  // The attention weighting is what impact adds: over these gap prompts (fixed, so the result
  // is deterministic) its first-token KL must come out well below deviation's with the same
  // pass; bench_fidelity measures 0.0006 against 0.0080 over 200 prompts.
  auto engine = test::stories260k_engine();
  engine->add_schema_string(kTale);
  const std::vector<std::string> prompts = {
      R"(<prompt schema="tale"><dog/><rain/> The next day, Lily</prompt>)",
      R"(<prompt schema="tale"><park/><cake/> Then,</prompt>)",
      R"(<prompt schema="tale"><opening/><rain/><cake/> Lily said,</prompt>)",
      R"(<prompt schema="tale"><park/><dog/><cake/> So they</prompt>)",
  };
  double impact = 0, deviation = 0;
  for (const auto& xml : prompts) {
    FidelityOptions options;
    options.tokens = 1;
    options.recompute = {0.2, RecomputeCriterion::kImpact, 1};
    impact += measure_fidelity(*engine, pml::parse_prompt_string(xml), options).first_token_kl;
    options.recompute.criterion = RecomputeCriterion::kDeviation;
    deviation += measure_fidelity(*engine, pml::parse_prompt_string(xml), options).first_token_kl;
  }
  WARN("summed first-token KL at r = 0.2: impact " << impact << ", deviation " << deviation);
  CHECK(impact < 0.5 * deviation);
}
