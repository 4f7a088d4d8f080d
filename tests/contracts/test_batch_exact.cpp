// Batches: prompts with different module selections (of one schema or several) run together in
// one batch KV cache. Each row must get exactly what its prompt gets alone: the same last-token
// logits (within 1e-5, f32) and the same greedy tokens, with the cache and without it.
#include "support/catch_torch.hpp"

#include <set>

#include "support/random_schema.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

double max_diff(const torch::Tensor& x, const torch::Tensor& y) {
  return (x.cpu().reshape({-1}) - y.cpu().reshape({-1})).abs().max().item<double>();
}

}  // namespace

TEST_CASE("batch-exact: every prompt of a batch gets the logits and tokens it gets alone",
          "[contract][batch]") {
  auto engine = test::tiny_engine(4);
  SamplingParams params;
  params.max_new_tokens = 6;
  params.stop_at_eos = false;  // every row decodes the same number of steps alone and together
  int batches = 0, rows = 0, two_schemas = 0, uneven_cached = 0, uneven_fresh = 0;
  for (std::uint64_t seed = 0; seed < 10; ++seed) {
    const auto a = test::make_case(seed, "a" + std::to_string(seed), 3);
    const auto b = test::make_case(seed + 100, "b" + std::to_string(seed), 2);
    engine->add_schema_string(a.schema);
    engine->add_schema_string(b.schema);
    std::vector<pml::Prompt> prompts;
    std::vector<pml::ResolvedPrompt> resolved;
    std::vector<std::string> xml = a.prompts;
    xml.insert(xml.end(), b.prompts.begin(), b.prompts.end());
    for (const auto& p : xml) {
      try {
        auto prompt = pml::parse_prompt_string(p);
        resolved.push_back(engine->resolve(prompt));
        prompts.push_back(std::move(prompt));
      } catch (const Error& e) {
        REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);  // a random argument may not fit
      }
    }
    if (prompts.size() < 2) continue;
    INFO("seed " << seed << "\nschema a: " << a.schema << "\nschema b: " << b.schema);
    const auto n = static_cast<int64_t>(prompts.size());
    for (bool use_cache : {true, false}) {
      INFO((use_cache ? "cached" : "uncached"));
      KVCache batch_cache = engine->model().make_cache(0, n);
      const auto together = engine->prefill_batch(resolved, batch_cache, use_cache);
      REQUIRE(together.logits.size(0) == n);
      std::set<int64_t> cached, fresh;
      for (int64_t i = 0; i < n; ++i) {
        INFO("prompt " << i << ": " << xml[i]);
        KVCache single = engine->model().make_cache(0);
        const auto alone = engine->prefill(resolved[i], single, use_cache);
        const auto& row = together.assembled.rows[i];
        CHECK(row.fresh_tokens == alone.assembled.fresh_tokens);
        CHECK(row.fresh_positions == alone.assembled.fresh_positions);
        CHECK(row.cached_tokens == alone.assembled.cached_tokens);
        CHECK(max_diff(together.logits[i], alone.logits) <=
              test::logit_tolerance(engine->model(), alone.logits, 1e-5));
        cached.insert(row.cached_tokens);
        fresh.insert(static_cast<int64_t>(row.fresh_tokens.size()));
      }
      if (use_cache) {
        uneven_cached += cached.size() > 1;
        uneven_fresh += fresh.size() > 1;
      }
      const auto responses = engine->generate_batch(prompts, params, {}, RequestOptions{use_cache});
      REQUIRE(responses.size() == prompts.size());
      for (int64_t i = 0; i < n; ++i) {
        INFO("prompt " << i << ": " << xml[i]);
        const auto alone = engine->generate(prompts[i], params, {}, RequestOptions{use_cache});
        CHECK(responses[i].tokens == alone.tokens);
        CHECK(responses[i].text == alone.text);
        CHECK(responses[i].stop_reason == StopReason::kMaxTokens);
        CHECK(responses[i].cached_tokens == alone.cached_tokens);
        CHECK(responses[i].fresh_tokens == alone.fresh_tokens);
        CHECK(responses[i].timings.decode_tokens == params.max_new_tokens - 1);
      }
    }
    ++batches;
    rows += static_cast<int>(n);
    two_schemas += prompts.front().schema != prompts.back().schema;
  }
  WARN("batches " << batches << ", prompts " << rows << ", two schemas " << two_schemas
                  << ", uneven cached " << uneven_cached << ", uneven fresh " << uneven_fresh);
  // The cases really mix schemas and rows of different shapes (padding in both regions).
  CHECK(batches >= 8);
  CHECK(two_schemas >= 5);
  CHECK(uneven_cached >= 5);
  CHECK(uneven_fresh >= 5);
}
