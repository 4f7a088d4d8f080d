// Prefix-exact and batch-exact contract checks for suites that run them on several models (model
// families, quantized weights).
#pragma once

#include <string>
#include <vector>

#include "promptcache/engine.hpp"
#include "support/catch_torch.hpp"
#include "support/random_schema.hpp"
#include "support/tiny_model.hpp"

namespace promptcache::test {

// The story schema prefix-exact runs on.
inline const char* story_schema() {
  return R"(<schema name="story">
  <system>You are a helpful assistant. Keep your answers short and clear.</system>
  <module name="intro">Once upon a time, there was a little girl named Lily.</module>
  <module name="park">She loved to play outside in the park. One day, she saw a big red ball.</module>
  <module name="friend">Her friend Tom came to help, and together they found a long stick.</module>
</schema>)";
}

// Prefix-exact on two prompts of story_schema(): the last-token logits with the cached modules
// equal those of the plain prefill within the logit tolerance (1e-4 in f32), and 12 greedy
// tokens are the same. Returns the plain prefill's fresh token counts.
inline std::vector<std::size_t> check_prefix_exact(Engine& engine) {
  engine.add_schema_string(story_schema());
  std::vector<std::size_t> fresh;
  for (const std::string prompt :
       {R"(<prompt schema="story"><intro/><park/><friend/>What did Lily see?</prompt>)",
        R"(<prompt schema="story"><intro/><park/><user>Where was the ball?</user></prompt>)"}) {
    INFO(prompt);
    const auto resolved = engine.resolve(pml::parse_prompt_string(prompt));
    KVCache cached = engine.model().make_cache(0), plain = engine.model().make_cache(0);
    const auto a = engine.prefill(resolved, cached, /*use_cache=*/true);
    const auto b = engine.prefill(resolved, plain, /*use_cache=*/false);
    CHECK(a.assembled.cached_tokens > 0);
    fresh.push_back(b.assembled.fresh_tokens.size());
    const double diff =
        (a.logits.cpu().reshape({-1}) - b.logits.cpu().reshape({-1})).abs().max().item<double>();
    INFO("max abs logit diff " << diff);
    CHECK(diff <= logit_tolerance(engine.model(), b.logits, 1e-4));
    SamplingParams greedy;
    greedy.max_new_tokens = 12;
    greedy.stop_at_eos = false;
    const auto with_cache = engine.generate_xml(prompt, greedy);
    const auto without = engine.generate_xml(prompt, greedy, {}, RequestOptions{false});
    CHECK(with_cache.tokens.size() == 12u);
    CHECK(with_cache.tokens == without.tokens);
    CHECK(with_cache.text == without.text);
  }
  return fresh;
}

// Batch-exact: every prompt of a batch gets, within the logit tolerance, the logits it gets
// alone, and the same greedy tokens, with the cache and without it. Runs the check on the random
// schemas of seeds [0, seeds) (3 prompts each; prompts whose arguments do not fit are left out) and
// returns how many made a batch of at least two.
inline int check_batch_exact(Engine& engine, std::uint64_t seeds, int max_new_tokens) {
  auto max_diff = [](const torch::Tensor& x, const torch::Tensor& y) {
    return (x.cpu().reshape({-1}) - y.cpu().reshape({-1})).abs().max().item<double>();
  };
  SamplingParams params;
  params.max_new_tokens = max_new_tokens;
  params.stop_at_eos = false;
  int batches = 0;
  for (std::uint64_t seed = 0; seed < seeds; ++seed) {
    const auto a = make_case(seed, "a" + std::to_string(seed), 3);
    engine.add_schema_string(a.schema);
    std::vector<pml::Prompt> prompts;
    std::vector<pml::ResolvedPrompt> resolved;
    for (const auto& p : a.prompts) {
      try {
        auto prompt = pml::parse_prompt_string(p);
        resolved.push_back(engine.resolve(prompt));
        prompts.push_back(std::move(prompt));
      } catch (const Error& e) {
        REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);
      }
    }
    if (prompts.size() < 2) continue;
    INFO("seed " << seed << "\nschema: " << a.schema);
    const auto n = static_cast<int64_t>(prompts.size());
    for (bool use_cache : {true, false}) {
      INFO((use_cache ? "cached" : "uncached"));
      KVCache batch_cache = engine.model().make_cache(0, n);
      const auto together = engine.prefill_batch(resolved, batch_cache, use_cache);
      for (int64_t i = 0; i < n; ++i) {
        KVCache single = engine.model().make_cache(0);
        const auto alone = engine.prefill(resolved[i], single, use_cache);
        CHECK(max_diff(together.logits[i], alone.logits) <=
              logit_tolerance(engine.model(), alone.logits, 1e-5));
      }
      const auto responses = engine.generate_batch(prompts, params, {}, RequestOptions{use_cache});
      REQUIRE(responses.size() == prompts.size());
      for (int64_t i = 0; i < n; ++i) {
        const auto alone = engine.generate(prompts[i], params, {}, RequestOptions{use_cache});
        CHECK(responses[i].tokens == alone.tokens);
      }
    }
    ++batches;
  }
  return batches;
}

}  // namespace promptcache::test
